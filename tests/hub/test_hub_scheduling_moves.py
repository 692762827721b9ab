"""The scheduler's inputs for moves, latency and PriorityClasses, as tables
(``hub.decide.schedule``):
which evictions may drain, draining replicas' room, ``placement.maxLatencyP95`` against the
devices' self-benchmarks, ``never_preempt``. Pure: no hub, no store."""

from __future__ import annotations

import pytest
from schedulingtesting import NOW, dep, node

from edgefleet.api import TaintEffect
from hub.decide.devices import Device, DevicePhase, Taint
from hub.decide.placement import TAINT_NOT_READY, ZONE_LABEL, SecurityPolicy
from hub.decide.schedule import node_of, schedule

SHA = "ab" * 32
NOT_READY = Taint(TAINT_NOT_READY, TaintEffect.NO_SCHEDULE)


@pytest.mark.parametrize(
    ("change", "reason", "drain"),
    [
        ({"labels": {"site": "depot"}}, "not matching nodeSelector site=shop", True),
        (
            {"taints": (NOT_READY,), "last_heartbeat": NOW - 500},
            "not ready for longer than 60s",
            False,
        ),
    ],
)
def test_an_eviction_may_drain_only_where_the_device_still_runs_the_replica(
    change: dict[str, object], reason: str, drain: bool
) -> None:
    d = dep("x", 1, placement={"nodeSelector": {"site": "shop"}})
    labels = change.pop("labels", {"site": "shop"})
    nodes = [node("a", labels=labels, **change), node("b", labels={"site": "shop"})]
    result = schedule([d], nodes, {"x": ["a"]}, NOW)
    assert result.placements == {"x": ("b",)}
    (eviction,) = result.evictions
    assert (eviction.device, eviction.drain) == ("a", drain)
    assert eviction.reason == f"no longer fits: {reason}"


def test_a_draining_replica_keeps_its_room() -> None:
    big = dep("big", 1, resources={"cpu": "3"})
    other = dep("other", 1, resources={"cpu": "2"})
    nodes = [node("a"), node("b")]
    # big is placed on b and still drains on a: other does not fit on a (4 cpus)
    result = schedule([big, other], nodes, {"big": ["b"]}, NOW, draining={"big": ["a"]})
    assert result.placements == {"big": ("b",), "other": ()}
    assert "insufficient cpu" in result.explanations["other"].message()


LATENCY = {"placement": {"maxLatencyP95": "100ms"}}


@pytest.mark.parametrize(
    ("latencies", "expected", "message"),
    [
        pytest.param(
            {"a": 0.05, "b": 0.2, "c": 0.09},
            {"a", "c"},
            "2/3 replicas placed; 0/3 devices fit: 2 already running a replica, "
            "1 over maxLatencyP95 100ms (measured p95 up to 200.0ms)",
            id="over-the-bound-filtered-with-the-figure",
        ),
        pytest.param(
            {"a": 0.05},
            {"a", "b", "c"},
            "3/3 replicas placed; 2 on devices that have not measured the model's p95 yet "
            "(checked against maxLatencyP95 once they report it)",
            id="unmeasured-placed-and-said",
        ),
    ],
)
def test_max_latency_p95_keeps_a_model_off_devices_measured_over_it(
    latencies: dict[str, float], expected: set[str], message: str
) -> None:
    d = dep("x", 3, **LATENCY)
    nodes = [node(n, latencies={SHA: p} if (p := latencies.get(n)) else {}) for n in "abc"]
    result = schedule([d], nodes, {}, NOW, artifacts={"x": SHA})
    assert set(result.placements["x"]) == expected
    assert result.explanations["x"].message() == message


def test_a_placement_measured_over_the_bound_moves_with_its_figure_and_may_drain() -> None:
    d = dep("x", 1, **LATENCY)
    nodes = [node("a", latencies={SHA: 0.1834}), node("b")]
    result = schedule([d], nodes, {"x": ["a"]}, NOW, artifacts={"x": SHA})
    assert result.placements == {"x": ("b",)}
    (eviction,) = result.evictions
    assert eviction.reason == "no longer fits: measured p95 183.4ms over maxLatencyP95 100ms"
    assert eviction.drain
    # another model's figure, or none, does not count
    other = [node("a", latencies={"cd" * 32: 9.0}), node("b")]
    assert schedule([d], other, {"x": ["a"]}, NOW, artifacts={"x": SHA}).placements == {"x": ("a",)}


def test_node_of_reads_the_devices_self_benchmarks() -> None:
    device = Device("a", phase=DevicePhase.READY, latencies={SHA: 0.02})
    assert node_of(device, SecurityPolicy(), region="eu").latencies == {SHA: 0.02}


def test_never_preempt_places_in_priority_order_but_evicts_nothing() -> None:
    low = dep("low", 1, resources={"cpu": "3"})
    urgent = dep("urgent", 1, resources={"cpu": "3"}, priority=100)
    nodes = [node("a", labels={ZONE_LABEL: "z1"})]
    kept = schedule([low, urgent], nodes, {"low": ["a"]}, NOW, never_preempt={"urgent"})
    assert kept.placements == {"low": ("a",), "urgent": ()} and not kept.evictions
    taken = schedule([low, urgent], nodes, {"low": ["a"]}, NOW)
    assert taken.placements == {"low": (), "urgent": ("a",)}


def test_a_placed_device_gets_a_manifest_it_accepts_without_the_scheduler_only_fields() -> None:
    """A ``replicas.total`` deployment reaches its devices as ``perDevice: 1``; the placement
    fields only the scheduler acts on (which edged refuses with ``perDevice``) stay at the
    hub, so the device parses what it is sent (found end to end: it dropped the deployment
    as an invalid manifest)."""
    import orjson

    from edgefleet.api import parse_manifest
    from hub.decide.desired import SCHEDULER_ONLY_PLACEMENT, manifest_for
    from hub.decide.rollout import Revision, template_hash

    manifest = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": "lat"},
        "spec": {
            "model": {"name": "lat", "version": "1.0.0"},
            "replicas": {"total": 2},
            "placement": {
                "nodeSelector": {"site": "a"},
                "maxLatencyP95": "50ms",
                "strategy": "BinPack",
                "deploymentAntiAffinity": ["other"],
            },
        },
    }
    hub_side = parse_manifest(manifest).to_dict()
    revision = Revision("lat", 1, template_hash(hub_side), hub_side, 0.0)
    sent = orjson.loads(manifest_for(revision, {"site": "a"}))
    assert sent["spec"]["replicas"] == {"perDevice": 1}
    assert sent["spec"]["placement"] == {"nodeSelector": {"site": "a"}}
    assert not set(SCHEDULER_ONLY_PLACEMENT) & set(sent["spec"]["placement"])
    parse_manifest(sent)  # what edged does with it: no ValidationError
