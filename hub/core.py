"""The hub's working state and the loops that keep it: cache, writer, projector, sessions, events.

The hub is the only writer of its store (one hub per SQLite file; several hub replicas on etcd
are a later issue, and will replace the cache's loading with a watch). So it keeps everything
in memory (:class:`Cache`), writes through to the store, and never reads the store on a hot
path.

* :class:`DeviceWriter` coalesces device updates (heartbeat times, reported status, acks)
  and writes every changed device in **one transaction** per flush: with 2,000 devices
  acknowledging a change, that is a handful of fsyncs instead of 2,000.
* :class:`Projector` decides what each device should run (:func:`hub.placing.project`, pure)
  and what exactly it is sent (:func:`build_desired`, pure). It works in batches: devices
  marked dirty (by an apply, a label change, a health or attestation change...) are projected
  together and every changed desired record is written in one transaction; then the devices'
  sessions get the new state. Level-based: it always recomputes from the cache, so marking a
  device twice is harmless.
* :class:`Sessions`: one per connected device; holds the newest desired state not yet sent
  (older ones are dropped: the device only needs the latest) and challenges.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edgefleet.api import ModelDeployment, parse_manifest
from edgefleet.logs import get_logger
from hub import objects
from hub.model import Device
from hub.placing import Projection, SecurityPolicy, project
from hub.store import Put, Store

log = get_logger(__name__)

MAX_EVENTS = 1000


@dataclass(frozen=True, slots=True)
class StoredObject:
    """An operator object as applied: its canonical manifest and the revision it was written at."""

    kind: str
    name: str
    manifest: Mapping[str, Any]
    revision: int
    encoded: bytes = b""  # the manifest as sent to devices: encoded once, shared by all

    def __post_init__(self) -> None:
        if not self.encoded:
            object.__setattr__(self, "encoded", objects.dumps(self.manifest))


@dataclass(slots=True)
class Cache:
    """Everything the hub knows, as last written to the store."""

    devices: dict[str, Device] = field(default_factory=dict)
    stored: dict[tuple[str, str], StoredObject] = field(default_factory=dict)
    deployments: dict[str, ModelDeployment] = field(default_factory=dict)
    models: dict[tuple[str, str], objects.ModelRecord] = field(default_factory=dict)
    desired: dict[str, objects.DesiredRecord] = field(default_factory=dict)
    revoked: dict[str, str] = field(default_factory=dict)  # serial hex -> device name
    events: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=MAX_EVENTS))

    @classmethod
    async def load(cls, store: Store) -> Cache:
        cache = cls()
        for kv in (await store.range(objects.DEVICES)).kvs:
            device = Device.from_json(objects.loads(kv.value))
            cache.devices[device.name] = device
        for kv in (await store.range(objects.OBJECTS)).kvs:
            cache.put_object(objects.manifest_of(kv.value), kv.mod_revision)
        for kv in (await store.range(objects.MODELS)).kvs:
            model = objects.ModelRecord.from_json(objects.loads(kv.value))
            cache.models[(model.name, model.version)] = model
        for kv in (await store.range(objects.DESIRED)).kvs:
            name = kv.key[len(objects.DESIRED) :]
            cache.desired[name] = objects.DesiredRecord.from_json(objects.loads(kv.value))
        for kv in (await store.range(objects.REVOKED)).kvs:
            cache.revoked[kv.key[len(objects.REVOKED) :]] = kv.value.decode()
        for kv in (await store.range(objects.EVENTS)).kvs[-MAX_EVENTS:]:
            cache.events.append(objects.loads(kv.value))
        return cache

    def put_object(self, manifest: Mapping[str, Any], revision: int) -> None:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        self.stored[(kind, name)] = StoredObject(kind, name, manifest, revision)
        if kind == "ModelDeployment":
            dep = parse_manifest(dict(manifest))
            assert isinstance(dep, ModelDeployment)
            self.deployments[name] = dep

    def drop_object(self, kind: str, name: str) -> None:
        self.stored.pop((kind, name), None)
        if kind == "ModelDeployment":
            self.deployments.pop(name, None)

    def objects_of(self, kind: str) -> list[StoredObject]:
        return sorted((o for (k, _), o in self.stored.items() if k == kind), key=lambda o: o.name)

    def security_policy(self) -> SecurityPolicy:
        """Every SecurityBaseline applies fleet-wide; any one requiring attestation wins."""
        require = any(
            bool(o.manifest.get("spec", {}).get("requireAttestation"))
            for o in self.objects_of("SecurityBaseline")
        )
        return SecurityPolicy(require_attestation=require)


@dataclass(frozen=True, slots=True)
class FleetPolicies:
    """What every device gets alike: the SecurityBaseline verdict, the DeviceHealthPolicies."""

    security: SecurityPolicy
    health_policies: tuple[bytes, ...]

    @classmethod
    def of(cls, cache: Cache) -> FleetPolicies:
        return cls(
            cache.security_policy(),
            tuple(o.encoded for o in cache.objects_of("DeviceHealthPolicy")),
        )


# -- what a device is sent -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DesiredContent:
    """The documents of one device's desired state, and a digest that changes with them."""

    deployments: tuple[str, ...]
    manifests: tuple[bytes, ...]
    artifact_metadata: tuple[bytes, ...]
    rollback_allowances: tuple[bytes, ...]
    digest: str
    excluded: Mapping[str, str]
    artifacts: frozenset[str]  # sha256 of every artifact the device may fetch


def build_desired(
    device: Device,
    cache: Cache,
    *,
    previous: frozenset[str],
    region: str,
    fleet: FleetPolicies | None = None,
) -> DesiredContent:
    """What ``device`` should be sent (pure over the cache). ``fleet``: what applies to every
    device, read from the cache once per batch (read here when not given)."""
    fleet = fleet or FleetPolicies.of(cache)
    projection: Projection = project(
        device,
        cache.deployments.values(),
        previous=previous,
        policy=fleet.security,
        region=region,
    )
    excluded = dict(projection.excluded)
    names: list[str] = []
    manifests: list[bytes] = []
    metadata: list[bytes] = []
    artifacts: set[str] = set()
    for name in projection.names:
        dep = cache.deployments[name]
        model = cache.models.get((dep.spec.model.name, dep.spec.model.version))
        if model is None:
            excluded[name] = (
                f"model {dep.spec.model.name} {dep.spec.model.version} has not been pushed"
            )
            continue
        names.append(name)
        manifests.append(cache.stored[("ModelDeployment", name)].encoded)
        metadata.append(model.envelope)
        artifacts.add(model.sha256)
    manifests.extend(fleet.health_policies)
    allowances: list[bytes] = []
    h = hashlib.sha256()
    for part in (*manifests, b"--", *metadata, b"--", *allowances):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return DesiredContent(
        tuple(names),
        tuple(manifests),
        tuple(sorted(set(metadata))),
        tuple(allowances),
        h.hexdigest(),
        excluded,
        frozenset(artifacts),
    )


async def wake_or_stop(wake: asyncio.Event, stop: asyncio.Event) -> None:
    """Wait until ``wake`` or ``stop`` is set; clears ``wake`` (the loops here are level-based:
    one wake-up handles everything marked so far)."""
    waiter = asyncio.ensure_future(wake.wait())
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        stopper.cancel()
    wake.clear()


# -- sessions --------------------------------------------------------------------------------------
class Session:
    """One connected device's stream: the newest unsent desired state, challenges, a close flag."""

    __slots__ = (
        "_wake",
        "challenges",
        "close_reason",
        "closed",
        "desired",
        "device",
        "sent_any",
        "serial",
    )

    def __init__(self, device: str, serial: str) -> None:
        self.device = device
        self.serial = serial
        self.desired: DesiredContent | None = None
        self.sent_any = False  # set by the stream once a desired state went out
        self.challenges: list[bytes] = []
        self.closed = False
        self.close_reason = ""
        self._wake = asyncio.Event()

    def offer(self, content: DesiredContent) -> None:
        self.desired = content
        self._wake.set()

    def challenge(self, nonce: bytes) -> None:
        self.challenges.append(nonce)
        self._wake.set()

    def close(self, reason: str) -> None:
        self.closed = True
        self.close_reason = reason
        self._wake.set()

    async def wait(self) -> None:
        await self._wake.wait()
        self._wake.clear()


class Sessions:
    def __init__(self) -> None:
        self._by_device: dict[str, Session] = {}

    def open(self, device: str, serial: str) -> Session:
        old = self._by_device.get(device)
        if old is not None:
            old.close("replaced by a newer stream from the same device")
        session = Session(device, serial)
        self._by_device[device] = session
        return session

    def release(self, session: Session) -> None:
        if self._by_device.get(session.device) is session:
            del self._by_device[session.device]

    def get(self, device: str) -> Session | None:
        return self._by_device.get(device)

    def __len__(self) -> int:
        return len(self._by_device)

    def names(self) -> list[str]:
        return list(self._by_device)


# -- writing ---------------------------------------------------------------------------------------
class DeviceWriter:
    """Coalesces device record updates and events; flushes them in one transaction."""

    name = "device-writer"

    def __init__(self, store: Store, cache: Cache, *, period: float = 0.2) -> None:
        self._store = store
        self._cache = cache
        self._period = period
        self._dirty: set[str] = set()
        self._events: list[dict[str, Any]] = []
        self._wake = asyncio.Event()
        self._flushed = asyncio.Event()
        self._seq = 0

    def update(self, device: Device) -> None:
        self._cache.devices[device.name] = device
        self._dirty.add(device.name)
        self._wake.set()

    def event(self, kind: str, name: str, type_: str, reason: str, message: str) -> None:
        ev = {
            "type": type_,
            "reason": reason,
            "message": message,
            "object": {"kind": kind, "name": name},
            "time": time.time(),
        }
        self._cache.events.append(ev)
        self._events.append(ev)
        self._wake.set()
        log.info("event", kind=kind, name=name, type=type_, reason=reason, message=message)

    async def flush(self) -> None:
        if not self._dirty and not self._events:
            return
        names, self._dirty = self._dirty, set()
        events, self._events = self._events, []
        ops: list[Put] = [
            Put(objects.device_key(n), objects.dumps(self._cache.devices[n].to_json()))
            for n in sorted(names)
            if n in self._cache.devices
        ]
        for ev in events:
            self._seq += 1
            key = f"{objects.EVENTS}{int(ev['time'] * 1000):015d}-{self._seq:06d}"
            ops.append(Put(key, objects.dumps(ev)))
        try:
            await self._store.txn((), ops)
        except Exception:
            self._dirty |= names  # retried at the next flush
            self._events = events + self._events
            raise
        if events:
            await self._trim_events()

    async def _trim_events(self) -> None:
        kvs = (await self._store.range(objects.EVENTS)).kvs
        for kv in kvs[: max(0, len(kvs) - MAX_EVENTS)]:
            await self._store.delete(kv.key)

    async def run(self, stop: asyncio.Event) -> None:
        backoff = self._period
        while not stop.is_set():
            await wake_or_stop(self._wake, stop)
            if not stop.is_set():
                await asyncio.sleep(self._period)  # let a burst of updates gather
            try:
                await self.flush()
                backoff = self._period
            except Exception as exc:
                log.error("device-writer-failed", error=str(exc))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                self._wake.set()
        await self.flush()


class Projector:
    """Batched, level-based projection of desired state onto devices (see module doc)."""

    name = "projector"

    def __init__(
        self,
        store: Store,
        cache: Cache,
        sessions: Sessions,
        *,
        region: str,
        on_pushed: Callable[[str, int], None] | None = None,
    ) -> None:
        self._store = store
        self._cache = cache
        self._sessions = sessions
        self._region = region
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self.contents: dict[str, DesiredContent] = {}
        self._on_pushed = on_pushed

    def mark(self, names: Iterable[str]) -> None:
        self._dirty.update(names)
        self._wake.set()

    def mark_all(self) -> None:
        self.mark(self._cache.devices)

    async def project(self, names: Iterable[str]) -> None:
        changed: dict[str, tuple[DesiredContent, objects.DesiredRecord | None]] = {}
        fleet = FleetPolicies.of(self._cache)
        for name in sorted(set(names)):
            device = self._cache.devices.get(name)
            if device is None:
                self.contents.pop(name, None)
                continue
            previous = self._cache.desired.get(name)
            content = build_desired(
                device,
                self._cache,
                previous=frozenset(previous.deployments) if previous else frozenset(),
                region=self._region,
                fleet=fleet,
            )
            self.contents[name] = content
            if previous is None or previous.digest != content.digest:
                changed[name] = (content, previous)
            else:
                session = self._sessions.get(name)
                if session is not None and not session.sent_any and session.desired is None:
                    session.offer(content)  # connected before this hub had projected it
        if not changed:
            return
        current = (await self._store.range(objects.DESIRED + "\x00")).revision  # cheap read
        generation = current + 1  # the revision of the transaction below
        records: dict[str, objects.DesiredRecord] = {}
        for name, (content, previous) in changed.items():
            floor = max(previous.generation if previous else 0, self._acked(name))
            records[name] = objects.DesiredRecord(
                max(generation, floor + 1), content.deployments, content.digest
            )
        await self._store.txn(
            (),
            [
                Put(objects.desired_key(n), objects.dumps(r.to_json()))
                for n, r in sorted(records.items())
            ],
        )
        self._cache.desired.update(records)
        for name in changed:
            session = self._sessions.get(name)
            if session is not None:
                session.offer(self.contents[name])

    def _acked(self, name: str) -> int:
        device = self._cache.devices.get(name)
        return device.generation_acked if device else 0

    def content_for(self, name: str) -> DesiredContent | None:
        return self.contents.get(name)

    async def run(self, stop: asyncio.Event) -> None:
        backoff = 0.05
        while not stop.is_set():
            await wake_or_stop(self._wake, stop)
            if stop.is_set():
                break
            await asyncio.sleep(0.01)  # gather a burst (an apply marks every device at once)
            names, self._dirty = self._dirty, set()
            try:
                await self.project(names)
                backoff = 0.05
            except Exception as exc:
                log.error("projection-failed", devices=len(names), error=str(exc))
                self._dirty |= names
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                self._wake.set()
