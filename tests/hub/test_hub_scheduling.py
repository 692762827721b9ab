"""The scheduler as tables and properties: pure, no hub, no store (``hub.decide.schedule``)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from propertytesting import examples
from schedulingtesting import NOW, ZONES, GiB, dep, fleets, node

from edgefleet.api import ModelDeployment, TaintEffect
from hub.decide.devices import Device, DevicePhase, Health, RevisionReport, Taint, WorkloadReport
from hub.decide.placement import (
    REGION_LABEL,
    TAINT_NOT_READY,
    TAINT_UNHEALTHY,
    TAINT_UNSCHEDULABLE,
    ZONE_LABEL,
    SecurityPolicy,
)
from hub.decide.schedule import (
    Node,
    accelerator_slots,
    node_of,
    schedule,
)


def placed(deployments: list[ModelDeployment], nodes: list[Node], **kw: Any) -> dict[str, set[str]]:
    result = schedule(deployments, nodes, kw.pop("current", {}), NOW, **kw)
    return {k: set(v) for k, v in result.placements.items()}


NODES = [
    node("a", labels={ZONE_LABEL: "z1", "site": "retail", "accelerator.gpu": "1"}),
    node("b", labels={ZONE_LABEL: "z1", "site": "factory", "accelerator.npu": "1"}),
    node("c", labels={ZONE_LABEL: "z2", "site": "retail", REGION_LABEL: "us-east"}),
    node("d", labels={ZONE_LABEL: "z2", "site": "retail"}),
]


# -- filters ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("deployment", "expected", "reason"),
    [
        pytest.param(dep("x", 4), {"a", "b", "c", "d"}, None, id="no-constraint"),
        pytest.param(
            dep("x", 4, placement={"nodeSelector": {"site": "retail"}}),
            {"a", "c", "d"},
            "1 not matching nodeSelector site=retail",
            id="node-selector",
        ),
        pytest.param(
            dep(
                "x",
                4,
                placement={
                    "matchExpressions": [{"key": "site", "operator": "In", "values": ["factory"]}]
                },
            ),
            {"b"},
            "3 not matching site In (factory)",
            id="in",
        ),
        pytest.param(
            dep(
                "x",
                4,
                placement={
                    "matchExpressions": [{"key": "site", "operator": "NotIn", "values": ["retail"]}]
                },
            ),
            {"b"},
            "3 not matching site NotIn (retail)",
            id="not-in",
        ),
        pytest.param(
            dep(
                "x",
                4,
                placement={"matchExpressions": [{"key": "accelerator.gpu", "operator": "Exists"}]},
            ),
            {"a"},
            "3 not matching accelerator.gpu Exists",
            id="exists",
        ),
        pytest.param(
            dep(
                "x",
                4,
                placement={
                    "matchExpressions": [{"key": "accelerator.gpu", "operator": "DoesNotExist"}]
                },
            ),
            {"b", "c", "d"},
            "1 not matching accelerator.gpu DoesNotExist",
            id="does-not-exist",
        ),
        pytest.param(
            dep("x", 4, placement={"regions": ["eu-central"]}),
            {"a", "b", "d"},
            "1 outside region eu-central",
            id="region",
        ),
        pytest.param(
            dep("x", 4, placement={"zones": ["z2"]}),
            {"c", "d"},
            "2 outside zone z2",
            id="zone",
        ),
        pytest.param(
            dep("x", 4, resources={"accelerator": "npu"}),
            {"b"},
            "3 lack accelerator npu",
            id="accelerator",
        ),
        pytest.param(
            dep("x", 4, resources={"accelerator": {"anyOf": ["gpu", "npu"]}}),
            {"a", "b"},
            "2 lack accelerator gpu|npu",
            id="accelerator-any-of",
        ),
        pytest.param(
            dep("x", 4, resources={"cpu": "3"}),
            {"a", "b", "c", "d"},
            None,
            id="cpu-fits",
        ),
        pytest.param(
            dep("x", 4, resources={"cpu": "5"}),
            set(),
            "4 insufficient cpu",
            id="cpu-too-much",
        ),
        pytest.param(
            dep("x", 4, resources={"memory": "5Gi"}),
            set(),
            "4 insufficient memory",
            id="memory-too-much",
        ),
    ],
)
def test_filter(deployment: ModelDeployment, expected: set[str], reason: str | None) -> None:
    result = schedule([deployment], NODES, {}, NOW)
    assert set(result.placements["x"]) == expected
    explanation = result.explanations["x"]
    if reason is None:
        assert explanation.complete
    else:
        assert not explanation.complete
        assert reason in explanation.message()
        assert explanation.message().startswith(f"{len(expected)}/4 replicas placed; ")


def test_explanation_counts_every_device_once_under_its_first_failing_filter() -> None:
    nodes = [node(f"n{i}", labels={"accelerator.gpu": "1"} if i < 2 else {}) for i in range(10)]
    nodes += [node(f"o{i}", labels={REGION_LABEL: "us"}) for i in range(3)]
    nodes += [node("sick", taints=(Taint(TAINT_UNHEALTHY, TaintEffect.NO_EXECUTE),))]
    d = dep("x", 2, resources={"accelerator": "npu"}, placement={"regions": ["eu-central"]})
    message = schedule([d], nodes, {}, NOW).explanations["x"].message()
    assert message == (
        "0/2 replicas placed; 0/14 devices fit: 10 lack accelerator npu, "
        "3 outside region eu-central, 1 not tolerating taint unhealthy"
    )


@pytest.mark.parametrize(
    ("taint", "toleration", "expected"),
    [
        pytest.param(Taint(TAINT_UNSCHEDULABLE, TaintEffect.NO_SCHEDULE), None, set(), id="cordon"),
        pytest.param(
            Taint(TAINT_UNSCHEDULABLE, TaintEffect.NO_SCHEDULE),
            {"key": TAINT_UNSCHEDULABLE, "operator": "Exists"},
            {"t"},
            id="cordon-tolerated",
        ),
        pytest.param(Taint(TAINT_UNHEALTHY, TaintEffect.NO_EXECUTE), None, set(), id="unhealthy"),
        pytest.param(Taint("battery", TaintEffect.NO_SCHEDULE, "low"), None, set(), id="custom"),
        pytest.param(
            Taint("battery", TaintEffect.NO_SCHEDULE, "low"),
            {"key": "battery", "value": "low"},
            {"t"},
            id="custom-tolerated",
        ),
    ],
)
def test_taints_and_tolerations(
    taint: Taint, toleration: dict[str, str] | None, expected: set[str]
) -> None:
    placement = {"tolerations": [toleration]} if toleration else {}
    assert placed([dep("x", placement=placement)], [node("t", taints=(taint,))])["x"] == expected


def test_cordon_and_short_not_ready_keep_placements_noexecute_and_long_not_ready_move_them() -> (
    None
):
    cordon = Taint(TAINT_UNSCHEDULABLE, TaintEffect.NO_SCHEDULE)
    not_ready = Taint(TAINT_NOT_READY, TaintEffect.NO_SCHEDULE)
    sick = Taint(TAINT_UNHEALTHY, TaintEffect.NO_EXECUTE)
    nodes = [
        node("cordoned", taints=(cordon,)),
        node("away-briefly", taints=(not_ready,), last_heartbeat=NOW - 10),
        node("away-long", taints=(not_ready,), last_heartbeat=NOW - 100),
        node("sick", taints=(sick,)),
        node("spare1"),
        node("spare2"),
    ]
    current = {"x": ["cordoned", "away-briefly", "away-long", "sick"]}
    result = schedule([dep("x", 4)], nodes, current, NOW, not_ready_grace_s=60)
    assert set(result.placements["x"]) == {"cordoned", "away-briefly", "spare1", "spare2"}
    reasons = {e.device: e.reason for e in result.evictions}
    assert reasons == {
        "away-long": "no longer fits: not ready for longer than 60s",
        "sick": "no longer fits: not tolerating taint unhealthy",
    }


def test_lost_accelerator_moves_the_placement_to_a_device_with_an_acceptable_class() -> None:
    any_of = dep("x", 1, resources={"accelerator": {"anyOf": ["gpu", "npu"]}})
    before = [
        node("gpu-box", labels={"accelerator.gpu": "1"}),
        node("npu-box", labels={"accelerator.npu": "1"}),
    ]
    assert placed([any_of], before)["x"] == {"gpu-box"}  # the first class is preferred
    after = [node("gpu-box"), before[1]]
    result = schedule([any_of], after, {"x": ["gpu-box"]}, NOW)
    assert result.placements["x"] == ("npu-box",)
    assert [e.reason for e in result.evictions] == ["no longer fits: lack accelerator gpu|npu"]


def test_device_affinity_and_anti_affinity() -> None:
    nodes = [node("a"), node("b"), node("c")]
    pinned = {"camera": ["a", "b"]}
    camera = dep("camera", None, replicas={"perDevice": 1})
    near = dep("near", 3, placement={"deploymentAffinity": ["camera"]})
    away = dep("away", 3, placement={"deploymentAntiAffinity": ["camera"]})
    result = placed([camera, near, away], nodes, pinned=pinned)
    assert result["near"] == {"a", "b"}
    assert result["away"] == {"c"}


def test_anti_affinity_is_symmetric() -> None:
    nodes = [node("a"), node("b")]
    first = dep("first", 1, priority=10)
    second = dep("second", 2, placement={"deploymentAntiAffinity": ["first"]})
    result = placed([first, second], nodes, current={"first": ["a"]})
    assert result == {"first": {"a"}, "second": {"b"}}
    # and the other way: "first" new, "second" already on a
    result = placed([first, second], nodes, current={"second": ["a"]})
    assert result["first"] == {"b"}


# -- capacity ----------------------------------------------------------------------------------


def test_capacity_counts_what_is_placed_and_pinned() -> None:
    nodes = [node("a", cpu=2000), node("b", cpu=2000)]
    big = dep("big", 2, resources={"cpu": "1500m"})
    small = dep("small", 2, resources={"cpu": "600m"})
    daemon = dep("daemon", None, replicas={"perDevice": 1}, resources={"cpu": "500m"})
    result = schedule([big, small, daemon], nodes, {}, NOW, pinned={"daemon": ["a"]})
    assert result.placements["big"] == ("a", "b")  # a has 1500m left after the daemon
    assert result.placements["small"] == ()
    assert result.explanations["small"].message() == (
        "0/2 replicas placed; 0/2 devices fit: 2 insufficient cpu"
    )


def test_accelerator_slots_are_counted() -> None:
    nodes = [node("a", labels={"accelerator.gpu": "2"}), node("b", labels={"accelerator.gpu": "1"})]
    deps = [dep(f"m{i}", 1, resources={"accelerator": "gpu"}) for i in range(4)]
    result = schedule(deps, nodes, {}, NOW)
    counts: dict[str, int] = {}
    for devices in result.placements.values():
        for d in devices:
            counts[d] = counts.get(d, 0) + 1
    assert counts == {"a": 2, "b": 1}
    assert "without a free gpu slot" in result.explanations["m3"].message()


def test_operator_label_overrides_slot_count_and_vendor_names_the_first_accelerator() -> None:
    assert accelerator_slots({"accelerator.gpu": "4"}) == {"gpu": 4}
    labels = {
        "accelerator": "npu",
        "accelerator.npu": "1",
        "accelerator.vendor": "hailo",
        "accelerator.kind": "hailo-8",
    }
    assert accelerator_slots(labels) == {"npu": 1, "hailo": 1, "hailo-8": 1}


# -- scores ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [("Spread", {"empty"}), ("BinPack", {"busy"})],
)
def test_spread_and_bin_pack(strategy: str, expected: set[str]) -> None:
    nodes = [node("busy", cpu=4000), node("empty", cpu=4000)]
    filler = dep("filler", 1, resources={"cpu": "2"})
    x = dep("x", 1, resources={"cpu": "1"}, placement={"strategy": strategy})
    result = placed([filler, x], nodes, current={"filler": ["busy"]})
    assert result["x"] == expected


def test_devices_holding_the_artifact_are_preferred() -> None:
    nodes = [node("a"), node("b", artifacts=frozenset({"f" * 64}))]
    assert placed([dep("x")], nodes, artifacts={"x": "f" * 64})["x"] == {"b"}
    assert placed([dep("x")], nodes)["x"] == {"a"}


def test_current_placements_are_kept_even_where_another_device_scores_better() -> None:
    nodes = [node("small", cpu=1000), node("large", cpu=64000)]
    x = dep("x", resources={"cpu": "500m"})
    assert placed([x], nodes)["x"] == {"large"}
    assert placed([x], nodes, current={"x": ["small"]})["x"] == {"small"}


def test_scale_down_removes_the_lowest_scored() -> None:
    nodes = [node("small", cpu=1000), node("large", cpu=64000), node("mid", cpu=8000)]
    x = dep("x", 2, resources={"cpu": "500m"})
    result = schedule([x], nodes, {"x": ["small", "large", "mid"]}, NOW)
    assert set(result.placements["x"]) == {"large", "mid"}
    assert [(e.device, e.reason) for e in result.evictions] == [("small", "scaled down")]


# -- topology spread ---------------------------------------------------------------------------


def zones(counts: Mapping[str, int]) -> list[Node]:
    return [
        node(f"{z}-{i}", labels={ZONE_LABEL: z})
        for z, n in sorted(counts.items())
        for i in range(n)
    ]


def per_zone(devices: set[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in devices:
        out[d.split("-")[0]] = out.get(d.split("-")[0], 0) + 1
    return out


def test_topology_spread_balances_domains() -> None:
    nodes = zones({"z1": 5, "z2": 5, "z3": 5})
    x = dep("x", 6, placement={"topologySpread": {"key": ZONE_LABEL}})
    assert per_zone(placed([x], nodes)["x"]) == {"z1": 2, "z2": 2, "z3": 2}


def test_max_skew_is_hard_when_a_domain_runs_out() -> None:
    nodes = zones({"z1": 1, "z2": 5})
    x = dep("x", 5, placement={"topologySpread": {"key": ZONE_LABEL, "maxSkew": 1}})
    result = schedule([x], nodes, {}, NOW)
    assert per_zone(set(result.placements["x"])) == {"z1": 1, "z2": 2}
    assert "topologySpread maxSkew 1" in result.explanations["x"].message()
    soft = dep("x", 5, placement={"topologySpread": {"key": ZONE_LABEL}})
    assert per_zone(placed([soft], nodes)["x"]) == {"z1": 1, "z2": 4}


def test_min_per_domain_unmet_is_explained() -> None:
    nodes = zones({"z1": 1, "z2": 5})
    x = dep("x", 4, placement={"topologySpread": {"key": ZONE_LABEL, "minPerDomain": 2}})
    result = schedule([x], nodes, {}, NOW)
    assert result.explanations["x"].complete  # 4 placed: 1 + 3; z1 has only one device
    assert result.explanations["x"].message() == (
        "4/4 replicas placed; topologySpread minPerDomain 2 not met in z1"
    )


# -- priorities and preemption -----------------------------------------------------------------


def test_priority_orders_placement() -> None:
    nodes = [node("a", cpu=1000)]
    low = dep("a-low", 1, resources={"cpu": "1"}, priorityClassName="low")
    high = dep("z-high", 1, resources={"cpu": "1"}, priority=5)
    assert placed([low, high], nodes) == {"a-low": set(), "z-high": {"a"}}


def test_preemption_evicts_the_fewest_least_important() -> None:
    nodes = [node("a", cpu=3000), node("b", cpu=3000)]
    small = [dep(f"s{i}", 1, resources={"cpu": "1"}, priority=i) for i in range(3)]
    big = dep("big", 1, resources={"cpu": "2"}, priority=1)
    current = {"s0": ["a"], "s1": ["a"], "s2": ["a"]}
    filler = dep("filler", 1, resources={"cpu": "2"}, priority=0)
    current["filler"] = ["b"]
    result = schedule([*small, big, filler], nodes, current, NOW)
    # one eviction on b (filler, priority 0) beats two on a
    assert result.placements["big"] == ("b",)
    evicted = [(e.deployment, e.device, e.by) for e in result.evictions]
    assert evicted == [("filler", "b", "big")]
    assert result.evictions[0].reason == "preempted by big (priority 1)"
    # the evicted one is placed again where it fits, if it can: nowhere here
    assert result.placements["filler"] == ()


def test_room_freed_by_a_preemption_is_used_in_the_same_pass() -> None:
    """Found by the stability property: ``first`` cannot go where ``low`` runs (anti-affinity
    and no room), ``second`` preempts ``low`` there; the room that frees must be offered to
    ``first`` in the same pass, or the next pass would move it (not a fixed point)."""
    taint = (Taint(TAINT_UNSCHEDULABLE, TaintEffect.NO_SCHEDULE),)
    nodes = [node("a", taints=taint), node("b", cpu=1000, mem=GiB)]
    small = {"cpu": "250m", "memory": "256Mi"}
    first = dep("first", 1, priority=1, resources=small)
    second = dep("second", 1, priority=1, resources=small)
    low = dep(
        "low",
        2,
        resources={"memory": "1Gi"},
        placement={"deploymentAntiAffinity": ["first"]},
    )
    current = {"low": ["a", "b"]}
    result = schedule([first, second, low], nodes, current, NOW)
    assert result.placements == {"first": ("b",), "second": ("b",), "low": ("a",)}
    again = schedule([first, second, low], nodes, result.placements, NOW)
    assert again.placements == result.placements and again.evictions == ()


def test_a_preemption_that_lifts_an_anti_affinity_is_acted_on_in_the_same_pass() -> None:
    """The second case the stability property found: ``top`` is kept off ``b`` by ``low``'s
    anti-affinity (not by room, so it preempts nothing); ``big`` preempts ``low`` there; then
    ``top`` must preempt ``big`` in this pass, and ``big``'s passing placement is no eviction."""
    taint = (Taint(TAINT_UNSCHEDULABLE, TaintEffect.NO_SCHEDULE),)
    small = {"cpu": "250m", "memory": "256Mi"}
    top = dep("top", 1, priority=2, resources=small)
    big = dep("big", 1, priority=1, resources={"cpu": "250m", "memory": "1Gi"})
    low = dep("low", 2, resources=small, placement={"deploymentAntiAffinity": ["top"]})
    nodes = [node("a", cpu=1000, mem=GiB, taints=taint), node("b", cpu=1000, mem=GiB)]
    result = schedule([top, big, low], nodes, {"low": ["a", "b"]}, NOW)
    assert result.placements == {"top": ("b",), "big": (), "low": ("a",)}
    assert [(e.deployment, e.device, e.by) for e in result.evictions] == [("low", "b", "big")]
    again = schedule([top, big, low], nodes, result.placements, NOW)
    assert again.placements == result.placements and again.evictions == ()


def test_no_preemption_of_equal_or_higher_priority() -> None:
    nodes = [node("a", cpu=1000)]
    a = dep("a", 1, resources={"cpu": "1"}, priority=5)
    b = dep("b", 1, resources={"cpu": "1"}, priority=5)
    result = schedule([a, b], nodes, {"b": ["a"]}, NOW)
    assert result.placements == {"a": (), "b": ("a",)}
    assert result.evictions == ()


# -- node_of -----------------------------------------------------------------------------------


def test_node_of_reads_capacity_labels_taints_and_artifacts() -> None:
    device = Device(
        "d1",
        labels={"site": "x"},
        reported_labels={"accelerator": "gpu", "accelerator.gpu": "1"},
        phase=DevicePhase.READY,
        last_heartbeat=5.0,
        health=Health(False, ("hot",)),
        facts={"facts": {"cpuCount": 4, "memoryTotalBytes": 8 * GiB}},
        workloads={"m": WorkloadReport("1", revisions=(RevisionReport("1", "a" * 64),))},
    )
    n = node_of(device, SecurityPolicy(), region="eu")
    assert (n.cpu_millis, n.memory_bytes) == (4000, 8 * GiB)
    assert n.labels[REGION_LABEL] == "eu"
    assert n.accelerators == {"gpu": 1}
    assert n.artifacts == {"a" * 64}
    assert [t.key for t in n.taints] == [TAINT_UNHEALTHY]
    assert node_of(device.with_(facts={}), SecurityPolicy(), region="").cpu_millis == 0


# -- properties --------------------------------------------------------------------------------


def usage(
    deps: list[ModelDeployment], placements: Mapping[str, tuple[str, ...]]
) -> dict[str, list[int]]:
    by_name = {d.metadata.name: d for d in deps}
    out: dict[str, list[int]] = {}
    for name, devices in placements.items():
        res = by_name[name].spec.resources
        for d in devices:
            u = out.setdefault(d, [0, 0, 0])
            u[0] += res.cpu_millis or 0
            u[1] += res.memory_bytes or 0
            u[2] += int(bool(res.accelerators))
    return out


@examples(300)
@given(fleets())
def test_property_no_device_over_capacity_and_hard_constraints_hold(
    fleet: tuple[list[ModelDeployment], list[Node], dict[str, list[str]]],
) -> None:
    deps, nodes, current = fleet
    result = schedule(deps, nodes, current, NOW)
    by_node = {x.name: x for x in nodes}
    for name, (cpu, mem, acc) in usage(deps, result.placements).items():
        x = by_node[name]
        assert cpu <= x.cpu_millis and mem <= x.memory_bytes
        assert acc <= x.accelerators.get("gpu", 0)
    for d in deps:
        devices = result.placements[d.metadata.name]
        assert len(devices) == len(set(devices)) <= (d.spec.replicas.total or 0)
        kept = set(current.get(d.metadata.name, ()))
        for name in devices:
            labels = by_node[name].labels
            assert all(labels.get(k) == v for k, v in d.spec.placement.node_selector.items())
            if d.spec.resources.accelerators:
                assert by_node[name].accelerators.get("gpu", 0) > 0
            if by_node[name].taints:  # cordoned: only what was already there stays
                assert name in kept
            if d.spec.placement.zones:
                assert labels[ZONE_LABEL] in d.spec.placement.zones
            if d.spec.placement.deployment_anti_affinity and name not in kept:
                assert name not in result.placements["d0"]


@examples(200)
@given(fleets())
def test_property_stability_the_same_input_twice_moves_nothing(
    fleet: tuple[list[ModelDeployment], list[Node], dict[str, list[str]]],
) -> None:
    deps, nodes, current = fleet
    first = schedule(deps, nodes, current, NOW)
    second = schedule(deps, nodes, first.placements, NOW)
    assert second.placements == first.placements
    assert second.evictions == ()


@examples(150)
@given(fleets())
def test_property_spread_is_honoured_when_it_can_be(
    fleet: tuple[list[ModelDeployment], list[Node], dict[str, list[str]]],
) -> None:
    """From scratch on roomy devices, a spread deployment's domains differ by at most one
    replica, unless a domain has no device left for it."""
    deps, nodes, _ = fleet
    roomy = [
        Node(x.name, x.labels, cpu_millis=10**6, memory_bytes=10**12, last_heartbeat=NOW)
        for x in nodes
    ]
    for d in deps:
        if d.spec.placement.topology_spread is None:
            continue
        alone = dep(d.metadata.name, d.spec.replicas.total, placement=d.spec.placement.to_dict())
        result = schedule([alone], roomy, {}, NOW)
        eligible: dict[str, int] = {}
        for x in roomy:
            zones_ok = x.labels[ZONE_LABEL] in (alone.spec.placement.zones or ZONES)
            selected = all(
                x.labels.get(k) == v for k, v in alone.spec.placement.node_selector.items()
            )
            if selected and zones_ok:
                eligible[x.labels[ZONE_LABEL]] = eligible.get(x.labels[ZONE_LABEL], 0) + 1
        counts = dict.fromkeys(eligible, 0)
        for name in result.placements[alone.metadata.name]:
            counts[next(x for x in roomy if x.name == name).labels[ZONE_LABEL]] += 1
        if counts:
            full = {z for z, c in counts.items() if c == eligible[z]}
            lowest = (
                min(c for z, c in counts.items() if z not in full)
                if len(full) < len(counts)
                else None
            )
            if lowest is not None:
                assert all(c <= lowest + 1 for z, c in counts.items())


@examples(200)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from([250, 500, 1000, 1500])),
        min_size=1,
        max_size=6,
    ),
    st.integers(1, 4),
    st.sampled_from([500, 1000, 2000]),
)
def test_property_preemption_evicts_a_minimal_set(
    victims: list[tuple[int, int]], devices: int, need: int
) -> None:
    """One high-priority replica on a full fleet: no device would have needed fewer
    evictions, and nothing of equal or higher priority is evicted."""
    nodes = [node(f"n{i}", cpu=2000) for i in range(devices)]
    deps, current = [], {}
    load = dict.fromkeys(range(devices), 0)
    for j, (prio, cpu) in enumerate(victims):
        i = j % devices
        if load[i] + cpu > 2000:
            continue
        load[i] += cpu
        name = f"v{j}"
        deps.append(dep(name, 1, resources={"cpu": f"{cpu}m"}, priority=prio))
        current[name] = [f"n{i}"]
    high = dep("high", 1, resources={"cpu": f"{need}m"}, priority=10)
    result = schedule([*deps, high], nodes, current, NOW)
    preempted = [e for e in result.evictions if e.by == "high"]
    if not preempted:
        return
    assert len({e.device for e in preempted}) == 1
    by_name = {d.metadata.name: d for d in deps}
    best = None
    for i in range(devices):
        on = [n for n, ds in current.items() if ds == [f"n{i}"]]
        free = 2000 - load[i]
        for k in range(len(on) + 1):
            if any(
                free + sum(by_name[v].spec.resources.cpu_millis or 0 for v in combo) >= need
                for combo in itertools.combinations(on, k)
            ):
                best = k if best is None else min(best, k)
                break
    assert len(preempted) == best


def test_require_tpm_places_only_on_tpm_attested_devices() -> None:
    from hub.decide.devices import Attestation, TrustState

    base = Device("soft", labels={"attestation.edgefleet.io/tpm": "true"})  # claims it
    devices = [
        base,
        Device("tpm", attestation_key_pem="pem", attestation=Attestation(TrustState.TRUSTED)),
        Device("failing", attestation_key_pem="pem"),
    ]
    policy = SecurityPolicy()
    nodes = [
        node_of(d.with_(phase=DevicePhase.READY, last_heartbeat=NOW), policy, region="eu")
        for d in devices
    ]
    nodes = [Node(n.name, n.labels, cpu_millis=4000, memory_bytes=4 * GiB, last_heartbeat=NOW)
             for n in nodes]  # fmt: skip
    want = dep("tpm", total=3, placement={"requireTpm": True})
    result = schedule([want], nodes, {}, NOW)
    assert set(result.placements["tpm"]) == {"tpm"}
    assert "2 not TPM-attested (placement.requireTpm)" in result.explanations["tpm"].message()
