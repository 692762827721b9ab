"""No single device (or region) decides a canary: the pure functions of ``hub.decide.weighing`` as
tables, and the property that makes them worth having (hypothesis): for any honest set of
devices and any one more device reporting anything, the analysis decides as it does without
that device, or waits. Pure: no clock, no store.

What "as without it" means, exactly (the error rate is the counters' check, the one a sum let
a liar decide; ``minAccuracy`` and ``maxLatencyP95`` stay worst-device checks by design, see
``hub.decide.analysis``):

* the error rate check, decided for the honest devices, is the same or Wait with one more;
* a verdict the honest devices reach is never turned around: Pass stays Pass or Wait (or
  Fail by a worst-device check that the extra canary device fails itself), Fail stays Fail
  or Wait;
* a Pass with the extra device is a Pass of the honest devices' own figures;
* an extra device whose figures are impossible changes nothing and is named.

An unrestricted "same or Wait, whatever the honest set" would decide nothing at all: every
set is a smaller set plus one device, down to the empty one, which waits.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from propertytesting import examples

from edgefleet.api import CanaryAnalysis
from hub.decide.analysis import Analysis, Observed, Sample, Verdict, analyze, figures
from hub.decide.devices import RevisionPhase, RevisionReport
from hub.decide.wave import RegionSide, RevisionFigures, analyze_regions, side_figures
from hub.decide.weighing import (
    MAX_REQUESTS_PER_REPLICA_S,
    Counts,
    newly_excluded,
    screen,
    weigh,
    without_each,
    worst_latency_without_each,
)

NOW, WINDOW = 1000.0, 10.0
BIG = 2**40


def samples(*points: tuple[float, int, int]) -> list[Sample]:
    return [Sample(at, r, e) for at, r, e in points]


# -- screen: a member's counters over the window, or why they cannot be ----------------------


@pytest.mark.parametrize(
    ("points", "per_second", "expected"),
    [
        ([], 100, (0, 0)),
        ([(995, 10, 1)], 100, (0, 0)),  # one sample: nothing measured between two
        ([(980, 0, 0), (990, 100, 5), (1000, 300, 11)], 100, (200, 6)),  # from the one at 990
        ([(990, 100, 5), (995, 20, 2), (1000, 120, 4)], 100, (120, 4)),  # a restart at 995
        ([(990, 0, 0), (1000, 1000, 0)], 100, (1000, 0)),  # 100 a second: the bound itself
        ([(990, 0, 0), (1000, 1001, 0)], 100, "1001 requests in 10 s, above the plausible 100"),
        ([(999.9, 0, 0), (1000, 150, 0)], 100, "150 requests in 1 s"),  # at least a second
        ([(990, 10, 11)], 100, "errors (11) above requests (10)"),
        ([(990, -1, 0)], 100, "negative counters"),
        ([(990, 10, 5), (1000, 10, 4)], 100, "errors went down from 5 to 4 while requests did"),
        ([(990, 0, 0), (1000, BIG, BIG)], MAX_REQUESTS_PER_REPLICA_S, "above the plausible"),
        ([(math.nan, 0, 0)], 100, "a sample at nan"),
    ],
)
def test_screen(
    points: list[tuple[float, int, int]], per_second: float, expected: tuple[int, int] | str
) -> None:
    got = screen(samples(*points), NOW, WINDOW, per_second)
    if isinstance(expected, str):
        assert isinstance(got, str) and expected in got, got
    else:
        assert got == expected


# -- weigh: a side's totals with bounded weights ---------------------------------------------


def c(name: str, requests: int, errors: int = 0, p95: float | None = None) -> Counts:
    return Counts(name, requests, errors, p95)


@pytest.mark.parametrize(
    ("members", "expected"),
    [
        ([], (0, 0)),
        ([c("a", 100, 10)], (100, 10)),  # alone: all its requests
        ([c("a", 100, 10), c("b", 100, 30)], (200, 40)),
        ([c("a", 100, 0), c("b", BIG, BIG)], (200, 100)),  # b weighs no more than a: 50%
        ([c("a", 100, 0), c("b", 40, 0), c("x", BIG, 0)], (240, 0)),  # x weighs like a
        ([c("a", 100, 10), c("idle", 0)], (100, 10)),  # an idle member bounds no one
        ([c("a", 3, 1), c("b", 2, 0)], (4, 1)),  # a at 2 requests: 2/3 errors, rounded
    ],
)
def test_weigh(members: list[Counts], expected: tuple[int, int]) -> None:
    assert weigh(members) == expected


@given(
    st.lists(
        st.tuples(st.integers(0, 2**53), st.integers(0, 100)).map(
            lambda t: (t[0], t[0] * t[1] // 100)
        ),
        max_size=8,
    )
)
@examples(300)
def test_without_each_is_weigh_of_the_others(pairs: list[tuple[int, int]]) -> None:
    members = [c(f"m{i}", r, e) for i, (r, e) in enumerate(pairs)]
    got = without_each(members)
    assert got == {m.name: weigh([o for o in members if o is not m]) for m in members}


def test_worst_latency_without_each() -> None:
    members = [c("a", 1, p95=0.3), c("b", 1, p95=0.1), c("c", 1), c("d", 1, p95=0.2)]
    assert worst_latency_without_each(members) == {"a": 0.2, "b": 0.3, "c": 0.3, "d": 0.3}
    assert worst_latency_without_each([c("a", 1, p95=0.3)]) == {"a": None}


def test_newly_excluded_names_each_once() -> None:
    assert newly_excluded({"b": "why b", "a": "why a"}, ()) == [("a", "why a"), ("b", "why b")]
    assert newly_excluded({"b": "why b", "a": "why a"}, {"a"}) == [("b", "why b")]
    assert newly_excluded({}, {"a"}) == []


# -- the attacks on the analysis, as tables ---------------------------------------------

SPEC = CanaryAnalysis(max_error_rate_increase=0.05, min_requests=20, window_s=WINDOW)


def device(name: str, requests: int, errors: int, *, replicas: int = 1, **kw: Any) -> Observed:
    """A device that answered ``requests`` (``errors`` of them failed) over the window."""
    rep = RevisionReport(
        "2.0.0",
        phase=RevisionPhase.READY,
        ready_replicas=replicas,
        requests=requests,
        errors=errors,
        **kw,
    )
    return Observed(name, rep, samples((NOW - WINDOW, 0, 0), (NOW, requests, errors)))


def decide(canary: list[Observed], stable: list[Observed], spec: CanaryAnalysis = SPEC) -> Analysis:
    return analyze(spec, figures(canary, NOW, WINDOW), figures(stable, NOW, WINDOW))


HONEST_STABLE = [device("s1", 100, 0), device("s2", 100, 0)]


@pytest.mark.parametrize(
    ("canary", "stable", "verdict", "says"),
    [
        # honest: the canary's 50% errors against the stable 0%
        ([device("c1", 100, 50)], HONEST_STABLE, Verdict.FAIL, "above maxErrorRateIncrease"),
        # a stable device reports requests = errors, 2^40 more: left out, the canary fails
        (
            [device("c1", 100, 50)],
            [*HONEST_STABLE, device("liar", BIG, BIG)],
            Verdict.FAIL,
            "above maxErrorRateIncrease",
        ),
        # the same within the plausible bound: it weighs like one device, and alone decides
        (
            [device("c1", 100, 50)],
            [*HONEST_STABLE, device("liar", 100_000, 100_000)],
            Verdict.WAIT,
            "error rate inconclusive: s1 alone decides it",
        ),
        # a canary device reports 2^40 requests, no errors: left out; the honest ones fail
        (
            [device("c1", 100, 50), device("c2", 100, 50), device("liar", BIG, 0)],
            [],
            Verdict.FAIL,
            "error rate 50.00% (100/200)",
        ),
        # ... within the bound: it weighs like one of them, and the canary still fails
        (
            [device("c1", 100, 50), device("c2", 100, 50), device("liar", 100_000, 0)],
            [],
            Verdict.FAIL,
            "error rate 33.33% (100/300)",
        ),
        # the canary's only device is the canary: it decides
        ([device("c1", 100, 0)], HONEST_STABLE, Verdict.PASS, "within maxErrorRateIncrease"),
        # two canary devices that disagree: inconclusive, naming one
        (
            [device("c1", 100, 0), device("c2", 100, 50)],
            HONEST_STABLE,
            Verdict.WAIT,
            "c2 alone decides it (Fail with it, Pass without)",
        ),
        # too few requests without any one device: wait
        (
            [device("c1", 15, 0), device("c2", 15, 0)],
            HONEST_STABLE,
            Verdict.WAIT,
            "alone decides it (Pass with it, Wait without)",
        ),
    ],
)
def test_one_device_decides_nothing(
    canary: list[Observed], stable: list[Observed], verdict: Verdict, says: str
) -> None:
    got = decide(canary, stable)
    assert got.verdict is verdict, got.message
    assert says in got.message, got.message


def test_a_liar_is_excluded_and_named() -> None:
    got = decide([device("c1", 100, 50)], [*HONEST_STABLE, device("liar", BIG, BIG)])
    assert set(got.stable.excluded) == {"liar"}
    assert "above the plausible 10000 per second" in got.stable.excluded["liar"]
    assert got.to_json()["stable"]["excluded"] == got.stable.excluded
    # a plausible bound grows with the replicas the device has ready
    fine = decide([device("c1", 100, 50)], [device("busy", 150_000, 0, replicas=2)])
    assert fine.stable.excluded == {} and fine.stable.requests == 150_000


def test_latency_passes_only_where_no_one_device_decides() -> None:
    spec = CanaryAnalysis(max_latency_p95_s=0.1, min_requests=20, window_s=WINDOW)
    fast = {"latency_p95_s": 0.05, "window_requests": 10}
    # the honest device has too few requests; a second one with many cannot make it pass
    got = decide([device("c1", 10, 0, **fast), device("liar", 10_000, 0, **fast)], [], spec)
    assert got.verdict is Verdict.WAIT, got.message
    assert "latency p95 inconclusive: liar alone decides it (Pass with it, Wait" in got.message
    # a device above the bound fails the canary by itself (a worst-device check)
    slow = {"latency_p95_s": 0.5, "window_requests": 10}
    got = decide([device("c1", 100, 0, **fast), device("c2", 100, 0, **slow)], [], spec)
    assert got.verdict is Verdict.FAIL


# -- the property ----------------------------------------------------------------------------


@st.composite
def honest_devices(draw: st.DrawFn, prefix: str, least: int) -> list[Observed]:
    out = []
    for i in range(draw(st.integers(least, 5))):
        requests = draw(st.integers(0, 2000))  # at most 200 a second: well within the bound
        errors = draw(st.integers(0, requests))
        before = draw(st.integers(0, 10**6))
        failed_before = draw(st.integers(0, before))
        p95 = draw(st.none() | st.floats(0.001, 1.0)) if requests else None
        rep = RevisionReport(
            "2.0.0",
            phase=RevisionPhase.READY,
            ready_replicas=1,
            requests=before + requests,
            errors=failed_before + errors,
            latency_p95_s=p95,
            window_requests=requests if p95 is not None else 0,
            accuracy=draw(st.none() | st.floats(0.0, 1.0)),
        )
        points = (NOW - WINDOW, before, failed_before), (NOW, before + requests,
                                                          failed_before + errors)  # fmt: skip
        out.append(Observed(f"{prefix}{i}", rep, samples(*points)))
    return out


ANY_COUNT = st.integers(-3, 2**53) | st.sampled_from([0, 1, 19, 20, BIG, 2**53])
ANY_FLOAT = st.none() | st.floats(allow_nan=True, allow_infinity=True)


@st.composite
def any_device(draw: st.DrawFn) -> Observed:
    """One device reporting anything: counters in any order and size, any latency, accuracy,
    replicas; its samples at the times the hub took them (in order, within three windows)."""
    times = sorted(draw(st.lists(st.floats(NOW - 3 * WINDOW, NOW), max_size=5)))
    points = [(t, draw(ANY_COUNT), draw(ANY_COUNT)) for t in times]
    rep = RevisionReport(
        "2.0.0",
        phase=RevisionPhase.READY,
        ready_replicas=draw(st.integers(0, 10_000)),
        latency_p95_s=draw(ANY_FLOAT),
        window_requests=draw(ANY_COUNT),
        accuracy=draw(ANY_FLOAT),
        validation_reason=draw(st.sampled_from(["", "", "NoValidationSet"])),
    )
    return Observed("x", rep, samples(*points))


SPECS = st.builds(
    CanaryAnalysis,
    min_accuracy=st.none() | st.floats(0.0, 1.0),
    max_error_rate_increase=st.floats(0.0, 0.5),
    max_latency_p95_s=st.none() | st.floats(0.001, 1.0),
    min_requests=st.integers(1, 100),
    window_s=st.just(WINDOW),
)


def verdict_of(analysis: Analysis, check: str) -> Verdict:
    return next(c.verdict for c in analysis.checks if c.name == check)


@given(
    SPECS,
    honest_devices("c", 1),
    honest_devices("s", 0),
    any_device(),
    st.booleans(),
)
@examples(2000)
def test_one_more_device_decides_as_without_it_or_waits(
    spec: CanaryAnalysis,
    canary: list[Observed],
    stable: list[Observed],
    extra: Observed,
    on_canary: bool,
) -> None:
    honest_c, honest_s = figures(canary, NOW, WINDOW), figures(stable, NOW, WINDOW)
    without = analyze(spec, honest_c, honest_s)
    if on_canary:
        with_it = analyze(spec, figures([*canary, extra], NOW, WINDOW), honest_s)
    else:
        with_it = analyze(spec, honest_c, figures([*stable, extra], NOW, WINDOW))
    side = with_it.canary if on_canary else with_it.stable
    if "x" in side.excluded:  # impossible figures: named, and as if it were not there
        assert with_it.verdict is without.verdict
        assert [c.verdict for c in with_it.checks] == [c.verdict for c in without.checks]
        return

    before, after = verdict_of(without, "errorRate"), verdict_of(with_it, "errorRate")
    if before is not Verdict.WAIT:
        assert after in (before, Verdict.WAIT), (with_it.message, without.message)

    if without.verdict is Verdict.PASS and with_it.verdict is Verdict.FAIL:
        # only by a worst-device check that the extra canary device fails itself
        assert on_canary, with_it.message
        assert {c.name for c in with_it.failed} <= {"accuracy", "latencyP95"}, with_it.message
    if without.verdict is Verdict.FAIL:
        assert with_it.verdict in (Verdict.FAIL, Verdict.WAIT), with_it.message
    if with_it.verdict is Verdict.PASS:  # a pass the honest devices' own figures make
        own = analyze(spec, replace(honest_c, members=()), replace(honest_s, members=()))
        assert own.verdict is Verdict.PASS, (with_it.message, own.message)


# -- the root over regions --------------------------------------------------------------------


def region(name: str, devices: int, requests: int, errors: int) -> RegionSide:
    figures = RevisionFigures(name, devices=devices, requests=requests, errors=errors)
    return RegionSide(name, figures, samples((NOW - WINDOW, 0, 0), (NOW, requests, errors)))


REGION_SPEC = CanaryAnalysis(max_error_rate_increase=0.05, min_requests=20, window_s=WINDOW)
STABLE_REGIONS = [region("us", 3, 300, 0), region("ap", 2, 200, 0)]


@pytest.mark.parametrize(
    ("canary", "stable", "verdict", "says", "excluded"),
    [
        ([region("eu", 2, 200, 100)], STABLE_REGIONS, Verdict.FAIL, "above", set()),
        # a region whose counters no device count could answer: left out, named
        (
            [region("eu", 2, 200, 100)],
            [*STABLE_REGIONS, region("sa", 1, BIG, BIG)],
            Verdict.FAIL,
            "above",
            {"sa"},
        ),
        # a stable region within its bound weighs like the heaviest other and decides nothing
        (
            [region("eu", 2, 200, 100)],
            [*STABLE_REGIONS, region("sa", 1, 900_000, 900_000)],
            Verdict.WAIT,
            "alone decides it",
            set(),
        ),
        # a canary region adding requests without errors does not pass the other's 50%: it
        # weighs like eu, and eu alone would decide it
        (
            [region("eu", 2, 200, 100), region("sa", 1, 900_000, 0)],
            STABLE_REGIONS,
            Verdict.WAIT,
            "eu alone decides it (Fail with it, Pass without)",
            set(),
        ),
        ([region("eu", 2, 200, 100), region("sa", 1, BIG, 0)], [], Verdict.FAIL, "", {"sa"}),
    ],
)
def test_no_one_region_decides_the_analysis_across_regions(
    canary: list[RegionSide],
    stable: list[RegionSide],
    verdict: Verdict,
    says: str,
    excluded: set[str],
) -> None:
    got = analyze_regions(REGION_SPEC, canary, stable, NOW)
    assert got.verdict is verdict, got.message
    assert says in got.message, got.message
    assert set(got.canary.excluded) | set(got.stable.excluded) == excluded


def test_region_bound_counts_its_devices() -> None:
    f = side_figures([region("eu", 2, 2_000_000, 0)], NOW, WINDOW)  # 100,000 a second each
    assert f.excluded == {} and f.requests == 2_000_000
    f = side_figures([region("eu", 1, 2_000_000, 0)], NOW, WINDOW)
    assert "above the plausible 100000 per second" in f.excluded["eu"]


@st.composite
def honest_regions(draw: st.DrawFn, prefix: str, least: int) -> list[RegionSide]:
    out = []
    for i in range(draw(st.integers(least, 4))):
        requests = draw(st.integers(0, 5000))
        out.append(
            region(
                f"{prefix}{i}", draw(st.integers(1, 5)), requests, draw(st.integers(0, requests))
            )
        )
    return out


@given(
    SPECS.map(lambda s: replace(s, min_accuracy=None, max_latency_p95_s=None)),
    honest_regions("c", 1),
    honest_regions("s", 0),
    st.tuples(st.integers(0, 1000), ANY_COUNT, ANY_COUNT, ANY_COUNT, ANY_COUNT),
    st.booleans(),
)
@examples(1000)
def test_one_more_region_decides_as_without_it_or_waits(
    spec: CanaryAnalysis,
    canary: list[RegionSide],
    stable: list[RegionSide],
    extra: tuple[int, int, int, int, int],
    on_canary: bool,
) -> None:
    devices, r0, e0, r1, e1 = extra
    x = RegionSide(
        "x",
        RevisionFigures("x", devices=devices, requests=r1, errors=e1),
        samples((NOW - WINDOW, r0, e0), (NOW, r1, e1)),
    )
    without = analyze_regions(spec, canary, stable, NOW)
    if on_canary:
        with_it = analyze_regions(spec, [*canary, x], stable, NOW)
    else:
        with_it = analyze_regions(spec, canary, [*stable, x], NOW)
    if without.verdict is not Verdict.WAIT:
        assert with_it.verdict in (without.verdict, Verdict.WAIT), with_it.message
