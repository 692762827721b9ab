"""An AgentUpgrade's rollout across regions (a root hub's waves), decided: pure, tested as
tables (issue 32, docs/agent-updates.md "Waves by region"); applied by
:mod:`hub.controllers.agentwaves`. Built on the ModelDeployment waves' own pieces
(:mod:`hub.decide.wave`: the same :class:`edgefleet.api.Wave`, :func:`wave_regions`,
:func:`wave_text`).

The root keeps one :class:`AgentWaveState` per upgrade. :func:`plan_agent_waves` takes one
step from it and what each region last reported of the upgrade (:class:`RegionAgentView`,
read from the region's claim by :func:`read_region_claim`, which bounds it):

* a wave of regions is **released**: each of its regions is sent the upgrade (its manifest
  without the waves, carrying the root's revision); inside the region its own canary steps,
  ``maxUnavailable`` and ``failureThreshold`` run on its own devices
  (:mod:`hub.decide.agentupgrade`). A region is released only if it holds the release of the
  version (the region's report lists the agent release versions its hub holds: each region
  fetches the root's release of a version its slice names, checked as a push is,
  :mod:`hub.decide.agentrelay`); until it does, the wave waits, reason ``ReleaseMissing``
  naming the region (and, when its report says so, why it refused the root's release), and
  the progress deadline counts;
* the wave **passes** when each of its regions reports the upgrade, at the root's revision,
  ``Complete``; a ``pause`` wave waits its duration or (none given) until ``rollout
  resume``; after the last wave the regions no wave names follow;
* a released region that reports the upgrade ``RolledBack`` or ``Failed`` at the root's
  revision **stops** the waves: phase RolledBack, and every released region is told to roll
  back (:meth:`AgentWaveState.undo`: the region's upgrade is stopped, and its own rollback
  semantics send each device that committed the version back to the release it came from);
  status names the region and its failed devices with their reasons (as the region claims
  them, bounded);
* a region of the current wave not connected, or that has not reported the upgrade, holds
  the wave (neither a pass nor a failure, ``RegionUnreachable``); a wave not finished
  ``progressDeadlineSeconds`` after it could last go on fails like a region that rolled back
  (``ProgressDeadlineExceeded``).

**What one region can claim.** A report speaks only for the region that sent it, and only of
the upgrade and the root revision it was sent: a ``Complete`` or ``RolledBack`` for a revision
never sent to it counts for nothing; its counts are clamped (never more devices than its own
inventory, done + updating + failed never more than its pool), its failed devices at most
:data:`MAX_FAILED`, each name and reason cut to :data:`MAX_NAME` / :data:`MAX_TEXT`; an unknown
phase is no phase. A region can stop the waves (as any region that rolled back: the cautious
side), never pass another region's wave. A claim for the root's revision N must name revision
N's version: a region claims N only once its own rollout record is of N's manifest
(:func:`hub.decide.agentupgrade.takes_up`), and its report names the version of that record;
a claim of N naming another version (a regional hub still running code from before that rule,
whose record is still the previous revision's; or a hostile one) counts as no claim for N,
neither a pass nor a failure, as a claim of revision 0 does (:attr:`RegionAgentView.stale`
says what it claimed; the root logs it once). The report carries no commit settings: the
version is what is checked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from edgefleet.api import Wave
from hub.decide.agentrevisions import MAX_REVISIONS, named
from hub.decide.rollout import Event
from hub.decide.wave import wave_regions, wave_text

MAX_HISTORY = 64
MAX_FAILED = 20  # failed devices a region's claim may name
MAX_NAME = 253
MAX_TEXT = 512
MAX_RELEASES = 64  # agent release versions a region's claim may list
MAX_COUNT = 1_000_000

COMPLETE = "Complete"
FAILED_PHASES = ("RolledBack", "Failed")
REGION_PHASES = ("Progressing", "Paused", COMPLETE, *FAILED_PHASES)


class AgentWavePhase(StrEnum):
    PROGRESSING = "Progressing"
    PAUSED = "Paused"
    COMPLETE = "Complete"
    ROLLED_BACK = "RolledBack"


@dataclass(frozen=True, slots=True)
class AgentWaveState:
    """Where an upgrade's rollout across regions stands."""

    upgrade: str
    revision: int  # the root's revision of the upgrade being rolled out
    version: str
    released: frozenset[str] = frozenset()  # regions sent the upgrade
    phase: AgentWavePhase = AgentWavePhase.PROGRESSING
    step: int = 0  # index in spec.rollout.waves (== len: the remaining regions)
    step_at: float = 0.0
    reason: str = ""
    message: str = ""
    started_at: float = 0.0
    changed_at: float = 0.0
    deadline_from: float = 0.0
    history: tuple[Mapping[str, Any], ...] = ()  # {wave, outcome, at, message, regions}
    failed_region: str = ""  # the region that stopped the waves
    failed: Mapping[str, str] = field(default_factory=dict)  # its failed devices: reason
    # what each region was sent of the revisions before, until this one is released to it:
    # region -> {version, revision, stop?} (a region keeps its upgrade and its history)
    previous: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    deadline_s: int = 0  # this revision's commit settings (spec.commit), for history and undo
    max_tries: int = 0
    source: int = 0  # the earlier revision it is a copy of (same version and commit), 0: none
    # the revisions before this one, oldest first, at most MAX_REVISIONS - 1: what history
    # shows and undo goes back to ({number, version, deadlineSeconds, maxTries, createdAt,
    # source, outcome})
    revisions: tuple[Mapping[str, Any], ...] = ()

    def sent_to(self, region: str) -> Mapping[str, Any] | None:
        """What ``region`` is sent now: the version, the root revision and, once the waves
        stopped, why (None: nothing)."""
        if region in self.released:
            out: dict[str, Any] = {"version": self.version, "revision": self.revision}
            if self.undo(region):
                out["stop"] = self.message[:MAX_TEXT]
            return out
        return self.previous.get(region)

    def sends(self, region: str) -> bool:
        """Whether ``region`` is sent the upgrade (to run, or to roll back)."""
        return self.phase is AgentWavePhase.COMPLETE or region in self.released

    def undo(self, region: str) -> bool:
        """Whether ``region`` is told to roll the upgrade back (the waves stopped)."""
        return self.phase is AgentWavePhase.ROLLED_BACK and region in self.released

    def to_json(self) -> dict[str, Any]:
        return {
            "upgrade": self.upgrade,
            "revision": self.revision,
            "version": self.version,
            "released": sorted(self.released),
            "phase": self.phase.value,
            "step": self.step,
            "stepAt": self.step_at,
            "reason": self.reason,
            "message": self.message,
            "startedAt": self.started_at,
            "changedAt": self.changed_at,
            "deadlineFrom": self.deadline_from,
            "history": [dict(h) for h in self.history],
            "failedRegion": self.failed_region,
            "failed": dict(sorted(self.failed.items())),
            "previous": {r: dict(v) for r, v in sorted(self.previous.items())},
            "deadlineSeconds": self.deadline_s,
            "maxTries": self.max_tries,
            "source": self.source,
            "revisions": [dict(r) for r in self.revisions],
        }

    def record(self) -> dict[str, Any]:
        """This revision as history shows it (``outcome`` once it is over)."""
        out: dict[str, Any] = {
            "number": self.revision,
            "version": self.version,
            "deadlineSeconds": self.deadline_s,
            "maxTries": self.max_tries,
            "createdAt": self.started_at,
            "source": self.source,
        }
        if self.phase is AgentWavePhase.COMPLETE:
            out["outcome"] = "complete"
        elif self.phase is AgentWavePhase.ROLLED_BACK:
            out["outcome"] = f"rolled back: {self.reason}"[:MAX_TEXT]
        return out

    def history_records(self) -> list[dict[str, Any]]:
        """Every revision kept, oldest first, this one last."""
        return [*(dict(r) for r in self.revisions), self.record()]

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> AgentWaveState:
        return cls(
            upgrade=str(doc["upgrade"]),
            revision=int(doc["revision"]),
            version=str(doc["version"]),
            released=frozenset(str(r) for r in doc.get("released", ())),
            phase=AgentWavePhase(doc.get("phase", AgentWavePhase.PROGRESSING.value)),
            step=int(doc.get("step", 0)),
            step_at=float(doc.get("stepAt", 0.0)),
            reason=str(doc.get("reason", "")),
            message=str(doc.get("message", "")),
            started_at=float(doc.get("startedAt", 0.0)),
            changed_at=float(doc.get("changedAt", 0.0)),
            deadline_from=float(doc.get("deadlineFrom", 0.0)),
            history=tuple(dict(h) for h in doc.get("history", ())),
            failed_region=str(doc.get("failedRegion", "")),
            failed={str(k): str(v) for k, v in doc.get("failed", {}).items()},
            previous={str(r): dict(v) for r, v in doc.get("previous", {}).items()},
            deadline_s=int(doc.get("deadlineSeconds", 0)),
            max_tries=int(doc.get("maxTries", 0)),
            source=int(doc.get("source", 0)),
            revisions=tuple(dict(r) for r in doc.get("revisions", ())),
        )


def start(
    upgrade: str,
    revision: int,
    version: str,
    now: float,
    before: AgentWaveState | None = None,
    commit: tuple[int, int] = (0, 0),
) -> AgentWaveState:
    """A new revision's rollout across regions, at its first wave, no region sent it yet;
    each region keeps what it was sent of the revisions ``before`` until its wave.
    ``commit``: the upgrade's (deadlineSeconds, maxTries). The revision before is kept in
    history with its outcome (``superseded`` if it was still rolling out)."""
    previous: dict[str, Mapping[str, Any]] = {}
    kept: tuple[Mapping[str, Any], ...] = ()
    source = 0
    if before is not None:
        for region in sorted(before.released | frozenset(before.previous)):
            sent = before.sent_to(region)
            if sent is not None:
                previous[region] = sent
        last = before.record()
        last.setdefault("outcome", "superseded")
        kept = (*before.revisions, last)[-(MAX_REVISIONS - 1) :]
        same = [
            int(r["number"])
            for r in kept
            if r["version"] == version and (r["deadlineSeconds"], r["maxTries"]) == commit
        ]
        source = max(same, default=0)
    return AgentWaveState(
        previous=previous,
        deadline_s=commit[0],
        max_tries=commit[1],
        source=source,
        revisions=kept,
        upgrade=upgrade,
        revision=revision,
        version=version,
        started_at=now,
        step_at=now,
        changed_at=now,
        deadline_from=now,
        reason="Started",
        message=f"revision {revision} (edged {version}) rolls out across regions in waves",
    )


@dataclass(frozen=True, slots=True)
class RegionAgentView:
    """What the root knows now of one region and the upgrade there (bounded: see
    :func:`read_region_claim`)."""

    name: str
    connected: bool = False
    reported: bool = False  # its last report has the upgrade
    revision: int = 0  # the root revision its upgrade was sent with
    phase: str = ""
    message: str = ""
    pool: int = 0
    done: int = 0
    updating: int = 0
    failed: Mapping[str, str] = field(default_factory=dict)  # device -> reason
    releases: frozenset[str] = frozenset()  # agent release versions its hub holds
    # version -> why the region refused the root's release of it (hub.decide.agentrelay)
    refusals: Mapping[str, str] = field(default_factory=dict)
    # the version it claimed for the root's revision when that revision has another one (its
    # claim then counts for nothing: ``revision`` is 0); empty: none
    stale: str = ""

    def figures(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "pool": self.pool,
            "done": self.done,
            "updating": self.updating,
            "failed": dict(sorted(self.failed.items())),
        }

    def text(self) -> str:
        if self.stale:
            return (
                f"claims the root's revision with edged {self.stale}, not that revision's "
                "version: not counted"
            )
        out = (
            f"{self.done} of {self.pool} devices done, {self.updating} updating, "
            f"{len(self.failed)} failed, upgrade {self.phase or 'not reported'}"
        )
        if self.failed:
            out += f" (failed: {named(self.failed)})"
        return out


def _cut(text: object, limit: int) -> str:
    return str(text)[:limit]


def _count(value: object, ceiling: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return max(0, min(value, ceiling, MAX_COUNT))


def read_region_claim(
    region: str,
    claim: Mapping[str, Any] | None,
    *,
    upgrade: str,
    connected: bool,
    inventory_total: int,
    revision: int,
    version: str,
) -> RegionAgentView:
    """What the root believes of ``region``'s claim about ``upgrade``, bounded: counts within
    its inventory and its pool, failed devices at most :data:`MAX_FAILED` (names and reasons
    cut), an unknown phase none, a claim about another upgrade none at all. ``revision``: the
    root's revision being rolled out (0: none yet), ``version``: its version; a claim of that
    revision naming another version is no claim of it (module doc)."""
    releases_raw = claim.get("releases", ()) if isinstance(claim, Mapping) else ()
    releases = frozenset(
        _cut(v, MAX_NAME)
        for v in (releases_raw if isinstance(releases_raw, list | tuple) else ())[:MAX_RELEASES]
        if isinstance(v, str) and v
    )
    refusals_raw = claim.get("refusals") if isinstance(claim, Mapping) else None
    refusals = {
        _cut(v, MAX_NAME): _cut(why, MAX_TEXT)
        for v, why in sorted(refusals_raw.items() if isinstance(refusals_raw, Mapping) else [])[
            :MAX_RELEASES
        ]
    }
    if not isinstance(claim, Mapping) or claim.get("name") != upgrade:
        return RegionAgentView(
            name=region, connected=connected, releases=releases, refusals=refusals
        )
    claimed = claim.get("rootRevision")
    claimed = claimed if isinstance(claimed, int) and not isinstance(claimed, bool) else 0
    stale = ""
    named_version = claim.get("version")
    if revision and claimed == revision and named_version != version:
        given = isinstance(named_version, str) and named_version
        stale = _cut(named_version, MAX_NAME) if given else "<none>"
        claimed = 0
    phase = claim.get("phase")
    pool = _count(claim.get("pool"), max(0, inventory_total))
    done = _count(claim.get("done"), pool)
    updating = _count(claim.get("updating"), pool - done)
    failed_raw = claim.get("failed")
    failed: dict[str, str] = {}
    if isinstance(failed_raw, Mapping):
        for device, why in sorted(failed_raw.items(), key=lambda kv: str(kv[0])):
            if len(failed) >= min(MAX_FAILED, max(0, pool - done - updating)):
                break
            failed[_cut(device, MAX_NAME)] = _cut(why, MAX_TEXT)
    return RegionAgentView(
        name=region,
        connected=connected,
        reported=True,
        revision=claimed,
        phase=phase if phase in REGION_PHASES else "",
        message=_cut(claim.get("message", ""), MAX_TEXT),
        pool=pool,
        done=done,
        updating=updating,
        failed=failed,
        releases=releases,
        refusals=refusals,
        stale=stale,
    )


def _missing_text(region: str, version: str, refusal: str | None) -> str:
    head = f"region {region}'s hub holds no release of edged {version}"
    if refusal:
        return f"{head}: it refused the root's release ({refusal})"
    return (
        f"{head}: it fetches the root's; push the release at the root hub if the root holds "
        "none either (edgectl agent push)"
    )


def summed_figures(views: Mapping[str, RegionAgentView], revision: int) -> dict[str, int]:
    """The devices of the regions that report the upgrade at the root's ``revision``, summed:
    what ``get agentupgrades`` and the dashboard show for an upgrade in waves (each region's
    figures bounded by :func:`read_region_claim`: its inventory, its pool, ``MAX_FAILED``)."""
    shown = [v for v in views.values() if v.reported and v.revision == revision]
    return {
        "poolDevices": sum(v.pool for v in shown),
        "doneDevices": sum(v.done for v in shown),
        "updatingDevices": sum(v.updating for v in shown),
        "failedCount": sum(len(v.failed) for v in shown),
        "reportingRegions": len(shown),
    }


@dataclass(frozen=True, slots=True)
class AgentWaveStep:
    state: AgentWaveState | None = None
    events: tuple[Event, ...] = ()


def region_done(view: RegionAgentView | None, revision: int) -> bool:
    return (
        view is not None and view.reported and view.revision == revision and view.phase == COMPLETE
    )


def region_failed(view: RegionAgentView | None, revision: int) -> bool:
    return (
        view is not None
        and view.reported
        and view.revision == revision
        and view.phase in FAILED_PHASES
    )


def plan_agent_waves(
    waves: Sequence[Wave],
    state: AgentWaveState,
    placed: Sequence[str],
    views: Mapping[str, RegionAgentView],
    now: float,
    deadline_s: float | None = None,
) -> AgentWaveStep:
    """The next step (see the module doc). ``waves``: the upgrade's ``spec.rollout.waves``
    (regions and pauses); ``placed``: the enrolled regions, sorted; ``views``: region -> what
    it last said; ``deadline_s``: the upgrade's ``progressDeadlineSeconds``."""
    if state.phase in (AgentWavePhase.COMPLETE, AgentWavePhase.ROLLED_BACK):
        return AgentWaveStep()
    for region in sorted(state.released):
        view = views.get(region)
        if region_failed(view, state.revision):
            assert view is not None
            return _roll_back(state, waves, region, view, "RegionFailed", view.text(), now)
    if state.phase is AgentWavePhase.PAUSED:
        return AgentWaveStep()
    i = state.step
    if i < len(waves) and waves[i].pause:
        return _pause(state, waves, now)
    regions = wave_regions(waves, i, placed, state.released)
    missing = [
        r
        for r in regions
        if r not in state.released and views.get(r) and state.version not in views[r].releases
    ]
    away = [r for r in regions if not (views.get(r) and views[r].connected)]
    new = [r for r in regions if r not in state.released and r not in away and r not in missing]
    if new:
        moved = replace(
            state,
            released=state.released | frozenset(new),
            changed_at=now,
            deadline_from=now,
            reason="WaveStarted",
            message=f"{wave_text(waves, i)}: revision {state.revision} (edged {state.version}) "
            f"sent to {', '.join(new)}",
        )
        return AgentWaveStep(moved, (Event("Normal", "WaveStarted", moved.message),))
    since = max(state.step_at, state.deadline_from)
    unfinished = [r for r in regions if not region_done(views.get(r), state.revision)]
    if missing or away:
        why = "; ".join(
            [
                _missing_text(r, state.version, views[r].refusals.get(state.version))
                for r in missing
                if r not in away
            ]
            + [f"region {r} is unreachable (not connected to the root)" for r in away]
        )
        reason = "ReleaseMissing" if [r for r in missing if r not in away] else "RegionUnreachable"
        if missing and deadline_s is not None and now - since > deadline_s:
            return _deadline(state, waves, deadline_s, unfinished, views, now)
        message = f"{wave_text(waves, i)} waits, neither passed nor failed: {why}"
        if state.reason == reason and state.message == message:
            return AgentWaveStep()
        held = replace(state, reason=reason, message=message, changed_at=now)
        return AgentWaveStep(held, (Event("Warning", "WaveWaiting", message),))
    if unfinished:
        if state.reason in ("RegionUnreachable", "ReleaseMissing"):
            going = replace(
                state,
                reason="WaveProgressing",
                message=f"{wave_text(waves, i)}: every region of the wave can go on",
                changed_at=now,
                deadline_from=now,
            )
            return AgentWaveStep(going, (Event("Normal", "WaveProgressing", going.message),))
        if deadline_s is not None and now - since > deadline_s:
            return _deadline(state, waves, deadline_s, unfinished, views, now)
        return AgentWaveStep()
    figures = {r: views[r].figures() for r in regions}
    summary = "; ".join(f"{r}: {views[r].text()}" for r in regions) or "no region in it"
    if i >= len(waves):
        message = (
            f"revision {state.revision} (edged {state.version}) is done in every region "
            f"({', '.join(placed) or 'none enrolled'}): {summary}"
        )
        done = replace(
            state,
            phase=AgentWavePhase.COMPLETE,
            released=state.released | frozenset(placed),
            reason="RolloutComplete",
            message=message,
            changed_at=now,
            history=_record(state, "Passed", message, figures, now),
        )
        return AgentWaveStep(done, (Event("Normal", "RolloutComplete", message),))
    return _next(state, waves, f"passed ({summary})", figures, now)


def _record(
    state: AgentWaveState, outcome: str, message: str, regions: Mapping[str, Any], now: float
) -> tuple[Mapping[str, Any], ...]:
    entry = {
        "wave": state.step + 1,
        "outcome": outcome,
        "at": now,
        "message": message,
        "regions": dict(regions),
    }
    return (*state.history, entry)[-MAX_HISTORY:]


def _next(
    state: AgentWaveState,
    waves: Sequence[Wave],
    why: str,
    figures: Mapping[str, Any],
    now: float,
) -> AgentWaveStep:
    message = f"{wave_text(waves, state.step)} {why}; now at {wave_text(waves, state.step + 1)}"
    moved = replace(
        state,
        step=state.step + 1,
        step_at=now,
        changed_at=now,
        reason="WavePassed",
        message=message,
        history=_record(state, "Passed", message, figures, now),
    )
    return AgentWaveStep(moved, (Event("Normal", "WavePassed", message),))


def _pause(state: AgentWaveState, waves: Sequence[Wave], now: float) -> AgentWaveStep:
    wave = waves[state.step]
    if wave.pause_s is None:
        paused = replace(
            state,
            phase=AgentWavePhase.PAUSED,
            reason="WavePause",
            message=f"paused at {wave_text(waves, state.step)} until edgectl rollout resume",
            changed_at=now,
        )
        return AgentWaveStep(paused, (Event("Normal", "WavePaused", paused.message),))
    if now - state.step_at >= wave.pause_s:
        return _next(state, waves, "is over", {}, now)
    return AgentWaveStep()


def pause(waves: Sequence[Wave], state: AgentWaveState, now: float) -> AgentWaveState | None:
    """An operator's ``rollout pause`` at the root: no further wave starts and no region is
    sent the upgrade (None: not Progressing). The regions already sent it go on with their own
    rollouts, and one of them that fails still rolls every released region back."""
    if state.phase is not AgentWavePhase.PROGRESSING:
        return None
    return replace(
        state,
        phase=AgentWavePhase.PAUSED,
        reason="Paused",
        message=f"paused by an operator at {wave_text(waves, state.step)}: no further region "
        "is sent the upgrade until edgectl rollout resume",
        changed_at=now,
    )


def resume(waves: Sequence[Wave], state: AgentWaveState, now: float) -> AgentWaveState | None:
    """``rollout resume`` at the root: on from where an operator paused (the wave's deadline
    counted again from now), or past a pause wave (None: not paused)."""
    if state.phase is not AgentWavePhase.PAUSED:
        return None
    if state.reason != "WavePause":
        return replace(
            state,
            phase=AgentWavePhase.PROGRESSING,
            changed_at=now,
            deadline_from=now,
            reason="Resumed",
            message=f"resumed by an operator at {wave_text(waves, state.step)}",
        )
    message = f"resumed by an operator after {wave_text(waves, state.step)}"
    return replace(
        state,
        phase=AgentWavePhase.PROGRESSING,
        step=state.step + 1,
        step_at=now,
        changed_at=now,
        deadline_from=now,
        reason="Resumed",
        message=message,
        history=_record(state, "Passed", message, {}, now),
    )


def _roll_back(
    state: AgentWaveState,
    waves: Sequence[Wave],
    region: str,
    view: RegionAgentView | None,
    reason: str,
    why: str,
    now: float,
) -> AgentWaveStep:
    back = sorted(state.released)
    message = (
        f"revision {state.revision} (edged {state.version}) failed in region {region} at "
        f"{wave_text(waves, state.step)}: {why}; every region sent it "
        f"({', '.join(back) or 'none'}) is told to roll it back"
    )
    new = replace(
        state,
        phase=AgentWavePhase.ROLLED_BACK,
        reason=reason,
        message=message,
        changed_at=now,
        failed_region=region,
        failed=dict(view.failed) if view is not None else {},
        history=_record(state, "Failed", message, {region: view.figures()} if view else {}, now),
    )
    return AgentWaveStep(new, (Event("Warning", reason, message),))


def _deadline(
    state: AgentWaveState,
    waves: Sequence[Wave],
    deadline_s: float,
    unfinished: Sequence[str],
    views: Mapping[str, RegionAgentView],
    now: float,
) -> AgentWaveStep:
    why = f"not done within progressDeadlineSeconds ({deadline_s:g} s): " + "; ".join(
        f"{r}: {views[r].text() if r in views else 'not reported'}" for r in unfinished
    )
    first = unfinished[0] if unfinished else ""
    return _roll_back(state, waves, first, views.get(first), "ProgressDeadlineExceeded", why, now)
