"""Canary analysis as tables: windowed counters, figures per side, verdicts. Pure: no clock."""

from __future__ import annotations

from typing import Any

import pytest

from edgefleet.api import CanaryAnalysis
from hub.decide.analysis import (
    Figures,
    History,
    Observed,
    Sample,
    Verdict,
    analyze,
    figures,
)
from hub.decide.devices import RevisionPhase, RevisionReport
from hub.decide.weighing import screen


def samples(*points: tuple[float, int, int]) -> list[Sample]:
    return [Sample(at, r, e) for at, r, e in points]


@pytest.mark.parametrize(
    ("points", "now", "window", "expected"),
    [
        ([], 100, 60, (0, 0)),
        ([(50, 10, 1)], 100, 60, (0, 0)),  # one sample: nothing measured between two
        ([(10, 100, 5), (50, 150, 6), (100, 400, 16)], 100, 60, (300, 11)),  # oldest: no older
        ([(10, 100, 5), (40, 150, 6), (100, 400, 16)], 100, 60, (250, 10)),  # from 40 (<= 40)
        ([(10, 100, 5), (50, 20, 2), (100, 120, 4)], 100, 90, (120, 4)),  # a restart at 50
        ([(0, 0, 0), (10, 10, 0), (20, 10, 0)], 20, 5, (0, 0)),  # nothing in the last 5 s
    ],
)
def test_windowed_counts(
    points: list[tuple[float, int, int]], now: float, window: float, expected: tuple[int, int]
) -> None:
    assert screen(samples(*points), now, window, per_second=1e6) == expected


def test_history_is_bounded_and_spaced() -> None:
    h = History(per_key=4)
    for t in range(100):
        h.record("k", Sample(float(t), t, 0), spacing=10)
    got = h.samples("k")
    assert len(got) <= 4
    assert got[-1] == Sample(99.0, 99, 0)  # the newest counters are always there
    h.keep([])
    assert len(h) == 0


def rev(
    requests: int = 0,
    errors: int = 0,
    p95: float | None = None,
    accuracy: float | None = None,
    reason: str = "",
) -> RevisionReport:
    return RevisionReport(
        "2.0.0",
        phase=RevisionPhase.READY,
        ready_replicas=1,
        requests=requests,
        errors=errors,
        latency_p95_s=p95,
        window_requests=requests,
        accuracy=accuracy,
        validation_reason=reason,
    )


def test_figures_weigh_devices_take_the_worst_latency_and_accuracy() -> None:
    """a's 100 requests weigh no more than b's 50 (the heaviest other device): a counts
    50 requests at its own rate (1%: 0.5 errors, rounded to 1)."""
    got = figures(
        [
            Observed("a", rev(100, 1, p95=0.010, accuracy=0.97), samples((0, 0, 0), (60, 100, 1))),
            Observed("b", rev(50, 4, p95=0.030, accuracy=0.91), samples((0, 10, 0), (60, 60, 4))),
            Observed("c", rev(reason="NoValidationSet")),
        ],
        now=60,
        window=60,
    )
    assert (got.devices, got.requests, got.errors) == (3, 100, 5)
    assert got.latency_p95_s == 0.030 and got.accuracy == 0.91 and got.accuracy_devices == 2
    assert got.validation_problems == {"c": "NoValidationSet"}


def spec(**kw: Any) -> CanaryAnalysis:
    return CanaryAnalysis(min_requests=20, **kw)


def side(
    devices: int = 1,
    requests: int = 0,
    errors: int = 0,
    p95: float | None = None,
    accuracy: float | None = None,
    measured: int | None = None,
    problems: dict[str, str] | None = None,
) -> Figures:
    return Figures(
        devices,
        requests,
        errors,
        p95,
        accuracy,
        devices if measured is None and accuracy is not None else measured or 0,
        problems or {},
    )


@pytest.mark.parametrize(
    ("analysis", "canary", "stable", "verdict", "says"),
    [
        # nothing to check
        (spec(), side(), side(), Verdict.PASS, "no checks"),
        # accuracy
        (spec(min_accuracy=0.9), side(accuracy=0.95), side(), Verdict.PASS, "0.9500 >= "),
        (spec(min_accuracy=0.9), side(accuracy=0.5), side(), Verdict.FAIL, "0.5000 on the"),
        (
            spec(min_accuracy=0.9),
            side(devices=2, accuracy=0.95, measured=1),
            side(),
            Verdict.WAIT,
            "1 of 2 canary devices",
        ),
        # one device below is enough to fail, even before the others reported
        (
            spec(min_accuracy=0.9),
            side(devices=3, accuracy=0.2, measured=1),
            side(),
            Verdict.FAIL,
            "below minAccuracy 0.9",
        ),
        (
            spec(min_accuracy=0.9),
            side(problems={"d1": "NoValidationSet"}),
            side(),
            Verdict.FAIL,
            "no accuracy on d1 (NoValidationSet)",
        ),
        (spec(min_accuracy=0.9), side(devices=0), side(), Verdict.WAIT, "0 of 0"),
        # error rate against the stable revision's
        (
            spec(max_error_rate_increase=0.02),
            side(requests=100, errors=3),
            side(requests=1000, errors=20),
            Verdict.PASS,
            "error rate 3.00% (3/100) vs stable 2.00% (20/1000): +1.00%",
        ),
        (
            spec(max_error_rate_increase=0.02),
            side(requests=100, errors=30),
            side(requests=1000, errors=20),
            Verdict.FAIL,
            "above maxErrorRateIncrease 2.00%",
        ),
        (
            spec(max_error_rate_increase=0.02),
            side(requests=19, errors=19),
            side(requests=1000),
            Verdict.WAIT,
            "19 canary requests in the window, waiting for 20",
        ),
        # the stable side unmeasured counts as 0%
        (
            spec(max_error_rate_increase=0.02),
            side(requests=100, errors=3),
            side(requests=5),
            Verdict.FAIL,
            "stable not measured (5 requests), counted as 0%",
        ),
        # latency
        (
            spec(max_latency_p95_s=0.05),
            side(requests=50, p95=0.02),
            side(),
            Verdict.PASS,
            "latency p95 20.0 ms within maxLatencyP95 50.0 ms",
        ),
        (
            spec(max_latency_p95_s=0.05),
            side(requests=50, p95=0.2),
            side(),
            Verdict.FAIL,
            "latency p95 200.0 ms above",
        ),
        (spec(max_latency_p95_s=0.05), side(requests=50), side(), Verdict.WAIT, "waiting"),
        # any failure fails; else any wait waits
        (
            spec(min_accuracy=0.9, max_error_rate_increase=0.02),
            side(requests=5, accuracy=0.5),
            side(),
            Verdict.FAIL,
            "accuracy 0.5000",
        ),
        (
            spec(min_accuracy=0.9, max_error_rate_increase=0.02),
            side(requests=5, accuracy=0.95),
            side(),
            Verdict.WAIT,
            "5 canary requests",
        ),
    ],
)
def test_analysis(
    analysis: CanaryAnalysis, canary: Figures, stable: Figures, verdict: Verdict, says: str
) -> None:
    got = analyze(analysis, canary, stable)
    assert got.verdict is verdict, got.message
    assert says in got.message, got.message
    assert got.to_json()["verdict"] == verdict.value
