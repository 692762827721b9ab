"""The scheduler controller (``hub.controllers.placement``) on a real SQLite store: placements
stored and
kept across a restart, moved off a device silent for too long, each move an event; what
devices are sent for a ``replicas.total`` deployment. Faked: the clock only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from asynctesting import async_test
from hubtesting import FakeClock
from placementtesting import device, parts

from edgefleet.api import parse_manifest
from hub.decide.desired import build_desired
from hub.decide.devices import DevicePhase
from hub.decide.rollout import Revision, template_hash
from hub.decide.status import deployment_status
from hub.state import storekeys
from hub.state.cache import Cache
from hub.state.snapshots import snapshot_of
from hub.state.store import SqliteStore


def deployment(name: str, **spec: Any) -> dict[str, Any]:
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {"model": {"name": name, "version": "1.0.0"}, **spec},
    }
    return parse_manifest(doc).to_dict()


@async_test
async def test_placements_are_stored_kept_across_a_restart_and_moved_off_a_silent_device(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    store = await SqliteStore.open(tmp_path / "hub.db")
    try:
        cache = Cache(devices={f"d{i}": device(f"d{i}", clock.now) for i in range(4)})
        cache.put_object(deployment("fraud", replicas={"total": 2}), 1)
        scheduler, _, _ = parts(store, cache, clock)
        await scheduler.pass_now()
        first = cache.placements["fraud"]
        assert len(first) == 2
        kv = await store.get(storekeys.placement_key("fraud"))
        assert kv is not None and set(storekeys.loads(kv.value)["devices"]) == first
        assert cache.explanations["fraud"].message() == "2/2 replicas placed"
        assert [e["reason"] for e in cache.events] == ["Scheduled"]

        # a restarted hub reads the same placements and moves nothing
        again = await Cache.load(store)
        assert again.placements == {"fraud": first}
        again.devices = cache.devices
        again.put_object(deployment("fraud", replicas={"total": 2}), 1)
        restarted, _, _ = parts(store, again, clock)
        assert restarted.plan().placements == {"fraud": tuple(sorted(first))}

        # one placed device goes silent: NotReady within the grace keeps it, beyond moves it
        silent = sorted(first)[0]
        clock.advance(30)
        cache.devices[silent] = cache.devices[silent].with_(phase=DevicePhase.NOT_READY)
        for name in cache.devices:
            if name != silent:
                cache.devices[name] = cache.devices[name].with_(last_heartbeat=clock.now)
        await scheduler.pass_now()
        assert cache.placements["fraud"] == first
        clock.advance(40)
        await scheduler.pass_now()
        now_on = cache.placements["fraud"]
        assert silent not in now_on and len(now_on) == 2 and (first - {silent}) <= now_on
        moved = [e for e in cache.events if e["reason"] == "Rescheduled"]
        assert [e["message"] for e in moved] == [
            f"replica taken off {silent}: no longer fits: not ready for longer than 60s"
        ]
        assert moved[0]["type"] == "Warning"
    finally:
        await store.close()


@async_test
async def test_an_unplaceable_deployment_explains_itself_in_its_status(tmp_path: Path) -> None:
    clock = FakeClock()
    store = await SqliteStore.open(tmp_path / "hub.db")
    try:
        cache = Cache(devices={f"d{i}": device(f"d{i}", clock.now) for i in range(3)})
        cache.put_object(
            deployment("npu", replicas={"total": 2}, resources={"accelerator": "npu"}), 1
        )
        scheduler, _, _ = parts(store, cache, clock)
        await scheduler.pass_now()
        dep = cache.deployments["npu"]
        status = deployment_status(
            dep, cache.devices.values(), {}, scheduled=cache.explanations["npu"]
        )
        scheduled = next(c for c in status.conditions if c.type == "Scheduled")
        assert (scheduled.status.value, scheduled.reason) == ("False", "Unschedulable")
        assert scheduled.message == ("0/2 replicas placed; 0/3 devices fit: 3 lack accelerator npu")
        # a deleted deployment's placements go too
        cache.put_object(deployment("fraud", replicas={"total": 1}), 2)
        await scheduler.pass_now()
        assert set(cache.placements) == {"fraud", "npu"}
        cache.drop_object("ModelDeployment", "fraud")
        await scheduler.pass_now()
        assert "fraud" not in cache.placements
        assert await store.get(storekeys.placement_key("fraud")) is None
    finally:
        await store.close()


def test_a_placed_device_is_sent_one_replica_and_its_own_accelerator_class() -> None:
    manifest = deployment(
        "fraud", replicas={"total": 3}, resources={"accelerator": {"anyOf": ["gpu", "npu"]}}
    )
    cache = Cache(devices={"d1": device("d1", 0.0, **{"accelerator.npu": "1"})})
    cache.put_object(manifest, 1)
    revision = Revision("fraud", 1, template_hash(manifest), manifest, 0.0)
    cache.revisions["fraud"] = {1: revision}
    cache.models[("fraud", "1.0.0")] = storekeys.ModelRecord(
        name="fraud",
        version="1.0.0",
        sha256="a" * 64,
        length=1,
        envelope=b"{}",
        pushed_at=0.0,
    )
    d1 = cache.devices["d1"]
    planned = {"fraud": revision}
    off = build_desired(d1, snapshot_of(cache), previous=frozenset(), region="eu", planned=planned)
    assert off.deployments == () and "the scheduler placed no replica here" in off.excluded["fraud"]
    cache.set_placement("fraud", frozenset({"d1"}))
    on = build_desired(d1, snapshot_of(cache), previous=frozenset(), region="eu", planned=planned)
    assert on.deployments == ("fraud",)
    sent = orjson.loads(on.manifests[0])
    assert sent["spec"]["replicas"] == {"perDevice": 1}
    assert sent["spec"]["resources"]["accelerator"] == "npu"
    assert parse_manifest(sent).spec.replicas.count_on_device() == 1  # type: ignore[union-attr]


def test_describe_device_says_why_a_deployment_is_not_there() -> None:
    from edgectl.printing import describe_device
    from hub.decide.placement import SecurityPolicy
    from hub.decide.presentation import device_object

    why = {"fraud": "replicas.total: the scheduler placed no replica here"}
    doc = device_object(device("d1", 0.0), SecurityPolicy(), None, why)
    assert doc["status"]["notRunning"] == why
    text = describe_device(doc, [], now=0.0)
    assert "Not running:      fraud: replicas.total: the scheduler placed no replica here" in text
