"""The scheduler controller: keeps ``replicas.total`` placements, stored, with their reasons.

A pass reads the cache (devices as :class:`hub.scheduling.Node`, deployments, the stored
placements, perDevice deployments where the projector sent them), runs the pure
:func:`hub.scheduling.schedule` off the event loop, and when placements changed writes every
changed ``/placements/NAME`` record and the events that describe the change in **one**
transaction (a replica moved off a device or preempted: a Warning event with the reason;
replicas placed: a Normal ``Scheduled`` event), then updates the cache and marks the devices
concerned for projection. The explanations of the last pass live in memory
(``cache.explanations``: the deployment's ``Scheduled`` condition).

Placements are stored, so a restarted hub keeps them (the first pass keeps every placement
that still qualifies). Wakes: any projection mark (an apply, a label, health, attestation or
phase change, a device connecting), and, while a device holding a placement is not Ready, a
tick of a quarter of ``devices.rescheduleAfter`` (at most 5 s), which notices it silent for
longer than that. A quiet fleet costs no passes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from edgefleet.api import ModelDeployment
from edgefleet.backoff import Backoff
from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop
from hub import storekeys
from hub.batching import GIVE_UP_AFTER, BatchLoop
from hub.caching import Cache
from hub.devices import DevicePhase
from hub.projecting import Projector
from hub.scheduling import Eviction, Node, Schedule, node_of, schedule
from hub.store import Delete, Put, Store
from hub.writing import DeviceWriter, PreparedEvent

log = get_logger(__name__)

GATHER = 0.05
RETRY = Backoff(0.05, 10.0)
MAX_TICK = 5.0
MAX_NAMED = 5  # devices named in one event


class Scheduler:
    """Runs :func:`hub.scheduling.schedule` and stores what it decides (see module doc)."""

    name = "scheduler"

    def __init__(
        self,
        store: Store,
        cache: Cache,
        projector: Projector,
        writer: DeviceWriter,
        *,
        region: str,
        reschedule_after_s: float,
        clock: Callable[[], float] = time.time,
        give_up_after: float = GIVE_UP_AFTER,
    ) -> None:
        self._store = store
        self._cache = cache
        self._projector = projector
        self._writer = writer
        self._region = region
        self._grace = reschedule_after_s
        self._clock = clock
        self._tick = min(max(reschedule_after_s / 4, 0.05), MAX_TICK)
        self._batches = BatchLoop(
            self.name, self._pass, gather=GATHER, backoff=RETRY, give_up_after=give_up_after
        )
        self._lock = asyncio.Lock()
        projector.on_mark = self.wake
        # the fleet autoscaler's total for a deployment (hub/fleetscaling.py); None: the spec's
        self.totals: Callable[[str], int | None] = lambda name: None

    def wake(self) -> None:
        self._batches.wake()

    async def run(self, stop: asyncio.Event) -> None:
        ticker = asyncio.create_task(self._ticks(stop))
        try:
            await self._batches.run(stop)
        finally:
            ticker.cancel()

    async def _ticks(self, stop: asyncio.Event) -> None:
        self.wake()
        while not await wait_for_stop(stop, self._tick):
            if self._waiting_out():
                self.wake()

    def _waiting_out(self) -> bool:
        """Whether a placed device is not Ready: only time can move its replicas (every
        other change marks the projector, which wakes the scheduler)."""
        devices = self._cache.devices
        placed = set().union(*self._cache.placements.values()) if self._cache.placements else ()
        return any(
            (d := devices.get(name)) is None or d.phase is not DevicePhase.READY for name in placed
        )

    def plan(self) -> Schedule:
        """The scheduler's decision on what the cache holds now (pure over a snapshot)."""
        return self._snapshot().decide()

    def _snapshot(self) -> _Snapshot:
        cache = self._cache
        policy = cache.security_policy()
        nodes = [
            node_of(device, policy, region=self._region)
            for _, device in sorted(cache.devices.items())
        ]
        deployments = [
            _with_total(d, self.totals(d.metadata.name)) for d in cache.deployments.values()
        ]
        artifacts = {}
        for dep in deployments:
            model = cache.models.get((dep.spec.model.name, dep.spec.model.version))
            if model is not None:
                artifacts[dep.metadata.name] = model.sha256
        pinned: dict[str, set[str]] = {}
        for device, record in cache.desired.items():
            for name in record.deployments:
                pinned.setdefault(name, set()).add(device)
        current = {k: v for k, v in cache.placements.items() if k in cache.deployments}
        return _Snapshot(deployments, nodes, current, self._clock(), pinned, artifacts, self._grace)

    async def pass_now(self) -> None:
        """One pass at once (tests, and the loop's work)."""
        await self._pass()

    async def _pass(self) -> None:
        async with self._lock:
            snapshot = self._snapshot()
            result = await asyncio.to_thread(snapshot.decide)
            await self._apply(result)

    async def _apply(self, result: Schedule) -> None:
        cache = self._cache
        cache.explanations = dict(result.explanations)
        before = cache.placements
        after = {
            name: frozenset(devices)
            for name, devices in result.placements.items()
            if name in cache.deployments
        }
        changed = {n for n in after if after[n] != before.get(n, frozenset())}
        gone = {n for n in before if n not in after}
        if not changed and not gone:
            return
        events = self._events(result.evictions, before, after, changed)
        puts: list[Put | Delete] = [
            Put(
                storekeys.placement_key(n),
                storekeys.dumps({"devices": sorted(after[n])}),
            )
            for n in sorted(changed)
        ]
        puts += [Delete(storekeys.placement_key(n)) for n in sorted(gone)]
        await self._store.txn([], [*puts, *(e.put for e in events)])
        for e in events:
            self._writer.committed(e)
        touched: set[str] = set()
        for n in changed | gone:
            touched |= before.get(n, frozenset()) ^ after.get(n, frozenset())
        cache.placements = {**{n: d for n, d in before.items() if n not in gone}, **after}
        for n in gone:
            cache.placements.pop(n, None)
        log.info(
            "placements changed",
            deployments=len(changed) + len(gone),
            devices=len(touched),
            evictions=len(result.evictions),
        )
        self._projector.mark(touched, notify=False)

    def _events(
        self,
        evictions: tuple[Eviction, ...],
        before: dict[str, frozenset[str]],
        after: dict[str, frozenset[str]],
        changed: set[str],
    ) -> list[PreparedEvent]:
        w = self._writer
        out = []
        for e in evictions:
            if e.deployment not in after:
                continue
            reason = "Preempted" if e.by else "Rescheduled"
            out.append(
                w.prepare_event(
                    "ModelDeployment",
                    e.deployment,
                    "Warning",
                    reason,
                    f"replica taken off {e.device}: {e.reason}",
                )
            )
        for name in sorted(changed):
            added = sorted(after[name] - before.get(name, frozenset()))
            if not added:
                continue
            shown = ", ".join(added[:MAX_NAMED])
            more = f" and {len(added) - MAX_NAMED} more" if len(added) > MAX_NAMED else ""
            out.append(
                w.prepare_event(
                    "ModelDeployment",
                    name,
                    "Normal",
                    "Scheduled",
                    f"{len(added)} replica(s) placed on {shown}{more} ({len(after[name])} in all)",
                )
            )
        return out


def _with_total(dep: ModelDeployment, total: int | None) -> ModelDeployment:
    """``dep`` with the autoscaler's ``replicas.total`` (as it is without one)."""
    if total is None or dep.spec.replicas.total is None or total == dep.spec.replicas.total:
        return dep
    replicas = replace(dep.spec.replicas, total=total)
    return replace(dep, spec=replace(dep.spec, replicas=replicas))


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """What a pass decides on, copied from the cache on the event loop."""

    deployments: list[ModelDeployment]
    nodes: list[Node]
    current: dict[str, frozenset[str]]
    now: float
    pinned: dict[str, set[str]]
    artifacts: dict[str, str]
    grace: float

    def decide(self) -> Schedule:
        return schedule(
            self.deployments,
            self.nodes,
            self.current,
            self.now,
            pinned=self.pinned,
            artifacts=self.artifacts,
            not_ready_grace_s=self.grace,
        )
