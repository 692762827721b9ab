"""The canary analysis over time: which samples are kept (pure, a table), and the ring in the
store: written by the rollout controller during a canary over a real SQLite store, bounded
(the oldest deleted in the same transaction as the newest written), loaded again by a hub
started on the same store, and forgotten with the deployment."""

from __future__ import annotations

from pathlib import Path

import pytest
from asynctesting import async_test
from canarytesting import DEVICES, deployment, push, report, step
from hubserving import AdminHub, make_hub_dir

from edgefleet.api import CanaryAnalysis
from edgefleet.v1 import admin_pb2
from hub.api.dashboard import rolloutpages
from hub.decide.analysis import (
    Analysis,
    Check,
    Figures,
    TimelineSample,
    Verdict,
    timeline_due,
    timeline_period,
    timeline_sample,
)
from hub.state import storekeys


def sample(at: float, revision: int = 2, verdict: str = "Wait", **verdicts: str) -> TimelineSample:
    return TimelineSample(at, revision, 1, 0, verdict, {}, {}, {}, verdicts)


@pytest.mark.parametrize(
    ("last", "new", "due"),
    [
        (None, sample(10), True),  # the first
        (sample(10), sample(10.5), False),  # within the period
        (sample(10), sample(12), True),  # a period later
        (sample(10), sample(10.5, revision=3), True),  # another revision
        (sample(10), sample(10.5, verdict="Fail"), True),  # a failure is always kept
        (sample(10, errorRate="Wait"), sample(10.5, errorRate="Pass"), True),  # a check moved
    ],
)
def test_which_samples_are_kept(
    last: TimelineSample | None, new: TimelineSample, due: bool
) -> None:
    assert timeline_due(last, new, period=2.0) is due


def test_the_period_is_a_tenth_of_the_window_within_bounds() -> None:
    assert [timeline_period(w) for w in (0.001, 60, 3600)] == [1.0, 6.0, 30.0]


def test_a_sample_holds_both_sides_and_the_limit_the_canary_is_held_to() -> None:
    spec = CanaryAnalysis(
        min_accuracy=0.9, max_error_rate_increase=0.05, max_latency_p95_s=0.2, min_requests=10
    )
    canary = Figures(1, 40, 4, 0.15, 0.95, 1)
    checks = (Check("errorRate", Verdict.FAIL, 0.08, 0.05, "..."),)
    for stable, base in ((Figures(2, 100, 2, 0.1, 0.97, 2), 0.02), (Figures(2, 5, 1), 0.0)):
        analysis = Analysis(Verdict.FAIL, checks, canary, stable, 60.0)
        got = timeline_sample(spec, analysis, at=5.0, revision=3, stable_revision=2, step=1)
        assert got.limits == pytest.approx(
            {"accuracy": 0.9, "latencyP95Seconds": 0.2, "errorRate": base + 0.05}
        )  # the stable rate counts once it has minRequests, as in the check
        assert got.canary["errorRate"] == 0.1 and got.stable["requests"] == stable.requests
        assert got.verdicts == {"errorRate": "Fail"} and got.verdict == "Fail"
        assert TimelineSample.from_json(got.to_json()) == got


@async_test
async def test_the_analysis_is_kept_in_the_store_bounded_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        for name in DEVICES:
            await report(hub, name, "1.0.0")
        await push(hub, "1.0.0")
        await push(hub, "2.0.0")
        await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment("1.0.0")]))
        for name in DEVICES:
            hub.ctx.cache.desired[name] = storekeys.DesiredRecord(7, ("det",), "d")
        await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment("2.0.0")]))
        await step(hub)
        await report(hub, "dev-0", "2.0.0")  # serving, no accuracy yet: Wait
        await step(hub)
        await report(hub, "dev-0", "2.0.0", accuracy=0.95)  # Pass
        await step(hub)
        ring = hub.ctx.cache.analysis["det"]
        kept = list(ring.values())
        assert {s.revision for s in kept} == {2}
        assert [s.verdict for s in kept][:1] == ["Wait"] and "Pass" in [s.verdict for s in kept]
        assert kept[-1].canary["accuracy"] == 0.95 and kept[-1].limits == {"accuracy": 0.9}
        stored = (await hub.ctx.store.range(storekeys.analysis_prefix("det"))).kvs
        assert [kv.key for kv in stored] == [storekeys.analysis_key("det", n) for n in ring]

        # bounded: a ring of timeline_samples, the oldest deleted as the newest is written
        rollouts = hub.ctx.rollouts
        assert rollouts is not None
        rollouts.timeline_samples = 5
        first = kept[-1].at
        for i in range(1, 9):
            await rollouts.keep_sample("det", sample(first + 100 * i), period=1.0)
        ring = hub.ctx.cache.analysis["det"]
        assert len(ring) == 5 and list(ring) == sorted(ring)
        stored = (await hub.ctx.store.range(storekeys.analysis_prefix("det"))).kvs
        assert [kv.key for kv in stored] == [storekeys.analysis_key("det", n) for n in ring]
        before = list(ring.values())

    # a hub started again on the same store shows the same figures over time
    async with AdminHub(paths) as hub:
        assert list(hub.ctx.cache.analysis["det"].values()) == before
        html = rolloutpages.canary_fragment("det", before, "Paused", "")
        assert "5 samples" in html and "kept by the hub across restarts" in html

        # and forgets them with the deployment
        async with hub.channel() as channel:
            await hub.stub(channel).Delete(
                admin_pb2.DeleteRequest(kind="ModelDeployment", name="det")
            )
        assert hub.ctx.rollouts is not None
        await hub.ctx.rollouts.reconcile(["det"])
        assert "det" not in hub.ctx.cache.analysis
        assert not (await hub.ctx.store.range(storekeys.ANALYSIS)).kvs


def test_the_comparison_page_plots_both_sides_with_the_limit_dashed() -> None:
    samples = [
        TimelineSample(
            100.0 + i,
            2,
            1,
            0,
            "Wait" if i < 2 else "Fail",
            {"errorRate": 0.1 * i, "latencyP95Seconds": 0.01, "accuracy": 0.95},
            {"errorRate": 0.01, "latencyP95Seconds": 0.008, "accuracy": None},
            {"errorRate": 0.06, "latencyP95Seconds": 0.5, "accuracy": 0.9},
            {"errorRate": "Fail" if i >= 2 else "Wait", "accuracy": "Pass"},
        )
        for i in range(4)
    ]
    html = rolloutpages.canary_fragment("det", samples, "RolledBack", "failed <b>")
    for figure, threshold in (
        ("errorRate", "6"),
        ("latencyP95Seconds", "500"),
        ("accuracy", "0.9"),
    ):
        assert f'data-figure={figure} data-threshold="{threshold}"' in html
    assert html.count("data-series=canary data-points=4") == 3
    assert html.count("data-series=threshold data-points=4") == 3
    assert html.count("data-series=stable data-points=4") == 2  # no stable accuracy measured
    assert "failed &lt;b&gt;" in html and "<b>" not in html.split("failed")[1][:10]
    assert "no canary analysis kept" in rolloutpages.canary_fragment("det", [], "—", "")
