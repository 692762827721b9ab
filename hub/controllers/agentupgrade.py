"""The AgentUpgrade controller: applies :func:`hub.decide.agentupgrade.plan_upgrade` to one
upgrade at a time (issue 32, docs/agent-updates.md "The AgentUpgrade kind").

Per key, on a :class:`hub.state.workloop.KeyLoop` of upgrade names, like the rollout
controller (:mod:`hub.controllers.rollout`) whose shape it follows. The change feed queues an
upgrade when it is applied or deleted, and every upgrade when a device's record changes what
the planner reads of it (:func:`agent_view_of`: its phase, labels, agent report, the workloads
that serve); an upgrade in progress comes back every :data:`TICK` (its deadlines are timers);
the slow resync looks at every one again. The releases the hub holds are read from the store
at most every :data:`RELEASES_EVERY` seconds (:func:`hub.state.agentreleases.agent_releases`:
the push writes them) into the cache.

One reconcile: the selected devices and their reports, the stored rollout record, the
releases, ``now``. A step is written to the store (``/agentupgrades/NAME``, compared with the
mod revision it was read at) before anything is sent; then the cache, the events, and the
devices whose desired release the step changed are projected again (the projector builds
``DesiredState.agent`` from the record: :func:`hub.decide.agentdesired.desired_agent_of`). A
hub killed at any moment restarts from what the store holds and never takes a step twice.

Operators act through :meth:`AgentUpgradeController.act` (pause, resume, retry after a
rollback); ``rollout undo`` applies an older revision's version (:func:`undo_manifest`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from edgefleet.api import parse_manifest
from edgefleet.api.agentupgrades import AgentUpgrade
from edgefleet.backoff import Backoff
from edgefleet.errors import CompareFailed, EdgefleetError
from edgefleet.logs import get_logger
from edgefleet.versioning import installed_version
from hub.decide.agentdesired import desired_agent
from hub.decide.agentrevisions import (
    AgentDeviceView,
    AgentPlan,
    AgentRevision,
    AgentUpgradeState,
    agent_upgrade_key,
)
from hub.decide.agentupgrade import plan_upgrade, retry_plan
from hub.decide.devices import Device, DevicePhase
from hub.decide.revisions import RolloutPhase
from hub.state import feed as kinds
from hub.state import storekeys
from hub.state.agentreleases import agent_releases
from hub.state.batchloop import GIVE_UP_AFTER
from hub.state.cache import Cache
from hub.state.projector import Projector
from hub.state.store import Compare, Delete, Put, Store
from hub.state.workloop import RESYNC, KeyLoop
from hub.state.writer import DeviceWriter

log = get_logger(__name__)

KIND = AgentUpgrade.KIND
TICK = 0.5  # seconds between looks at an upgrade in progress (its deadlines)
RELEASES_EVERY = 2.0  # seconds between reads of the releases the hub holds
RETRY = Backoff(0.05, 10.0)


class ActionRefused(Exception):
    """An operator's action that does not apply now; the message says why."""


def serving_of(device: Device) -> tuple[str, ...]:
    """The workloads that serve on ``device`` now with every replica ready, sorted."""
    return tuple(sorted(name for name, w in device.workloads.items() if w.ready))


def agent_view_of(device: Device) -> Hashable:
    """What an upgrade reads of ``device``: a report that changes it may let one step."""
    return (
        device.phase,
        tuple(sorted(device.all_labels().items())),
        device.agent,
        serving_of(device),
    )


def upgrades_of(
    cache: Cache, memo: dict[str, tuple[int, AgentUpgrade]] | None = None
) -> dict[str, AgentUpgrade]:
    """The applied AgentUpgrades by name; ``memo``: those parsed before, by store revision.
    An upgrade in waves (``spec.rollout.waves``, at a root hub) is not one of them: it goes to
    the regions (hub.controllers.agentwaves), not to this hub's own devices."""
    out = {}
    for stored in cache.objects_of(KIND):
        if stored.manifest.get("spec", {}).get("rollout", {}).get("waves"):
            continue
        known = memo.get(stored.name) if memo is not None else None
        if known is not None and known[0] == stored.revision:
            out[stored.name] = known[1]
            continue
        parsed = parse_manifest(dict(stored.manifest))
        assert isinstance(parsed, AgentUpgrade)
        out[stored.name] = parsed
        if memo is not None:
            memo[stored.name] = (stored.revision, parsed)
    if memo is not None:
        for gone in set(memo) - set(out):
            del memo[gone]
    return out


def selected(upgrade: AgentUpgrade, devices: Iterable[Device]) -> list[Device]:
    return [d for d in devices if not d.revoked and upgrade.spec.selector.matches(d.all_labels())]


def device_views(
    cache: Cache, upgrade: AgentUpgrade, upgrades: Mapping[str, AgentUpgrade]
) -> list[AgentDeviceView]:
    """The devices ``upgrade`` selects as its planner sees them; a device also selected by an
    upgrade earlier by name is that one's (``claimed_by``)."""
    earlier = [u for n, u in sorted(upgrades.items()) if n < upgrade.name]
    out = []
    for d in selected(upgrade, cache.devices.values()):
        labels = d.all_labels()
        claimed = next((u.name for u in earlier if u.spec.selector.matches(labels)), "")
        out.append(
            AgentDeviceView(
                d.name,
                d.phase is DevicePhase.READY,
                d.agent,
                serving_of(d),
                claimed,
                d.agent_version,
            )
        )
    return out


def departed_views(
    cache: Cache, state: AgentUpgradeState | None, chosen: Iterable[AgentDeviceView]
) -> dict[str, AgentDeviceView]:
    """The devices ``state`` names (sent, sent back, held while leaving) that the selector no
    longer selects, as the planner sees them; a deleted device is not among them."""
    if state is None:
        return {}
    names = (set(state.sent) | set(state.rollback) | set(state.leaving)) - {d.name for d in chosen}
    out = {}
    for name in sorted(names):
        d = cache.devices.get(name)
        if d is not None:
            out[name] = AgentDeviceView(
                d.name, d.phase is DevicePhase.READY, d.agent, serving_of(d)
            )
    return out


def changed_devices(
    before: AgentUpgradeState | None, after: AgentUpgradeState | None, cache: Cache
) -> set[str]:
    """The devices whose desired release ``after`` makes other than ``before`` did."""
    names: set[str] = set()
    for state in (before, after):
        if state is not None:
            names |= set(state.sent) | set(state.rollback) | set(state.leaving)
    out = set()
    for name in names:
        device = cache.devices.get(name)
        report = device.agent if device is not None else None
        old = desired_agent(before, name, report, cache.agent_releases) if before else None
        new = desired_agent(after, name, report, cache.agent_releases) if after else None
        if old != new:
            out.add(name)
    return out


def _names(state: AgentUpgradeState, device: str) -> bool:
    return device in state.sent or device in state.rollback or device in state.leaving


def undo_manifest(manifest: Mapping[str, Any], revision: AgentRevision) -> dict[str, Any]:
    """The upgrade's manifest with ``revision``'s version and commit settings: what ``rollout
    undo`` applies (its selector and rollout settings stay)."""
    spec = dict(manifest["spec"])
    spec["version"] = revision.version
    spec["commit"] = {"deadlineSeconds": revision.deadline_s, "maxTries": revision.max_tries}
    return {**manifest, "spec": spec}


class AgentUpgradeController:
    """Drives every AgentUpgrade's rollout (module doc)."""

    name = "agentupgrades"

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
        hub_version: str | None = None,
        on_step: Callable[[str, AgentUpgradeState], None] | None = None,
    ) -> None:
        self._store = store
        self._cache = cache
        self._projector = projector
        self._writer = writer
        self._clock = clock
        self._tick = tick
        self.hub_version = hub_version or installed_version()
        self._on_step = on_step
        self._keys: KeyLoop[str] = KeyLoop(
            self.name,
            self._reconcile,
            keys=lambda: sorted(
                {o.name for o in cache.objects_of(KIND)} | set(cache.agent_upgrades)
            ),
            resync=resync,
            base_delay=RETRY.base,
            max_delay=RETRY.cap,
            give_up_after=give_up_after,
        )
        self._lock = asyncio.Lock()
        self._seen: dict[str, Hashable] = {}
        self._releases_at = -1e18
        self._parsed: dict[str, tuple[int, AgentUpgrade]] = {}  # upgrades_of's memo
        self.progress: dict[str, Any] = {}  # the last plan's counts, by upgrade (status)
        cache.feed.watch((KIND, kinds.DEVICE), self._changed, settled=self._keys.settled)

    def _changed(self, kind: str, name: str) -> None:
        if kind == KIND:
            self._keys.add(name)
            return
        cache = self._cache
        device = cache.devices.get(name)
        seen = agent_view_of(device) if device is not None else None
        if seen == self._seen.get(name):
            return
        if seen is None:
            self._seen.pop(name, None)
        else:
            self._seen[name] = seen
        labels = device.all_labels() if device is not None else {}
        self._keys.add_all(
            n
            for n, u in upgrades_of(cache, self._parsed).items()
            if u.spec.selector.matches(labels)  # selects it, or did: its record names it
            or (n in cache.agent_upgrades and _names(cache.agent_upgrades[n], name))
        )

    def wake(self, names: Iterable[str] | None = None) -> None:
        if names is None:
            self._keys.resync()
        else:
            self._keys.add_all(names)

    async def run(self, stop: asyncio.Event) -> None:
        await self._keys.run(stop)

    async def drain(self) -> None:
        await self._keys.drain()

    @property
    def reconciled(self) -> int:
        return self._keys.reconciled

    async def refresh_releases(self, *, force: bool = False) -> None:
        """Read the releases the hub holds into the cache (at most every RELEASES_EVERY s);
        the devices they change are projected again."""
        now = time.monotonic()
        if not force and now - self._releases_at < RELEASES_EVERY:
            return
        self._releases_at = now
        try:
            records = await agent_releases(self._store)
        except EdgefleetError as exc:
            log.warning("agent releases not read", error=str(exc))
            return
        fresh = {r.key: r for r in records}
        cache = self._cache
        if fresh == cache.agent_releases:
            return
        before = dict(cache.agent_releases)
        cache.agent_releases.clear()
        cache.agent_releases.update(fresh)
        marked: set[str] = set()
        for state in cache.agent_upgrades.values():
            for name in set(state.sent) | set(state.rollback) | set(state.leaving):
                device = cache.devices.get(name)
                report = device.agent if device is not None else None
                if desired_agent(state, name, report, before) != desired_agent(
                    state, name, report, fresh
                ):
                    marked.add(name)
        self._projector.mark(marked)
        self._keys.add_all(o.name for o in cache.objects_of(KIND))

    async def _reconcile(self, name: str) -> float | None:
        await self.refresh_releases()
        async with self._lock:
            await self._reconcile_one(name, self._clock())
        state = self._cache.agent_upgrades.get(name)
        progress = self.progress.get(name)
        if (KIND, name) in self._cache.stored and (
            state is None
            or state.phase in (RolloutPhase.PROGRESSING, RolloutPhase.PAUSED)
            or (progress is not None and progress.updating)  # their deadlines
        ):
            return self._tick
        return None

    async def reconcile(self, names: Iterable[str]) -> None:
        """Take the steps owed to ``names`` now, here (tests)."""
        await self.refresh_releases(force=True)
        async with self._lock:
            now = self._clock()
            for name in sorted(set(names)):
                await self._reconcile_one(name, now)

    async def _reconcile_one(self, name: str, now: float) -> None:
        cache = self._cache
        if (KIND, name) not in cache.stored:
            self.progress.pop(name, None)
            if name in cache.agent_upgrades:
                await self._forget(name)
            return
        upgrades = upgrades_of(cache, self._parsed)
        upgrade = upgrades.get(name)
        if upgrade is None:  # in waves: the regions' (hub.controllers.agentwaves)
            self.progress.pop(name, None)
            if name in cache.agent_upgrades:
                await self._forget(name)
            return
        for _ in range(3):  # a new revision, then its first devices
            plan = self.plan(upgrade, upgrades, now)
            self.progress[name] = plan.progress
            if not await self._write(name, cache.agent_upgrades.get(name), plan):
                break

    def plan(
        self, upgrade: AgentUpgrade, upgrades: Mapping[str, AgentUpgrade], now: float
    ) -> AgentPlan:
        """The planner's answer for ``upgrade`` now (also for status: it writes nothing)."""
        cache = self._cache
        state = cache.agent_upgrades.get(upgrade.name)
        views = device_views(cache, upgrade, upgrades)
        return plan_upgrade(
            upgrade,
            state,
            views,
            cache.agent_releases,
            self.hub_version,
            now,
            departed_views(cache, state, views),
        )

    async def _write(self, name: str, before: AgentUpgradeState | None, plan: AgentPlan) -> bool:
        state = plan.state
        if state is None:
            return False
        cache = self._cache
        key = agent_upgrade_key(name)
        try:
            revision = await self._store.txn(
                [Compare(key, cache.agent_upgrade_revisions.get(name, 0))],
                [Put(key, storekeys.dumps(state.to_json()))],
            )
        except CompareFailed:
            await self._reload(name)
            self._keys.add(name)
            return False
        self._put(name, state, revision)
        for event in plan.events:
            self._writer.event(KIND, name, event.type, event.reason, event.message)
        log.info(
            "agent upgrade step",
            upgrade=name,
            revision=state.revision,
            phase=state.phase.value,
            sent=len(state.sent),
            failed=len(state.failed),
        )
        self._projector.mark(changed_devices(before, state, cache))
        if self._on_step is not None:
            self._on_step(name, state)
        return True

    def _put(self, name: str, state: AgentUpgradeState | None, revision: int = 0) -> None:
        cache = self._cache
        if state is None:
            cache.agent_upgrades.pop(name, None)
            cache.agent_upgrade_revisions.pop(name, None)
        else:
            cache.agent_upgrades[name] = state
            cache.agent_upgrade_revisions[name] = revision

    async def _reload(self, name: str) -> None:
        kv = await self._store.get(agent_upgrade_key(name))
        if kv is None:
            self._put(name, None)
            return
        self._put(name, AgentUpgradeState.from_json(storekeys.loads(kv.value)), kv.mod_revision)

    async def _forget(self, name: str) -> None:
        """The upgrade was deleted: its record goes, and its devices are sent no release of
        it (each keeps the release it committed)."""
        before = self._cache.agent_upgrades.get(name)
        await self._store.txn((), [Delete(agent_upgrade_key(name))])
        self._put(name, None)
        self._projector.mark(changed_devices(before, None, self._cache))

    # -- operators -------------------------------------------------------------------------
    async def act(self, name: str, action: str) -> AgentUpgradeState:
        """``pause``, ``resume`` (after a rollback: retry the same version as a new revision)."""
        if (KIND, name) not in self._cache.stored or name not in self._cache.agent_upgrades:
            raise ActionRefused(f"AgentUpgrade {name} has no rollout")
        async with self._lock:
            return await self._act(name, action)

    async def _act(self, name: str, action: str) -> AgentUpgradeState:
        cache = self._cache
        state = cache.agent_upgrades[name]
        now = self._clock()
        if action == "pause":
            if state.phase is not RolloutPhase.PROGRESSING:
                raise ActionRefused(
                    f"the rollout of AgentUpgrade {name} is {state.phase.value}, not Progressing"
                )
            plan = AgentPlan(
                replace(
                    state,
                    phase=RolloutPhase.PAUSED,
                    reason="Paused",
                    message="paused by an operator",
                    changed_at=now,
                )
            )
        elif action == "resume" and state.phase is RolloutPhase.PAUSED:
            plan = AgentPlan(
                replace(
                    state,
                    phase=RolloutPhase.PROGRESSING,
                    reason="Resumed",
                    message="resumed by an operator",
                    changed_at=now,
                )
            )
        elif action == "resume" and state.phase is RolloutPhase.ROLLED_BACK:
            upgrade = upgrades_of(cache)[name]
            plan = retry_plan(upgrade, state, now)
        elif action == "resume":
            raise ActionRefused(
                f"the rollout of AgentUpgrade {name} is {state.phase.value}: nothing to resume"
            )
        else:
            raise ActionRefused(f"unknown rollout action {action!r}")
        assert plan.state is not None
        if not await self._write(name, state, plan):
            raise ActionRefused(f"the rollout of AgentUpgrade {name} changed meanwhile; try again")
        new = plan.state
        if not plan.events:
            self._writer.event(KIND, name, "Normal", new.reason, f"rollout {new.message}")
        self._keys.add(name)
        return new
