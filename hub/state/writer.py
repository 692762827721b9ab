"""The device writer: device record updates and events, coalesced, one transaction per batch.

Updates (reports, acks, phase changes) go to the cache at once and to the store at the next
batch (every ``period``, 0.2 s): 2,000 acknowledgements cost a handful of fsyncs, not 2,000.

**Conditional writes** (``conditional=True``: hub replicas, where two replicas write one
device's record — the one holding its stream the status and heartbeats, the leader its phase,
admin calls its spec): each record is written with a compare on the mod revision of the stored
version this writer's copy was made from (its *base*: its own last write, or the record taken
from another replica through :meth:`observed`). When the compare fails, the stored record is
read and merged field by field (:func:`merge_record`, three-way): a field this writer changed
since its base takes its value, every other field the stored one; then written again on the
new revision. So a heartbeat written here never undoes a cordon or a phase change written
elsewhere meanwhile, and a record deleted meanwhile is not brought back (it leaves the
cache).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgefleet.backoff import Backoff
from edgefleet.errors import CompareFailed
from edgefleet.logs import get_logger
from hub.decide.devices import Device
from hub.state import storekeys
from hub.state.batchloop import GIVE_UP_AFTER, BatchLoop
from hub.state.cache import MAX_EVENTS, Cache
from hub.state.store import Compare, Put, Store

log = get_logger(__name__)

RETRY_CAP = 10.0


def _event(kind: str, name: str, type_: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": type_,
        "reason": reason,
        "message": message,
        "object": {"kind": kind, "name": name},
        "time": time.time(),
    }


def offline_event(kind: str, name: str, type_: str, reason: str, message: str) -> Put:
    """An event written by a command that runs beside the hub rather than in it (``hub token
    create``): a random sequence part keeps its key apart from the serving hub's own, and the
    serving hub shows it once it reloads its cache (at its next start)."""
    ev = _event(kind, name, type_, reason, message)
    return Put(
        f"{storekeys.EVENTS}{int(ev['time'] * 1000):015d}-{secrets.randbelow(10**6):06d}",
        storekeys.dumps(ev),
    )


@dataclass(frozen=True, slots=True)
class PreparedEvent:
    """An event record and the Put that stores it (:meth:`DeviceWriter.prepare_event`)."""

    put: Put
    event: dict[str, Any]


class DeviceWriter:
    """Coalesces device record updates and events; flushes them in one transaction."""

    name = "device-writer"

    def __init__(
        self,
        store: Store,
        cache: Cache,
        *,
        period: float = 0.2,
        give_up_after: float = GIVE_UP_AFTER,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        conditional: bool = False,
    ) -> None:
        self._store = store
        self._cache = cache
        self.conditional = conditional
        self._base: dict[str, tuple[int, dict[str, Any]]] = {}
        """Conditional writes: per device, the stored version (mod revision, record) that the
        cache's copy was made from."""
        self.merged = 0
        """Conditional writes that found the record changed elsewhere and merged (metrics)."""
        self._on_event = on_event  # told of every event recorded (the hub's metrics count them)
        self._dirty: set[str] = set()
        self._events: list[dict[str, Any]] = []
        self._seq = 0
        self._batches = BatchLoop(
            self.name,
            self.flush,
            gather=period,
            backoff=Backoff(period, max(period, RETRY_CAP)),
            give_up_after=give_up_after,
            final=True,
        )

    def observed(self, name: str, mod_revision: int, record: dict[str, Any]) -> None:
        """The stored version (``record`` at ``mod_revision``) the cache's copy of ``name`` now
        comes from (a record taken from another replica, or written by enrollment)."""
        if self.conditional:
            self._base[name] = (mod_revision, record)

    def base_revision(self, name: str) -> int | None:
        """The store revision the cache's copy of ``name`` comes from (None: not known)."""
        base = self._base.get(name)
        return base[0] if base is not None else None

    def taken(self, name: str, mod_revision: int, record: dict[str, Any]) -> Device:
        """A record another replica wrote, for the cache: as it is, or, when this writer has a
        change of ``name`` not written yet, merged with it (that change is kept); it becomes
        the base of the next write here."""
        device = Device.from_json(record)
        base = self._base.get(name)
        mine = self._cache.devices.get(name)
        if self.conditional and name in self._dirty and base is not None and mine is not None:
            device = Device.from_json(merge_record(base[1], mine.to_json(), record))
        self.observed(name, mod_revision, record)
        return device

    def update(self, device: Device) -> None:
        self._cache.put_device(device)
        self._dirty.add(device.name)
        self._batches.wake()

    def event(self, kind: str, name: str, type_: str, reason: str, message: str) -> None:
        ev = _event(kind, name, type_, reason, message)
        self._cache.events.append(ev)
        self._events.append(ev)
        self._batches.wake()
        if self._on_event is not None:
            self._on_event(ev)
        log.info("event", kind=kind, name=name, type=type_, reason=reason, message=message)

    def prepare_event(
        self, kind: str, name: str, type_: str, reason: str, message: str
    ) -> PreparedEvent:
        """An event to write in the caller's own transaction, with the change it describes
        (then :meth:`committed`): the change is never stored without its event."""
        ev = _event(kind, name, type_, reason, message)
        return PreparedEvent(Put(self._event_key(ev), storekeys.dumps(ev)), ev)

    def committed(self, prepared: PreparedEvent) -> None:
        """The transaction holding ``prepared`` committed: show the event."""
        ev = prepared.event
        self._cache.events.append(ev)
        if self._on_event is not None:
            self._on_event(ev)
        obj = ev["object"]
        log.info(
            "event",
            kind=obj["kind"],
            name=obj["name"],
            type=ev["type"],
            reason=ev["reason"],
            message=ev["message"],
        )

    def _event_key(self, ev: dict[str, Any]) -> str:
        self._seq += 1
        return f"{storekeys.EVENTS}{int(ev['time'] * 1000):015d}-{self._seq:06d}"

    async def flush(self) -> None:
        """Write everything pending now; on failure it stays pending (and the loop retries)."""
        if not self._dirty and not self._events:
            return
        names, self._dirty = self._dirty, set()
        events, self._events = self._events, []
        try:
            if self.conditional:
                await self._write_conditionally(sorted(names), events)
            else:
                ops: list[Put] = [
                    Put(storekeys.device_key(n), storekeys.dumps(self._cache.devices[n].to_json()))
                    for n in sorted(names)
                    if n in self._cache.devices
                ]
                ops += [Put(self._event_key(ev), storekeys.dumps(ev)) for ev in events]
                await self._store.txn((), ops)
        except Exception:
            self._dirty |= names  # retried at the next flush
            self._events = events + self._events
            self._batches.wake()
            raise
        if events:
            await self._trim_events()

    async def _base_of(self, name: str) -> tuple[int, dict[str, Any]]:
        base = self._base.get(name)
        if base is None:  # loaded at start: the stored version now is the best guess
            kv = await self._store.get(storekeys.device_key(name))
            if kv is None:  # a new record: it must not exist when written
                return (0, self._cache.devices[name].to_json())
            base = self._base[name] = (kv.mod_revision, storekeys.loads(kv.value))
        return base

    async def _write_conditionally(self, names: list[str], events: list[dict[str, Any]]) -> None:
        event_ops = [Put(self._event_key(ev), storekeys.dumps(ev)) for ev in events]
        pending = [n for n in names if n in self._cache.devices]
        for _ in range(len(pending) + 3):  # each failure settles one record at least
            compares: list[Compare] = []
            ops: list[Put] = []
            records: dict[str, dict[str, Any]] = {}
            for name in pending:
                base = await self._base_of(name)
                records[name] = self._cache.devices[name].to_json()
                key = storekeys.device_key(name)
                compares.append(Compare(key, base[0]))
                ops.append(Put(key, storekeys.dumps(records[name])))
            try:
                revision = await self._store.txn(compares, [*ops, *event_ops])
            except CompareFailed as exc:
                # every record the failure names is merged before the next try: retrying a
                # transaction of N records once per record changed elsewhere wrote N x k
                # records to etcd's log for k changed (hundreds of MB after a replica's bulk
                # write: the soak harness, seed 62, docs/soak.md)
                for key in (exc.key, *exc.also):
                    if key.startswith(storekeys.DEVICES):
                        await self._merge(key[len(storekeys.DEVICES) :], pending)
                continue
            for name, record in records.items():
                self._base[name] = (revision, record)
            return
        raise CompareFailed(storekeys.DEVICES, 0, 0)  # changed elsewhere all along: next batch

    async def _merge(self, name: str, pending: list[str]) -> None:
        """The stored record of ``name`` changed elsewhere: merge it into the cache's copy."""
        kv = await self._store.get(storekeys.device_key(name))
        if kv is None:  # deleted elsewhere (edgectl delete device): not brought back
            self._base.pop(name, None)
            self._cache.drop_device(name)
            if name in pending:
                pending.remove(name)
            log.info("device record deleted elsewhere", device=name)
            return
        theirs = storekeys.loads(kv.value)
        base = self._base.get(name, (0, theirs))[1]
        device = self._cache.devices.get(name)
        if device is not None:
            merged = merge_record(base, device.to_json(), theirs)
            self._cache.put_device(Device.from_json(merged))
        self._base[name] = (kv.mod_revision, theirs)
        self.merged += 1
        log.info("device record merged", device=name)

    async def _trim_events(self) -> None:
        kvs = (await self._store.range(storekeys.EVENTS)).kvs
        for kv in kvs[: max(0, len(kvs) - MAX_EVENTS)]:
            await self._store.delete(kv.key)

    async def run(self, stop: asyncio.Event) -> None:
        """Flush batch after batch until ``stop``, then once more (:class:`BatchLoop`)."""
        await self._batches.run(stop)


def merge_record(
    base: dict[str, Any], ours: dict[str, Any], theirs: dict[str, Any]
) -> dict[str, Any]:
    """A device record changed here (``ours``) and elsewhere (``theirs``) since ``base``:
    each top-level field takes ours where we changed it since ``base``, else theirs (pure)."""
    merged = dict(theirs)
    for key in ours.keys() | base.keys():
        if ours.get(key) != base.get(key):
            if key in ours:
                merged[key] = ours[key]
            else:
                merged.pop(key, None)
    return merged
