"""How a worker's exit is classified, as a table: how it ended and what edged knew in."""

from __future__ import annotations

import signal
from dataclasses import dataclass

import pytest

from edged.runtime.exiting import (
    STABLE_AFTER_S,
    ExitVerdict,
    classify_exit,
    classify_launch_failure,
)

T = 1000.0  # "now", monotonic seconds
STARTUP_TIMEOUT = ("StartupTimeout", "model not loaded and warmed up within 10s")
LIVENESS = ("LivenessFailed", "the worker stopped answering probes")
LOAD_FAILED = ("ModelLoadFailed", "onnxruntime cannot load the model: bad graph")


@dataclass(frozen=True)
class Exit:
    code: int
    expected: ExitVerdict
    stopping: bool = False
    killed: tuple[str, str] | None = None
    failed: tuple[str, str] | None = None
    ready_since: float | None = None
    crash_streak: int = 2


EXITS = {
    # -- on purpose ---------------------------------------------------------------------------
    "drained and stopped: clean, no crash": Exit(
        0, ExitVerdict(stopped=True, crash_streak=2), stopping=True
    ),
    "stopped with SIGKILL after the drain timeout: still a stop": Exit(
        -signal.SIGKILL, ExitVerdict(stopped=True, crash_streak=2), stopping=True
    ),
    # -- killed by edged ----------------------------------------------------------------------
    "killed for a startup timeout: edged's reason": Exit(
        -signal.SIGKILL, ExitVerdict(False, *STARTUP_TIMEOUT, 3), killed=STARTUP_TIMEOUT
    ),
    "killed by liveness: edged's reason, even after a load failure report": Exit(
        -signal.SIGKILL,
        ExitVerdict(False, *LIVENESS, 3),
        killed=LIVENESS,
        failed=LOAD_FAILED,
    ),
    # -- the worker's own failures ------------------------------------------------------------
    "load failure: the worker's reason": Exit(
        3, ExitVerdict(False, *LOAD_FAILED, 3), failed=LOAD_FAILED
    ),
    "SIGKILL from outside (OOM killer)": Exit(
        -signal.SIGKILL,
        ExitVerdict(
            False, "Killed", "worker killed by SIGKILL (out of memory, or from outside)", 3
        ),
    ),
    "another signal: named": Exit(
        -signal.SIGSEGV, ExitVerdict(False, "Signaled", "worker killed by SIGSEGV", 3)
    ),
    "a signal number Python does not know: the code": Exit(
        -99, ExitVerdict(False, "Signaled", "worker killed by -99", 3)
    ),
    "crash with an exit code": Exit(1, ExitVerdict(False, "Error", "worker exited with code 1", 3)),
    "exit 0 nobody asked for": Exit(
        0, ExitVerdict(False, "Completed", "worker exited with code 0", 3)
    ),
    # -- crash streaks ------------------------------------------------------------------------
    "first crash": Exit(
        1, ExitVerdict(False, "Error", "worker exited with code 1", 1), crash_streak=0
    ),
    "ready shortly before the crash: the streak grows": Exit(
        1,
        ExitVerdict(False, "Error", "worker exited with code 1", 3),
        ready_since=T - STABLE_AFTER_S + 1,
    ),
    "ready long enough before the crash: a new streak": Exit(
        1,
        ExitVerdict(False, "Error", "worker exited with code 1", 1),
        ready_since=T - STABLE_AFTER_S,
        crash_streak=7,
    ),
}


@pytest.mark.parametrize("case", EXITS.values(), ids=EXITS.keys())
def test_classify_exit(case: Exit) -> None:
    verdict = classify_exit(
        case.code,
        stopping=case.stopping,
        killed=case.killed,
        failed=case.failed,
        ready_since=case.ready_since,
        crash_streak=case.crash_streak,
        now=T,
    )
    assert verdict == case.expected


def test_a_process_that_cannot_start_is_a_launch_failure() -> None:
    verdict = classify_launch_failure("[Errno 2] No such file or directory", crash_streak=4)
    assert verdict == ExitVerdict(False, "LaunchFailed", "[Errno 2] No such file or directory", 5)
