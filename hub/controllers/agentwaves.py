"""A root hub's AgentUpgrades in waves: applies :func:`hub.decide.agentwaves.plan_agent_waves`
(docs/agent-updates.md "Waves by region").

An AgentUpgrade with ``spec.rollout.waves`` at a root hub is not run on the root's own devices
(:func:`hub.controllers.agentupgrade.upgrades_of` leaves it out): it goes to the regions. The
root keeps an :class:`hub.decide.agentwaves.AgentWaveState` per upgrade at ``/agentwaves/NAME``
(a new one, the next root revision, when the version changes), and every pass of the wave
controller (:class:`hub.controllers.wave.WaveController`, which owns this one: same tick, same
leader, same follower watch) takes the planner's next step from what each region last
reported (``RegionReport.agent_upgrades`` and ``agent_release_versions``, read through
:func:`hub.decide.agentwaves.read_region_claim`), written with a compare-and-swap, then its
events. A region released is sent the upgrade by its slice (:meth:`manifest_for`): its
manifest without the waves, at the state's version, annotated with the root's revision
(``federation.edgefleet.io/agent-revision``) and, once the waves stopped, why
(``federation.edgefleet.io/agent-stop``: the region rolls its rollout back,
:mod:`hub.decide.agentupgrade`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from edgefleet.api import AgentUpgrade, parse_manifest
from edgefleet.errors import CompareFailed
from edgefleet.logs import get_logger
from hub.decide import regionslice
from hub.decide.agentwaves import (
    MAX_TEXT,
    AgentWaveState,
    RegionAgentView,
    pause,
    plan_agent_waves,
    read_region_claim,
    resume,
    start,
    summed_figures,
)
from hub.decide.wave import wave_regions, wave_text
from hub.state import storekeys
from hub.state.cache import Cache
from hub.state.regions import Regions
from hub.state.store import Compare, Delete, EventType, Put, Store
from hub.state.store import Event as StoreEvent
from hub.state.writer import DeviceWriter

log = get_logger(__name__)

AGENT_WAVES = "/agentwaves/"
KIND = "AgentUpgrade"
MAX_STALE_LOGGED = 1024  # stale claims remembered as logged (then forgotten, logged again)


def agent_wave_key(name: str) -> str:
    return f"{AGENT_WAVES}{name}"


def in_waves(manifest: Mapping[str, Any]) -> bool:
    return bool(manifest.get("spec", {}).get("rollout", {}).get("waves"))


class AgentWaveController:
    """Drives every AgentUpgrade in waves (module doc)."""

    def __init__(
        self,
        store: Store,
        cache: Cache,
        regions: Regions,
        writer: DeviceWriter,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._cache = cache
        self._regions = regions
        self._writer = writer
        self._clock = clock
        self.states: dict[str, AgentWaveState] = {}
        self._mods: dict[str, int] = {}
        self._parsed: dict[str, tuple[int, AgentUpgrade]] = {}
        # (upgrade, region, root revision, version claimed) of the stale claims logged: once
        self._stale_logged: set[tuple[str, str, int, str]] = set()

    async def load(self) -> None:
        states: dict[str, AgentWaveState] = {}
        mods: dict[str, int] = {}
        for kv in (await self._store.range(AGENT_WAVES)).kvs:
            state = AgentWaveState.from_json(storekeys.loads(kv.value))
            states[state.upgrade] = state
            mods[state.upgrade] = kv.mod_revision
        self.states, self._mods = states, mods

    def follow(self, event: StoreEvent) -> bool:
        """A follower replica's view of the leader's writes (True: one of ours)."""
        key = event.kv.key
        if not key.startswith(AGENT_WAVES):
            return False
        name = key[len(AGENT_WAVES) :]
        if event.type is EventType.PUT:
            self.states[name] = AgentWaveState.from_json(storekeys.loads(event.kv.value))
            self._mods[name] = event.kv.mod_revision
        else:
            self.states.pop(name, None)
            self._mods.pop(name, None)
        self._regions.changed()
        return True

    # -- what regions are sent ---------------------------------------------------------------
    def manifest_for(self, region: str, manifest: Mapping[str, Any]) -> Mapping[str, Any]:
        """What ``region`` is sent of an AgentUpgrade: in waves and released to it, the
        manifest without the waves, at the version the waves roll out, with the root's revision
        (and the stop, once the waves stopped); otherwise the manifest as applied, which no
        slice carries (:func:`hub.decide.regionslice.goes_to`)."""
        if not in_waves(manifest):
            return manifest
        state = self.states.get(str(manifest["metadata"]["name"]))
        sent = state.sent_to(region) if state is not None else None
        if sent is None:
            return manifest
        rollout = {k: v for k, v in manifest["spec"].get("rollout", {}).items() if k != "waves"}
        metadata = dict(manifest["metadata"])
        annotations = dict(metadata.get("annotations") or {})
        annotations[regionslice.ROOT_REVISION] = str(sent["revision"])
        if sent.get("stop"):
            annotations[regionslice.ROOT_STOP] = str(sent["stop"])[:MAX_TEXT]
        metadata["annotations"] = annotations
        return {
            **manifest,
            "metadata": metadata,
            "spec": {**manifest["spec"], "version": str(sent["version"]), "rollout": rollout},
        }

    # -- one pass ---------------------------------------------------------------------------
    def _upgrades(self) -> dict[str, AgentUpgrade]:
        out: dict[str, AgentUpgrade] = {}
        for stored in self._cache.objects_of(KIND):
            if not in_waves(stored.manifest):
                continue
            known = self._parsed.get(stored.name)
            if known is None or known[0] != stored.revision:
                parsed = parse_manifest(dict(stored.manifest))
                assert isinstance(parsed, AgentUpgrade)
                known = self._parsed[stored.name] = (stored.revision, parsed)
            out[stored.name] = known[1]
        for gone in set(self._parsed) - set(out):
            del self._parsed[gone]
        return out

    def views(self, name: str) -> dict[str, RegionAgentView]:
        """What each region last said of upgrade ``name``, read against the root's revision
        being rolled out now (a claim of it must name its version:
        :func:`hub.decide.agentwaves.read_region_claim`)."""
        views: dict[str, RegionAgentView] = {}
        root = self.states.get(name)
        revision, version = (root.revision, root.version) if root is not None else (0, "")
        for region, state in self._regions.regions.items():
            seen = self._regions.seen(state)
            report = seen.report if seen.current else None
            if report is None:
                views[region] = RegionAgentView(region, connected=seen.connected)
                continue
            claim: dict[str, Any] = {
                "releases": list(report.agent_release_versions),
                "refusals": dict(report.agent_release_refusals),
            }
            found = next((u for u in report.agent_upgrades if u.name == name), None)
            if found is not None:
                claim |= {
                    "name": found.name,
                    "rootRevision": found.root_revision,
                    "version": found.version,
                    "phase": found.phase,
                    "message": found.message,
                    "pool": found.pool,
                    "done": found.done,
                    "updating": found.updating,
                    "failed": dict(found.failed),
                }
            views[region] = read_region_claim(
                region,
                claim,
                upgrade=name,
                connected=seen.connected,
                inventory_total=report.inventory.total,
                revision=revision,
                version=version,
            )
            if views[region].stale:
                self._log_stale(name, region, revision, version, views[region].stale)
        return views

    def _log_stale(self, name: str, region: str, revision: int, version: str, claimed: str) -> None:
        """A region's claim of the root's revision naming another version, logged once (each
        pass and each status read sees it again)."""
        key = (name, region, revision, claimed)
        if key in self._stale_logged:
            return
        if len(self._stale_logged) >= MAX_STALE_LOGGED:
            self._stale_logged.clear()
        self._stale_logged.add(key)
        log.warning(
            "region agent upgrade claim not counted",
            why="it claims the root's revision with another version than that revision's (a "
            "regional hub that claims a revision before running it: upgrade that hub)",
            upgrade=name,
            region=region,
            revision=revision,
            version=version,
            claimed=claimed,
        )

    async def step(self) -> None:
        now = self._clock()
        upgrades = self._upgrades()
        for name in sorted(set(self.states) - set(upgrades)):
            await self._store.txn((), [Delete(agent_wave_key(name))])
            self.states.pop(name, None)
            self._mods.pop(name, None)
            self._regions.changed()
        placed = sorted(self._regions.regions)
        for name, upgrade in sorted(upgrades.items()):
            state = self.states.get(name)
            if state is None or state.version != upgrade.spec.version:
                revision = state.revision + 1 if state is not None else 1
                commit = (upgrade.spec.commit.deadline_s, upgrade.spec.commit.max_tries)
                new = start(name, revision, upgrade.spec.version, now, state, commit)
                event = ("Normal", "RolloutStarted", new.message)
                await self._write(name, new, (event,))
                continue
            planned = plan_agent_waves(
                upgrade.spec.rollout.waves,
                state,
                placed,
                self.views(name),
                now,
                upgrade.spec.rollout.progress_deadline_s,
            )
            if planned.state is not None:
                events = tuple((e.type, e.reason, e.message) for e in planned.events)
                await self._write(name, planned.state, events)

    async def _write(
        self, name: str, state: AgentWaveState, events: tuple[tuple[str, str, str], ...]
    ) -> bool:
        key = agent_wave_key(name)
        try:
            revision = await self._store.txn(
                [Compare(key, self._mods.get(name, 0))],
                [Put(key, storekeys.dumps(state.to_json()))],
            )
        except CompareFailed:
            await self.load()
            return False
        self.states[name] = state
        self._mods[name] = revision
        self._regions.changed()  # what regions are sent changed: their streams look
        for type_, reason, message in events:
            self._writer.event(KIND, name, type_, reason, message)
        log.info(
            "agent wave step",
            upgrade=name,
            revision=state.revision,
            phase=state.phase.value,
            step=state.step,
            released=len(state.released),
            reason=state.reason,
        )
        return True

    # -- operators and edgectl ------------------------------------------------------------------
    async def act(self, name: str, verb: str) -> AgentWaveState | None:
        """An operator's ``rollout pause`` or ``resume`` at the root (None: it does not apply
        now: not Progressing, or not paused)."""
        upgrade = self._upgrades().get(name)
        state = self.states.get(name)
        if upgrade is None or state is None:
            return None
        decide = pause if verb == "pause" else resume
        new = decide(upgrade.spec.rollout.waves, state, self._clock())
        reason = "Paused" if verb == "pause" else "Resumed"
        if new is None or not await self._write(name, new, (("Normal", reason, new.message),)):
            return None
        return new

    def status(self, name: str) -> dict[str, Any] | None:
        """The ``status`` of an AgentUpgrade in waves (None: not in waves, or no state yet)."""
        upgrade = self._upgrades().get(name)
        state = self.states.get(name)
        if upgrade is None or state is None:
            return None
        waves = upgrade.spec.rollout.waves
        placed = sorted(self._regions.regions)
        views = self.views(name)
        rows = []
        for i in range(len(waves) + 1):
            if i < len(waves) and waves[i].pause:
                rows.append({"wave": i + 1, "text": wave_text(waves, i), "regions": {}})
                continue
            regions = wave_regions(waves, i, placed, frozenset())
            if i >= len(waves) and not regions:
                continue
            rows.append(
                {
                    "wave": i + 1,
                    "text": wave_text(waves, i),
                    "regions": {
                        r: {
                            "sent": r in state.released,
                            "connected": views[r].connected if r in views else False,
                            **(
                                views[r].figures()
                                if r in views and views[r].revision == state.revision
                                else {}
                            ),
                            # a claim of this revision naming another version: not counted
                            **(
                                {"notCounted": views[r].text()}
                                if r in views and views[r].stale
                                else {}
                            ),
                        }
                        for r in regions
                    },
                }
            )
        return {
            "phase": state.phase.value,
            "reason": state.reason,
            "message": state.message,
            "revision": state.revision,
            "version": state.version,
            "wave": min(state.step + 1, len(waves) + 1),
            "waveCount": len(waves),
            "waves": rows,
            "released": sorted(state.released),
            **summed_figures(views, state.revision),
            **({"failedRegion": state.failed_region} if state.failed_region else {}),
            "failedDevices": dict(sorted(state.failed.items())),
        }
