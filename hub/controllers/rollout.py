"""The rollout controller: applies :func:`hub.decide.rollout.plan_rollout` to one deployment at
a time.

Per key, on a :class:`hub.state.workloop.KeyLoop` of deployment names. The cache's change feed
(:mod:`hub.state.feed`) queues a deployment when it is applied or deleted, when a model of its
is pushed, when a device's desired record gains, loses or renews it, and when a device that
holds it reports; an operator's action queues it too. A rollout in progress comes back every
:data:`TICK` (its pauses, deadlines and analysis are timers); every deployment is looked at
again at the slow resync (:data:`RESYNC`), the only look at the whole fleet.

One reconcile of a deployment: its targeted devices (those the projector placed it on), their
reports, the stored revisions and rollout state, ``now``. A step is written to the store
before anything is sent: the new revision (must not exist) and the rollout record (compared
with the mod revision it was read at) in **one** transaction, then the cache, the events, and
the devices whose revision the step changed are projected again (the whole fleet only for a
deployment's first revision). A hub killed at any moment restarts from what the store holds:
a step either happened (its devices are in the record) or did not, and is never taken twice.
Records of deleted deployments are removed; old revisions are pruned
(:func:`hub.decide.rollout.prune`).

Operators act through :meth:`RolloutController.act` (pause, resume or retry after a rollback,
promote, abort, restart: :mod:`hub.decide.rolloutactions`);
``rollout undo`` is an apply of an older revision's template (:func:`undo_manifest`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from edgefleet.api import Canary, ModelDeployment
from edgefleet.backoff import Backoff
from edgefleet.errors import CompareFailed, EdgefleetError
from edgefleet.logs import get_logger
from edgefleet.timestamps import rfc3339
from hub.decide import modelconfigs, rolloutactions
from hub.decide.analysis import (
    TIMELINE_SAMPLES,
    Analysis,
    History,
    Observed,
    Sample,
    TimelineSample,
    analyze,
    figures,
    timeline_due,
    timeline_period,
    timeline_sample,
)
from hub.decide.devices import Device
from hub.decide.revisions import with_config, with_live_fields
from hub.decide.rollout import (
    DeviceView,
    Progress,
    Revision,
    RolloutPhase,
    RolloutState,
    Step,
    canary_target,
    canary_weight,
    max_weight_of,
    measure,
    plan_rollout,
    prune,
    resolve_budget,
    view_device,
)
from hub.decide.rolloutactions import ActionRefused
from hub.decide.status import revisions_of, wanted_revision
from hub.decide.weighing import newly_excluded
from hub.state import feed as kinds
from hub.state import storekeys
from hub.state.batchloop import GIVE_UP_AFTER
from hub.state.cache import Cache
from hub.state.projector import Projector
from hub.state.store import Compare, Delete, Put, Store
from hub.state.workloop import RESYNC, KeyLoop
from hub.state.writer import DeviceWriter

log = get_logger(__name__)

TICK = 0.5  # seconds between looks at a rollout in progress (its timers)
PLACE_WAIT = 1.0  # seconds a step waits for the projector to place a new manifest's devices
RETRY = Backoff(0.05, 10.0)


RevisionHook = Callable[
    [str, RolloutState | None, Revision, Mapping[int, Revision]],
    tuple[list[Put], Callable[[int], None]],
]
"""Given a deployment, its rollout state before, its new revision and its revisions: more
puts for the revision's transaction, and what to call with the store revision it committed."""


def targeted(cache: Cache, deployment: str) -> list[str]:
    """The devices the projector placed ``deployment`` on, by name (:meth:`Cache.targeted`)."""
    return cache.targeted(deployment)


def changed_devices(targeted: Iterable[str], before: RolloutState, after: RolloutState) -> set[str]:
    """The devices (of ``targeted``, and those either state updated) that ``after`` sends
    another revision than ``before`` does."""
    candidates = set(targeted) | before.updated | after.updated
    return {d for d in candidates if before.revision_for(d) != after.revision_for(d)}


def rollout_view_of(device: Device) -> Hashable:
    """What a rollout reads of ``device`` (its phase, health, the generation its report was
    made at, its workloads' revisions less their figures): a report that changes it may let a
    rollout step; new figures alone wait for the rollout's tick."""
    return (
        device.phase,
        device.health.schedulable,
        device.observed_generation,
        tuple(
            (
                name,
                w.model_version,
                w.desired_replicas,
                w.ready_replicas,
                tuple(
                    (r.model_version, r.sha256, r.phase, r.ready_replicas, r.wanted, r.revision)
                    for r in w.revisions
                ),
                w.config_digest,
                w.config_error,
            )
            for name, w in sorted(device.workloads.items())
        ),
    )


ViewMemo = dict[str, tuple[Device, Hashable, DeviceView]]
"""A deployment's device views by device name, with what each was computed from."""


def views(
    cache: Cache, deployment: str, revision: Revision | None, memo: ViewMemo | None = None
) -> list[DeviceView]:
    """How ``deployment``'s rollout of ``revision`` sees each of its targeted devices.
    ``memo`` (the controller's, per deployment; replaced in place by this call's): a view
    computed from the same device record (records are immutable: the same object), version,
    artifact and freshness is reused, so a reconcile after one device's report computes one
    view, not one per device."""
    out = []
    sha: str | None = None
    version = ""
    if revision is not None:
        version = revision.model[1]
        model = cache.models.get(revision.model)
        sha = model.sha256 if model is not None else None
    previous = dict(memo) if memo is not None else {}
    if memo is not None:
        memo.clear()  # only the devices targeted now: the memo never outgrows the deployment
    for name in targeted(cache, deployment):
        device = cache.devices.get(name)
        if device is not None:
            fresh = revision is None or fresh_report(cache, device, deployment, revision.number)
            basis = (version, sha, fresh)
            seen = previous.get(name)
            if seen is not None and seen[0] is device and seen[1] == basis:
                view = seen[2]
            else:
                view = view_device(device, deployment, version, sha, fresh=fresh)
            if memo is not None:
                memo[name] = (device, basis, view)
            out.append(view)
    return out


def fresh_report(cache: Cache, device: Device, deployment: str, number: int) -> bool:
    """Whether ``device``'s report was made after it received revision ``number`` of
    ``deployment``: its desired record carries that revision and the report's generation
    reached the one that first carried it (Kubernetes' observedGeneration; a later generation
    for another deployment's sake does not make it stale). Without it, a report that
    arrives after the rollout gave the device the revision but was made before (the hub
    reads reports as they come) would count the old revision's replicas, still draining, as
    the new one's, or the last attempt's refusal as this one's. A device that does not say its
    generation (0: an edged too old to say) is taken at its word."""
    if device.observed_generation == 0:
        return True
    record = cache.desired.get(device.name)
    since = record.carried(deployment, number) if record is not None else None
    return since is not None and device.observed_generation >= since


def progress_of(cache: Cache, deployment: str) -> Progress | None:
    """The rollout's counts now, from the cache (for status)."""
    state = cache.rollouts.get(deployment)
    dep = cache.deployments.get(deployment)
    if state is None or dep is None:
        return None
    revision = cache.revisions.get(deployment, {}).get(state.revision)
    devices = views(cache, deployment, revision)
    rollout = dep.spec.rollout
    return measure(
        state, devices, resolve_budget(rollout.max_surge, rollout.max_unavailable, len(devices))
    )


def canary_status(
    canary: Canary, state: RolloutState, targeted: int, analysis: Analysis | None
) -> dict[str, Any]:
    """``status.rollout.canary``: the current step, its weight and device count, and the
    analysis figures against their thresholds."""
    weight = canary_weight(canary, state.step)
    out: dict[str, Any] = {
        "step": min(state.step + 1, len(canary.steps)),
        "stepCount": len(canary.steps),
        "pastLastStep": state.step >= len(canary.steps),
        "weight": weight,
        "weightDevices": canary_target(weight, targeted),
        "stepStartedAt": rfc3339(state.step_at) if state.step_at else None,
        "stepReadyAt": rfc3339(state.step_ready_at) if state.step_ready_at else None,
        "steps": [s.to_dict() for s in canary.steps],
    }
    if canary.analysis is not None:
        out["analysisWindowSeconds"] = canary.analysis.window_s
    if analysis is not None:
        out["analysis"] = analysis.to_json()
    return out


def undo_manifest(manifest: Mapping[str, Any], revision: Revision) -> dict[str, Any]:
    """The deployment's manifest with ``revision``'s template (model, runtime, ...) and its own
    placement, replicas, scaling and rollout settings (:data:`LIVE_FIELDS`, as kubectl's
    undo keeps the replicas): what ``rollout undo`` applies."""
    return {**manifest, "spec": with_live_fields(revision.manifest, manifest)["spec"]}


class RolloutController:
    """Drives every deployment's rollout (see the module doc)."""

    name = "rollouts"

    def __init__(
        self,
        store: Store,
        cache: Cache,
        projector: Projector,
        writer: DeviceWriter,
        *,
        clock: Callable[[], float] = time.time,
        tick: float = TICK,
        resync: float = RESYNC,
        give_up_after: float = GIVE_UP_AFTER,
        timeline_samples: int = TIMELINE_SAMPLES,
        revision_hook: RevisionHook | None = None,
    ) -> None:
        self._store = store
        self._cache = cache
        self._projector = projector
        self._writer = writer
        self._clock = clock
        self._tick = tick
        self._keys: KeyLoop[str] = KeyLoop(
            self.name,
            self._reconcile,
            keys=lambda: sorted(set(cache.deployments) | set(cache.rollouts) | set(cache.analysis)),
            resync=resync,
            base_delay=RETRY.base,
            max_delay=RETRY.cap,
            give_up_after=give_up_after,
        )
        self._lock = asyncio.Lock()  # one reconcile at a time: the loop's, an action's
        # canary analysis: counter samples per (deployment, device, version, sha256), in
        # memory only (after a restart the window fills again), and the last verdicts
        self._history = History()
        self._analyses: dict[str, Analysis] = {}
        self._excluded: dict[str, set[str]] = {}  # devices named as left out, per deployment
        self._views: dict[str, ViewMemo] = {}  # per deployment (views)
        # per deployment and revision: the views of its stable and held revisions (hold)
        self._other_views: dict[tuple[str, int], ViewMemo] = {}
        self.timeline_samples = timeline_samples  # the ring kept per deployment
        # a root hub's waves (hub.controllers.wave): what to write with a new revision, in its
        # transaction
        self._revision_hook = revision_hook
        self._sampled_by: dict[str, set[Hashable]] = {}  # history keys each analysis sampled
        # what a rollout last saw of each device (rollout_view_of): a report that changes it
        # queues the device's deployments
        self._seen: dict[str, Hashable] = {}
        cache.feed.watch(
            (
                "ModelDeployment",
                kinds.DESIRED_OF,
                kinds.DEVICE,
                kinds.MODEL,
                modelconfigs.KIND,
            ),
            self._changed,
            settled=self._keys.settled,
        )

    # -- what queues a deployment ------------------------------------------------------------
    def _changed(self, kind: str, name: str) -> None:
        """The change feed: queue the deployments a changed key concerns."""
        cache = self._cache
        if kind in ("ModelDeployment", kinds.DESIRED_OF):
            self._keys.add(name)
        elif kind == kinds.DEVICE:  # its report: the deployments it is sent and holds
            device = cache.devices.get(name)
            seen = rollout_view_of(device) if device is not None else None
            if seen == self._seen.get(name):
                return  # figures, a heartbeat, an ack: the loop's tick reads them
            if seen is None:
                self._seen.pop(name, None)
            else:
                self._seen[name] = seen
            record = cache.desired.get(name)
            if record is not None:
                self._keys.add_all(record.deployments)
            if device is not None:
                self._keys.add_all(d for d in device.workloads if d in cache.deployments)
        elif kind == modelconfigs.KIND:  # a config: a new revision of its model's deployments
            self._keys.add_all(cache.deployments)  # (the config's model may have changed)
        elif kind == kinds.MODEL:  # pushed: the deployments of that model may go on
            self._keys.add_all(
                d for d, dep in cache.deployments.items() if dep.spec.model.name == name
            )

    def wake(self, names: Iterable[str] | None = None) -> None:
        """Look at ``names`` (None: every deployment) soon."""
        if names is None:
            self._keys.resync()
        else:
            self._keys.add_all(names)

    async def run(self, stop: asyncio.Event) -> None:
        await self._keys.run(stop)

    async def drain(self) -> None:
        """Reconcile every deployment queued now, here (tests, benchmarks)."""
        await self._keys.drain()

    @property
    def reconciled(self) -> int:
        """Deployments reconciled so far (tests count them)."""
        return self._keys.reconciled

    # -- one deployment ------------------------------------------------------------------------
    async def _reconcile(self, name: str) -> float | None:
        """The loop's reconcile of ``name``; seconds until it looks again (a rollout in
        progress), or None."""
        async with self._lock:
            await self._reconcile_one(name, self._clock())
        state = self._cache.rollouts.get(name)
        if name in self._cache.deployments and (
            state is None
            or state.phase in (RolloutPhase.PROGRESSING, RolloutPhase.PAUSED)
            or state.held
            or state.returning
        ):
            return self._tick
        return None

    async def _reconcile_one(self, name: str, now: float) -> None:
        cache = self._cache
        if name in cache.deployments:
            for _ in range(2):  # a new revision, then its first devices
                if not await self._step(name, now):
                    break
            return
        if name in cache.rollouts:
            await self._forget(name)
        self._analyses.pop(name, None)
        self._excluded.pop(name, None)
        self._views.pop(name, None)
        for key in [k for k in self._other_views if k[0] == name]:
            del self._other_views[key]
        if self._sampled_by.pop(name, None) is not None:
            self._keep_history()
        if name in cache.analysis:
            await self._forget_timeline(name)

    def _keep_history(self) -> None:
        """Forget the counter samples of devices and revisions no longer analysed."""
        self._history.keep(set().union(*self._sampled_by.values()))

    async def reconcile(self, names: Iterable[str]) -> None:
        """Take the steps owed to ``names`` now, here (tests; the loop does it otherwise)."""
        async with self._lock:
            now = self._clock()
            for name in sorted(set(names)):
                await self._reconcile_one(name, now)

    def _config(self, model: str) -> str:
        """The model's ModelConfig as a revision carries it ("": none)."""
        stored = (o.manifest for o in self._cache.objects_of(modelconfigs.KIND))
        return modelconfigs.config_text(stored, model)

    async def _step(self, name: str, now: float) -> bool:
        """One step of ``name``'s rollout; whether something was written."""
        cache = self._cache
        await self._wait_placed(name)  # first: what follows is read after it
        dep = cache.deployments.get(name)
        stored = cache.stored.get(("ModelDeployment", name))
        if dep is None or stored is None:
            return False
        state = cache.rollouts.get(name)
        revisions = cache.revisions.get(name, {})
        current = revisions.get(state.revision) if state is not None else None
        pushed = current is None or current.model in cache.models
        placed = self._placed(name, state, stored.revision)
        devices = views(cache, name, current, self._views.setdefault(name, {}))
        others: dict[int, list[DeviceView]] = {}
        if state is not None:  # what its devices may run besides: held, or sent back to
            for number in sorted({state.stable, *state.held.values()} - {state.revision}):
                revision = revisions.get(number)
                if revision is not None:
                    memo = self._other_views.setdefault((name, number), {})
                    others[number] = views(cache, name, revision, memo)
            for key in [k for k in self._other_views if k[0] == name and k[1] not in others]:
                del self._other_views[key]
        analysis = self._analyze(name, dep, state, now)
        step = plan_rollout(
            dep,
            with_config(stored.manifest, self._config(dep.spec.model.name)),
            revisions,
            state,
            devices,
            now,
            pushed,
            analysis,
            max_weight_of(stored.manifest),  # a root hub's wave of a percentage
            placed,
            others,
        )
        wrote = await self._write(name, state, step)
        canary = dep.spec.rollout.canary
        if analysis is not None and state is not None and canary and canary.analysis:
            sample = timeline_sample(
                canary.analysis,
                analysis,
                at=now,
                revision=state.revision,
                stable_revision=state.stable,
                step=state.step,
            )
            await self.keep_sample(name, sample, timeline_period(canary.analysis.window_s))
        return wrote

    def _placed(self, name: str, state: RolloutState | None, applied: int) -> bool:
        """Whether ``name``'s targeted devices are whole: the projector has projected every
        device with its manifest as applied (store revision ``applied``). Until then a rollout
        in progress takes no step (:func:`hub.decide.rollout.plan_rollout`'s ``placed``): a
        revision applied before the last one was projected would otherwise complete on no
        device and then reach every device at once."""
        if state is None or state.phase not in (RolloutPhase.PROGRESSING, RolloutPhase.PAUSED):
            return True
        return self._projector.has_projected(name, applied)

    async def _wait_placed(self, name: str) -> None:
        """Wait for the projector's batch until :meth:`_placed` (:data:`PLACE_WAIT` at most:
        else the step holds, and the rollout's tick looks again)."""
        cache = self._cache

        def placed() -> bool:
            stored = cache.stored.get(("ModelDeployment", name))
            return stored is None or self._placed(name, cache.rollouts.get(name), stored.revision)

        if not placed():
            await self._projector.wait_until(placed, PLACE_WAIT)

    async def keep_sample(self, name: str, sample: TimelineSample, period: float) -> None:
        """Keep ``sample`` of ``name``'s analysis over time when it is due: written with the
        deletion of the oldest beyond the ring's size in one transaction, then the cache. A
        sample that cannot be written is logged and skipped (the rollout never waits on it)."""
        ring = self._cache.analysis.get(name, {})
        last_seq = next(reversed(ring)) if ring else 0
        if not timeline_due(ring[last_seq] if ring else None, sample, period):
            return
        seq = last_seq + 1
        oldest = list(ring)[: max(0, len(ring) + 1 - self.timeline_samples)]
        ops: list[Put | Delete] = [
            Put(storekeys.analysis_key(name, seq), storekeys.dumps(sample.to_json()))
        ]
        ops += [Delete(storekeys.analysis_key(name, n)) for n in oldest]
        try:
            await self._store.txn((), ops)
        except EdgefleetError as exc:
            log.warning("analysis sample not kept", deployment=name, error=str(exc))
            return
        ring = self._cache.analysis.setdefault(name, {})
        for n in oldest:
            ring.pop(n, None)
        ring[seq] = sample

    async def _forget_timeline(self, name: str) -> None:
        ring = self._cache.analysis.get(name, {})
        await self._store.txn((), [Delete(storekeys.analysis_key(name, n)) for n in ring])
        self._cache.analysis.pop(name, None)

    def analysis(self, name: str) -> Analysis | None:
        """The canary analysis of ``name`` at the last pass (None: none running)."""
        return self._analyses.get(name)

    def _analyze(
        self, name: str, dep: ModelDeployment, state: RolloutState | None, now: float
    ) -> Analysis | None:
        """The canary analysis of a rollout in progress with ``canary.analysis``: the devices
        given the new revision where it serves, against the others where the stable one
        serves; each device's counters sampled into the history."""
        canary = dep.spec.rollout.canary
        spec = canary.analysis if canary is not None else None
        if (
            spec is None
            or state is None
            or state.phase not in (RolloutPhase.PROGRESSING, RolloutPhase.PAUSED)
        ):
            self._analyses.pop(name, None)
            if self._sampled_by.pop(name, None) is not None:
                self._keep_history()
            return None
        cache = self._cache
        sampled: set[Hashable] = set()
        revisions = cache.revisions.get(name, {})
        wanted = {}
        for which, number in (("canary", state.revision), ("stable", state.stable)):
            rev = revisions.get(number)
            if rev is not None:
                model = cache.models.get(rev.model)
                wanted[which] = (rev.model[1], model.sha256 if model is not None else None)
        sides: dict[str, list[Observed]] = {"canary": [], "stable": []}
        spacing = spec.window_s / 32
        for device_name in targeted(cache, name):
            device = cache.devices.get(device_name)
            report = device.workloads.get(name) if device is not None else None
            which = "canary" if device_name in state.updated else "stable"
            if report is None or which not in wanted:
                continue
            if which == "canary" and (
                device is None or not fresh_report(cache, device, name, state.revision)
            ):
                # made before the device received this revision: its figures are another
                # revision's (a config revision has the same model: the accuracy measured
                # with the config before, or one a rollback left)
                continue
            version, sha = wanted[which]
            got = wanted_revision(revisions_of(report), version, sha)
            if got is None or not got.serves:
                continue
            key = (name, device_name, version, got.sha256)
            self._history.record(key, Sample(now, got.requests, got.errors), spacing)
            sampled.add(key)
            sides[which].append(Observed(device_name, got, self._history.samples(key)))
        result = analyze(
            spec,
            figures(sides["canary"], now, spec.window_s),
            figures(sides["stable"], now, spec.window_s),
        )
        self._analyses[name] = result
        self._sampled_by[name] = sampled
        self._keep_history()
        self._announce(name, {**result.canary.excluded, **result.stable.excluded})
        return result

    def _announce(self, name: str, excluded: Mapping[str, str]) -> None:
        """An event for each device newly left out of ``name``'s analysis (once while it
        stays out; again if it comes back and is left out again)."""
        for device, why in newly_excluded(excluded, self._excluded.get(name, ())):
            self._writer.event(
                "ModelDeployment",
                name,
                "Warning",
                "AnalysisExcluded",
                f"device {device} is left out of the canary analysis: its figures are "
                f"impossible ({why})",
            )
        self._excluded[name] = set(excluded)

    async def _write(self, name: str, before: RolloutState | None, step: Step) -> bool:
        if step.state is None and step.revision is None:
            return False
        cache = self._cache
        puts: list[Put | Delete] = []
        compares = [Compare(storekeys.rollout_key(name), cache.rollout_revisions.get(name, 0))]
        if step.revision is not None:
            key = storekeys.revision_key(name, step.revision.number)
            compares.append(Compare(key, 0))
            puts.append(Put(key, storekeys.dumps(step.revision.to_json())))
        state = step.state
        revisions = dict(cache.revisions.get(name, {}))
        if step.revision is not None:
            revisions[step.revision.number] = step.revision
        if state is not None:
            puts.append(Put(storekeys.rollout_key(name), storekeys.dumps(state.to_json())))
            stale = prune(revisions.values(), state)
            puts += [Delete(storekeys.revision_key(name, n)) for n in stale]
        hooked: Callable[[int], None] | None = None
        if step.revision is not None and self._revision_hook is not None:
            more, hooked = self._revision_hook(name, before, step.revision, revisions)
            puts += more
        try:
            revision = await self._store.txn(compares, puts)
        except CompareFailed:
            # Someone else wrote it (an operator's action): read it again, look again.
            await self._reload(name)
            self._keys.add(name)
            return False
        kept = dict(cache.revisions.get(name, {}))
        if step.revision is not None:
            kept[step.revision.number] = step.revision
        if state is not None:
            for n in stale:
                kept.pop(n, None)
        cache.put_rollout(
            name,
            state if state is not None else before,
            revision if state is not None else cache.rollout_revisions.get(name, 0),
            revisions=kept,
        )
        for event in step.events:
            self._writer.event("ModelDeployment", name, event.type, event.reason, event.message)
        if hooked is not None:
            hooked(revision)
        log.info(
            "rollout step",
            deployment=name,
            revision=state.revision if state else None,
            phase=state.phase.value if state else None,
            updated=len(state.updated) if state else None,
            before=len(before.updated) if before else None,
        )
        self._project(name, before, cache.rollouts.get(name))
        return True

    def _project(self, name: str, before: RolloutState | None, after: RolloutState | None) -> None:
        """Project again the devices whose revision of ``name`` changed from ``before`` to
        ``after``; a first revision: every device (none was sent the deployment yet)."""
        if before is None or after is None:
            self._projector.mark_all()
            return
        self._projector.mark(changed_devices(targeted(self._cache, name), before, after))

    async def _reload(self, name: str) -> None:
        kv = await self._store.get(storekeys.rollout_key(name))
        if kv is None:
            self._cache.put_rollout(name, None)
            return
        state = RolloutState.from_json(storekeys.loads(kv.value))
        self._cache.put_rollout(name, state, kv.mod_revision)

    async def _forget(self, name: str) -> None:
        """The deployment was deleted: its rollout and revisions go too."""
        ops: list[Put | Delete] = [Delete(storekeys.rollout_key(name))]
        ops += [
            Delete(storekeys.revision_key(name, n)) for n in self._cache.revisions.get(name, {})
        ]
        ops += [Delete(storekeys.analysis_key(name, n)) for n in self._cache.analysis.get(name, {})]
        await self._store.txn((), ops)
        self._cache.analysis.pop(name, None)
        self._cache.put_rollout(name, None, revisions={})

    # -- operators -------------------------------------------------------------------------
    async def act(
        self, name: str, action: str, *, actor: str = "an operator", full: bool = False
    ) -> RolloutState:
        """``actor``'s ``pause``, ``resume``, ``promote`` (``full``), ``abort`` or ``restart``
        (:mod:`hub.decide.rolloutactions`), written with a compare-and-swap on the rollout
        record and recorded as an event naming ``actor``."""
        cache = self._cache
        state = cache.rollouts.get(name)
        if name not in cache.deployments or state is None:
            raise ActionRefused(f"deployment {name} has no rollout")
        async with self._lock:
            return await self._act(name, action, actor, full)

    async def _act(self, name: str, action: str, actor: str, full: bool) -> RolloutState:
        cache = self._cache
        state = cache.rollouts[name]
        canary = cache.deployments[name].spec.rollout.canary
        new = rolloutactions.act(state, action, canary, self._clock(), actor=actor, full=full)
        try:
            revision = await self._store.txn(
                [Compare(storekeys.rollout_key(name), cache.rollout_revisions.get(name, 0))],
                [Put(storekeys.rollout_key(name), storekeys.dumps(new.to_json()))],
            )
        except CompareFailed:
            await self._reload(name)
            raise ActionRefused(f"the rollout of {name} changed meanwhile; try again") from None
        cache.put_rollout(name, new, revision)
        kind = "Warning" if action == "abort" else "Normal"
        self._writer.event("ModelDeployment", name, kind, new.reason, f"rollout {new.message}")
        self._project(name, state, new)
        if action == "restart":  # the new revision exists when the call answers
            await self._reconcile_one(name, self._clock())
        self._keys.add(name)
        return new
