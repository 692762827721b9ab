"""Device records across hub replicas (hub.controllers.replicas.ReplicaDevices), in this process:
two hub
contexts built from copies of one data directory on one real etcd, as two replicas are. A
device connected to one replica is written there, heartbeats included, and shows in the other
replica's cache (where the leader's lifecycle controller judges it)."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from asynctesting import async_test, eventually
from etcdtesting import EtcdServer
from hubtesting import replica_contexts

from edgefleet.v1 import admin_pb2
from hub.controllers.replicas import CacheFollower, ReplicaDevices, reload_cache
from hub.decide.agentreleases import AgentReleaseRecord
from hub.decide.agentrevisions import AgentRevision, AgentUpgradeState, agent_upgrade_key
from hub.decide.devices import Device, DevicePhase
from hub.initializing import init_hub
from hub.server import build_context
from hub.state import storekeys, tokens
from hub.state.store import EtcdStore
from hub.state.writer import merge_record


@async_test
async def test_device_records_and_heartbeats_reach_the_other_replicas(
    tmp_path: Path, etcd_server: EtcdServer, etcd_namespace: str
) -> None:
    url = f"etcd://{etcd_server.endpoint}{etcd_namespace}"
    await init_hub(tmp_path / "r0", region="eu", store=url)
    shutil.copytree(tmp_path / "r0", tmp_path / "r1")
    contexts = []
    for d in ("r0", "r1"):
        store = await EtcdStore.open([etcd_server.endpoint], namespace=etcd_namespace)
        contexts.append(await build_context(tmp_path / d, store=store))
    here, there = contexts
    assert here.elector is not None and there.elector is not None  # replicas on etcd
    seen_here: dict[str, float] = {}
    stop = asyncio.Event()
    components = _replica_devices(here, there, seen_here, grace_s=0.4)
    tasks = [asyncio.create_task(c.run(stop)) for c in components]
    tasks += [asyncio.create_task(ctx.writer.run(stop)) for ctx in contexts]
    try:
        # cam-1 connects to "here": its record is written there...
        here.sessions.open("cam-1", "01")
        here.cache.devices["cam-1"] = Device("cam-1", phase=DevicePhase.READY)
        here.writer.update(here.cache.devices["cam-1"])
        await here.writer.flush()
        # ... and shows "there", which marks it for projection (the leader may be there)
        await eventually(lambda: "cam-1" in there.cache.devices, 10)
        assert there.cache.devices["cam-1"].phase is DevicePhase.READY
        # its messages keep arriving here: the heartbeat time reaches the store and "there"
        now = time.time()
        seen_here["cam-1"] = now
        await eventually(lambda: (there.cache.devices["cam-1"].last_heartbeat or 0) >= now, 10)
        # "there" never overwrites what "here" holds for its own device
        there.writer.update(Device("cam-1", phase=DevicePhase.NOT_READY))
        await there.writer.flush()
        await asyncio.sleep(0.3)
        assert here.cache.devices["cam-1"].phase is DevicePhase.READY
        # a device that connects nowhere is followed too, deletions included
        kv = await here.store.get("/devices/cam-1")
        assert kv is not None
        await here.store.delete("/devices/cam-1")
        await eventually(lambda: "cam-1" not in there.cache.devices, 10)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        for ctx in contexts:
            await ctx.store.close()


@async_test
async def test_a_followers_cache_follows_the_leaders_writes(
    tmp_path: Path, etcd_server: EtcdServer, etcd_namespace: str
) -> None:
    url = f"etcd://{etcd_server.endpoint}{etcd_namespace}"
    await init_hub(tmp_path / "r0", region="eu", store=url)
    store = await EtcdStore.open([etcd_server.endpoint], namespace=etcd_namespace)
    ctx = await build_context(tmp_path / "r0", store=store)
    assert ctx.elector is not None and not ctx.elector.leading  # its elector is not running
    follower = CacheFollower(ctx.store, ctx.cache, ctx.sessions, ctx.elector)
    stop = asyncio.Event()
    task = asyncio.create_task(follower.run(stop))
    manifest = storekeys.object_value(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "ModelDeployment",
            "metadata": {"name": "d1"},
            "spec": {"model": {"name": "m", "version": "1.0.0"}, "replicas": {"perDevice": 1}},
        }
    )
    try:
        key = storekeys.object_key("ModelDeployment", "d1")
        await eventually(lambda: follower.applied == 0 and ctx.cache.stored == {}, 10)
        revision = await ctx.store.put(key, manifest)  # as the leader would
        await eventually(lambda: "d1" in ctx.cache.deployments, 10)
        assert ctx.cache.stored[("ModelDeployment", "d1")].revision == revision
        await ctx.store.put(storekeys.revoked_key("0abc"), b"cam-9")
        await eventually(lambda: ctx.cache.revoked.get("0abc") == "cam-9", 10)
        await ctx.store.delete(key)
        await eventually(lambda: "d1" not in ctx.cache.deployments, 10)
        # an AgentUpgrade's rollout record and a release (issue 32)
        release = AgentReleaseRecord("0.2.1", "x86_64", "cp311", "ab" * 32, 10, b"{}", 1.0)
        await ctx.store.put(release.key, storekeys.dumps(release.to_json()))
        state = AgentUpgradeState("up", 1, (AgentRevision(1, "0.2.1", 300, 3, 1.0),))
        await ctx.store.put(agent_upgrade_key("up"), storekeys.dumps(state.to_json()))
        await eventually(lambda: ctx.cache.agent_upgrades.get("up") == state, 10)
        assert ctx.cache.agent_releases == {release.key: release}
        await ctx.store.delete(agent_upgrade_key("up"))
        await eventually(lambda: "up" not in ctx.cache.agent_upgrades, 10)
    finally:
        stop.set()
        await task
        await ctx.store.close()


@async_test
async def test_a_followers_cache_follows_the_leaders_placements(
    tmp_path: Path, etcd_server: EtcdServer, etcd_namespace: str
) -> None:
    """Found by the soak harness (docs/soak.md; seed 43, 5 devices, half on the follower): a
    follower's cache never took the scheduler's placements of a ``replicas.total`` deployment,
    so the state it built for its devices lacked them, its digest never matched the leader's
    record, and a device placed by the leader but connected to the follower was never sent
    its replica (2 of 4 placed replicas ran; never the follower's devices')."""
    url = f"etcd://{etcd_server.endpoint}{etcd_namespace}"
    await init_hub(tmp_path / "r0", region="eu", store=url)
    store = await EtcdStore.open([etcd_server.endpoint], namespace=etcd_namespace)
    ctx = await build_context(tmp_path / "r0", store=store)
    assert ctx.elector is not None and not ctx.elector.leading
    follower = CacheFollower(ctx.store, ctx.cache, ctx.sessions, ctx.elector)
    stop = asyncio.Event()
    task = asyncio.create_task(follower.run(stop))
    try:
        await eventually(lambda: follower.applied == 0, 10)
        record = {"devices": ["cam-1", "cam-2"], "draining": ["cam-3"], "waiting": ["cam-2"]}
        await ctx.store.put(storekeys.placement_key("det"), storekeys.dumps(record))  # the leader
        await eventually(lambda: "det" in ctx.cache.placements, 10)
        assert ctx.cache.placements["det"] == {"cam-1", "cam-2"}
        assert ctx.cache.sent_placements["det"] == {"cam-1", "cam-3"}  # cam-2 waits, cam-3 drains
        await ctx.store.delete(storekeys.placement_key("det"))
        await eventually(lambda: "det" not in ctx.cache.placements, 10)
        assert "det" not in ctx.cache.sent_placements
    finally:
        stop.set()
        await task
        await ctx.store.close()


def test_a_three_way_merge_keeps_each_sides_changes() -> None:
    base = {"phase": "Ready", "cordoned": False, "lastHeartbeat": 1.0, "facts": {}}
    ours = {**base, "lastHeartbeat": 2.0}  # the stream's replica: a heartbeat
    theirs = {**base, "cordoned": True, "phase": "NotReady"}  # elsewhere: cordon, phase
    assert merge_record(base, ours, theirs) == {
        "phase": "NotReady",
        "cordoned": True,
        "lastHeartbeat": 2.0,
        "facts": {},
    }
    # the same field changed on both sides: ours (the later write) wins for that field only
    assert merge_record(base, {**base, "phase": "Pending"}, theirs)["phase"] == "Pending"


@async_test
async def test_two_replicas_writing_one_device_record_lose_neither_change(
    tmp_path: Path, etcd_server: EtcdServer, etcd_namespace: str
) -> None:
    """Last-writer-wins would let the heartbeat written by the device's replica undo the
    cordon written by another one meanwhile; the conditional write merges them."""
    url = f"etcd://{etcd_server.endpoint}{etcd_namespace}"
    await init_hub(tmp_path / "r0", region="eu", store=url)
    shutil.copytree(tmp_path / "r0", tmp_path / "r1")
    contexts = []
    for d in ("r0", "r1"):
        store = await EtcdStore.open([etcd_server.endpoint], namespace=etcd_namespace)
        contexts.append(await build_context(tmp_path / d, store=store))
    here, there = contexts
    try:
        assert here.writer.conditional and there.writer.conditional
        here.sessions.open("cam-1", "01")
        here.writer.update(Device("cam-1", phase=DevicePhase.READY, last_heartbeat=1.0))
        await here.writer.flush()
        kv = await there.store.get("/devices/cam-1")
        assert kv is not None
        record = storekeys.loads(kv.value)
        there.writer.observed("cam-1", kv.mod_revision, record)  # as its watch would
        there.cache.devices["cam-1"] = Device.from_json(record)

        # at the same time: cordoned there, a heartbeat here (which has not seen the cordon)
        there.writer.update(there.cache.devices["cam-1"].with_(cordoned=True))
        await there.writer.flush()
        here.writer.update(here.cache.devices["cam-1"].with_(last_heartbeat=2.0))
        await here.writer.flush()

        kv = await here.store.get("/devices/cam-1")
        assert kv is not None
        stored = Device.from_json(storekeys.loads(kv.value))
        assert stored.cordoned and stored.last_heartbeat == 2.0
        assert stored.phase is DevicePhase.READY
        assert here.writer.merged == 1
        assert here.cache.devices["cam-1"].cordoned  # the merge reached this replica's cache

        # deleted elsewhere meanwhile: a late heartbeat does not bring the record back
        await there.store.delete("/devices/cam-1")
        here.writer.update(here.cache.devices["cam-1"].with_(last_heartbeat=3.0))
        await here.writer.flush()
        assert await here.store.get("/devices/cam-1") is None
    finally:
        for ctx in contexts:
            await ctx.store.close()


@async_test
async def test_a_change_not_written_yet_survives_a_record_taken_from_another_replica() -> None:
    """The leader marks a device NotReady; before its writer's batch, the device's replica
    writes a heartbeat, which the leader takes from its watch: the phase change is kept."""
    from hub.state.cache import Cache
    from hub.state.store import MemoryStore
    from hub.state.writer import DeviceWriter

    store, cache = MemoryStore(), Cache()
    writer = DeviceWriter(store, cache, conditional=True)
    first = Device("cam-1", phase=DevicePhase.READY, last_heartbeat=1.0)
    revision = await store.put("/devices/cam-1", storekeys.dumps(first.to_json()))
    cache.devices["cam-1"] = writer.taken("cam-1", revision, first.to_json())
    writer.update(cache.devices["cam-1"].with_(phase=DevicePhase.NOT_READY))  # not written yet

    beat = first.with_(last_heartbeat=2.0).to_json()  # written by the device's replica
    revision = await store.put("/devices/cam-1", storekeys.dumps(beat))
    cache.devices["cam-1"] = writer.taken("cam-1", revision, beat)
    assert cache.devices["cam-1"].phase is DevicePhase.NOT_READY
    assert cache.devices["cam-1"].last_heartbeat == 2.0
    await writer.flush()
    kv = await store.get("/devices/cam-1")
    assert kv is not None
    stored = Device.from_json(storekeys.loads(kv.value))
    assert (stored.phase, stored.last_heartbeat) == (DevicePhase.NOT_READY, 2.0)
    assert writer.merged == 0  # taken in time: the write's compare held


@async_test
async def test_a_follower_sends_its_devices_the_state_the_leader_recorded(
    tmp_path: Path, etcd_server: EtcdServer, etcd_namespace: str
) -> None:
    """Found by the soak harness (docs/soak.md, seed 35): a device connected to a follower got
    no new desired state (the projector runs on the leader only) and kept running a deployment
    deleted long before. The follower now sends what the leader records, built from its own
    cache, and only when the digest is the record's."""
    from hub.decide.desired import FleetPolicies, build_within_bound
    from hub.decide.revisions import Revision, RolloutPhase, RolloutState, template_hash
    from hub.state.snapshots import snapshot_of

    url = f"etcd://{etcd_server.endpoint}{etcd_namespace}"
    await init_hub(tmp_path / "r0", region="eu", store=url)
    store = await EtcdStore.open([etcd_server.endpoint], namespace=etcd_namespace)
    ctx = await build_context(tmp_path / "r0", store=store)
    assert ctx.elector is not None and not ctx.elector.leading
    follower = CacheFollower(ctx.store, ctx.cache, ctx.sessions, ctx.elector, region="eu")
    stop = asyncio.Event()
    task = asyncio.create_task(follower.run(stop))
    device = Device("dev-a", labels={"site": "a"}, phase=DevicePhase.READY)
    ctx.cache.devices["dev-a"] = device  # as ReplicaDevices does
    manifest = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": "d1"},
        "spec": {
            "model": {"name": "m", "version": "1.0.0"},
            "replicas": {"perDevice": 1},
            "placement": {"nodeSelector": {"site": "a"}},
        },
    }

    def recorded(generation: int, digest: str | None = None) -> tuple[bytes, str]:
        """The record the leader's projector would write now, as this cache sees the fleet."""
        view = snapshot_of(ctx.cache)
        content = build_within_bound(
            ctx.cache.devices["dev-a"], view, previous=frozenset(), region="eu",
            fleet=FleetPolicies.of(view),
        )  # fmt: skip
        carried = tuple((d, n, generation) for d, n in content.revisions)
        record = storekeys.DesiredRecord(
            generation, content.deployments, digest or content.digest, carried
        )
        return storekeys.dumps(record.to_json()), content.digest

    try:
        session = ctx.sessions.open("dev-a", "01")
        await eventually(lambda: follower.applied == 0, 10)
        await ctx.store.put(storekeys.object_key("ModelDeployment", "d1"),
                            storekeys.object_value(manifest))  # fmt: skip
        await eventually(lambda: "d1" in ctx.cache.deployments, 10)
        # its revision and rollout record, as the leader's rollout controller writes them
        template = template_hash(manifest)
        revision = Revision("d1", 1, template, manifest, time.time())
        await ctx.store.put(storekeys.revision_key("d1", 1), storekeys.dumps(revision.to_json()))
        rollout = RolloutState("d1", 1, 1, phase=RolloutPhase.COMPLETE)
        await ctx.store.put(storekeys.rollout_key("d1"), storekeys.dumps(rollout.to_json()))
        model = storekeys.ModelRecord("m", "1.0.0", "ab" * 32, 10, b"{}", time.time())
        await ctx.store.put(storekeys.model_key("m", "1.0.0"), storekeys.dumps(model.to_json()))
        await eventually(lambda: "d1" in ctx.cache.rollouts and ctx.cache.models, 10)
        value, digest = recorded(7)
        await ctx.store.put(storekeys.desired_key("dev-a"), value)  # as the leader would
        await eventually(lambda: session.desired is not None, 10)
        assert session.desired is not None and session.desired.digest == digest
        assert "d1" in session.desired.deployments
        # the deployment deleted at the leader: the device is sent a state without it
        session.desired = None
        await ctx.store.delete(storekeys.object_key("ModelDeployment", "d1"))
        await eventually(lambda: "d1" not in ctx.cache.deployments, 10)
        value, digest = recorded(8)
        await ctx.store.put(storekeys.desired_key("dev-a"), value)
        await eventually(lambda: session.desired is not None, 10)
        assert session.desired is not None and session.desired.digest == digest
        assert "d1" not in session.desired.deployments
        # a record this cache cannot build yet (the leader is ahead): nothing is sent
        session.desired = None
        value, _ = recorded(9, digest="0" * 64)
        await ctx.store.put(storekeys.desired_key("dev-a"), value)
        await eventually(lambda: follower.offers.behind >= 1, 10)
        assert session.desired is None
        # a device that connects to the follower is sent what it is owed
        ctx.sessions.release(session)
        value, digest = recorded(10)
        await ctx.store.put(storekeys.desired_key("dev-a"), value)
        await eventually(lambda: ctx.cache.desired["dev-a"].generation == 10, 10)
        again = ctx.sessions.open("dev-a", "01")
        await eventually(lambda: again.desired is not None, 10)
        assert again.desired is not None and again.desired.digest == digest
    finally:
        stop.set()
        await task
        await ctx.store.close()


@async_test
async def test_admin_writes_on_a_replica_are_fenced_by_the_leaders_term(
    tmp_path: Path, etcd_server: EtcdServer, etcd_namespace: str
) -> None:
    """Found by the soak harness (docs/soak.md, seed 7): a leader SIGSTOPped past its lease
    resumed in the middle of an apply and acknowledged it, written unfenced where the new
    leader's cache never looks (the leader's cache follows nothing): reads at the leader went
    on showing the value before, for good. The admin API's writes now go through the store
    fenced by the term (hub.state.store.electing.FencedStore: a deposed leader's write is
    refused, tests/hub/test_hub_electing.py), which the hub answers UNAVAILABLE and edgectl
    takes to the next replica."""
    from hub.state.store.electing import FencedStore, NotLeader
    from hub.wiring import admin_servicer

    url = f"etcd://{etcd_server.endpoint}{etcd_namespace}"
    await init_hub(tmp_path / "r0", region="eu", store=url)
    store = await EtcdStore.open([etcd_server.endpoint], namespace=etcd_namespace)
    ctx = await build_context(tmp_path / "r0", store=store)
    try:
        servicer = admin_servicer(ctx)
        writers = {
            "applies": servicer.applies.store,
            "deletes": servicer.deletes.store,
            "devices": servicer.devices.store,
            "rollouts": servicer.rollouts.store,
            # and since stop 43: tokens, pushes (models, edged releases), rollback allowances
            "tokens": servicer.tokens.store,
            "models": servicer.artifacts.artifacts.store,
            "agent releases": servicer.artifacts.agent_releases.store,
            "allowances": servicer.artifacts.allowances.store,
        }
        for name, written in writers.items():
            assert isinstance(written, FencedStore), name
            assert written.elector is ctx.elector, name
        # this replica does not lead (its elector has no term): the write is refused
        with pytest.raises(NotLeader):
            await servicer.applies.store.put("/objects/PriorityClass/p", b"{}")
        assert await ctx.store.get("/objects/PriorityClass/p") is None
        made = await tokens.list_tokens(ctx.store)  # hub init's
        with pytest.raises(NotLeader):  # a token it would have answered with, never stored
            await tokens.create_token(servicer.tokens.store, now=ctx.clock(), ttl=600)
        assert await tokens.list_tokens(ctx.store) == made
    finally:
        await ctx.store.close()


@async_test
async def test_tokens_pushes_and_allowances_at_a_deposed_leader_are_refused_unavailable(
    tmp_path: Path, etcd_server: EtcdServer, etcd_namespace: str
) -> None:
    """A leader paused past its lease (its term over, another replica elected) that resumes
    in the middle of CreateToken, PushArtifact or PushRollbackAllowance: the write is fenced
    by its old term and refused, the call answered UNAVAILABLE ("no longer leads"), nothing
    stored where the new leader would never see it (before stop 43 these were written
    through the plain store and acknowledged)."""
    from hub.state.store.electing import LEADER_KEY
    from hub.wiring import admin_servicer

    url = f"etcd://{etcd_server.endpoint}{etcd_namespace}"
    await init_hub(tmp_path / "r0", region="eu", store=url)
    store = await EtcdStore.open([etcd_server.endpoint], namespace=etcd_namespace)
    ctx = await build_context(tmp_path / "r0", store=store)
    elector = ctx.elector
    assert elector is not None
    try:
        servicer = admin_servicer(ctx)
        # it led a term, and lost it without noticing: another replica's key now
        elector.term = await ctx.store.put(LEADER_KEY, b"replica r0")
        await ctx.store.put(LEADER_KEY, b"replica r1")
        aborted: list[tuple[grpc.StatusCode, str]] = []

        class Context:
            def peer(self) -> str:
                return "ipv4:127.0.0.1:1"

            def auth_context(self) -> dict[str, list[bytes]]:
                return {}

            async def abort(self, code: grpc.StatusCode, details: str) -> None:
                aborted.append((code, details))
                raise grpc.aio.AbortError()

        async def refused(call: Any) -> tuple[grpc.StatusCode, str]:
            aborted.clear()
            with pytest.raises(grpc.aio.AbortError):
                await call
            return aborted[-1]

        made = await tokens.list_tokens(ctx.store)  # hub init's
        servicer.tokens.authorize = _allowed  # type: ignore[method-assign]
        servicer.artifacts.authorize = _allowed  # type: ignore[method-assign]
        code, details = await refused(
            servicer.tokens.CreateToken(admin_pb2.CreateTokenRequest(), Context())
        )
        assert code is grpc.StatusCode.UNAVAILABLE and "no longer leads" in details, details
        assert await tokens.list_tokens(ctx.store) == made
        # a push's record and an allowance written through their receivers' fenced stores, as
        # their last step does: refused, answered UNAVAILABLE (not UNKNOWN: edgectl goes on)
        elector.term = (await ctx.store.get(LEADER_KEY)).mod_revision  # type: ignore[union-attr]
        await ctx.store.put(LEADER_KEY, b"replica r2")
        model_key = storekeys.model_key("det", "1.0.0")

        async def record_push(*_: Any, **__: Any) -> Any:
            await servicer.artifacts.artifacts.store.put(model_key, b"{}")

        async def record_allowance(*_: Any, **__: Any) -> Any:
            await servicer.artifacts.allowances.store.put(model_key, b"{}")

        servicer.artifacts.artifacts.receive = record_push  # type: ignore[method-assign]
        servicer.artifacts.allowances.receive = record_allowance  # type: ignore[method-assign]
        servicer.artifacts.agent_releases.receive = record_push  # type: ignore[method-assign]
        for call in (
            servicer.artifacts.PushArtifact(_no_requests(), Context()),
            servicer.artifacts.PushAgentRelease(_no_requests(), Context()),
            servicer.artifacts.PushRollbackAllowance(
                admin_pb2.PushRollbackAllowanceRequest(), Context()
            ),
        ):
            elector.term = (await ctx.store.get(LEADER_KEY)).mod_revision  # type: ignore[union-attr]
            await ctx.store.put(LEADER_KEY, b"another replica")
            code, details = await refused(call)
            assert code is grpc.StatusCode.UNAVAILABLE and "no longer leads" in details, details
        assert await ctx.store.get(model_key) is None
    finally:
        await ctx.store.close()


async def _allowed(context: Any) -> None:
    return None


async def _no_requests() -> AsyncIterator[admin_pb2.PushArtifactRequest]:
    return
    yield


def _replica_devices(
    here: Any, there: Any, seen: dict[str, float], *, grace_s: float
) -> tuple[ReplicaDevices, ReplicaDevices]:
    """The ``replica-devices`` component of each context: ``here`` (replica r0) with the
    last-message times ``seen``, ``there`` (r1) with none of its own."""
    return tuple(  # type: ignore[return-value]
        ReplicaDevices(
            store=ctx.store,
            cache=ctx.cache,
            sessions=ctx.sessions,
            writer=ctx.writer,
            projector=ctx.projector,
            last_seen=last,
            grace_s=grace_s,
            replica=replica,
        )
        for ctx, last, replica in ((here, seen, "r0"), (there, {}, "r1"))
    )


@async_test
async def test_heartbeats_are_one_record_per_replica_not_a_write_of_each_device(
    tmp_path: Path, etcd_server: EtcdServer, etcd_namespace: str
) -> None:
    """Found by the soak harness (docs/soak.md, seed 62's 1-hour runs): each replica wrote
    every connected device's whole record every heartbeatGrace / 4 to carry one time, 85 %
    of what the region wrote to etcd; etcd members held it in memory past 1 GiB. Now the
    times go into one record per replica; the other replica's cache and a reload there
    take them, and a device's record is not written for a heartbeat."""
    contexts = await replica_contexts(tmp_path, etcd_server.endpoint, etcd_namespace)
    here, there = contexts
    names = [f"cam-{i}" for i in range(50)]
    seen: dict[str, float] = {}
    devices, other = _replica_devices(here, there, seen, grace_s=0.4)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(c.run(stop)) for c in (devices, other)]
    tasks += [asyncio.create_task(ctx.writer.run(stop)) for ctx in contexts]
    try:
        for name in names:
            here.sessions.open(name, "01")
            here.writer.update(Device(name, phase=DevicePhase.READY))
        await here.writer.flush()
        await eventually(lambda: all(n in there.cache.devices for n in names), 10)
        before = {n: (await here.store.get(f"/devices/{n}")).mod_revision for n in names}  # type: ignore[union-attr]
        for _ in range(5):  # five periods of messages from every device
            now = time.time()
            seen.update({n: now for n in names})
            await asyncio.sleep(0.15)
        await eventually(
            lambda: all((there.cache.devices[n].last_heartbeat or 0) >= now for n in names), 10
        )
        after = {n: (await here.store.get(f"/devices/{n}")).mod_revision for n in names}  # type: ignore[union-attr]
        assert after == before, "a heartbeat rewrote device records"
        assert 1 <= devices.records_written <= 8, devices.records_written
        record = await here.store.get("/heartbeats/r0")
        assert record is not None and len(record.value) < 60 * len(names)
        # a reload (the other replica elected) keeps the times the records do not hold
        await reload_cache(there.cache, there.store, there.sessions, there.writer)
        assert all((there.cache.devices[n].last_heartbeat or 0) >= now for n in names)
        # another replica's record that is not a record of times changes nothing
        held = dict(there.cache.heard)
        await here.store.put("/heartbeats/r9", b'{"devices": {"cam-1": "soon", "cam-2": 1e300}}')
        await here.store.put("/heartbeats/r8", b"not json")
        # a good record written after them: once it is taken, the bad ones were read before
        await here.store.put("/heartbeats/r7", b'{"devices": {"sentinel": 1.5e9}}')
        await eventually(lambda: "sentinel" in there.cache.heard, 10)
        assert there.cache.heard == {**held, "sentinel": 1.5e9}
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        for ctx in contexts:
            await ctx.store.close()


@async_test
async def test_acknowledgements_go_into_the_heartbeat_record_not_the_device_records(
    tmp_path: Path, etcd_server: EtcdServer, etcd_namespace: str
) -> None:
    """Found by the soak harness (docs/soak.md, seed 62, run C): once the heartbeat times had
    left the device records, each device's acknowledgement of a new desired state still
    rewrote its whole record, 75 % of what the region wrote to etcd. Now a replica puts its
    devices' acknowledged generations into its heartbeat record within ACK_GATHER; the other
    replica's cache and a reload there take them, a device record is not written for one,
    and entries of a record that are not a generation change nothing."""
    contexts = await replica_contexts(tmp_path, etcd_server.endpoint, etcd_namespace)
    here, there = contexts
    names = [f"cam-{i}" for i in range(50)]
    seen: dict[str, float] = {}
    devices, other = _replica_devices(here, there, seen, grace_s=60.0)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(c.run(stop)) for c in (devices, other)]
    tasks += [asyncio.create_task(ctx.writer.run(stop)) for ctx in contexts]
    try:
        now = time.time()
        for name in names:
            here.sessions.open(name, "01")
            here.writer.update(Device(name, phase=DevicePhase.READY))
            seen[name] = now
        await here.writer.flush()
        await eventually(lambda: all(n in there.cache.devices for n in names), 10)
        before = {n: (await here.store.get(f"/devices/{n}")).mod_revision for n in names}  # type: ignore[union-attr]
        written = devices.records_written
        # every device acknowledges generation 7, as DeviceSync tells it (the cache first);
        # the times are due only once a minute (grace 60 s): the acknowledgements alone write
        for name in names:
            here.cache.put_device(here.cache.devices[name].with_(generation_acked=7))
            devices.acked(name, 7)
        await eventually(
            lambda: all(there.cache.devices[n].generation_acked == 7 for n in names), 10
        )
        after = {n: (await here.store.get(f"/devices/{n}")).mod_revision for n in names}  # type: ignore[union-attr]
        assert after == before, "an acknowledgement rewrote device records"
        assert 1 <= devices.records_written - written <= 2, devices.records_written - written
        # a reload (the other replica elected) keeps what the device records do not hold
        await reload_cache(there.cache, there.store, there.sessions, there.writer)
        assert all(there.cache.devices[n].generation_acked == 7 for n in names)
        # a record of another device's status written later at "here" carries the ack along;
        # one from another replica with an older acknowledgement does not undo it "there"
        stale = here.cache.devices["cam-1"].with_(generation_acked=3)
        await there.store.put("/devices/cam-1", storekeys.dumps(stale.to_json()))
        # a record written after it: once taken, the stale one was taken before
        await there.store.put("/devices/cam-zz", storekeys.dumps(Device("cam-zz").to_json()))
        await eventually(lambda: "cam-zz" in there.cache.devices, 10)
        assert there.cache.devices["cam-1"].generation_acked == 7
        # hostile entries change nothing: not an integer, a bool, negative, past int64
        held = dict(there.cache.acked)
        await here.store.put(
            "/heartbeats/r9",
            b'{"acked": {"cam-2": "99", "cam-3": true, "cam-4": -5, "cam-5": 1e30,'
            b' "cam-6": 99999999999999999999999}}',
        )
        await here.store.put("/heartbeats/r7", b'{"acked": {"sentinel": 5}}')
        await eventually(lambda: "sentinel" in there.cache.acked, 10)
        assert there.cache.acked == {**held, "sentinel": 5}
        assert all(there.cache.devices[n].generation_acked == 7 for n in names)
        # a device deleted leaves no acknowledgement behind
        await here.store.delete("/devices/cam-9")
        await eventually(lambda: "cam-9" not in there.cache.devices, 10)
        assert "cam-9" not in there.cache.acked
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        for ctx in contexts:
            await ctx.store.close()


@async_test
async def test_records_changed_elsewhere_are_all_merged_after_one_failed_transaction(
    tmp_path: Path, etcd_server: EtcdServer, etcd_namespace: str
) -> None:
    """Found by the soak harness (docs/soak.md, seed 62, the 1-hour run of 7 December, run
    D): a batch of N device records of which k had changed at the other replica was tried
    k + 1 times, each failure merging one record: after the leader's bulk phase changes
    (~900 records, ~580 KB a transaction) etcd's log took 1.4 GB in 9 minutes and its members
    2.6-2.9 GiB of memory. Now one failure names every key whose compare failed, all are
    merged, and the batch is written on the second try."""
    here, there = await replica_contexts(tmp_path, etcd_server.endpoint, etcd_namespace)
    names = [f"cam-{i:03d}" for i in range(100)]
    try:
        for name in names:
            here.writer.update(Device(name, phase=DevicePhase.READY, last_heartbeat=1.0))
        await here.writer.flush()
        # the other replica cordons 40 of them (its copies taken from the store, as its
        # watch would)
        for name in names[:40]:
            kv = await there.store.get(f"/devices/{name}")
            assert kv is not None
            record = storekeys.loads(kv.value)
            there.writer.observed(name, kv.mod_revision, record)
            there.writer.update(Device.from_json(record).with_(cordoned=True))
        await there.writer.flush()
        # here, unaware, every one gets a new heartbeat
        tries = 0
        txn = here.store.txn

        async def counted(*args: Any, **kwargs: Any) -> int:
            nonlocal tries
            tries += 1
            return await txn(*args, **kwargs)

        here.store.txn = counted  # type: ignore[method-assign]
        for name in names:
            here.writer.update(here.cache.devices[name].with_(last_heartbeat=2.0))
        await here.writer.flush()
        assert tries == 2, tries
        assert here.writer.merged == 40
        for name in names:
            kv = await there.store.get(f"/devices/{name}")
            assert kv is not None
            stored = Device.from_json(storekeys.loads(kv.value))
            assert stored.last_heartbeat == 2.0 and stored.cordoned == (name in names[:40])
    finally:
        for ctx in (here, there):
            await ctx.store.close()
