"""The fleet's state as series (hub.decide.fleetmetrics), pure, as tables: replicas counted as
the device counts are, generations, state sets, the last analysis, and the caps on devices and
(region, deployment) pairs; and how /metrics serves them (hub.state.metrics: the deployments'
computed yielding to the event loop, again only when due)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asynctesting import async_test
from metricstesting import series_value

from edgefleet.api import ModelDeployment, parse_manifest
from hub.decide import fleetmetrics
from hub.decide.analysis import TimelineSample
from hub.decide.devices import (
    Attestation,
    Device,
    DevicePhase,
    RevisionPhase,
    RevisionReport,
    TrustState,
    WorkloadReport,
)
from hub.decide.fleetmetrics import (
    RegionView,
    deployment_series,
    device_series,
    generations,
    region_series,
    replica_counts,
)
from hub.decide.records import DesiredRecord
from hub.decide.revisions import Revision, RolloutPhase, RolloutState, template_hash
from hub.decide.status import deployment_status
from hub.state.cache import Cache
from hub.state.metrics import HubMetrics
from hub.state.sessions import Sessions


def manifest(version: str = "2.0.0", replicas: dict[str, int] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": "det"},
        "spec": {
            "model": {"name": "det", "version": version},
            "replicas": replicas or {"perDevice": 2},
            "rollout": {"canary": {"steps": ["50%", {"pause": {}}, "100%"]}},
        },
    }


def deployment(doc: dict[str, Any]) -> ModelDeployment:
    dep = parse_manifest(doc)
    assert isinstance(dep, ModelDeployment)
    return dep


def device(name: str, *revisions: RevisionReport, phase: DevicePhase = DevicePhase.READY) -> Device:
    report = WorkloadReport("2.0.0", desired_replicas=2, revisions=revisions)
    return Device(name=name, phase=phase, workloads={"det": report} if revisions else {})


def rev(version: str, phase: RevisionPhase, ready: int) -> RevisionReport:
    return RevisionReport(version, phase=phase, ready_replicas=ready, wanted=version == "2.0.0")


FLEET = [
    device("a", rev("2.0.0", RevisionPhase.READY, 2)),  # updated, ready
    device("b", rev("2.0.0", RevisionPhase.READY, 1)),  # updated, one replica short
    device("c", rev("2.0.0", RevisionPhase.LOADING, 0), rev("1.0.0", RevisionPhase.READY, 2)),
    device("d", rev("2.0.0", RevisionPhase.FAILED, 0), rev("1.0.0", RevisionPhase.READY, 1)),
    device("e", rev("2.0.0", RevisionPhase.READY, 2), phase=DevicePhase.NOT_READY),
    device("f"),  # placed, nothing reported yet
]


def test_replicas_are_counted_as_the_devices_are() -> None:
    dep = deployment(manifest())
    status = deployment_status(dep, FLEET, {d.name: ("det",) for d in FLEET})
    assert (status.desired, status.updated, status.ready, status.available) == (6, 3, 2, 3)
    counts = replica_counts(dep, FLEET)
    # desired: 2 on each of 6; updated: 2.0.0 serving (a 2, b 1, e 2); ready: every serving
    # revision (a 2, b 1, c 2, d 1, e 2); available: connected, what they are sent or, while
    # switching, what serves meanwhile (a 2, b 1, c 2); d's revision failed, e is NotReady
    assert counts == fleetmetrics.ReplicaCounts(12, 5, 8, 5)


def test_a_total_deployment_desires_its_total_or_what_the_autoscaler_made_it() -> None:
    dep = deployment(manifest(replicas={"total": 5}))
    assert replica_counts(dep, FLEET[:2]).desired == 5
    assert replica_counts(dep, FLEET[:2], total=7).desired == 7


def test_generations_follow_the_rollout_controller() -> None:
    doc = manifest()
    first = Revision("det", 1, template_hash(manifest("1.0.0")), manifest("1.0.0"), 1.0)
    second = Revision("det", 2, template_hash(doc), doc, 2.0)
    assert generations(doc, {}, None) == (1, 0)  # applied, not taken yet
    state = RolloutState("det", revision=1, stable=1)
    assert generations(doc, {1: first}, state) == (2, 1)  # a change the controller has not made
    state = RolloutState("det", revision=2, stable=1)
    assert generations(doc, {1: first, 2: second}, state) == (2, 2)


def test_a_rolled_back_deployment_and_its_last_analysis() -> None:
    doc = manifest()
    dep = deployment(doc)
    state = RolloutState(
        "det", revision=2, stable=1, phase=RolloutPhase.ROLLED_BACK, changed_at=1700.0, step=1,
        steps=3, reason="AnalysisFailed",
    )  # fmt: skip
    sample = TimelineSample(
        at=1699.0, revision=2, stable_revision=1, step=0, verdict="Fail",
        canary={"errorRate": 0.2, "latencyP95Seconds": None, "accuracy": 0.8, "requests": 40,
                "devices": 1},
        stable={"errorRate": 0.01, "requests": 400, "devices": 3},
        limits={"errorRate": 0.06, "accuracy": 0.9, "bogus": 1.0},
        verdicts={"errorRate": "Fail", "accuracy": "Fail"},
    )  # fmt: skip
    status = deployment_status(dep, FLEET, {d.name: ("det",) for d in FLEET})
    revisions = {2: Revision("det", 2, template_hash(doc), doc, 2.0)}
    got = deployment_series(dep, doc, status, replica_counts(dep, FLEET), state, revisions, sample)
    assert got["hub_deployment_rollout_phase"] == {
        ("det", p.value): float(p is RolloutPhase.ROLLED_BACK) for p in RolloutPhase
    }
    assert got["hub_deployment_devices_available"] == {("det",): 3.0}
    assert got["hub_deployment_rollout_reason"] == {("det", "AnalysisFailed"): 1.0}
    assert got["hub_deployment_rollout_stable_revision"] == {("det",): 1.0}
    assert got["hub_deployment_rollout_canary_step"] == {("det",): 2.0}  # from 1
    assert got["hub_deployment_rollout_canary_weight_percent"] == {("det",): 50.0}
    assert got["hub_deployment_rollout_changed_timestamp_seconds"] == {("det",): 1700.0}
    assert got["hub_deployment_analysis_verdict"] == {
        ("det", "Pass"): 0.0, ("det", "Wait"): 0.0, ("det", "Fail"): 1.0
    }  # fmt: skip
    figures = got["hub_deployment_analysis_figure"]
    assert figures[("det", "canary", "errorRate")] == 0.2
    assert ("det", "canary", "latencyP95Seconds") not in figures  # not measured: no series
    assert figures[("det", "stable", "requests")] == 400
    assert got["hub_deployment_analysis_limit"] == {
        ("det", "errorRate"): 0.06,
        ("det", "accuracy"): 0.9,
    }  # fmt: skip  (a figure no check holds is not exported)
    checks = got["hub_deployment_analysis_check"]
    assert checks[("det", "accuracy", "Fail")] == 1.0 and checks[("det", "accuracy", "Pass")] == 0
    assert ("det", "latencyP95Seconds", "Fail") not in checks


def test_before_any_rollout_every_phase_is_zero() -> None:
    doc = manifest()
    dep = deployment(doc)
    status = deployment_status(dep, [], {})
    got = deployment_series(dep, doc, status, replica_counts(dep, []), None, {}, None)
    assert set(got["hub_deployment_rollout_phase"].values()) == {0.0}
    assert "hub_deployment_analysis_verdict" not in got
    assert got["hub_deployment_generation"] == {("det",): 1.0}


def test_devices_past_the_cap_are_counted_not_exported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleetmetrics, "MAX_DEVICES", 2)
    devices = [
        Device(name="c", last_heartbeat=90.0),
        Device(
            name="a",
            phase=DevicePhase.READY,
            last_heartbeat=50.0,
            agent_version="0.9.1",
            attestation=Attestation(TrustState.TRUSTED),
        ),
        Device(name="b"),
    ]
    got, omitted = device_series(devices, 100.0, {"a": 95.0})
    assert omitted == 1
    assert got["hub_device_ready"] == {("a",): 1.0, ("b",): 0.0}
    assert got["hub_device_agent_info"] == {("a", "0.9.1"): 1.0, ("b", "unknown"): 1.0}
    assert got["hub_device_attestation"][("a", "Trusted")] == 1.0
    assert got["hub_device_attestation"][("b", "Unknown")] == 1.0
    # the hub's own last message of a is newer than the stored heartbeat; b was never heard
    assert got["hub_device_last_report_age_seconds"] == {("a",): 5.0}


def test_regions_and_their_deployments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleetmetrics, "MAX_REGION_DEPLOYMENTS", 3)
    figures = {"desiredDevices": 4, "updatedDevices": 4, "readyDevices": 3, "availableDevices": 4}
    regions = [
        RegionView("us", False),  # never reported
        RegionView(
            "eu",
            True,
            12.5,
            {"Ready": 3, "NotReady": 1, "Bogus": 9},
            {
                "det": {**figures, "rollout": {"phase": "RolledBack", "reason": "Aborted"}},
                "ocr": {**figures, "rollout": {"phase": "Paused", "reason": "any <thing>"}},
                "pos": {**figures, "rollout": {"phase": "Sideways"}},
                "zzz": figures,
            },
        ),
    ]
    got, omitted = region_series(regions)
    assert omitted == 1  # zzz: past the 3 pairs
    assert got["hub_region_connected"] == {("eu",): 1.0, ("us",): 0.0}
    assert got["hub_region_report_age_seconds"] == {("eu",): 12.5}
    assert got["hub_region_devices"] == {
        ("eu", "Pending"): 0.0, ("eu", "Ready"): 3.0, ("eu", "NotReady"): 1.0
    }  # fmt: skip
    assert got["hub_region_deployment_devices_ready"] == {
        ("eu", "det"): 3.0, ("eu", "ocr"): 3.0, ("eu", "pos"): 3.0
    }  # fmt: skip
    phases = got["hub_region_deployment_rollout_phase"]
    assert phases[("eu", "det", "RolledBack")] == 1.0 and phases[("eu", "ocr", "Paused")] == 1.0
    assert not any(k[1] == "pos" for k in phases)  # a phase this hub does not know
    assert got["hub_region_deployment_rollout_reason"] == {
        ("eu", "det", "Aborted"): 1.0, ("eu", "ocr", "Other"): 1.0  # not one word: Other
    }  # fmt: skip


def fleet_cache(deployments: int, devices: int) -> Cache:
    """A cache with ``deployments`` deployments, each on every one of ``devices`` devices that
    serve it (v1.0.0, one replica)."""
    cache = Cache()
    names = [f"dep-{i:03d}" for i in range(deployments)]
    for name in names:
        doc = {**manifest("1.0.0", {"perDevice": 1}), "metadata": {"name": name}}
        doc["spec"] = {**doc["spec"], "model": {"name": name, "version": "1.0.0"}}
        cache.put_object(doc, 1)
    serving = RevisionReport("1.0.0", phase=RevisionPhase.READY, ready_replicas=1, wanted=True)
    report = WorkloadReport("1.0.0", desired_replicas=1, revisions=(serving,))
    records = {}
    for i in range(devices):
        name = f"dev-{i:03d}"
        workloads = dict.fromkeys(names, report)
        cache.devices[name] = Device(name=name, phase=DevicePhase.READY, workloads=workloads)
        records[name] = DesiredRecord(1, tuple(names), "d")
    cache.put_desired(records)
    return cache


@async_test
async def test_served_metrics_yield_between_deployments_and_are_computed_again_when_due() -> None:
    cache = fleet_cache(deployments=20, devices=3)
    metrics = HubMetrics()
    metrics.watch(cache, Sessions())
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticking = asyncio.create_task(ticker())
    try:
        await asyncio.sleep(0)
        before = ticks
        served = await metrics.render_served()
        assert ticks - before >= 20  # the event loop ran between every two deployments
    finally:
        ticking.cancel()
    assert served == metrics.render()  # nothing changed: the same as a fresh read
    available = 'hub_deployment_devices_available{deployment="dep-000"}'
    assert series_value(served, available) == 3

    # a device goes away: the devices' series say so at once, the deployments' once due
    gone = cache.devices["dev-000"]
    cache.devices["dev-000"] = Device(
        name="dev-000", phase=DevicePhase.NOT_READY, workloads=gone.workloads
    )
    again = await metrics.render_served()
    assert series_value(again, 'hub_device_ready{device="dev-000"}') == 0
    assert series_value(again, available) == 3  # computed less than 10 s ago
    metrics.min_interval_s = metrics.cost_factor = 0  # due at once
    assert series_value(await metrics.render_served(), available) == 2
