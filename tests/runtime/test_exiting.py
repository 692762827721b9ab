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
    oom_kills: int = 0  # how many OOM kills the worker's cgroup counted while it ran
    memory_max: int | None = None


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
    "SIGKILL with the cgroup's oom_kill grown: OOMKilled, naming memory.max": Exit(
        -signal.SIGKILL,
        ExitVerdict(
            False,
            "OOMKilled",
            "worker killed by the kernel's OOM killer: it reached its cgroup's memory.max "
            "67108864 bytes (memory.events oom_kill +1)",
            3,
        ),
        oom_kills=1,
        memory_max=64 << 20,
    ),
    "OOM kill even after the worker reported a failure: the kill is why it ended": Exit(
        -signal.SIGKILL,
        ExitVerdict(
            False,
            "OOMKilled",
            "worker killed by the kernel's OOM killer: it reached its cgroup's memory.max "
            "(memory.events oom_kill +2)",
            3,
        ),
        failed=LOAD_FAILED,
        oom_kills=2,
    ),
    "edged's own kill wins over an OOM count": Exit(
        -signal.SIGKILL, ExitVerdict(False, *LIVENESS, 3), killed=LIVENESS, oom_kills=1
    ),
    "an OOM count but no SIGKILL: the exit as it was": Exit(
        1, ExitVerdict(False, "Error", "worker exited with code 1", 3), oom_kills=1
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
        oom_kills=case.oom_kills,
        memory_max=case.memory_max,
    )
    assert verdict == case.expected


def test_a_process_that_cannot_start_is_a_launch_failure() -> None:
    verdict = classify_launch_failure("[Errno 2] No such file or directory", crash_streak=4)
    assert verdict == ExitVerdict(False, "LaunchFailed", "[Errno 2] No such file or directory", 5)


def test_limits_that_cannot_be_written_are_their_own_reason() -> None:
    error = "cannot write 1048576 to /sys/fs/cgroup/x/workloads/r/memory.max: Permission denied"
    verdict = classify_launch_failure(error, crash_streak=0, limits=True)
    assert verdict == ExitVerdict(False, "LimitsFailed", error, 1)


def test_an_adopted_worker_ends_with_no_status_known() -> None:
    verdict = classify_exit(
        None, stopping=False, killed=None, failed=None, ready_since=None, crash_streak=0, now=1.0
    )
    assert verdict.reason == "Exited" and "not known" in verdict.message
    killed = classify_exit(
        None,
        stopping=False,
        killed=("NotAdopted", "its socket does not answer"),
        failed=None,
        ready_since=None,
        crash_streak=0,
        now=1.0,
    )
    assert killed.reason == "NotAdopted"
