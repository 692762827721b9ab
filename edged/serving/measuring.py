"""What each workload revision answered on this device, for the hub's canary analysis.

Per (workload, revision) a :class:`RevisionMeter`: counters of requests and errors (answers
with a status of 500 or more: the worker's own failures, and the 503s of edged's own router
when it has no ready replica for the request, :meth:`RevisionMeters.refused`) since the
revision first answered in this process, and a bounded reservoir of the latest latencies
(:data:`RESERVOIR` of them, each with the time it was answered) from which the p95 over the
last ``latency_window`` seconds is computed when a report is made. Recording is two
increments and one append on the inference path; nothing is sorted there.

Snapshots are refreshed at most every ``period`` seconds (:meth:`RevisionMeters.snapshot`),
so a device under steady traffic does not send the hub a new status every second; a meter
not refreshed for an hour with no request is dropped (its revision is gone).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edged.runtime.configreports import validation_doc

if TYPE_CHECKING:
    from edged.runtime.processes import Replica

RESERVOIR = 2048
FORGET_AFTER_S = 3600.0


@dataclass(frozen=True, slots=True)
class RevisionMeasures:
    """A revision's figures as reported to the hub."""

    requests: int
    errors: int
    latency_p95_s: float  # 0: no request in the window
    latency_window_s: float
    window_requests: int


class RevisionMeter:
    __slots__ = ("errors", "last_at", "latencies", "requests")

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.latencies: deque[tuple[float, float]] = deque(maxlen=RESERVOIR)
        self.last_at = 0.0

    def measures(self, now: float, window: float) -> RevisionMeasures:
        recent = sorted(s for at, s in self.latencies if at >= now - window)
        p95 = percentile(recent, 0.95) if recent else 0.0
        return RevisionMeasures(self.requests, self.errors, p95, window, len(recent))


def percentile(ordered: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of sorted values (the smallest value with at least
    ``q`` of them at or below it)."""
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


class RevisionMeters:
    """Every revision's meter on this device; fed by the inference path."""

    def __init__(
        self,
        *,
        period: float = 5.0,
        latency_window: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._meters: dict[tuple[str, str], RevisionMeter] = {}
        self._period = period
        self._window = latency_window
        self._clock = clock
        self._snapshot: dict[tuple[str, str], RevisionMeasures] = {}
        self._snapshot_at = -math.inf

    def answered(self, workload: str, revision: str, status: int, seconds: float) -> None:
        key = (workload, revision)
        meter = self._meters.get(key)
        if meter is None:
            meter = self._meters[key] = RevisionMeter()
        now = self._clock()
        meter.requests += 1
        if status >= 500:
            meter.errors += 1
        meter.latencies.append((now, seconds))
        meter.last_at = now

    def refused(self, workload: str, revision: str) -> None:
        """edged itself answered a request of that revision 503 (its router had no ready
        replica, the replica went away while serving it): an error, with no latency."""
        key = (workload, revision)
        meter = self._meters.get(key)
        if meter is None:
            meter = self._meters[key] = RevisionMeter()
        meter.requests += 1
        meter.errors += 1
        meter.last_at = self._clock()

    def snapshot(self) -> dict[tuple[str, str], RevisionMeasures]:
        """Every revision's figures, refreshed at most every ``period`` seconds."""
        now = self._clock()
        if now - self._snapshot_at >= self._period:
            for key in [k for k, m in self._meters.items() if now - m.last_at > FORGET_AFTER_S]:
                del self._meters[key]
            self._snapshot = {k: m.measures(now, self._window) for k, m in self._meters.items()}
            self._snapshot_at = now
        return self._snapshot

    def of(self, workload: str, revision: str) -> RevisionMeasures | None:
        return self.snapshot().get((workload, revision))


@dataclass(frozen=True, slots=True)
class BenchmarkResult:
    """A revision's self-benchmark on this device: the p95 of its worker's timed runs after
    the warm-up (runtime/worker.py)."""

    p95_s: float
    runs: int

    @classmethod
    def from_worker(cls, doc: object) -> BenchmarkResult | None:
        """From a worker's READY metadata (``benchmark``), held to bounds; None when absent
        or malformed."""
        if not isinstance(doc, dict):
            return None
        try:
            p95 = float(doc.get("p95Seconds", -1.0))
            runs = int(doc.get("runs", 0))
        except (TypeError, ValueError):
            return None
        if not (0.0 <= p95 < 3600.0) or not (0 < runs <= 1000):
            return None
        return cls(p95, runs)


@dataclass(frozen=True, slots=True)
class ValidationResult:
    """A revision's accuracy on its validation set, as its worker found (or why not)."""

    accuracy: float = 0.0
    samples: int = 0
    correct: int = 0
    reason: str = ""
    message: str = ""

    @classmethod
    def from_worker(cls, doc: object) -> ValidationResult | None:
        """From a worker's READY metadata (``validation``), held to the hub's bounds; None
        when the worker did not evaluate one (not slot 0)."""
        if not isinstance(doc, dict):
            return None
        reason = str(doc.get("reason", ""))[:128]
        if reason:
            return cls(reason=reason, message=str(doc.get("message", ""))[:1024])
        try:
            samples = max(0, min(int(doc.get("samples", 0)), 2**32 - 1))
            correct = max(0, min(int(doc.get("correct", 0)), samples))
        except (TypeError, ValueError):
            return cls(reason="ValidationFailed", message="the worker's answer is malformed")
        if samples == 0:
            return cls(reason="ValidationInvalid", message="the validation set is empty")
        return cls(correct / samples, samples, correct)


def validation_of(
    replicas: Iterable[Replica], revision: str, config: str | None = None
) -> ValidationResult | None:
    """What a replica of ``revision`` found on the validation set (the first that says);
    ``config``: the digest of the workload's model config on disk ("" none): only a result
    measured with it counts (:func:`edged.runtime.configreports.validation_doc`)."""
    for rep in replicas:
        if rep.revision == revision:
            found = ValidationResult.from_worker(validation_doc(rep, config))
            if found is not None:
                return found
    return None


def benchmark_of(replicas: Iterable[Replica], revision: str) -> BenchmarkResult | None:
    """The self-benchmark of a replica of ``revision`` (the slowest one's p95)."""
    found = [
        b
        for rep in replicas
        if rep.revision == revision
        and (b := BenchmarkResult.from_worker(rep.metadata.get("benchmark"))) is not None
    ]
    return max(found, key=lambda b: b.p95_s) if found else None
