"""The lifecycle controller: a silent device becomes NotReady, one that speaks again Ready.

A device whose last message is older than ``devices.heartbeatGrace`` becomes NotReady (an
event, and its desired state is projected again: NoSchedule taint); a message brings it back to
Ready. The decision is :func:`hub.decide.placement.lifecycle_phase` (pure); this loop only applies
it. It
scans every device once per ``grace / 4`` (a scan of 2,000 devices costs about a millisecond),
so no per-device timers exist. Silence counts from this hub's own observations
(:mod:`hub.decide.staleness`): after a hub start or election, a device Ready before gets the whole
grace period to reconnect.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop
from hub.decide.devices import DevicePhase
from hub.decide.placement import lifecycle_phase
from hub.decide.staleness import ObservedSince
from hub.state.cache import Cache
from hub.state.projector import Projector
from hub.state.writer import DeviceWriter

log = get_logger(__name__)


class Lifecycle:
    name = "lifecycle"

    def __init__(
        self,
        cache: Cache,
        writer: DeviceWriter,
        projector: Projector,
        last_seen: Mapping[str, float],
        *,
        grace_s: float,
        observed_since: ObservedSince,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``last_seen``: each device's last message (the device servicer's); ``grace_s``:
        hub.toml's ``devices.heartbeatGrace``; ``observed_since``: when this hub began to
        observe devices (its start, its election)."""
        self._cache = cache
        self._writer = writer
        self._projector = projector
        self.last_seen = last_seen
        self._grace = grace_s
        self._observed_since = observed_since
        self._clock = clock

    def scan(self) -> list[str]:
        """Apply phase changes; the names of the devices that changed."""
        cache, writer = self._cache, self._writer
        now = self._clock()
        grace = self._grace
        changed = []
        for name, stored in list(cache.devices.items()):
            seen = self.last_seen.get(name)
            device = stored
            if seen is not None and (stored.last_heartbeat or 0) < seen:
                device = stored.with_(last_heartbeat=seen)
            phase, _ = lifecycle_phase(
                device, now=now, grace_s=grace, observed_since=self._observed_since.since
            )
            if phase is device.phase:
                if seen is not None and device.last_heartbeat != cache.devices[name].last_heartbeat:
                    cache.devices[name] = device  # keep the time; written with the next change
                continue
            changed.append(name)
            writer.update(device.with_(phase=phase))
            if phase is DevicePhase.NOT_READY:
                writer.event(
                    "Device", name, "Warning", "NotReady", f"no message for more than {grace:g} s"
                )
            elif phase is DevicePhase.READY:
                writer.event("Device", name, "Normal", "Ready", "messages arrive again")
        if changed:
            self._projector.mark(changed)
        return changed

    async def run(self, stop: asyncio.Event) -> None:
        period = max(self._grace / 4, 0.05)
        while not stop.is_set():
            if not await wait_for_stop(stop, period):
                self.scan()
