"""The scheduler controller: keeps ``replicas.total`` placements, stored, with their reasons.

A pass reads the cache (devices as :class:`hub.decide.schedule.Node`, deployments, the stored
placements, perDevice deployments where the projector sent them), runs the pure
:func:`hub.decide.schedule.schedule` off the event loop, and when placements changed writes every
changed ``/placements/NAME`` record and the events that describe the change in **one**
transaction (a replica moved off a device or preempted: a Warning event with the reason;
replicas placed: a Normal ``Scheduled`` event), then updates the cache and marks the devices
concerned for projection. The explanations of the last pass live in memory
(``cache.explanations``: the deployment's ``Scheduled`` condition).

Placements are stored, so a restarted hub keeps them (the first pass keeps every placement
that still qualifies). Wakes, from the cache's change feed (:mod:`hub.state.feed`): any
projection mark (:data:`~hub.state.feed.PROJECTING`: an apply, a label, health, attestation or
phase change, a device connecting) and a total the fleet autoscaler changed
(:data:`~hub.state.feed.SCALED`); and, while a device holding a placement is not Ready, a
tick of a quarter of ``devices.rescheduleAfter`` (at most 5 s), which notices it silent for
longer than that. A quiet fleet costs no passes.

Not per key, unlike the rollout controller: where one replica goes depends on every other
deployment's (capacity, priorities, preemption, spreading), so a decision is the whole
fleet's by nature. A change wakes **one** pass, gathered (:data:`GATHER`: the changes that
come together, an apply marking every device, make one pass) and never run twice at once
(:class:`hub.state.batchloop.BatchLoop`); what a pass costs is the scheduler's
(``bench/scheduling.py``), and what it changes is written and projected per deployment and
device. A device's silence counts from its last
heartbeat or from when this hub began to observe (its start, its election: ``observed_since``,
:mod:`hub.decide.staleness`), whichever is later: the hub's own downtime moves nothing. No placement
makes a device's desired state larger than it can receive (:mod:`hub.decide.statebound`).

Moves keep the rollout budget (:mod:`hub.decide.moves`): each pass plans, per deployment, which
devices are sent it now (placements started, old devices draining until their replacements
serve, new ones waiting for ``maxSurge``); the record stores the move and the cache's
``sent_placements`` is what the projector sends. While a move is under way a tick every
:data:`MOVE_TICK` advances it from the devices' reports, without a scheduling pass.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from edgefleet.api import ModelDeployment, PriorityClass, TaintEffect
from edgefleet.backoff import Backoff
from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop
from hub.decide.devices import Device, DevicePhase
from hub.decide.moves import MOVING, MoveStep, Replica, plan_moves
from hub.decide.placement import taints_for, tolerates, with_secret_tpm
from hub.decide.priority import class_of, classes_of, resolved
from hub.decide.rollout import Budget, resolve_budget
from hub.decide.schedule import Eviction, Node, Schedule, StateBound, node_of, schedule
from hub.decide.staleness import ObservedSince
from hub.decide.statebound import state_bound
from hub.decide.status import revisions_of
from hub.state import feed as kinds
from hub.state import storekeys
from hub.state.batchloop import GIVE_UP_AFTER, BatchLoop
from hub.state.cache import Cache
from hub.state.projector import Projector
from hub.state.snapshots import snapshot_of
from hub.state.store import Delete, Put, Store
from hub.state.writer import DeviceWriter, PreparedEvent

log = get_logger(__name__)

GATHER = 0.05
RETRY = Backoff(0.05, 10.0)
MAX_TICK = 5.0
MOVE_TICK = 0.5  # while a move is under way: how often devices' reports are looked at
MAX_NAMED = 5  # devices named in one event


class Scheduler:
    """Runs :func:`hub.decide.schedule.schedule` and stores what it decides (see module doc)."""

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
        observed_since: ObservedSince | None = None,
    ) -> None:
        self._store = store
        self._cache = cache
        self._projector = projector
        self._writer = writer
        self._region = region
        self._grace = reschedule_after_s
        self._clock = clock
        # when this hub began to observe devices (hub.decide.staleness): its start, its election
        self.observed_since = observed_since or ObservedSince(clock())
        self._tick = min(max(reschedule_after_s / 4, 0.05), MAX_TICK)
        self._batches = BatchLoop(
            self.name, self._pass, gather=GATHER, backoff=RETRY, give_up_after=give_up_after
        )
        self._lock = asyncio.Lock()
        self._full_owed = True  # a scheduling pass is owed (else only the moves advance)
        # devices marked to be projected again (their labels, health, an apply...) and a
        # total the fleet autoscaler changed: look again (module doc, "Wakes")
        cache.feed.watch((kinds.PROJECTING, kinds.SCALED), lambda kind, name: self.wake())

    def wake(self) -> None:
        self._full_owed = True
        self._batches.wake()

    def _advance(self) -> None:
        """Look at the moves under way again: what devices report decides when an old
        replica may stop (cheap: no scheduling pass, unless one is owed anyway)."""
        self._batches.wake()

    async def run(self, stop: asyncio.Event) -> None:
        ticker = asyncio.create_task(self._ticks(stop))
        try:
            await self._batches.run(stop)
        finally:
            ticker.cancel()

    async def _ticks(self, stop: asyncio.Event) -> None:
        self.wake()
        last = time.monotonic()
        while not await wait_for_stop(stop, min(self._tick, MOVE_TICK)):
            if time.monotonic() - last >= self._tick:
                last = time.monotonic()
                if self._waiting_out():
                    self.wake()
                    continue
            if self._cache.draining or self._cache.waiting:
                self._advance()

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
        classes = classes_of(o.manifest for o in cache.objects_of(PriorityClass.KIND))
        tpm_secrets = cache.tpm_secrets()
        deployments = [
            # a deployment mounting a Secret that requires a TPM is placed on TPM-attested
            # devices only, as one with placement.requireTpm
            with_secret_tpm(
                resolved(_with_total(d, cache.scaled_totals.get(d.metadata.name)), classes),
                tpm_secrets,
            )
            for d in cache.deployments.values()
        ]
        never = frozenset(d.metadata.name for d in deployments if not class_of(d, classes).preempts)
        artifacts = {}
        for dep in deployments:
            model = cache.models.get((dep.spec.model.name, dep.spec.model.version))
            if model is not None:
                artifacts[dep.metadata.name] = model.sha256
        pinned = {name: set(devices) for name, devices in cache.desired.by_deployment().items()}
        current = {k: v for k, v in cache.placements.items() if k in cache.deployments}
        draining = {k: v for k, v in cache.draining.items() if k in cache.deployments}
        # None: no device could exceed it
        bound = state_bound(snapshot_of(cache), region=self._region)
        return _Snapshot(
            deployments,
            nodes,
            current,
            self._clock(),
            pinned,
            artifacts,
            self._grace,
            draining,
            never,
            self.observed_since.since,
            bound,
        )

    async def pass_now(self) -> None:
        """One scheduling pass at once (tests)."""
        self._full_owed = True
        await self._pass()

    async def advance_now(self) -> None:
        """Advance the moves under way at once (tests)."""
        await self._pass()

    async def _pass(self) -> None:
        async with self._lock:
            full, self._full_owed = self._full_owed, False
            try:
                if not full:
                    await self._apply(None)
                    return
                snapshot = self._snapshot()
                result = await asyncio.to_thread(snapshot.decide)
                await self._apply(result)
            except BaseException:
                self._full_owed |= full  # still owed: the loop retries
                raise

    def _move_views(
        self, targets: dict[str, frozenset[str]], evictions: tuple[Eviction, ...]
    ) -> dict[str, dict[str, Replica]]:
        """Per deployment, what a move needs to know of its devices (see hub.decide.moves)."""
        cache = self._cache
        policy = cache.security_policy()
        drains = {(e.deployment, e.device) for e in evictions if e.drain}
        out: dict[str, dict[str, Replica]] = {}
        for name, target in targets.items():
            dep = cache.deployments[name]
            sent = cache.sent_placements.get(name, frozenset())
            draining = cache.draining.get(name, frozenset())
            views: dict[str, Replica] = {}
            for d in target | sent:
                device = cache.devices.get(d)
                if device is None:
                    continue
                may = (name, d) in drains or d in draining
                if may and any(
                    t.effect is TaintEffect.NO_EXECUTE
                    and not tolerates(dep.spec.placement.tolerations, t)
                    for t in taints_for(device, policy)
                ):
                    may = False
                views[d] = Replica(serving=_serving(device, name), may_drain=may)
            out[name] = views
        return out

    async def _apply(self, result: Schedule | None) -> None:
        """Store what ``result`` decided (None: only advance the moves under way)."""
        cache = self._cache
        before = cache.placements
        if result is None:
            evictions: tuple[Eviction, ...] = ()
            after = {n: d for n, d in before.items() if n in cache.deployments}
            explanations = {  # the last pass's, less the moves' notes (written again below)
                n: replace(ex, notes=tuple(x for x in ex.notes if not x.startswith(MOVING)))
                for n, ex in cache.explanations.items()
            }
        else:
            evictions = result.evictions
            after = {
                name: frozenset(devices)
                for name, devices in result.placements.items()
                if name in cache.deployments
            }
            explanations = dict(result.explanations)
        # the moves' budget counts from the total the scheduler placed: the fleet autoscaler's
        # when it changed it (else new replicas past the spec's total + maxSurge would wait)
        budgets = {
            n: _budget(_with_total(cache.deployments[n], cache.scaled_totals.get(n))) for n in after
        }
        steps = plan_moves(
            budgets,
            after,
            {n: cache.sent_placements.get(n, frozenset()) for n in after},
            self._move_views(after, evictions),
        )
        for n, step in steps.items():
            if step.moving and n in explanations:
                ex = explanations[n]
                note = step.note(budgets[n][1])
                explanations[n] = replace(ex, notes=(*ex.notes, note))
        cache.explanations = explanations
        changed = {
            n
            for n in after
            if after[n] != before.get(n, frozenset())
            or steps[n].draining != cache.draining.get(n, frozenset())
            or steps[n].waiting != cache.waiting.get(n, frozenset())
        }
        gone = {n for n in before if n not in after}
        if not changed and not gone:
            return
        events = self._events(evictions, before, after, changed, steps)
        puts: list[Put | Delete] = [
            Put(storekeys.placement_key(n), storekeys.dumps(_record(after[n], steps[n])))
            for n in sorted(changed)
        ]
        puts += [Delete(storekeys.placement_key(n)) for n in sorted(gone)]
        await self._store.txn([], [*puts, *(e.put for e in events)])
        for e in events:
            self._writer.committed(e)
        touched: set[str] = set()
        for n in changed | gone:
            old = cache.sent_placements.get(n, frozenset())
            touched |= old ^ (steps[n].sent if n in steps else frozenset())
        for n in gone:
            cache.drop_placement(n)
        for n in after:
            cache.set_placement(n, after[n], draining=steps[n].draining, waiting=steps[n].waiting)
        log.info(
            "placements changed",
            deployments=len(changed) + len(gone),
            devices=len(touched),
            evictions=len(evictions),
            moving=sum(1 for n in changed if steps[n].moving),
        )
        self._projector.mark(touched, notify=False)

    def _events(
        self,
        evictions: tuple[Eviction, ...],
        before: dict[str, frozenset[str]],
        after: dict[str, frozenset[str]],
        changed: set[str],
        steps: Mapping[str, MoveStep],
    ) -> list[PreparedEvent]:
        w = self._writer
        out = []
        for e in evictions:
            if e.deployment not in after:
                continue
            reason = "Preempted" if e.by else "Rescheduled"
            kept = e.device in steps[e.deployment].draining
            out.append(
                w.prepare_event(
                    "ModelDeployment",
                    e.deployment,
                    "Warning",
                    reason,
                    f"replica taken off {e.device}: {e.reason}"
                    + (" (it serves until its replacement is ready)" if kept else ""),
                )
            )
        for name in sorted(changed):
            done = sorted(self._cache.draining.get(name, frozenset()) - steps[name].draining)
            if done:
                out.append(
                    w.prepare_event(
                        "ModelDeployment",
                        name,
                        "Normal",
                        "Moved",
                        f"replica(s) on {', '.join(done[:MAX_NAMED])} stopped: "
                        f"{steps[name].serving}/{len(after[name])} serving where placed",
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
    draining: dict[str, frozenset[str]]
    never_preempt: frozenset[str]
    observed_since: float
    bound: StateBound | None

    def decide(self) -> Schedule:
        return schedule(
            self.deployments,
            self.nodes,
            self.current,
            self.now,
            pinned=self.pinned,
            artifacts=self.artifacts,
            not_ready_grace_s=self.grace,
            draining=self.draining,
            never_preempt=self.never_preempt,
            observed_since=self.observed_since,
            bound=self.bound,
        )


def _budget(dep: ModelDeployment) -> tuple[int, Budget]:
    total = dep.spec.replicas.total or 0
    rollout = dep.spec.rollout
    return total, resolve_budget(rollout.max_surge, rollout.max_unavailable, total)


def _serving(device: Device, deployment: str) -> bool:
    """Whether ``deployment`` serves on ``device`` (connected, some revision ready)."""
    if device.phase is not DevicePhase.READY:
        return False
    report = device.workloads.get(deployment)
    return report is not None and any(r.serves for r in revisions_of(report))


def _record(devices: frozenset[str], step: MoveStep) -> dict[str, Any]:
    out: dict[str, Any] = {"devices": sorted(devices)}
    if step.draining:
        out["draining"] = sorted(step.draining)
    if step.waiting:
        out["waiting"] = sorted(step.waiting)
    return out
