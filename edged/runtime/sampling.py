"""What the autoscaler and the eviction see of the workers, measured cheaply.

* :class:`QueueMeter`: requests in flight per workload, time-averaged exactly over each sample
  period (Little's law): the seconds of the requests answered in the period, plus the age of
  those in flight now, less the age of those in flight at the previous sample. The inference
  path pays one dict lookup per answer (:meth:`QueueMeter.answered`), nothing when the
  workload is not measured; the ages are read from the worker channels at each sample.
* :func:`cpu_seconds`, :func:`rss_bytes`: one ``/proc/<pid>`` file each, per replica and sample.
* :func:`mem_available`: ``MemAvailable`` of ``/proc/meminfo``. The test-only seam:
  ``EDGED_TEST_MEMINFO`` names another file in the meminfo format to read instead (the
  memory-pressure tests write a low ``MemAvailable`` there; nothing else reads it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

MEMINFO = "/proc/meminfo"
TEST_MEMINFO_ENV = "EDGED_TEST_MEMINFO"
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


class QueueMeter:
    """Time-averaged requests in flight of the workloads being measured."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._answered: dict[str, float] = {}  # seconds of requests answered since the sample
        self._ages: dict[str, float] = {}  # summed age of requests in flight at the sample
        self._at: dict[str, float] = {}

    def watch(self, workloads: Iterable[str]) -> None:
        """Measure exactly these workloads from now on."""
        keep = set(workloads)
        for w in list(self._answered):
            if w not in keep:
                del self._answered[w], self._ages[w], self._at[w]
        for w in keep - set(self._answered):
            self._answered[w] = 0.0
            self._ages[w] = 0.0
            self._at[w] = self._clock()

    def answered(self, workload: str, seconds: float) -> None:
        """A request of ``workload`` was answered after ``seconds`` in flight."""
        acc = self._answered.get(workload)
        if acc is not None:
            self._answered[workload] = acc + seconds

    def sample(self, workload: str, started: Iterable[float]) -> float:
        """Average requests in flight since the last sample; ``started``: the start times
        (this meter's clock) of the requests in flight now."""
        if workload not in self._answered:
            return 0.0
        now = self._clock()
        ages = sum(now - t0 for t0 in started)
        area = self._answered[workload] + ages - self._ages[workload]
        span = now - self._at[workload]
        self._answered[workload], self._ages[workload], self._at[workload] = 0.0, ages, now
        return max(0.0, area / span) if span > 0 else 0.0


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (all its threads), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14, 15)


def rss_bytes(pid: int) -> int | None:
    """Resident memory of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def mem_available() -> int | None:
    """``MemAvailable`` in bytes (None when the kernel does not say)."""
    path = os.environ.get(TEST_MEMINFO_ENV) or MEMINFO
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
