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
from collections.abc import Mapping

from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop
from hub.context import HubContext
from hub.decide.devices import DevicePhase
from hub.decide.placement import lifecycle_phase

log = get_logger(__name__)


class Lifecycle:
    name = "lifecycle"

    def __init__(self, ctx: HubContext, last_seen: Mapping[str, float]) -> None:
        self.ctx = ctx
        self.last_seen = last_seen

    def scan(self) -> list[str]:
        """Apply phase changes; the names of the devices that changed."""
        ctx = self.ctx
        now = ctx.clock()
        grace = ctx.config.devices.heartbeat_grace_s
        changed = []
        for name, stored in list(ctx.cache.devices.items()):
            seen = self.last_seen.get(name)
            device = stored
            if seen is not None and (stored.last_heartbeat or 0) < seen:
                device = stored.with_(last_heartbeat=seen)
            phase, _ = lifecycle_phase(
                device, now=now, grace_s=grace, observed_since=ctx.observed_since.since
            )
            if phase is device.phase:
                if (
                    seen is not None
                    and device.last_heartbeat != ctx.cache.devices[name].last_heartbeat
                ):
                    ctx.cache.devices[name] = device  # keep the time; written with the next change
                continue
            changed.append(name)
            ctx.writer.update(device.with_(phase=phase))
            if phase is DevicePhase.NOT_READY:
                ctx.writer.event(
                    "Device", name, "Warning", "NotReady", f"no message for more than {grace:g} s"
                )
            elif phase is DevicePhase.READY:
                ctx.writer.event("Device", name, "Normal", "Ready", "messages arrive again")
        if changed:
            ctx.projector.mark(changed)
        return changed

    async def run(self, stop: asyncio.Event) -> None:
        period = max(self.ctx.config.devices.heartbeat_grace_s / 4, 0.05)
        while not stop.is_set():
            if not await wait_for_stop(stop, period):
                self.scan()
