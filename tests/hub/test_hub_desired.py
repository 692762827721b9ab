"""A device's desired state (``hub.decide.desired``, pure over a FleetView): what a projection batch
works out once for many devices gives each the same as working it out for it alone; the size
an apply checks before building each device's state (``wire_size_bound``) is at least every
device's actual size, whatever its labels, placements and assigned revisions."""

from __future__ import annotations

from typing import Any

from edgefleet.api import parse_manifest
from hub.decide.desired import (
    FleetPolicies,
    build_desired,
    build_within_bound,
    shed_order,
    wire_size,
    wire_size_bound,
)
from hub.decide.devices import Device, DevicePhase
from hub.decide.rollout import Revision, RolloutState, template_hash
from hub.state import storekeys
from hub.state.cache import Cache
from hub.state.snapshots import snapshot_of


def deployment(name: str, version: str = "1.0.0", **spec: Any) -> dict[str, Any]:
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "annotations": {"note": "n" * len(name) * 50}},
        "spec": {"model": {"name": name, "version": version}, **spec},
    }
    return parse_manifest(doc).to_dict()


def model(name: str, version: str, envelope: int, allowance: int = 0) -> storekeys.ModelRecord:
    return storekeys.ModelRecord(
        name, version, "a" * 64, 1, b"e" * envelope, 0.0, rollback_allowance=b"r" * allowance
    )


def test_the_bound_covers_every_device_and_every_revision_it_may_be_sent() -> None:
    devices = {
        "plain": Device("plain", labels={"site": "a"}, phase=DevicePhase.READY),
        "npu": Device(
            "npu",
            labels={"site": "a"},
            reported_labels={"accelerator.npu": "1"},
            phase=DevicePhase.READY,
        ),
        "elsewhere": Device("elsewhere", labels={"site": "b"}, phase=DevicePhase.READY),
    }
    cache = Cache(devices=devices)
    health = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "DeviceHealthPolicy",
        "metadata": {"name": "health"},
        "spec": {},
    }
    manifests = {
        "per": deployment(
            "per", replicas={"perDevice": 1}, placement={"nodeSelector": {"site": "a"}}
        ),
        "total": deployment(
            "total",
            replicas={"total": 2},
            resources={"accelerator": {"anyOf": ["gpu", "a-much-longer-accelerator-class", "npu"]}},
        ),
        "rolled": deployment("rolled", replicas={"perDevice": 1}),
        "unpushed": deployment("unpushed", version="9.9.9", replicas={"perDevice": 1}),
    }
    for i, m in enumerate(manifests.values()):
        cache.put_object(m, i + 1)
    cache.put_object(health, 10)
    cache.models[("per", "1.0.0")] = model("per", "1.0.0", 300, 40)
    cache.models[("total", "1.0.0")] = model("total", "1.0.0", 200)
    cache.models[("rolled", "1.0.0")] = model("rolled", "1.0.0", 100)
    cache.models[("rolled", "2.0.0")] = model("rolled", "2.0.0", 900, 70)
    old = Revision("rolled", 1, "t1", manifests["rolled"], 0.0)
    new_manifest = deployment(
        "rolled", version="2.0.0", replicas={"perDevice": 1}, priorityClassName="custom"
    )
    new = Revision("rolled", 2, "t2", new_manifest, 0.0)
    cache.revisions["rolled"] = {1: old, 2: new}
    cache.rollouts["rolled"] = RolloutState(
        "rolled", revision=2, stable=1, updated=frozenset({"npu"})
    )
    planned = {
        name: Revision(name, 0, template_hash(m), m, 0.0)
        for name, m in manifests.items()
        if name != "rolled"
    }
    fleet = FleetPolicies.of(snapshot_of(cache))
    assert fleet.health_policies  # every device gets it: counted in the bound too
    placements = {"total": frozenset(devices)}
    bound = wire_size_bound(snapshot_of(cache), fleet, planned=planned)
    sizes = {
        name: wire_size(
            build_desired(
                d,
                cache,
                previous=frozenset(),
                region="eu",
                fleet=fleet,
                planned=planned,
                placements=placements,
            )
        )
        for name, d in devices.items()
    }
    assert all(0 < size <= bound for size in sizes.values()), (sizes, bound)
    # npu gets the most: every sendable deployment, the longest rewrite is not its own (npu),
    # and the new revision of "rolled", with the larger envelope and an allowance
    assert sizes["npu"] == max(sizes.values())
    # not loose beyond the longest accelerator class and the revisions npu was not sent
    assert bound - sizes["npu"] < 200, (sizes, bound)


def test_an_empty_hub_is_bounded_by_the_envelope() -> None:
    cache = Cache()
    assert wire_size_bound(snapshot_of(cache), FleetPolicies.of(snapshot_of(cache))) == 64


def test_a_batch_shares_work_between_devices_and_gives_each_what_it_alone_would_get() -> None:
    devices = {
        f"d{i}": Device(
            f"d{i}",
            labels={"site": "a" if i % 3 else "b"},
            reported_labels={"accelerator.npu": "1"} if i % 2 else {},
            phase=DevicePhase.READY,
        )
        for i in range(12)
    }
    cache = Cache(devices=devices)
    manifests = {
        "per": deployment(
            "per", replicas={"perDevice": 1}, placement={"nodeSelector": {"site": "a"}}
        ),
        "acc": deployment(
            "acc", replicas={"perDevice": 1}, resources={"accelerator": {"anyOf": ["gpu", "npu"]}}
        ),
    }
    for i, (name, m) in enumerate(manifests.items()):
        cache.put_object(m, i + 1)
        cache.models[(name, "1.0.0")] = model(name, "1.0.0", 100)
        cache.revisions[name] = {1: Revision(name, 1, "t", m, 0.0)}
        cache.rollouts[name] = RolloutState(name, revision=1, stable=1)
    shared = FleetPolicies.of(snapshot_of(cache))
    batch = {
        n: build_desired(d, snapshot_of(cache), previous=frozenset(), region="eu", fleet=shared)
        for n, d in devices.items()
    }
    alone = {
        n: build_desired(d, snapshot_of(cache), previous=frozenset(), region="eu")
        for n, d in devices.items()
    }
    assert batch == alone
    # four kinds of device (site a or b, with an npu or not): four states, hashed once each
    assert len({c.digest for c in batch.values()}) == 4 == len(shared.digests)
    assert len(shared.rewrites) == 2


def _perdevice_fleet(names: list[str], **priorities: int) -> Cache:
    """One device sent every one of ``names`` (perDevice, as a wave's slice arrives), each
    with a revision and a pushed model; ``priorities``: a deployment's ``priority``."""
    cache = Cache(devices={"d": Device("d", labels={"site": "a"}, phase=DevicePhase.READY)})
    for i, name in enumerate(names):
        extra = {"priority": priorities[name]} if name in priorities else {}
        m = deployment(name, replicas={"perDevice": 1}, **extra)
        cache.put_object(m, i + 1)
        cache.revisions[name] = {1: Revision(name, 1, template_hash(m), m, 0.0)}
        cache.rollouts[name] = RolloutState(name, revision=1, stable=1)
        cache.models[(name, "1.0.0")] = model(name, "1.0.0", 400)
    return cache


def test_a_state_over_the_bound_is_never_built_for_sending_it_sheds_the_least_wanted() -> None:
    """Whatever made a device's state too large (a wave's slice, a label, a push), the state
    it is sent stays within the bound: deployments it was not sent before go first, then the
    lowest priority, then the last by name; each left out with the reason (issue 29, item 2)."""
    names = ["a", "b", "c", "d", "e", "f"]
    cache = _perdevice_fleet(names, e=100)
    device = cache.devices["d"]
    full = build_desired(device, snapshot_of(cache), previous=frozenset(), region="eu")
    assert set(full.deployments) == set(names)
    each = wire_size(full) // len(names)
    limit = wire_size(full) - 2 * each + each // 2  # room for four of six, not five

    within = build_within_bound(
        device, snapshot_of(cache), previous=frozenset("ab"), region="eu", limit=limit
    )
    assert wire_size(within) <= limit
    kept = set(within.deployments)
    # a and b were sent before: kept; e has the highest priority: kept; d and f (the last by
    # name of the rest, at priority 0) go without
    assert kept == {"a", "b", "c", "e"}, kept
    for name in ("d", "f"):
        assert within.excluded[name].startswith("not sent: the device's desired state would")
    # within the bound: the same as build_desired, nothing left out
    assert build_within_bound(device, snapshot_of(cache), previous=frozenset(), region="eu") == full


def test_the_shed_order_keeps_what_runs_then_priority_then_name() -> None:
    cases = [
        (["a", "b"], set(), {}, ["b", "a"]),
        (["a", "b"], {"b"}, {}, ["a", "b"]),
        (["a", "b", "c"], set(), {"a": 10}, ["c", "b", "a"]),
        (["a", "b", "c"], {"c"}, {"a": 10}, ["b", "a", "c"]),
        (["ab", "abc"], set(), {}, ["abc", "ab"]),
    ]
    for names, previous, priority, order in cases:
        assert shed_order(names, frozenset(previous), priority) == order, (names, previous)


def test_a_device_is_sent_the_current_replicas_and_scaling_with_its_revision() -> None:
    """``replicas`` and ``scaling`` are outside a revision's template (a scale is no rollout):
    a device gets its revision's manifest with the deployment's current ones, and the bound
    covers them."""
    import orjson

    cache = Cache(devices={"d": Device("d", phase=DevicePhase.READY)})
    made = deployment("per", replicas={"perDevice": 1})
    revision = Revision("per", 1, template_hash(made), made, 0.0)
    cache.models[("per", "1.0.0")] = model("per", "1.0.0", 100)
    cache.revisions["per"] = {1: revision}
    cache.rollouts["per"] = RolloutState("per", 1, 1)

    def sent(manifest: dict[str, Any], generation: int) -> dict[str, Any]:
        cache.put_object(manifest, generation)
        view = snapshot_of(cache)
        content = build_desired(
            cache.devices["d"],
            view,
            previous=frozenset(),
            region="eu",
            placements={"per": frozenset({"d"})},  # the scheduler's, once a total
        )
        assert wire_size(content) <= wire_size_bound(view, FleetPolicies.of(view))
        assert content.revisions == (("per", 1),)
        doc: dict[str, Any] = orjson.loads(content.manifests[0])
        return doc

    assert sent(made, 1) == orjson.loads(revision.encoded)  # as made: the same bytes
    scaled = deployment(
        "per", replicas={"perDevice": 3}, scaling={"minReplicas": 2, "maxReplicas": 6}
    )
    spec = sent(scaled, 2)["spec"]
    assert spec["replicas"] == {"perDevice": 3}
    assert (spec["scaling"]["minReplicas"], spec["scaling"]["maxReplicas"]) == (2, 6)
    assert spec["model"] == {"name": "per", "version": "1.0.0"}
    total = deployment("per", replicas={"total": 4}, scaling={"maxReplicas": 9})
    spec = sent(total, 3)["spec"]
    assert spec["replicas"] == {"perDevice": 1}  # the hub scales a total: one per device
    assert (spec["scaling"]["minReplicas"], spec["scaling"]["maxReplicas"]) == (1, 1)
