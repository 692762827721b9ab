"""Hub replicas on one etcd store: what ``hub serve`` adds when its store is etcd.

Every replica serves device streams (its devices' records go to the store through its own
device writer), enrollment and admin reads. One replica leads (:mod:`hub.state.store.electing`):

* the controllers (projection, rollouts, lifecycle, compaction) run only on the leader, each
  writing through a :class:`~hub.state.store.electing.FencedStore`;
* admin writes (apply, delete, cordon, revoke, push, tokens, rollout actions) are served by the
  leader only: a follower refuses them with UNAVAILABLE naming the leader (:class:`LeaderWrites`),
  so that every change the controllers act on is made where they run;
* a replica that becomes leader first reloads its cache from the store (:func:`reload_cache`),
  as the previous leader may have changed anything since this replica started; then the
  controllers project everything again;
* device records follow the store on every replica (:class:`ReplicaDevices`): a replica
  takes the records of devices connected elsewhere from a watch, and writes when each device
  connected to it last spoke, every ``heartbeatGrace / 4``, as one heartbeat record of its
  own (``/heartbeats/REPLICA``, which the other replicas watch too), so that the leader's
  lifecycle controller judges every device by its last message wherever it arrived (a single
  hub keeps the times in memory). The times were written into each device's record before:
  85 % of what a region of 1,351 devices wrote to etcd (docs/soak.md). The same record holds
  the newest generation each of its devices acknowledged, written within :data:`ACK_GATHER`
  of an acknowledgement: each acknowledgement rewrote the device's whole record before, 75 %
  of what the region wrote once the times had left (docs/soak.md, run C).

* a follower's cache follows the leader's writes (:class:`CacheFollower`: objects, models,
  desired state, revisions, rollouts, revocations, events, and through its ``followers`` a
  root's rollouts in waves, :meth:`hub.controllers.wave.WaveController.follow`), so admin reads on
  any
  replica show the fleet as the leader changes it;
* a follower sends the devices connected to it the desired state the leader recorded for them
  (:class:`FollowerOffers`): the projector runs on the leader only, so the follower builds the
  state from its cache and sends it when its digest is the record's (a cache behind the
  leader's sends nothing, until it catches up). Found by the soak harness (docs/soak.md, seed
  35): a device on a follower kept running a deployment deleted long before.

Devices and edgectl fail over between the replicas' addresses (``replicaAddresses``; edged's
hub link, edgectl's client). Writes to one device record by two replicas (a heartbeat here, a
phase change by the leader) are conditional on the record's revision and merged field by
field when it changed meanwhile (:mod:`hub.state.writer`). Artifacts' bytes are shared through the
store (:mod:`hub.state.sharedblobs`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import grpc

from edgefleet.errors import StoreError, StoreUnavailable
from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop
from hub.decide.agentreleases import AGENT_RELEASES, AgentReleaseRecord
from hub.decide.agentrevisions import AGENT_UPGRADES, AgentUpgradeState
from hub.decide.desired import FleetPolicies, build_within_bound
from hub.decide.devices import Device
from hub.decide.rollout import Revision, RolloutState
from hub.state import storekeys
from hub.state.cache import Cache
from hub.state.projector import Projector
from hub.state.secrets import record_of
from hub.state.sessions import Sessions
from hub.state.snapshots import snapshot_of
from hub.state.store.electing import Elector
from hub.state.store.identity import IDENTITY_KEY
from hub.state.store.protocol import Event, EventType, KeyValue, Store
from hub.state.writer import DeviceWriter

log = get_logger(__name__)

ADMIN_WRITES = frozenset(
    f"/edgefleet.v1.AdminService/{m}"
    for m in (
        "Apply",
        "Delete",
        "Cordon",
        "Uncordon",
        "RevokeDevice",
        "PushArtifact",
        "PushRollbackAllowance",
        "PushAgentRelease",
        "CreateToken",
        "RolloutAction",
    )
)
"""AdminService methods that write: served by the leading replica only."""


def replica_identity(listen: str = "") -> str:
    """Who a replica is, in the leader key: host, process and (when known) address."""
    where = f" {listen}" if listen else ""
    return f"{socket.gethostname()} pid {os.getpid()}{where}"


async def reload_cache(
    cache: Cache, store: Store, sessions: Sessions, writer: DeviceWriter | None = None
) -> None:
    """Replace ``cache``'s contents (in place: every component holds it) with the store's,
    except the records of devices connected to this replica (its own are newer) and those
    the cache took from the store after the reload's snapshot of the devices (``writer``
    knows each record's revision): a device enrolled here, or one :class:`ReplicaDevices`'
    watch brought, while the reload was reading. The watch tells each change once, so a
    record dropped by the reload was lost for good: a device enrolled at a replica just
    restarted was NOT_FOUND there ever after (the soak harness, seed 35, docs/soak.md)."""
    fresh = await Cache.load(store)
    for name, device in cache.devices.items():
        if sessions.get(name) is not None:
            fresh.devices[name] = device
        elif writer is not None:
            revision = writer.base_revision(name)
            if revision is not None and revision > fresh.devices_revision:
                fresh.devices[name] = device
    for name, heard in cache.heard.items():  # the heartbeat records' times (ReplicaDevices)
        found = fresh.devices.get(name)
        if found is not None and (found.last_heartbeat or 0) < heard:
            fresh.devices[name] = found.with_(last_heartbeat=heard)
    for name, generation in cache.acked.items():  # and their acknowledgements
        found = fresh.devices.get(name)
        if found is not None and found.generation_acked < generation:
            fresh.devices[name] = found.with_(generation_acked=generation)
    for f in dataclasses.fields(Cache):
        # the trust roots are installed from the data directory, not the store; the feed's
        # watchers registered with this cache; the fleet autoscaler's totals are its own, in
        # memory (hub.controllers.fleetautoscaler): not in the store; the heartbeat times
        # and acknowledgements are ReplicaDevices' (from the heartbeat records it follows)
        if f.name not in ("trust_roots", "feed", "scaled_totals", "heard", "acked"):
            setattr(cache, f.name, getattr(fresh, f.name))
    log.info("cache reloaded", devices=len(cache.devices), deployments=len(cache.deployments))


class LeaderWrites(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses admin writes on a replica that does not lead (UNAVAILABLE, naming the leader)."""

    def __init__(self, elector: Elector) -> None:
        self.elector = elector

    def _message(self) -> str:
        leader = self.elector.leader or "none yet (an election is under way)"
        return (
            f"this hub replica ({self.elector.identity}) does not lead; admin writes go to the "
            f"leading replica: {leader}"
        )

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or str(details.method) not in ADMIN_WRITES or self.elector.leading:
            return handler
        message = self._message()

        async def refuse(_request: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, message)

        kwargs = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(refuse, **kwargs)
        return grpc.unary_unary_rpc_method_handler(refuse, **kwargs)


MAX_HEARTBEAT_RECORD = 4 * 2**20
"""Bytes of another replica's heartbeat record read at most (about 100,000 devices): a larger
one is ignored, with a warning."""


def heartbeat_key(replica: str) -> str:
    """Where ``replica`` (host and port: the same across its restarts, so one record per
    replica, not per process) writes its devices' last message times."""
    return storekeys.HEARTBEATS + replica


MAX_GENERATION = 2**63 - 1


def heartbeat_record(value: bytes) -> tuple[dict[str, float], dict[str, int]]:
    """The times and acknowledged generations of a heartbeat record (``{"devices": {NAME:
    TIME}, "acked": {NAME: GENERATION}}``); entries that are not a device name and a finite
    time (a positive integer generation) are left out, a record not of that shape is empty."""
    try:
        doc = storekeys.loads(value)
    except ValueError:
        return {}, {}
    if not isinstance(doc, dict):
        return {}, {}
    devices, acked = doc.get("devices"), doc.get("acked")
    times = {
        name: float(t)
        for name, t in (devices.items() if isinstance(devices, dict) else ())
        if isinstance(name, str)
        and isinstance(t, int | float)
        and not isinstance(t, bool)
        and 0 <= t < 1e11
    }
    generations = {
        name: g
        for name, g in (acked.items() if isinstance(acked, dict) else ())
        if isinstance(name, str) and type(g) is int and 0 < g <= MAX_GENERATION
    }
    return times, generations


ACK_GATHER = 1.0
"""Seconds a replica gathers acknowledgements before it writes its heartbeat record for them:
a rollout's wave of acknowledgements is a write or two of one record, not one of each
device's."""


def _live_fields_apart(device: Device) -> Device:
    """A device record without what a heartbeat record carries (a change of those alone
    projects nothing)."""
    return device.with_(last_heartbeat=None, generation_acked=0)


class ReplicaDevices:
    """The ``replica-devices`` component (every replica on etcd; see the module doc)."""

    name = "replica-devices"

    def __init__(
        self,
        *,
        store: Store,
        cache: Cache,
        sessions: Sessions,
        writer: DeviceWriter,
        projector: Projector,
        last_seen: Mapping[str, float],
        grace_s: float,
        replica: str = "",
    ) -> None:
        self.store = store
        self.cache = cache
        self.sessions = sessions
        self.writer = writer
        self.projector = projector
        self.last_seen = last_seen
        self.period = grace_s / 4
        self.key = heartbeat_key(replica or replica_identity())
        self._written: dict[str, float] = {}  # the times in this replica's record, as written
        self._acks_due = False  # an acknowledgement here not in the record yet
        self._next_times = 0.0  # loop time at which the times are next looked at
        self.records_written = 0
        """Heartbeat records written (for tests and metrics)."""

    def _local(self, name: str) -> bool:
        return self.sessions.get(name) is not None

    def _take(self, name: str, kv: KeyValue | None) -> None:
        """A record written elsewhere, for a device not connected here (None: deleted)."""
        if self._local(name):
            return
        old = self.cache.devices.get(name)
        if kv is None:
            self.cache.heard.pop(name, None)
            self.cache.acked.pop(name, None)
            if self.cache.devices.pop(name, None) is not None:
                self.projector.mark([name])
            return
        # what a write here starts from; a change made here and not written yet is kept
        device = self.writer.taken(name, kv.mod_revision, storekeys.loads(kv.value))
        heard = self.cache.heard.get(name)
        if heard is not None and (device.last_heartbeat or 0) < heard:
            device = device.with_(last_heartbeat=heard)  # its last message, at any replica
        acked = self.cache.acked.get(name, 0)
        if device.generation_acked < acked:
            device = device.with_(generation_acked=acked)  # acknowledged at another replica
        self.cache.devices[name] = device
        if old is None or _live_fields_apart(old) != _live_fields_apart(device):
            self.projector.mark([name])  # not only a heartbeat: project it again

    def _heard(self, key: str, kv: KeyValue | None) -> None:
        """Another replica's heartbeat record: each device's time, where it is later than
        what the cache holds (a heartbeat alone projects nothing)."""
        if key == self.key or kv is None:  # ours, or deleted: the times already taken stay
            return
        if len(kv.value) > MAX_HEARTBEAT_RECORD:
            log.warning("heartbeat record too large", key=key, bytes=len(kv.value))
            return
        cache = self.cache
        times, acked = heartbeat_record(kv.value)
        for name, t in times.items():
            if self._local(name):
                continue
            if t > cache.heard.get(name, 0.0):
                cache.heard[name] = t  # kept for its record, when that comes later
            device = cache.devices.get(name)
            if device is not None and (device.last_heartbeat or 0) < t:
                cache.devices[name] = device.with_(last_heartbeat=t)
        for name, generation in acked.items():
            if self._local(name):
                continue
            if generation > cache.acked.get(name, 0):
                cache.acked[name] = generation
            device = cache.devices.get(name)
            if device is not None and device.generation_acked < generation:
                cache.devices[name] = device.with_(generation_acked=generation)

    async def _follow(self) -> None:
        tasks = [
            asyncio.ensure_future(self._follow_heartbeats()),
            asyncio.ensure_future(self._follow_devices()),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # its failure (compacted, store gone): raise, be restarted
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _follow_heartbeats(self) -> None:
        listed = await self.store.range(storekeys.HEARTBEATS)
        for kv in listed.kvs:
            self._heard(kv.key, kv)
        async for event in self.store.watch(storekeys.HEARTBEATS, listed.revision + 1):
            self._heard(event.kv.key, None if event.type is EventType.DELETE else event.kv)
        raise StoreUnavailable("the store ended the watch of the heartbeat records")

    async def _follow_devices(self) -> None:
        listed = await self.store.range(storekeys.DEVICES)
        for kv in listed.kvs:
            self._take(kv.key[len(storekeys.DEVICES) :], kv)
        async for event in self.store.watch(storekeys.DEVICES, listed.revision + 1):
            name = event.kv.key[len(storekeys.DEVICES) :]
            self._take(name, None if event.type is EventType.DELETE else event.kv)
        raise StoreUnavailable("the store ended the watch of the device records")

    def record_heartbeats(self) -> list[str]:
        """The last message times of the devices connected here, into the cache; the names of
        those not written for a period or more (:meth:`write_heartbeats` writes them)."""
        due = []
        for name, seen in self.last_seen.items():
            device = self.cache.devices.get(name)
            if device is None or not self._local(name):
                continue
            if (device.last_heartbeat or 0) < seen:
                self.cache.devices[name] = device.with_(last_heartbeat=seen)
            if self._written.get(name, 0.0) < seen - self.period:
                due.append(name)
        return due

    def acked(self, name: str, generation: int) -> None:
        """A device connected here acknowledged ``generation`` (the cache holds it already,
        :class:`hub.api.devicesync.DeviceSync`): it goes into the next heartbeat record,
        written within :data:`ACK_GATHER`."""
        self._acks_due = True

    async def write_heartbeats(self, *, times_due: bool = True) -> list[str]:
        """This replica's heartbeat record, when a device connected here spoke since its time
        there was written (or its time was never written), or acknowledged a generation
        since the last record: one put of every connected device's time and acknowledged
        generation; the names whose times were due. ``times_due`` False: only for
        acknowledgements (the times are looked at once a period)."""
        due = self.record_heartbeats() if times_due else []
        if not due and not self._acks_due:
            return due
        devices = self.cache.devices
        times = {
            name: seen
            for name, seen in self.last_seen.items()
            if self._local(name) and name in devices
        }
        acked = {
            name: devices[name].generation_acked
            for name in times
            if devices[name].generation_acked > 0
        }
        self._acks_due = False  # one arriving during the put is due again
        try:
            await self.store.put(self.key, storekeys.dumps({"devices": times, "acked": acked}))
        except StoreError as exc:  # the next period tries again (the times are still due)
            log.warning("heartbeat record not written", key=self.key, error=str(exc))
            self._acks_due = True
            return due
        self._written = times
        self.records_written += 1
        return due

    async def run(self, stop: asyncio.Event) -> None:
        follower = asyncio.ensure_future(self._follow())
        loop = asyncio.get_running_loop()
        self._next_times = loop.time() + self.period
        try:
            while not await wait_for_stop(stop, min(ACK_GATHER, self.period)):
                if follower.done():
                    follower.result()  # it failed (compacted, store gone): raise, be restarted
                    return
                times_due = loop.time() >= self._next_times
                if times_due:
                    self._next_times = loop.time() + self.period
                await self.write_heartbeats(times_due=times_due)
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)


class StoreFollower(Protocol):
    """State of a component outside the cache that a follower replica keeps as the leader
    writes it: loaded whole, then kept by the watch's events."""

    async def load(self) -> None: ...

    def follow(self, event: Event) -> bool:
        """Apply ``event`` if it is one of this component's keys (True), else False."""
        ...


class FollowerOffers:
    """What a follower sends its devices: for each device named, connected here and owed a
    desired state (a record in the cache), the state built from the cache as the leader's
    projector builds it (:func:`~hub.decide.desired.build_within_bound`), offered to its
    session only when its digest is the record's: never a state the leader did not record."""

    def __init__(self, cache: Cache, sessions: Sessions, region: str) -> None:
        self.cache = cache
        self.sessions = sessions
        self.region = region
        self.offered = 0  # states offered (for tests)
        self.behind = 0  # states not offered: this cache is behind the leader's record

    def offer(self, names: set[str]) -> None:
        connected = sorted(n for n in names if self.sessions.get(n) is not None)
        if not connected:
            return
        view = snapshot_of(self.cache)
        fleet = FleetPolicies.of(view)
        for name in connected:
            device = self.cache.devices.get(name)
            record = self.cache.desired.get(name)
            session = self.sessions.get(name)
            if device is None or record is None or session is None:
                continue
            content = build_within_bound(
                device,
                view,
                previous=frozenset(record.deployments),
                region=self.region,
                fleet=fleet,
            )
            if content.digest != record.digest:
                self.behind += 1
                continue
            session.offer(content)
            self.offered += 1

    def unsent(self) -> set[str]:
        """Devices connected here that no desired state went out to yet (connected to a
        follower, whose projector never ran), owed one."""
        names = set()
        for name in self.sessions.names():
            session = self.sessions.get(name)
            if (
                session is not None
                and not session.sent_any
                and session.desired is None
                and name in self.cache.desired
            ):
                names.add(name)
        return names


OFFER_DELAY_S = 0.02
"""A follower offers its devices their new states this long after the first desired-state
record of a batch came through the watch: the leader writes many devices' records in one
transaction, each a watch event; one snapshot of the cache serves them all."""
UNSENT_PERIOD_S = 1.0
"""How often a follower looks for devices connected to it that were sent nothing yet."""


class CacheFollower:
    """The ``cache-follower`` component: while its replica follows, the leader's writes reach
    the cache through a watch (devices: :class:`ReplicaDevices`). A replica reloads its cache
    when elected, so this stops during a term and starts again after it."""

    name = "cache-follower"

    def __init__(
        self,
        store: Store,
        cache: Cache,
        sessions: Sessions,
        elector: Elector,
        followers: Sequence[StoreFollower] = (),
        region: str = "",
        writer: DeviceWriter | None = None,
    ) -> None:
        self.store = store
        self.writer = writer
        self.cache = cache
        self.sessions = sessions
        self.elector = elector
        self.followers = tuple(followers)
        self.applied = 0
        """Events applied (for tests and metrics)."""
        self.offers = FollowerOffers(cache, sessions, region)
        self._owed: set[str] = set()  # devices whose record changed, not offered yet
        self._flush: asyncio.TimerHandle | None = None

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self.elector.leading:  # the leader's cache is its own: wait for the term's end
                await _race(stop.wait(), self.elector.wait_term_over(self.elector.term))
                continue
            follow = asyncio.ensure_future(self._follow())
            await _race(follow, stop.wait(), self.elector.wait_leading())
            if follow.done() and not follow.cancelled() and not stop.is_set():
                follow.result()  # the watch failed (compacted, store gone): raise, be restarted

    async def _follow(self) -> None:
        start = (await self.store.range(IDENTITY_KEY)).revision
        await reload_cache(self.cache, self.store, self.sessions, self.writer)
        for follower in self.followers:
            await follower.load()
        unsent = asyncio.ensure_future(self._offer_unsent())
        try:
            async for event in self.store.watch("/", start + 1):
                self.apply(event)
                if self._owed and self._flush is None:
                    loop = asyncio.get_running_loop()
                    self._flush = loop.call_later(OFFER_DELAY_S, self._offer_owed)
        finally:
            unsent.cancel()
            if self._flush is not None:
                self._flush.cancel()
                self._flush = None
            self._owed.clear()

    def _offer_owed(self) -> None:
        self._flush = None
        owed, self._owed = self._owed, set()
        self.offers.offer(owed)

    async def _offer_unsent(self) -> None:
        while True:
            self.offers.offer(self.offers.unsent())
            await asyncio.sleep(UNSENT_PERIOD_S)

    def apply(self, event: Event) -> None:
        key, put = event.kv.key, event.type is EventType.PUT
        value = event.kv.value
        c = self.cache
        if key.startswith(storekeys.OBJECTS):
            kind, _, name = key[len(storekeys.OBJECTS) :].partition("/")
            if put:  # a Secret's sealed record too: a new version, or re-sealed by a rotation
                doc = storekeys.loads(value)
                secret = record_of(doc, name) if kind == "Secret" else None
                c.put_object(doc["manifest"], event.kv.mod_revision, secret=secret)
            else:
                c.drop_object(kind, name)
        elif key.startswith(storekeys.MODELS):
            name, _, version = key[len(storekeys.MODELS) :].rpartition("/")
            if put:
                model = storekeys.ModelRecord.from_json(storekeys.loads(value))
                c.models[(model.name, model.version)] = model
            else:
                c.models.pop((name, version), None)
        elif key.startswith(storekeys.DESIRED):
            name = key[len(storekeys.DESIRED) :]
            if put:
                c.desired[name] = storekeys.DesiredRecord.from_json(storekeys.loads(value))
                self._owed.add(name)  # sent to the device if it is connected here
            else:
                c.desired.pop(name, None)
        elif key.startswith(storekeys.REVISIONS):
            deployment, _, number = key[len(storekeys.REVISIONS) :].rpartition("/")
            if put:
                rev = Revision.from_json(storekeys.loads(value))
                c.revisions.setdefault(rev.deployment, {})[rev.number] = rev
            elif number.isdigit():
                c.revisions.get(deployment, {}).pop(int(number), None)
        elif key.startswith(storekeys.ROLLOUTS):
            deployment = key[len(storekeys.ROLLOUTS) :]
            if put:
                c.rollouts[deployment] = RolloutState.from_json(storekeys.loads(value))
                c.rollout_revisions[deployment] = event.kv.mod_revision
            else:
                c.rollouts.pop(deployment, None)
                c.rollout_revisions.pop(deployment, None)
        elif key.startswith(AGENT_UPGRADES):  # an AgentUpgrade's rollout record
            upgrade = key[len(AGENT_UPGRADES) :]
            if put:
                c.agent_upgrades[upgrade] = AgentUpgradeState.from_json(storekeys.loads(value))
                c.agent_upgrade_revisions[upgrade] = event.kv.mod_revision
            else:
                c.agent_upgrades.pop(upgrade, None)
                c.agent_upgrade_revisions.pop(upgrade, None)
        elif key.startswith(AGENT_RELEASES):  # an edged release pushed
            if put:
                release = AgentReleaseRecord.from_json(storekeys.loads(value))
                c.agent_releases[release.key] = release
            else:
                c.agent_releases.pop(key, None)
        elif key.startswith(storekeys.PLACEMENTS):  # a replicas.total deployment's devices
            deployment = key[len(storekeys.PLACEMENTS) :]
            if put:
                doc = storekeys.loads(value)
                c.set_placement(
                    deployment,
                    frozenset(doc["devices"]),
                    draining=frozenset(doc.get("draining", ())),
                    waiting=frozenset(doc.get("waiting", ())),
                )
            else:
                c.drop_placement(deployment)
        elif key.startswith(storekeys.ANALYSIS):
            if put:
                c.put_analysis(key, storekeys.loads(value))
            else:
                c.drop_analysis(key)
        elif key.startswith(storekeys.REVOKED):
            serial = key[len(storekeys.REVOKED) :]
            if put:
                c.revoked[serial] = value.decode()
            else:
                c.revoked.pop(serial, None)
        elif key.startswith(storekeys.EVENTS) and put:
            c.events.append(storekeys.loads(value))
        elif not any(f.follow(event) for f in self.followers):
            return
        self.applied += 1


async def _race(*awaitables: Awaitable[object]) -> None:
    """Wait for the first of ``awaitables`` to finish; cancel the others (and wait for them)."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
