"""Per-revision request figures: counters, the latency window, the refresh period. Pure
(an injected clock)."""

from __future__ import annotations

from edged.serving.measuring import (
    RESERVOIR,
    RevisionMeasures,
    RevisionMeters,
    ValidationResult,
    percentile,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_percentile_is_nearest_rank() -> None:
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 0.95) == 95.0
    assert percentile([3.0], 0.95) == 3.0


def test_counts_errors_and_a_windowed_p95_per_revision() -> None:
    clock = Clock()
    meters = RevisionMeters(period=5, latency_window=60, clock=clock)
    for i in range(100):
        meters.answered("det", "r1", 500 if i < 10 else 200, 0.001 * (i + 1))
    meters.answered("det", "r2", 200, 0.5)
    assert meters.of("det", "r1") == RevisionMeasures(100, 10, 0.095, 60, 100)
    assert meters.of("det", "r2") == RevisionMeasures(1, 0, 0.5, 60, 1)
    assert meters.of("det", "nope") is None
    # the snapshot is held for the period; later, old latencies leave the window
    clock.now += 4
    meters.answered("det", "r1", 200, 0.2)
    assert meters.of("det", "r1") == RevisionMeasures(100, 10, 0.095, 60, 100)
    clock.now += 58
    assert meters.of("det", "r1") == RevisionMeasures(101, 10, 0.2, 60, 1)


def test_the_reservoir_is_bounded_and_idle_meters_are_forgotten() -> None:
    clock = Clock()
    meters = RevisionMeters(period=0, clock=clock)
    for _ in range(RESERVOIR * 2):
        meters.answered("det", "r1", 200, 0.01)
    got = meters.of("det", "r1")
    assert got is not None and got.requests == RESERVOIR * 2 and got.window_requests == RESERVOIR
    clock.now += 3601
    assert meters.of("det", "r1") is None


def test_validation_results_from_a_worker_are_bounded() -> None:
    assert ValidationResult.from_worker(None) is None
    assert ValidationResult.from_worker({"accuracy": 2, "samples": 4, "correct": 3}) == (
        ValidationResult(0.75, 4, 3)
    )
    assert ValidationResult.from_worker({"samples": 2, "correct": 9}) == ValidationResult(1.0, 2, 2)
    got = ValidationResult.from_worker({"reason": "X" * 500, "message": "m" * 5000})
    assert got is not None and len(got.reason) == 128 and len(got.message) == 1024
    assert ValidationResult.from_worker({"samples": "many"}) == ValidationResult(
        reason="ValidationFailed", message="the worker's answer is malformed"
    )
