"""Steering the kernel's OOM killer by priority: ``oom_score_adj`` of each worker process.

:func:`oom_score_adj` (pure) maps a deployment's priority onto -900..900, monotonically:
priority 0 is 0 (the kernel's default), higher priorities lower (the critical model is killed
last), lower ones higher (killed first). Lowering below what edged itself has needs
``CAP_SYS_RESOURCE``; without it :func:`set_oom_score_adj` writes what it may (edged's own
value), so the order still holds: low-priority workers are raised above the critical ones.
"""

from __future__ import annotations

from edgefleet.logs import get_logger

log = get_logger(__name__)

OOM_SCORE_ADJ_RANGE = 900  # the kernel's is -1000..1000; -1000 (never) is not ours to use


def oom_score_adj(priority: int) -> int:
    """-900..900: 0 for priority 0, -450 for 1000, about -900 for a million; mirrored below."""
    return round(-OOM_SCORE_ADJ_RANGE * priority / (abs(priority) + 1000))


def _own() -> int:
    try:
        with open("/proc/self/oom_score_adj") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


def set_oom_score_adj(pid: int, value: int) -> int | None:
    """Write ``value`` (or, without the privilege to go that low, edged's own value) for
    ``pid``; the value written, or None when neither could be."""
    for attempt in (value, max(value, _own())):
        try:
            with open(f"/proc/{pid}/oom_score_adj", "w") as f:
                f.write(str(attempt))
            return attempt
        except PermissionError:
            continue
        except OSError as exc:  # the process is gone
            log.debug("cannot set oom_score_adj", pid=pid, error=str(exc))
            return None
    return None
