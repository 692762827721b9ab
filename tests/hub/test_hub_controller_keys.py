"""Controllers per key (issue 30): the work loop's queue (dedup, backoff owned by the queue,
one key at a time), the cache's change feed, a rollout step that projects again only the
devices it changes, and an Apply from the API that reaches the rollout controller through the
feed."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import orjson
from asynctesting import async_test, eventually
from hubserving import AdminHub, make_hub_dir

from edgefleet.v1 import admin_pb2
from hub.controllers import rollout
from hub.controllers.wave import WaveController
from hub.decide.devices import Device
from hub.decide.rollout import DeviceView, Revision, RolloutPhase, template_hash
from hub.decide.wave import WaveState
from hub.state import feed as kinds
from hub.state.cache import Cache
from hub.state.desiredrecords import DesiredRecords
from hub.state.heldtuf import HeldTuf
from hub.state.regions import Regions
from hub.state.store import open_hub_store
from hub.state.storekeys import DesiredRecord
from hub.state.workloop import KeyLoop
from hub.state.writer import DeviceWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.hub_controllers import Fleet


@async_test
async def test_a_key_queued_twice_is_reconciled_once_and_one_at_a_time() -> None:
    seen: list[str] = []
    running: set[str] = set()

    async def reconcile(key: str) -> None:
        assert key not in running  # never twice at once
        running.add(key)
        seen.append(key)
        await asyncio.sleep(0)
        running.discard(key)

    loop: KeyLoop[str] = KeyLoop("t", reconcile, keys=lambda: ["a", "b"])
    for key in ("a", "b", "a", "a"):
        loop.add(key)
    await loop.drain()
    assert seen == ["a", "b"]


@async_test
async def test_a_failing_key_comes_back_after_its_own_backoff_and_others_go_on() -> None:
    now = [0.0]
    tries: dict[str, int] = {}

    async def reconcile(key: str) -> None:
        tries[key] = tries.get(key, 0) + 1
        if key == "bad" and tries[key] < 3:
            raise RuntimeError("store down")

    loop: KeyLoop[str] = KeyLoop(
        "t", reconcile, keys=lambda: [], base_delay=1.0, max_delay=8.0, clock=lambda: now[0]
    )
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    loop.add("bad")
    loop.add("good")
    await eventually(lambda: tries.get("good") == 1 and tries.get("bad") == 1)
    assert loop.queue.num_requeues("bad") == 1 and loop.queue.delayed == 1  # the queue owns it
    now[0] += 1.0  # its first backoff (0.5-1 s with jitter) has passed
    await eventually(lambda: tries["bad"] == 2)
    assert loop.queue.num_requeues("bad") == 2
    now[0] += 2.0
    await eventually(lambda: tries["bad"] == 3)
    await eventually(lambda: loop.queue.num_requeues("bad") == 0)  # forgotten once it worked
    assert tries["good"] == 1
    stop.set()
    await task


@async_test
async def test_a_failure_that_persists_is_raised_and_the_key_stays_owed() -> None:
    now = [0.0]

    async def reconcile(key: str) -> None:
        now[0] += 20.0
        raise RuntimeError("store down")

    loop: KeyLoop[str] = KeyLoop(
        "t", reconcile, keys=lambda: ["k"], give_up_after=30.0, clock=lambda: now[0]
    )
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    now_before = now[0]
    try:
        await asyncio.wait_for(task, 10)
    except RuntimeError as exc:
        assert "store down" in str(exc)
    else:
        raise AssertionError("a persistent failure must be raised")
    assert now[0] - now_before >= 30.0 and loop.queue.delayed == 1


def test_the_feed_tells_the_watchers_of_a_kind_the_key_that_changed() -> None:
    cache = Cache()
    told: list[tuple[str, str]] = []
    cache.feed.watch(("ModelDeployment", kinds.MODEL), lambda k, n: told.append((k, n)))
    manifest = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": "det"},
        "spec": {"model": {"name": "det", "version": "1.0.0"}},
    }
    cache.put_object(manifest, 3)
    cache.drop_object("ModelDeployment", "det")
    cache.drop_object("Secret", "s")  # not watched
    assert told == [("ModelDeployment", "det"), ("ModelDeployment", "det")]


@async_test
async def test_a_rollout_step_projects_again_only_the_devices_it_changes() -> None:
    fleet = Fleet(1000)  # 50 deployments of 20 devices; maxSurge 10%: 2 devices a step
    await fleet.start()
    fleet.apply(0, "2.0.0")
    await fleet.react()
    steps = 0
    while fleet.cache.rollouts["dep-0"].phase is not RolloutPhase.COMPLETE and steps < 20:
        before = fleet.updated("dep-0")
        for name in sorted(before):
            fleet.report(name, ready=True)
        fleet.projected = 0
        reconciled = fleet.rollouts.reconciled
        await fleet.react()
        touched = len(fleet.updated("dep-0") - before)
        if touched:
            steps += 1
            assert fleet.projected == touched  # not the fleet's 1,000
            assert fleet.rollouts.reconciled - reconciled == 1  # dep-0 alone, not 50
        await fleet.settle()
    assert steps >= 5


def deployment(version: str) -> bytes:
    return orjson.dumps(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "ModelDeployment",
            "metadata": {"name": "det"},
            "spec": {"model": {"name": "det", "version": version}},
        }
    )


@async_test
async def test_an_apply_reaches_the_rollout_controller_through_the_change_feed(
    tmp_path: Path,
) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub, hub.channel() as channel:
        rollouts = hub.ctx.rollouts
        assert rollouts is not None
        reconciled = rollouts.reconciled
        await hub.stub(channel).Apply(admin_pb2.ApplyRequest(documents=[deployment("1.0.0")]))
        # the handler only wrote and waited for the feed's watchers: the controller made the
        # revision in its own loop
        assert rollouts.reconciled > reconciled
        assert hub.ctx.cache.rollouts["det"].revision == 1
        await hub.stub(channel).Delete(admin_pb2.DeleteRequest(kind="ModelDeployment", name="det"))
        assert "det" not in hub.ctx.cache.rollouts and "det" not in hub.ctx.cache.revisions


def test_the_desired_records_index_devices_by_the_deployments_they_hold() -> None:
    """Every way of writing the table keeps the index equal to a scan of every record."""
    records = DesiredRecords()

    def scan(deployment: str) -> frozenset[str]:
        return frozenset(n for n, r in records.items() if deployment in r.deployments)

    writes: list[tuple[str, str, tuple[str, ...]]] = [
        ("set", "a", ("x", "y")),
        ("set", "b", ("x",)),
        ("set", "a", ("y", "z")),  # a record replaced: a loses x
        ("del", "b", ()),
        ("pop", "a", ()),
        ("pop", "gone", ()),  # pop of no record: nothing
        ("set", "c", ()),
        ("update", "d", ("x", "z")),
        ("setdefault", "d", ("y",)),  # already there: unchanged
        ("clear", "", ()),
        ("set", "e", ("z",)),
    ]
    for op, name, deployments in writes:
        record = DesiredRecord(1, deployments, "digest")
        if op == "set":
            records[name] = record
        elif op == "del":
            del records[name]
        elif op == "pop":
            records.pop(name, None)
        elif op == "update":
            records.update({name: record})
        elif op == "setdefault":
            records.setdefault(name, record)
        elif op == "clear":
            records.clear()
        for deployment in ("x", "y", "z"):
            assert records.holding(deployment) == scan(deployment), (op, name, deployment)
        assert records.by_deployment() == {d: scan(d) for d in ("x", "y", "z") if scan(d)}, (
            op,
            name,
        )
    assert dict(records) == {"e": DesiredRecord(1, ("z",), "digest")}


@async_test
async def test_a_report_computes_the_view_of_the_device_that_changed_only() -> None:
    """The controller reuses each device's rollout view until its record changes: after one
    report, one view is computed; the views equal those computed afresh."""
    fleet = Fleet(1000)
    await fleet.start()
    computed: list[str] = []
    real = rollout.view_device

    def counted(device: Device, *args: Any, **kwargs: Any) -> DeviceView:
        computed.append(device.name)
        return real(device, *args, **kwargs)

    rollout.view_device = counted  # type: ignore[assignment]
    try:
        fleet.report("d00001", ready=False)  # dep-1's device
        await fleet.react()
    finally:
        rollout.view_device = real
    assert computed == ["d00001"]
    revision = fleet.cache.revisions["dep-1"][fleet.cache.rollouts["dep-1"].revision]
    memo = fleet.rollouts._views["dep-1"]
    assert [v for _, _, v in memo.values()] == rollout.views(fleet.cache, "dep-1", revision)


def test_a_tuf_set_adopted_tells_the_feed_and_is_what_the_holder_serves() -> None:
    cache = Cache()
    told: list[tuple[str, str]] = []
    cache.feed.watch((kinds.TRUST,), lambda k, n: told.append((k, n)))
    held = HeldTuf(cache)
    assert held() is None and told == []
    held.adopt(None)  # what it serves replaced (here: by none): every device's state may change
    assert told == [(kinds.TRUST, "")]


def test_the_autoscalers_totals_tell_the_feed_of_each_deployment_whose_total_changed() -> None:
    cache = Cache()
    told: list[str] = []
    cache.feed.watch((kinds.SCALED,), lambda k, n: told.append(n))
    for totals, expected in (
        ({"a": 3}, ["a"]),
        ({"a": 3}, []),  # the same: nothing to place again
        ({"a": 4, "b": 1}, ["a", "b"]),
        ({"b": 1}, ["a"]),  # a back to its spec's total
    ):
        told.clear()
        cache.set_scaled_totals(totals)
        assert told == expected and cache.scaled_totals == totals


def waved(version: str, waves: list[dict[str, Any]] | None) -> dict[str, Any]:
    rollout = {"waves": waves} if waves is not None else {}
    return {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": "det"},
        "spec": {"model": {"name": "det", "version": version}, "rollout": rollout},
    }


@async_test
async def test_a_template_applied_in_waves_reaches_no_region_before_the_root_decided_it(
    tmp_path: Path,
) -> None:
    """An apply's write reaches the feed (and wakes the regions' streams) before the rollout
    controller made the revision and its wave state: until then each region is sent what it
    was sent, not the new template (the state before may be Complete: "send the new one")."""
    store = await open_hub_store("memory://", data_dir=tmp_path)
    cache = Cache()
    waves = WaveController(store, cache, Regions(), DeviceWriter(store, cache))
    first = waved("1.0.0", [{"regions": ["eu"]}])
    template = template_hash(first)
    cache.put_object(first, 1)
    cache.revisions["det"] = {1: Revision("det", 1, template, first, 0.0)}
    waves.states["det"] = WaveState("det", 1, 1, first, "1.0.0", "1.0.0")  # Complete

    def version(region: str) -> str:
        manifest = cache.stored[("ModelDeployment", "det")].manifest
        return str(waves.manifest_for(region, manifest)["spec"]["model"]["version"])

    assert version("eu") == version("us") == "1.0.0"
    cache.put_object(waved("2.0.0", [{"regions": ["eu"]}]), 2)  # not reconciled yet
    assert version("eu") == version("us") == "1.0.0"
    cache.put_object(waved("2.0.0", None), 3)  # without waves: every region at once
    assert version("eu") == version("us") == "2.0.0"
