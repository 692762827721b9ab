"""The device writer: device record updates and events, coalesced, one transaction per batch.

Updates (reports, acks, phase changes) go to the cache at once and to the store at the next
batch (every ``period``, 0.2 s): 2,000 acknowledgements cost a handful of fsyncs, not 2,000.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgefleet.backoff import Backoff
from edgefleet.logs import get_logger
from hub import storekeys
from hub.batching import GIVE_UP_AFTER, BatchLoop
from hub.caching import MAX_EVENTS, Cache
from hub.devices import Device
from hub.store import Put, Store

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
    ) -> None:
        self._store = store
        self._cache = cache
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

    def update(self, device: Device) -> None:
        self._cache.devices[device.name] = device
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
        ops: list[Put] = [
            Put(storekeys.device_key(n), storekeys.dumps(self._cache.devices[n].to_json()))
            for n in sorted(names)
            if n in self._cache.devices
        ]
        for ev in events:
            ops.append(Put(self._event_key(ev), storekeys.dumps(ev)))
        try:
            await self._store.txn((), ops)
        except Exception:
            self._dirty |= names  # retried at the next flush
            self._events = events + self._events
            self._batches.wake()
            raise
        if events:
            await self._trim_events()

    async def _trim_events(self) -> None:
        kvs = (await self._store.range(storekeys.EVENTS)).kvs
        for kv in kvs[: max(0, len(kvs) - MAX_EVENTS)]:
            await self._store.delete(kv.key)

    async def run(self, stop: asyncio.Event) -> None:
        """Flush batch after batch until ``stop``, then once more (:class:`BatchLoop`)."""
        await self._batches.run(stop)
