"""The root hub's wave controller: applies :func:`hub.decide.wave.plan_waves` to every deployment.

A root hub (one with regional hubs, :mod:`hub.state.regions`) keeps a
:class:`hub.decide.wave.WaveState`
per ModelDeployment at ``/waves/NAME``. The state of a new revision is written by the rollout
controller in the same transaction as the revision itself (:meth:`WaveController.revision_ops`,
its ``revision_hook``), so no revision exists without the state that says which regions get
it. Then, every :data:`TICK` (and when woken), one pass looks at every deployment in waves:
what each region last reported of it (:class:`hub.state.regions.Regions`), the plan's next step,
written with a compare-and-swap on the state's mod revision, then its events. The slices the
root streams to its regions read :meth:`WaveController.manifest_for`: a region not released
yet (or after a rollback) gets the stable revision; every state written (or, on a follower
replica, followed) wakes the regions' streams (:meth:`hub.state.regions.Regions.changed`), so a
wave released reaches its regions at once, not at the streams' next poll. A root restarted
at any moment goes on from the stored states; a wave judges a region by a report received
on its current connection only (until the region reconnects and reports, a wave waits: a
region not heard from is neither a pass nor a failure).

With hub replicas on etcd the controller runs on the leader only; every other replica keeps
the states as the leader writes them (:meth:`WaveController.follow`, from its cache
follower's watch), so ``edgectl rollout status`` and the slices any replica streams show the
waves where they are. The regions' reports reach every replica through the store
(:mod:`hub.state.sharedreports`), so the leader judges a region whatever replica it streams to, and
a follower samples the analysis across regions itself (:class:`WaveObserver`; samples are
in memory: a replica started later fills its window again).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import replace
from typing import Any

from edgefleet.api import ModelDeployment
from edgefleet.errors import CompareFailed, EdgefleetError
from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop
from hub.controllers.agentwaves import AgentWaveController
from hub.decide import regionrollout, regionslice
from hub.decide.analysis import Analysis, History, Sample
from hub.decide.revisions import config_of
from hub.decide.rollout import Revision, RolloutPhase, RolloutState, template_hash
from hub.decide.wave import (
    RegionSide,
    RegionView,
    RevisionFigures,
    WavePhase,
    WaveState,
    analyze_regions,
    expected_template,
    pause,
    plan_waves,
    region_manifest,
    resume,
    stable_of,
    start,
)
from hub.decide.wavestatus import waves_status
from hub.decide.weighing import newly_excluded
from hub.state import storekeys
from hub.state.cache import Cache
from hub.state.regions import Regions
from hub.state.store import Compare, Delete, EventType, Put, Store
from hub.state.store import Event as StoreEvent
from hub.state.store.electing import Elector
from hub.state.writer import DeviceWriter

log = get_logger(__name__)

TICK = 0.5


class WaveController:
    """Drives every deployment's rollout across regions (see the module doc)."""

    name = "waves"

    def __init__(
        self,
        store: Store,
        cache: Cache,
        regions: Regions,
        writer: DeviceWriter,
        *,
        clock: Callable[[], float] = time.time,
        tick: float = TICK,
    ) -> None:
        self._store = store
        self._cache = cache
        self._regions = regions
        self._writer = writer
        self._clock = clock
        self._tick = tick
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self.states: dict[str, WaveState] = {}
        self._mods: dict[str, int] = {}
        # the analysis across regions: samples of each region's counters per (deployment,
        # region, template), in memory only (after a restart the window fills again)
        self._history = History()
        self._sampled: set[Hashable] = set()
        self._analyses: dict[str, Analysis] = {}
        self._excluded: dict[str, set[str]] = {}  # regions named as left out, per deployment
        # per deployment, the revision and regions last named rolling back a revision sent to
        # every region at once (a RegionRolledBack event each time they change)
        self._rolled_back: dict[str, tuple[int, tuple[str, ...]]] = {}
        # AgentUpgrades in waves: the same tick, leader and follower watch (agentwaves)
        self.agent = AgentWaveController(store, cache, regions, writer, clock=clock)

    async def load(self) -> None:
        """Every stored state (at start, and after a write that lost a race)."""
        states: dict[str, WaveState] = {}
        mods: dict[str, int] = {}
        for kv in (await self._store.range(storekeys.WAVES)).kvs:
            state = WaveState.from_json(storekeys.loads(kv.value))
            states[state.deployment] = state
            mods[state.deployment] = kv.mod_revision
        self.states, self._mods = states, mods
        await self.agent.load()

    def follow(self, event: StoreEvent) -> bool:
        """A follower replica's view of the leader's writes
        (:class:`hub.controllers.replicas.CacheFollower`
        watching the store): a state at ``/waves/`` put or deleted (True), else False. The
        wave controller itself runs on the leader only; this keeps every replica's
        ``status.rollout.waves`` and the slices it streams to regions current."""
        key = event.kv.key
        if self.agent.follow(event):
            return True
        if not key.startswith(storekeys.WAVES):
            return False
        name = key[len(storekeys.WAVES) :]
        if event.type is EventType.PUT:
            self.states[name] = WaveState.from_json(storekeys.loads(event.kv.value))
            self._mods[name] = event.kv.mod_revision
        else:
            self.states.pop(name, None)
            self._mods.pop(name, None)
        self._regions.changed()  # a wave released (or rolled back): this replica's streams
        return True

    def wake(self) -> None:
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        await self.load()
        while not stop.is_set():
            try:
                await self.step()
            except EdgefleetError as exc:
                log.warning("wave pass failed", error=str(exc))
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._tick)

    # -- what the rollout controller writes with a new revision ----------------------------------
    def revision_ops(
        self,
        name: str,
        rollout: RolloutState | None,
        revision: Revision,
        revisions: Mapping[int, Revision],
    ) -> tuple[list[Put], Callable[[int], None]]:
        """The state of ``name``'s new ``revision`` (put in the revision's transaction) and
        what to do once that transaction committed at a store revision."""
        dep = self._cache.deployments.get(name)
        waves = dep.spec.rollout.waves if dep is not None else ()
        if not waves and not self._regions.regions and name not in self.states:
            return [], lambda _: None  # a hub without regions: nothing to keep
        before = self.states.get(name)
        if before is not None and before.phase is WavePhase.COMPLETE:
            before = self._as_regions_say(name, before, revisions)
        state, events = start(before, rollout, revision, revisions, waves, self._clock())
        put = Put(storekeys.wave_key(name), storekeys.dumps(state.to_json()))

        def committed(store_revision: int) -> None:
            self.states[name] = state
            self._mods[name] = store_revision
            for e in events:
                self._writer.event("ModelDeployment", name, e.type, e.reason, e.message)
            self._regions.changed()
            self.wake()

        return [put], committed

    def _as_regions_say(
        self, name: str, before: WaveState, revisions: Mapping[int, Revision]
    ) -> WaveState:
        """``before`` (Complete), or, when the regions did not all complete its revision (a
        revision sent to every region at once, without waves), as rolled back to the revision
        the regions not done with it serve: the stable revision a new rollout in waves starts
        from is the last one that completed everywhere, never one a region rolled back."""
        current = revisions.get(before.revision)
        stored = self._cache.stored.get(("ModelDeployment", name))
        if current is None or stored is None:
            return before
        placed = self._placed(stored.manifest)
        across = regionrollout.across_regions(
            RolloutPhase.COMPLETE.value,
            "",
            "",
            before.revision,
            current.model[1],
            placed,
            {r: expected_template(current.manifest, r) for r in placed},
            self._views(name, placed, current_only=False),
            None,
            self._stable_of(revisions),
        )
        kept = revisions.get(across.stable) if across.stable is not None else None
        if across.phase == RolloutPhase.COMPLETE.value or kept is None:
            return before  # done everywhere, or the regions' stable one not known: as it was
        return replace(
            before,
            phase=WavePhase.ROLLED_BACK,
            stable=kept.number,
            stable_manifest=dict(kept.manifest),
            stable_version=kept.model[1],
        )

    @staticmethod
    def _stable_of(revisions: Mapping[int, Revision]) -> Callable[[str, str], int | None]:
        """The root's revision (of ``revisions``) whose template is ``template`` in ``region``."""

        def stable_of(region: str, template: str) -> int | None:
            for number, rev in sorted(revisions.items(), reverse=True):
                if template and expected_template(rev.manifest, region) == template:
                    return number
            return None

        return stable_of

    # -- what regions are sent --------------------------------------------------------------
    def manifest_for(self, region: str, manifest: Mapping[str, Any]) -> Mapping[str, Any]:
        """What ``region`` is sent of the object ``manifest`` (a ModelDeployment in waves: the
        new revision once released, else the stable one; never ``spec.rollout.waves``)."""
        if manifest.get("kind") == "AgentUpgrade":
            return self.agent.manifest_for(region, manifest)
        if manifest.get("kind") != "ModelDeployment":
            return manifest
        name = str(manifest["metadata"]["name"])
        state = self.states.get(name)
        if state is not None:
            manifest = self._decided(name, manifest, state, region)
        return region_manifest(manifest, state, region)

    def config_for(self, region: str, manifest: Mapping[str, Any]) -> str | None:
        """The ModelConfig (canonical JSON; "": none) of the revision ``region`` is sent of
        the ModelDeployment ``manifest`` in waves: the stable revision's until the region's
        wave, then the rolled-out revision's (each revision carries its config:
        hub.decide.revisions.MODEL_CONFIG); None: the current ModelConfig (no waves state)."""
        name = str(manifest.get("metadata", {}).get("name", ""))
        state = self.states.get(name)
        if state is None or not manifest.get("spec", {}).get("rollout", {}).get("waves"):
            return None
        if not state.sends_new(region) and state.stable_manifest:
            return config_of(state.stable_manifest)
        current = self._cache.revisions.get(name, {}).get(state.revision)
        return config_of(current.manifest) if current is not None else None

    def _decided(
        self, name: str, manifest: Mapping[str, Any], state: WaveState, region: str
    ) -> Mapping[str, Any]:
        """``manifest``, or, while the root has not yet made its revision of a new template
        in waves, what ``region`` was sent: the rollout controller makes a revision and its
        wave state in one transaction, after the apply wrote the manifest (the change feed
        queues it), and a slice streamed in between must not send every region the new
        template at once (the state before it may be Complete: "send the new one")."""
        waves = manifest.get("spec", {}).get("rollout", {}).get("waves")
        current = self._cache.revisions.get(name, {}).get(state.revision)
        if not waves or current is None or current.template == template_hash(manifest):
            return manifest
        return stable_of(
            manifest, current.manifest if state.sends_new(region) else state.stable_manifest
        )

    # -- one pass -----------------------------------------------------------------------------
    def _placed(self, manifest: Mapping[str, Any]) -> list[str]:
        return sorted(r for r in self._regions.regions if regionslice.goes_to(manifest, r))

    def _views(
        self, name: str, placed: list[str], current_only: bool = True
    ) -> dict[str, RegionView]:
        """What each region of ``placed`` last reported of ``name``; ``current_only``: only a
        report received on its current connection (what a wave judges by)."""
        views: dict[str, RegionView] = {}
        for region in placed:
            state = self._regions.regions.get(region)
            if state is None:
                continue
            seen = self._regions.seen(state)
            found = None
            if seen.report is not None and (seen.current or not current_only):
                found = next((d for d in seen.report.deployments if d.name == name), None)
            if found is None:
                views[region] = RegionView(
                    region, connected=seen.connected, reported_at=seen.reported_at
                )
                continue
            views[region] = RegionView(
                region,
                connected=seen.connected,
                reported_at=seen.reported_at,
                reported=True,
                template=found.rollout_template,
                stable_template=found.stable_template,
                phase=found.rollout_phase,
                reason=found.rollout_reason,
                message=found.rollout_message,
                desired=found.desired,
                updated=found.updated,
                ready=found.ready,
                available=found.available,
                failing=dict(found.failing),
                revisions={
                    f.template: RevisionFigures(
                        template=f.template,
                        devices=f.devices,
                        requests=f.requests,
                        errors=f.errors,
                        latency_p95_s=f.latency_p95_s if f.HasField("latency_p95_s") else None,
                        accuracy=f.accuracy if f.HasField("accuracy") else None,
                        accuracy_devices=f.accuracy_devices,
                        validation_problems=dict(f.validation_problems),
                    )
                    for f in found.revision_figures
                },
            )
        return views

    def _analyze(
        self,
        name: str,
        dep: ModelDeployment,
        state: WaveState,
        placed: list[str],
        expected: Mapping[str, str],
        views: Mapping[str, RegionView],
        now: float,
    ) -> Analysis | None:
        """The analysis across regions of a rollout in waves with ``canary.analysis``: the
        regions given the new revision against the others on the stable one, each region's
        counters sampled into the history."""
        canary = dep.spec.rollout.canary
        spec = canary.analysis if canary is not None else None
        if spec is None or state.phase not in (WavePhase.PROGRESSING, WavePhase.PAUSED):
            self._analyses.pop(name, None)
            return None
        sides: dict[bool, list[RegionSide]] = {True: [], False: []}
        for region in placed:
            view = views.get(region)
            new = region in state.released
            template = (
                expected.get(region, "")
                if new
                else expected_template(state.stable_manifest, region)
            )
            figures = view.revisions.get(template) if view is not None else None
            if figures is None or figures.devices == 0:
                continue
            key = (name, region, template)
            self._history.record(
                key, Sample(now, figures.requests, figures.errors), spec.window_s / 32
            )
            self._sampled.add(key)
            sides[new].append(RegionSide(region, figures, self._history.samples(key)))
        result = analyze_regions(spec, sides[True], sides[False], now)
        self._analyses[name] = result
        return result

    def _expected(
        self, name: str, state: WaveState, manifest: Mapping[str, Any], placed: list[str]
    ) -> dict[str, str]:
        revision = self._cache.revisions.get(name, {}).get(state.revision)
        source = revision.manifest if revision is not None else manifest
        return {r: expected_template(source, r) for r in placed}

    def _inputs(
        self, name: str
    ) -> tuple[ModelDeployment, WaveState, list[str], dict[str, str], dict[str, RegionView]] | None:
        dep = self._cache.deployments.get(name)
        stored = self._cache.stored.get(("ModelDeployment", name))
        state = self.states.get(name)
        if dep is None or stored is None or state is None:
            return None
        placed = self._placed(stored.manifest)
        return (
            dep,
            state,
            placed,
            self._expected(name, state, stored.manifest, placed),
            self._views(name, placed),
        )

    async def step(self) -> None:
        """One pass over every deployment (see the module doc)."""
        async with self._lock:
            now = self._clock()
            self._sampled = set()
            for name in sorted(self.states):
                if name not in self._cache.deployments:
                    await self._forget(name)
                    continue
                got = self._inputs(name)
                if got is None:
                    continue
                dep, state, placed, expected, views = got
                analysis = self._analyze(name, dep, state, placed, expected, views, now)
                if analysis is not None:
                    self._announce(name, {**analysis.canary.excluded, **analysis.stable.excluded})
                planned = plan_waves(
                    dep.spec.rollout.waves,
                    state,
                    placed,
                    expected,
                    views,
                    now,
                    analysis,
                    dep.spec.rollout.progress_deadline_s,
                )
                if planned.state is not None:
                    await self._write(name, planned.state, planned.events)
                elif state.phase is WavePhase.COMPLETE:
                    self._announce_rolled_back(name, state, placed, expected, views)
            self._history.keep(self._sampled)
            for name in set(self._rolled_back) - set(self.states):
                del self._rolled_back[name]
            for name in set(self._analyses) - set(self.states):
                del self._analyses[name]
            for name in set(self._excluded) - set(self._analyses):
                del self._excluded[name]
            await self.agent.step()

    def _announce_rolled_back(
        self,
        name: str,
        state: WaveState,
        placed: list[str],
        expected: Mapping[str, str],
        views: Mapping[str, RegionView],
    ) -> None:
        """A Warning event ``RegionRolledBack`` when regions (a new set of them) report their
        rollout of a revision sent to every region at once rolled back (no waves judge it: the
        root's status says RolledBack, hub.decide.regionrollout); once per revision and set
        of regions while this replica leads (in memory: again after a restart)."""
        back = tuple(
            r
            for r in placed
            if (v := views.get(r)) is not None
            and v.reported
            and v.template
            and v.template == expected.get(r)
            and v.phase == RolloutPhase.ROLLED_BACK.value
        )
        if not back or self._rolled_back.get(name) == (state.revision, back):
            return
        self._rolled_back[name] = (state.revision, back)
        figures = "; ".join(f"{r}: {views[r].text()}" for r in back)
        self._writer.event(
            "ModelDeployment",
            name,
            "Warning",
            "RegionRolledBack",
            f"revision {state.revision} ({state.version}) was rolled back in region(s) "
            f"{', '.join(back)}: {figures}",
        )

    def _announce(self, name: str, excluded: Mapping[str, str]) -> None:
        """An event for each region newly left out of ``name``'s analysis across regions
        (once while it stays out)."""
        for region, why in newly_excluded(excluded, self._excluded.get(name, ())):
            self._writer.event(
                "ModelDeployment",
                name,
                "Warning",
                "AnalysisExcluded",
                f"region {region} is left out of the analysis across regions: its figures are "
                f"impossible ({why})",
            )
        self._excluded[name] = set(excluded)

    async def _write(self, name: str, state: WaveState, events: Any) -> bool:
        key = storekeys.wave_key(name)
        try:
            revision = await self._store.txn(
                [Compare(key, self._mods.get(name, 0))],
                [Put(key, storekeys.dumps(state.to_json()))],
            )
        except CompareFailed:
            await self.load()  # another writer (a new revision): look again next pass
            self.wake()
            return False
        self.states[name] = state
        self._mods[name] = revision
        self._regions.changed()  # what regions are sent may have changed: their streams look
        for e in events:
            self._writer.event("ModelDeployment", name, e.type, e.reason, e.message)
        log.info(
            "wave step",
            deployment=name,
            revision=state.revision,
            phase=state.phase.value,
            step=state.step,
            released=len(state.released),
            reason=state.reason,
        )
        return True

    async def _forget(self, name: str) -> None:
        await self._store.txn((), [Delete(storekeys.wave_key(name))])
        self.states.pop(name, None)
        self._mods.pop(name, None)

    def observe(self) -> None:
        """A follower replica's pass (:class:`WaveObserver`): the analysis across regions
        sampled from every region's reports as the store shares them, so that ``status`` shows
        it here too; nothing written."""
        now = self._clock()
        self._sampled = set()
        for name in sorted(self.states):
            got = self._inputs(name)
            if got is not None:
                dep, state, placed, expected, views = got
                self._analyze(name, dep, state, placed, expected, views, now)
        self._history.keep(self._sampled)
        for name in set(self._analyses) - set(self.states):
            del self._analyses[name]

    # -- operators and edgectl --------------------------------------------------------------------
    def in_progress(self, name: str) -> bool:
        """Whether ``name`` is being rolled out in waves (Progressing or Paused), or its last
        rollout in waves was rolled back (``rollout resume`` retries it)."""
        state = self.states.get(name)
        return state is not None and state.phase is not WavePhase.COMPLETE

    async def act(self, name: str, action: str) -> WaveState | None:
        """``rollout pause`` or ``resume`` at the root (None: it does not apply now)."""
        async with self._lock:
            dep = self._cache.deployments.get(name)
            state = self.states.get(name)
            if dep is None or state is None:
                return None
            now = self._clock()
            if action == "pause":
                new = pause(state, now)
            else:
                new = resume(dep.spec.rollout.waves, state, now)
            if new is None:
                return None
            if not await self._write(name, new, ()):
                return None
            self._writer.event("ModelDeployment", name, "Normal", new.reason, new.message)
        self.wake()
        return new

    def across_regions(self, name: str, status: Mapping[str, Any]) -> dict[str, Any] | None:
        """``status`` (a deployment's at the root, its regions' figures added) with its
        ``status.rollout`` across the regions it goes to (:mod:`hub.decide.regionrollout`:
        never Complete before every one of them reports this revision Complete, RolledBack
        when one rolled it back); None: nothing to add (no rollout here, or no region)."""
        stored = self._cache.stored.get(("ModelDeployment", name))
        rollout = self._cache.rollouts.get(name)
        revisions = self._cache.revisions.get(name, {})
        current = revisions.get(rollout.revision) if rollout is not None else None
        if stored is None or rollout is None or current is None or not status.get("rollout"):
            return None
        placed = self._placed(stored.manifest)
        state = self.states.get(name)
        if not placed and state is None:
            return None
        expected = {r: expected_template(current.manifest, r) for r in placed}
        views = self._views(name, placed, current_only=False)
        across = regionrollout.across_regions(
            rollout.phase.value,
            rollout.reason,
            rollout.message,
            rollout.revision,
            current.model[1],
            placed,
            expected,
            views,
            state,
            self._stable_of(revisions),
        )
        kept = revisions.get(across.stable) if across.stable is not None else None
        return regionrollout.shown(status, across, kept.model[1] if kept is not None else "")

    def status(self, name: str) -> dict[str, Any] | None:
        """``status.rollout.waves`` of ``name`` (None: it has no waves, or none in progress
        and none done since the waves were set)."""
        got = self._inputs(name)
        if got is None:
            return None
        dep, state, placed, expected, views = got
        if not dep.spec.rollout.waves and not state.history:
            return None
        shown = waves_status(
            dep.spec.rollout.waves, state, placed, expected, views, self._analyses.get(name)
        )
        now = self._regions.clock()
        for row in shown.get("waves", []):  # how old each region's last report is, now
            for region, figures in row.get("regions", {}).items():
                view = views.get(region)
                if view is not None and view.reported_at and figures.get("reportedAt"):
                    age = round(max(0.0, now - view.reported_at), 1)
                    figures["reportAgeSeconds"] = age
        return shown


class WaveObserver:
    """The ``wave-observer`` component (root replicas on etcd): while its replica does not
    lead, :meth:`WaveController.observe` every tick (the leader's ``step`` samples itself)."""

    name = "wave-observer"

    def __init__(self, waves: WaveController, elector: Elector, tick: float = TICK) -> None:
        self.waves = waves
        self.elector = elector
        self.tick = tick

    async def run(self, stop: asyncio.Event) -> None:
        while not await wait_for_stop(stop, self.tick):
            if not self.elector.leading:
                self.waves.observe()
