"""The desired-state bound on every path that changes a device's desired state
(``hub.decide.statebound``): the scheduler never places past it (tables and a property over
``hub.decide.schedule.schedule`` with a ``StateBound``), and an apply is refused only when it grows
some device past it (``refused_devices``). Pure: no hub, no store."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from propertytesting import examples
from schedulingtesting import NOW, dep, fleets, node

from edgefleet.api import ModelDeployment, TaintEffect, parse_manifest
from hub.decide.desired import MAX_DESIRED_STATE_BYTES
from hub.decide.devices import Device, DevicePhase, Taint
from hub.decide.placement import TAINT_NOT_READY
from hub.decide.rollout import Revision, RolloutState, template_hash
from hub.decide.schedule import Node, StateBound, schedule
from hub.decide.statebound import grown_past_bound, refused_devices, state_bound
from hub.state import storekeys
from hub.state.cache import Cache
from hub.state.snapshots import snapshot_of

LIMIT = MAX_DESIRED_STATE_BYTES  # 3.94 MiB
BIG = 840_000  # the deployments: about 840 KB each
GONE = Taint(TAINT_NOT_READY, TaintEffect.NO_SCHEDULE)


def bound_of(deps: list[ModelDeployment], size: int = BIG, **base: int) -> StateBound:
    return StateBound(LIMIT, base, {d.metadata.name: size for d in deps})


def test_the_last_device_standing_gets_only_what_it_can_receive() -> None:
    """The journey of issue 29: six ~840 KB ``total: 1`` deployments on four devices; three
    go away for longer than rescheduleAfter. Without the bound the scheduler moved all six
    onto the last device (4.8 MiB, never sent); with it, four move there and two stay
    unplaced, their condition naming the device."""
    deps = [dep(f"big{i}", 1) for i in range(6)]
    names = ["s1-a", "s1-b", "s1-c", "s1-d"]
    current = {f"big{i}": [names[i % 4]] for i in range(6)}
    nodes = [node("s1-a")] + [node(n, taints=(GONE,), last_heartbeat=NOW - 600) for n in names[1:]]

    unbounded = schedule(deps, nodes, current, NOW)
    assert all(p == ("s1-a",) for p in unbounded.placements.values())  # the defect

    bound = bound_of(deps, **{n: 2_000 for n in names})
    result = schedule(deps, nodes, current, NOW, bound=bound)
    on_a = [n for n, p in result.placements.items() if p == ("s1-a",)]
    assert len(on_a) == 4
    assert 2_000 + len(on_a) * BIG <= LIMIT
    left = sorted(n for n, p in result.placements.items() if not p)
    assert len(left) == 2
    for name in left:
        assert result.explanations[name].message() == (
            "0/1 replicas placed; 0/4 devices fit: 3 not tolerating taint not-ready, "
            "1 desired state would exceed 3.94 MiB (s1-a)"
        )
    # the next pass moves nothing (a fixed point)
    again = schedule(deps, nodes, result.placements, NOW, bound=bound)
    assert again.placements == result.placements and again.evictions == ()


def test_a_replica_goes_to_another_device_rather_than_past_the_bound() -> None:
    deps = [dep("x", 1)]
    nodes = [node("a", artifacts=frozenset({"sha"})), node("b")]  # a scores higher: artifact
    assert schedule(deps, nodes, {}, NOW, artifacts={"x": "sha"}).placements == {"x": ("a",)}
    full = bound_of(deps, a=LIMIT - BIG + 1, b=0)
    result = schedule(deps, nodes, {}, NOW, artifacts={"x": "sha"}, bound=full)
    assert result.placements == {"x": ("b",)}


def test_a_device_over_the_bound_loses_its_least_important_placements() -> None:
    """A device whose state is over the bound (placed before the bound was kept, or its
    perDevice part grew) sheds placements, least important first, until it fits: its state
    can be sent again. The evicted replica goes elsewhere when it fits there."""
    low, high = dep("low", 1), dep("high", 1, priority=10)
    nodes = [node("a"), node("b")]
    bound = StateBound(LIMIT, {"a": LIMIT - 2 * BIG + 1, "b": 0}, {"low": BIG, "high": BIG})
    result = schedule([low, high], nodes, {"low": ["a"], "high": ["a"]}, NOW, bound=bound)
    assert result.placements == {"high": ("a",), "low": ("b",)}
    (eviction,) = result.evictions
    assert (eviction.deployment, eviction.device) == ("low", "a")
    assert eviction.reason == "device's desired state over 3.94 MiB"


def test_a_higher_priority_replica_preempts_for_room_in_the_desired_state() -> None:
    low, urgent = dep("low", 1), dep("urgent", 1, priority=100)
    nodes = [node("a")]
    bound = StateBound(LIMIT, {"a": LIMIT - BIG - 10}, {"low": BIG, "urgent": BIG})
    result = schedule([low, urgent], nodes, {"low": ["a"]}, NOW, bound=bound)
    assert result.placements == {"low": (), "urgent": ("a",)}
    (eviction,) = result.evictions
    assert eviction.reason.startswith("preempted by urgent")


def test_without_a_bound_or_with_room_nothing_changes() -> None:
    deps = [dep(f"d{i}", 2) for i in range(3)]
    nodes = [node("a"), node("b"), node("c")]
    plain = schedule(deps, nodes, {}, NOW)
    roomy = schedule(deps, nodes, {}, NOW, bound=bound_of(deps, size=1_000))
    assert roomy.placements == plain.placements
    assert roomy.explanations == plain.explanations


@examples(200)
@given(fleets(), st.data())
def test_property_no_placement_takes_a_device_past_the_bound(
    fleet: tuple[list[ModelDeployment], list[Node], dict[str, list[str]]],
    data: st.DataObject,
) -> None:
    """For any fleet, sizes and current placements: after a pass, every device's base plus
    what its placements add is within the bound (a device whose base alone is over keeps no
    placement), and a second pass moves nothing."""
    deps, nodes, current = fleet
    limit = 1000
    base = {x.name: data.draw(st.integers(0, 1200)) for x in nodes}
    sizes = {d.metadata.name: data.draw(st.integers(0, 600)) for d in deps}
    bound = StateBound(limit, base, sizes)
    result = schedule(deps, nodes, current, NOW, bound=bound)
    used = dict.fromkeys(base, 0)
    for name, devices in result.placements.items():
        for device in devices:
            used[device] += sizes[name]
    for device, added in used.items():
        assert added == 0 or base[device] + added <= limit, (device, base[device], added)
    again = schedule(deps, nodes, result.placements, NOW, bound=bound)
    assert again.placements == result.placements


MiB = 2**20


@pytest.mark.parametrize(
    ("before", "after", "refused"),
    [
        pytest.param({"a": MiB}, {"a": 2 * MiB}, [], id="within-the-bound"),
        pytest.param({"a": 3 * MiB}, {"a": 5 * MiB}, [("a", 5 * MiB)], id="grows-past-it"),
        pytest.param({}, {"a": 5 * MiB}, [("a", 5 * MiB)], id="a-new-state-past-it"),
        # issue 29: s1-a is over already; an apply that leaves it as it is goes through
        pytest.param(
            {"s1-a": 5 * MiB, "s1-b": MiB},
            {"s1-a": 5 * MiB, "s1-b": 2 * MiB},
            [],
            id="over-untouched",
        ),
        pytest.param({"a": 5 * MiB}, {"a": 9 * MiB // 2}, [], id="over-but-shrinks"),
        pytest.param(
            {"a": 5 * MiB, "b": MiB},
            {"a": 5 * MiB + 1, "b": MiB},
            [("a", 5 * MiB + 1)],
            id="over-and-grows-still",
        ),
    ],
)
def test_an_apply_is_refused_only_where_it_grows_a_device_past_the_bound(
    before: dict[str, int], after: dict[str, int], refused: list[tuple[str, int]]
) -> None:
    assert refused_devices(before, after) == refused


# -- over a real Cache: what the scheduler is given, and the apply check ------------------------


def manifest(name: str, replicas: dict[str, int], site: str, filler: int = 0) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "annotations": {"filler": "x" * filler}},
        "spec": {
            "model": {"name": name, "version": "1.0.0"},  # one deployment per model name
            "replicas": replicas,
            "placement": {"nodeSelector": {"site": site}},
        },
    }
    return parse_manifest(doc).to_dict()


def oversize_fleet() -> Cache:
    """What the unbounded scheduler left (issue 29): six ~840 KB ``total: 1`` deployments all
    sent to s1-a (4.8 MiB), and s2-a beside it."""
    devices = {
        "s1-a": Device("s1-a", labels={"site": "s1"}, phase=DevicePhase.READY),
        "s2-a": Device("s2-a", labels={"site": "s2"}, phase=DevicePhase.READY),
    }
    cache = Cache(devices=devices)
    for name in [*(f"big{i}" for i in range(7)), "other", "grow"]:
        cache.models[(name, "1.0.0")] = storekeys.ModelRecord(
            name, "1.0.0", "a" * 64, 1, b"e" * 600, 0.0
        )
    for i in range(6):
        m = manifest(f"big{i}", {"total": 1}, "s1", BIG)
        cache.put_object(m, i + 1)
        cache.revisions[f"big{i}"] = {1: Revision(f"big{i}", 1, template_hash(m), m, 0.0)}
        cache.rollouts[f"big{i}"] = RolloutState(f"big{i}", revision=1, stable=1)
        cache.set_placement(f"big{i}", frozenset({"s1-a"}))
    return cache


def trial_of(cache: Cache, *manifests: dict[str, Any]) -> tuple[Cache, dict[str, Revision]]:
    trial = replace(cache, stored=dict(cache.stored), deployments=dict(cache.deployments))
    for m in manifests:
        trial.put_object(m, 0)
    planned = {
        m["metadata"]["name"]: Revision(m["metadata"]["name"], 0, template_hash(m), m, 0.0)
        for m in manifests
    }
    return trial, planned


def test_an_oversize_device_refuses_only_the_applies_that_grow_it() -> None:
    cache = oversize_fleet()
    cases = [
        # a perDevice deployment selecting only s2-a: through (before: refused, naming s1-a)
        (manifest("other", {"perDevice": 1}, "s2"), []),
        # a new total deployment: the scheduler places it only where it fits (before: counted
        # on every device, so refused)
        (manifest("big6", {"total": 1}, "s2", BIG), []),
        # one that grows s1-a, already over: refused, naming it
        (manifest("grow", {"perDevice": 1}, "s1", BIG), ["s1-a"]),
        # a larger revision of a deployment s1-a is sent: refused too
        (manifest("big0", {"total": 1}, "s1", BIG + 10_000), ["s1-a"]),
    ]
    for doc, refused in cases:
        trial, planned = trial_of(cache, doc)
        got = grown_past_bound(snapshot_of(cache), snapshot_of(trial), planned=planned, region="eu")
        assert [name for name, _ in got] == refused, doc["metadata"]["name"]
        assert all(size > LIMIT for _, size in got)


def test_the_scheduler_given_the_caches_bound_brings_an_oversize_device_back_under_it() -> None:
    cache = oversize_fleet()
    bound = state_bound(snapshot_of(cache), region="eu")
    assert bound is not None and bound.limit == LIMIT
    assert set(bound.replica) == {f"big{i}" for i in range(6)}
    assert all(BIG < size < BIG + 2_000 for size in bound.replica.values())
    assert bound.base["s1-a"] < 10_000  # without the placements: policies only
    deps = list(cache.deployments.values())
    nodes = [node("s1-a", labels={"site": "s1"}), node("s2-a", labels={"site": "s2"})]
    result = schedule(deps, nodes, dict(cache.placements), NOW, bound=bound)
    kept = sorted(n for n, p in result.placements.items() if p == ("s1-a",))
    assert len(kept) == 4
    assert {e.reason for e in result.evictions} == {"device's desired state over 3.94 MiB"}
    # a fleet that fits (the common case) is not built device by device
    small = Cache(devices=dict(cache.devices))
    assert state_bound(snapshot_of(small), region="eu") is None
