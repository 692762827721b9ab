"""What a worker's exit means (pure: how it ended and what edged knew in, verdict out).

:func:`classify_exit` names the exit that status shows (``lastExit``) and that the crash-loop
backoff counts, first match wins:

* the replica was being stopped (drain, scale-down, superseded): a clean stop, not a crash;
* edged killed it (startup timeout, liveness): the reason edged gave;
* the worker said why it could not start (FAILED frame: model load, limits, digest): that;
* the kernel's OOM killer acted in the worker's cgroup (its ``memory.events`` ``oom_kill``
  grew while it ran) and the worker died of SIGKILL: ``OOMKilled``, naming ``memory.max``;
* a signal: ``Killed`` for SIGKILL (the OOM killer, or someone outside), else ``Signaled``;
* an exit code: ``Error`` (non-zero) or ``Completed`` (zero; still unexpected).

A replica that was ready for :data:`STABLE_AFTER_S` before it exited starts a new crash
streak; otherwise the streak grows (and with it the restart delay, see planning.py).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import StrEnum

STABLE_AFTER_S = 60.0  # a replica ready this long before exiting starts a new crash streak


class ExitReason(StrEnum):
    """The reasons :func:`classify_exit` gives itself (others come from edged or the worker)."""

    KILLED = "Killed"
    SIGNALED = "Signaled"
    ERROR = "Error"
    COMPLETED = "Completed"
    LAUNCH_FAILED = "LaunchFailed"
    OOM_KILLED = "OOMKilled"
    EXITED = "Exited"  # an adopted worker ended: how is not known
    LIMITS_FAILED = "LimitsFailed"  # also the worker's own reason when it cannot join its cgroup


@dataclass(frozen=True, slots=True)
class ExitVerdict:
    stopped: bool  # ended on purpose (drained and stopped): no reason, no crash
    reason: str = ""
    message: str = ""
    crash_streak: int = 0  # the slot's crash streak after this exit


def classify_exit(
    code: int | None,
    *,
    stopping: bool,
    killed: tuple[str, str] | None,
    failed: tuple[str, str] | None,
    ready_since: float | None,
    crash_streak: int,
    now: float,
    oom_kills: int = 0,
    memory_max: int | None = None,
) -> ExitVerdict:
    """The verdict on a worker that exited with ``code`` (negative: killed by that signal;
    None: not known, the worker was adopted and is not edged's child).

    ``killed``: (reason, message) edged gave when it killed the worker; ``failed``: what the
    worker reported before exiting; ``ready_since``: when the replica last became ready;
    ``oom_kills``: how many OOM kills its cgroup counted while it ran; ``memory_max``: its
    cgroup's memory limit, for the message.
    """
    if stopping:
        return ExitVerdict(stopped=True, crash_streak=crash_streak)
    if killed is not None:
        reason, message = killed
    elif oom_kills > 0 and code in (None, -signal.SIGKILL):
        reason = ExitReason.OOM_KILLED.value
        limit = f"memory.max {memory_max} bytes" if memory_max is not None else "memory.max"
        message = (
            f"worker killed by the kernel's OOM killer: it reached its cgroup's {limit} "
            f"(memory.events oom_kill +{oom_kills})"
        )
    elif failed is not None:
        reason, message = failed
    elif code is None:
        reason = ExitReason.EXITED.value
        message = "the adopted worker exited (not edged's child: its exit status is not known)"
    elif code < 0:
        if code == -signal.SIGKILL:
            reason = ExitReason.KILLED.value
            message = "worker killed by SIGKILL (out of memory, or from outside)"
        else:
            known = -code in signal.Signals._value2member_map_
            reason = ExitReason.SIGNALED.value
            message = f"worker killed by {signal.Signals(-code).name if known else code}"
    else:
        reason = (ExitReason.ERROR if code else ExitReason.COMPLETED).value
        message = f"worker exited with code {code}"
    stable = ready_since is not None and now - ready_since >= STABLE_AFTER_S
    return ExitVerdict(False, reason, message, 1 if stable else crash_streak + 1)


def classify_launch_failure(error: str, *, crash_streak: int, limits: bool = False) -> ExitVerdict:
    """The process could not even be started (``error``: the OS's message); ``limits``: it was
    its cgroup or resource limits that could not be written (``LimitsFailed``)."""
    reason = ExitReason.LIMITS_FAILED if limits else ExitReason.LAUNCH_FAILED
    return ExitVerdict(False, reason.value, error, crash_streak + 1)
