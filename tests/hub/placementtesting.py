"""Placement inputs: a device with labels and the parts a placement decision is made of."""

from __future__ import annotations

from hubtesting import FakeClock

from hub.controllers.placement import Scheduler
from hub.decide.devices import Device, DevicePhase
from hub.state.cache import Cache
from hub.state.projector import Projector
from hub.state.sessions import Sessions
from hub.state.store import SqliteStore
from hub.state.writer import DeviceWriter

GiB = 1024**3


def device(name: str, now: float, **labels: str) -> Device:
    return Device(
        name,
        labels=labels,
        phase=DevicePhase.READY,
        last_heartbeat=now,
        facts={"facts": {"cpuCount": 4, "memoryTotalBytes": 4 * GiB}},
    )


def parts(
    store: SqliteStore, cache: Cache, clock: FakeClock
) -> tuple[Scheduler, Projector, DeviceWriter]:
    writer = DeviceWriter(store, cache)
    projector = Projector(store, cache, Sessions(), region="eu")
    scheduler = Scheduler(
        store, cache, projector, writer, region="eu", reschedule_after_s=60.0, clock=clock
    )
    return scheduler, projector, writer
