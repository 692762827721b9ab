"""An AgentUpgrade's rollout, decided: pure, tested as tables (issue 32, docs/agent-updates.md
"The AgentUpgrade kind"). :mod:`hub.controllers.agentupgrade` applies it.

A **revision** of an upgrade is what devices are sent: the version and the commit settings
(``spec.commit``). Changing them makes a new revision (numbered from 1, the last
:data:`MAX_REVISIONS` kept in the rollout record); changing the selector or the rollout
settings does not. ``rollout undo`` applies an older revision's version again: a new revision
like any other; ``rollout resume`` after a rollback retries the same version as a new
revision (``source``), so that no report about the failed attempt counts for the new one.

The **rollout record** (:class:`AgentUpgradeState`) names every device sent the release (with
the revision, when, the release it had committed then, and the workloads it served then) and
the devices that failed. :func:`plan_upgrade` takes one step from it and what the devices
report (:class:`AgentDeviceView`), with ``now`` passed in:

* a selected device is **refused** (never sent, listed with the reason) when it does not
  report its release (an edged too old), runs without the A/B launcher (it cannot update
  itself), runs a version outside this hub's window (:func:`edgefleet.agentskew.check_skew`),
  or has no release of the version for its platform (machine and Python ABI); one already
  **up to date** (it runs and committed the version) needs nothing. Neither counts in the
  percentages, the budget or the threshold: the **pool** is the other selected devices;
* a device sent the release is **done** once it *came back healthy*: connected, its report
  says it runs and committed the version for this very upgrade and revision, and every
  workload that served on it when it was sent serves again (all replicas ready). It
  **failed** when it reports ``RolledBack`` or ``Failed`` for this upgrade and revision (its
  launcher went back by itself: the reason is the device's), or when it is not done
  ``progressDeadlineSeconds`` after it was sent (it never came back: disconnected, stuck);
  otherwise it is **updating**;
* while Progressing, more devices of the pool are sent the release, in name order: each
  canary step raises how many may have it (its percentage of the pool, rounded up, at least
  one); a step is passed when that many were sent and none is still updating; past the last
  step, every device of the pool. At any moment at most ``maxUnavailable`` devices are
  updating (a count, or a percentage of the pool rounded down, at least one). Devices not
  connected are skipped (not sent) and hold completion, like a ModelDeployment's;
* failed devices reaching ``failureThreshold`` (a count, or a percentage of the pool rounded
  up, at least one) **stop** the rollout: phase RolledBack, status naming each failed device
  and its reason. Rollback semantics: a device whose attempt ended on the device (it
  reports RolledBack or Failed for this revision) is sent no release; any other that did
  not commit the new version is **held** at the release it had committed when it was sent
  (``held``, :func:`hold_targets`), so that a trial aborts and an install never switches (a
  trial edged asked nothing commits), and let go once settled on it; a device that *did*
  commit it is sent an explicit release, the one it had committed when it
  was sent (``rollback``), and stays pinned there while the upgrade is RolledBack. That
  release is still on the device (A/B: the slot it switched from, or the base install's
  edged, which the hub never holds as a release), so it is sent by version, with its signed
  metadata when the hub holds it and without otherwise: the device switches to what it has
  and never fetches (a device that no longer has it fails to fetch it and says so). A device
  whose previous release is not known cannot be sent back: status says so;
* when every device of the pool is done or failed (failures under the threshold), the
  rollout is Complete; devices selected later are still sent the release within the budget,
  and a failure then is recorded but reverts nothing (the fleet's verdict was given).

**What one device can claim.** A report speaks only for the device that made it, and only
about the upgrade and revision it was sent: ``Committed`` (or ``RolledBack``) for an upgrade
or revision never sent to it counts for nothing; a device already up to date is taken out of
the pool (it can only remove itself from the canary, never stand in for another device); a
failed device counts once. No count reaches a threshold or passes a step but one device per
device.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from edgefleet.agentskew import check_skew
from edgefleet.api.agentupgrades import AgentUpgrade
from edgefleet.api.quantities import IntOrPercent
from edgefleet.trust.versions import version_key
from hub.decide.agentreleases import AgentReleaseRecord, agent_release_key
from hub.decide.devices import AgentReport
from hub.decide.regionslice import ROOT_STOP
from hub.decide.revisions import RolloutPhase

AGENT_UPGRADES = "/agentupgrades/"
"""Store prefix of the rollout records: ``/agentupgrades/NAME`` (:class:`AgentUpgradeState`)."""

MAX_REVISIONS = 10
MAX_NAMED = 5  # devices a message names before "and N more"

COMMITTED = "Committed"

MAX_STOP_TEXT = 512
FAILED_PHASES = ("RolledBack", "Failed")


def agent_upgrade_key(name: str) -> str:
    return f"{AGENT_UPGRADES}{name}"


@dataclass(frozen=True, slots=True)
class AgentRevision:
    """One revision of an upgrade: what its devices are sent."""

    number: int
    version: str
    deadline_s: int
    max_tries: int
    created_at: float
    source: int = 0  # the revision it retries or copies (resume, undo), 0: none

    @property
    def template(self) -> tuple[str, int, int]:
        return self.version, self.deadline_s, self.max_tries

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "version": self.version,
            "deadlineSeconds": self.deadline_s,
            "maxTries": self.max_tries,
            "createdAt": self.created_at,
            "source": self.source,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> AgentRevision:
        return cls(
            int(doc["number"]),
            str(doc["version"]),
            int(doc["deadlineSeconds"]),
            int(doc["maxTries"]),
            float(doc["createdAt"]),
            int(doc.get("source", 0)),
        )


@dataclass(frozen=True, slots=True)
class SentAgent:
    """A device sent the release: of which revision, when, what it had committed then, and
    the workloads that served on it then (they must serve again for it to be done)."""

    revision: int
    sent_at: float
    from_version: str
    serving: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "sentAt": self.sent_at,
            "fromVersion": self.from_version,
            "serving": list(self.serving),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> SentAgent:
        return cls(
            int(doc["revision"]),
            float(doc["sentAt"]),
            str(doc.get("fromVersion", "")),
            tuple(str(s) for s in doc.get("serving", ())),
        )


@dataclass(frozen=True, slots=True)
class AgentUpgradeState:
    """Where an upgrade's rollout stands; stored at ``/agentupgrades/NAME``."""

    upgrade: str
    revision: int
    revisions: tuple[AgentRevision, ...]
    phase: RolloutPhase = RolloutPhase.PROGRESSING
    reason: str = ""
    message: str = ""
    started_at: float = 0.0
    changed_at: float = 0.0
    step: int = 0  # index into spec.rollout.canary.steps (== len: past the last)
    sent: Mapping[str, SentAgent] = field(default_factory=dict)
    failed: Mapping[str, str] = field(default_factory=dict)  # device -> why
    rollback: Mapping[str, str] = field(default_factory=dict)  # device -> version sent back
    leaving: Mapping[str, str] = field(default_factory=dict)  # left the selector: held at
    held: Mapping[str, str] = field(default_factory=dict)  # rolled back uncommitted: held at

    @property
    def current(self) -> AgentRevision:
        return next(r for r in self.revisions if r.number == self.revision)

    def revision_of(self, number: int) -> AgentRevision | None:
        return next((r for r in self.revisions if r.number == number), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "upgrade": self.upgrade,
            "revision": self.revision,
            "revisions": [r.to_json() for r in self.revisions],
            "phase": self.phase.value,
            "reason": self.reason,
            "message": self.message,
            "startedAt": self.started_at,
            "changedAt": self.changed_at,
            "step": self.step,
            "sent": {d: s.to_json() for d, s in sorted(self.sent.items())},
            "failed": dict(sorted(self.failed.items())),
            "rollback": dict(sorted(self.rollback.items())),
            **({"leaving": dict(sorted(self.leaving.items()))} if self.leaving else {}),
            **({"held": dict(sorted(self.held.items()))} if self.held else {}),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> AgentUpgradeState:
        return cls(
            str(doc["upgrade"]),
            int(doc["revision"]),
            tuple(AgentRevision.from_json(r) for r in doc.get("revisions", ())),
            RolloutPhase(doc.get("phase", RolloutPhase.PROGRESSING.value)),
            str(doc.get("reason", "")),
            str(doc.get("message", "")),
            float(doc.get("startedAt", 0.0)),
            float(doc.get("changedAt", 0.0)),
            int(doc.get("step", 0)),
            {str(d): SentAgent.from_json(s) for d, s in (doc.get("sent") or {}).items()},
            {str(d): str(r) for d, r in (doc.get("failed") or {}).items()},
            {str(d): str(v) for d, v in (doc.get("rollback") or {}).items()},
            {str(d): str(v) for d, v in (doc.get("leaving") or {}).items()},
            {str(d): str(v) for d, v in (doc.get("held") or {}).items()},
        )


@dataclass(frozen=True, slots=True)
class AgentDeviceView:
    """What the planner knows of one selected device."""

    name: str
    connected: bool
    report: AgentReport | None
    serving: tuple[str, ...] = ()  # workloads serving now with every replica ready, sorted
    claimed_by: str = ""  # another AgentUpgrade drives this device (the first by name)
    agent_version: str = ""  # the edged version its Hello said ("" when unknown)


FIRST_SELF_UPDATING = "0.2.0"
"""The first edged release that reports its release (Status.agent) and can update itself."""


def reports_later(d: AgentDeviceView) -> bool:
    """Whether ``d``, connected and without a report yet, runs an edged that sends one (its
    first report has not reached the hub: just connected, or the hub just started): such a
    device is not refused as too old, the rollout waits for it."""
    if d.report is not None or not d.connected or not d.agent_version:
        return False
    try:
        return version_key(d.agent_version) >= version_key(FIRST_SELF_UPDATING)
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class DesiredAgentSpec:
    """What a device's desired state says of its edged (``DesiredState.agent``), plain."""

    version: str
    signed_metadata: bytes
    upgrade: str
    upgrade_revision: int
    commit_deadline_s: int
    max_tries: int


Releases = Mapping[str, AgentReleaseRecord]
"""The releases the hub holds, by :func:`hub.decide.agentreleases.agent_release_key`."""


@dataclass(frozen=True, slots=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class AgentProgress:
    """One upgrade's devices at one moment, by what the planner calls them."""

    selected: int = 0
    pool: int = 0
    done: tuple[str, ...] = ()
    updating: tuple[str, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)
    skipped: Mapping[str, str] = field(default_factory=dict)
    up_to_date: tuple[str, ...] = ()
    waiting: int = 0  # in the pool, not sent yet
    max_unavailable: int = 1
    threshold: int = 1
    step_target: int = 0  # devices the current step may have sent
    rollback_blocked: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "selectedDevices": self.selected,
            "poolDevices": self.pool,
            "doneDevices": len(self.done),
            "updatingDevices": len(self.updating),
            "failedCount": len(self.failed),
            "waitingDevices": self.waiting,
            "upToDateDevices": len(self.up_to_date),
            "updating": list(self.updating[:100]),
            "refused": dict(sorted(self.refused.items())[:100]),
            "skipped": dict(sorted(self.skipped.items())[:100]),
            "maxUnavailable": self.max_unavailable,
            "failureThreshold": self.threshold,
            "stepDevices": self.step_target,
            **({"rollbackBlocked": dict(self.rollback_blocked)} if self.rollback_blocked else {}),
        }


@dataclass(frozen=True, slots=True)
class AgentPlan:
    """What to write (None: nothing changes), the events, the devices' counts."""

    state: AgentUpgradeState | None = None
    events: tuple[Event, ...] = ()
    progress: AgentProgress = AgentProgress()


# -- the pieces ------------------------------------------------------------------------------


def platform_of(report: AgentReport | None) -> tuple[str, str]:
    return (report.arch, report.python_abi) if report is not None else ("", "")


def release_for(
    releases: Releases, version: str, report: AgentReport | None
) -> AgentReleaseRecord | None:
    arch, abi = platform_of(report)
    if not arch or not abi:
        return None
    return releases.get(agent_release_key(version, arch, abi))


def refusal(d: AgentDeviceView, version: str, releases: Releases, hub_version: str) -> str:
    """Why ``d`` cannot be sent ``version`` ("" when it can)."""
    if d.claimed_by:
        return f"ClaimedByAnotherUpgrade: AgentUpgrade {d.claimed_by} drives this device"
    a = d.report
    if a is None:
        return "AgentStatusNotReported: its edged does not report its release (too old to update)"
    if not a.launcher:
        return (
            "NoLauncher: edged runs from its package, not under the A/B launcher: it cannot "
            "update itself"
        )
    running = a.version or a.committed_version
    verdict = _skew(running, hub_version)
    if not verdict.allowed:
        return f"{verdict.reason}: {verdict.message}"
    if not a.arch or not a.python_abi:
        return "PlatformNotReported: the device does not say its machine and Python ABI"
    if release_for(releases, version, a) is None:
        return (
            f"NoReleaseForPlatform: no release {version} for {a.arch}/{a.python_abi} "
            "(edgectl agent push)"
        )
    return ""


_skew = functools.lru_cache(maxsize=256)(check_skew)
"""check_skew, once per (device version, hub version): a fleet runs a few versions; bounded."""


def up_to_date(d: AgentDeviceView, version: str) -> bool:
    a = d.report
    return a is not None and a.version == version and a.committed_version == version


def came_back(d: AgentDeviceView, upgrade: str, revision: AgentRevision, sent: SentAgent) -> bool:
    """Done: connected, running and committed the version for this upgrade and revision,
    every workload that served when it was sent serving again."""
    a = d.report
    return (
        d.connected
        and a is not None
        and a.upgrade == upgrade
        and a.upgrade_revision == revision.number
        and a.phase == COMMITTED
        and a.version == revision.version
        and a.committed_version == revision.version
        and set(sent.serving) <= set(d.serving)
    )


def failure(
    d: AgentDeviceView,
    upgrade: str,
    revision: AgentRevision,
    sent: SentAgent,
    deadline_s: int,
    now: float,
) -> str:
    """Why a device sent ``revision`` failed ("" when it did not, yet)."""
    a = d.report
    if (
        a is not None
        and a.upgrade == upgrade
        and a.upgrade_revision == revision.number
        and a.phase in FAILED_PHASES
    ):
        why = a.reason or a.phase
        return f"{why}: {a.message}" if a.message else why
    if now - sent.sent_at > deadline_s:
        where = f"{a.phase or 'no phase'}" if a is not None else "nothing reported"
        if not d.connected:
            where = "not connected"
        missing = sorted(set(sent.serving) - set(d.serving))
        if (
            a is not None
            and a.phase == COMMITTED
            and a.version == revision.version
            and a.upgrade == upgrade
            and a.upgrade_revision == revision.number
            and missing
        ):
            where = f"committed, but {', '.join(missing[:MAX_NAMED])} do not serve again"
        return (
            f"ProgressDeadlineExceeded: did not come back healthy on {revision.version} within "
            f"{deadline_s} s of being sent ({where})"
        )
    return ""


def threshold_of(threshold: IntOrPercent, pool: int) -> int:
    return max(1, threshold.resolve(pool, round_up=True))


def unavailable_of(max_unavailable: IntOrPercent, pool: int) -> int:
    return max(1, max_unavailable.resolve(pool, round_up=False))


def step_target(steps: Sequence[int], step: int, pool: int) -> int:
    """How many devices of the pool may have been sent the release at ``step``: its
    percentage rounded up, at least one; past the last step, all."""
    if step >= len(steps) or pool == 0:
        return pool
    return min(pool, max(1, math.ceil(steps[step] * pool / 100)))


def named(items: Mapping[str, str] | Sequence[str], limit: int = MAX_NAMED) -> str:
    if isinstance(items, Mapping):
        parts = [f"{d} ({why})" for d, why in sorted(items.items())[:limit]]
    else:
        parts = list(sorted(items)[:limit])
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(parts) + more


def _step_text(steps: Sequence[int], step: int) -> str:
    if not steps:
        return "every device"
    if step >= len(steps):
        return f"past the last of {len(steps)} canary steps (every device)"
    return f"canary step {step + 1} of {len(steps)} ({steps[step]}%)"


# -- planning ----------------------------------------------------------------------------------


def plan_upgrade(
    upgrade: AgentUpgrade,
    state: AgentUpgradeState | None,
    devices: Sequence[AgentDeviceView],
    releases: Releases,
    hub_version: str,
    now: float,
    others: Mapping[str, AgentDeviceView] | None = None,
) -> AgentPlan:
    """The next step of ``upgrade``'s rollout (module doc). ``devices``: the devices its
    selector selects, any order; ``releases``: the releases the hub holds; ``others``: the
    devices the record names that the selector no longer selects (one absent from both was
    deleted)."""
    spec = upgrade.spec
    template = (spec.version, spec.commit.deadline_s, spec.commit.max_tries)
    if state is None or state.current.template != template:
        return _new_revision(upgrade, state, now)
    left = _leave(state, devices, others or {}, now)
    step = _step(
        upgrade, left.state or state, sorted(devices, key=lambda d: d.name), releases,
        hub_version, now,
    )  # fmt: skip
    if left.state is None:
        return step
    return AgentPlan(step.state or left.state, (*left.events, *step.events), step.progress)


BUSY_PHASES = ("Downloading", "Verifying", "Installing", "SmokeTesting", "Switching", "Trying")


def settled_on(d: AgentDeviceView, version: str) -> bool:
    """``d`` saw the hub ask for ``version`` and runs and committed it, nothing in flight: a
    device that left the selector may be let go."""
    a = d.report
    return (
        a is not None
        and a.desired_version == version
        and a.version == version
        and a.committed_version == version
        and a.phase not in BUSY_PHASES
    )


def _leave(
    state: AgentUpgradeState,
    devices: Sequence[AgentDeviceView],
    others: Mapping[str, AgentDeviceView],
    now: float,
) -> AgentPlan:
    """Devices that left the selector (labels changed) or were deleted are no longer the
    upgrade's (as a ModelDeployment's): out of ``sent`` and ``rollback`` (no deadline, no
    failure, no rollback, not in the pool; their failures stay recorded). One that committed
    the version keeps it (sent nothing); one sent this revision that did not commit it is
    held at the release it had committed (``leaving``) until it says it runs that one with
    nothing in flight: a trial aborts (RolledBackByHub), an install never switches; then it
    is sent nothing."""
    selected = {d.name for d in devices}
    version = state.current.version
    sent, rollback, leaving = dict(state.sent), dict(state.rollback), dict(state.leaving)
    held_back = dict(state.held)
    let_go: list[str] = []
    held: list[str] = []
    for name in sorted(set(leaving) & selected):  # selected again: the upgrade's again
        del leaving[name]
    for name in sorted((set(sent) | set(rollback) | set(leaving) | set(held_back)) - selected):
        d = others.get(name)
        was = sent.pop(name, None)
        rollback.pop(name, None)
        was_held = held_back.pop(name, None)  # held after a rollback: held while leaving
        if d is not None and was_held and name not in leaving and not settled_on(d, was_held):
            leaving[name] = was_held
            held.append(name)
            continue
        if d is None or name in leaving:  # deleted, or held until settled
            if d is None or settled_on(d, leaving[name]):
                leaving.pop(name, None)
                let_go.append(name)
            continue
        a = d.report
        back = was.from_version if was is not None else ""
        if (
            was is None
            or was.revision != state.revision
            or name in state.failed
            or (a is not None and a.committed_version == version)  # committed: keeps it
            or not back
            or back == version
            or settled_on(d, back)
        ):
            let_go.append(name)
            continue
        leaving[name] = back
        held.append(name)
    new = replace(state, sent=sent, rollback=rollback, leaving=leaving, held=held_back)
    if new == state:
        return AgentPlan()
    events = []
    if held:
        events.append(Event("Normal", "DevicesLeft", f"{named(held)} left the selector while "
                            f"being updated to {version}: held at the release each had "
                            "committed until settled, then no longer the upgrade's"))  # fmt: skip
    if let_go:
        events.append(Event("Normal", "DevicesLeft", f"{named(let_go)} no longer the "
                            "upgrade's (left the selector or deleted)"))  # fmt: skip
    return AgentPlan(replace(new, changed_at=now), tuple(events))


def _new_revision(
    upgrade: AgentUpgrade, state: AgentUpgradeState | None, now: float, *, retry: int = 0
) -> AgentPlan:
    spec = upgrade.spec
    revisions = state.revisions if state is not None else ()
    number = max((r.number for r in revisions), default=0) + 1
    template = (spec.version, spec.commit.deadline_s, spec.commit.max_tries)
    source = retry or next((r.number for r in revisions if r.template == template), 0)
    revision = AgentRevision(
        number, spec.version, spec.commit.deadline_s, spec.commit.max_tries, now, source
    )
    kept = (*revisions, revision)[-MAX_REVISIONS:]
    if retry:
        message = f"retrying {spec.version} as revision {number} (revision {retry} was rolled back)"
    else:
        message = f"rolling out edged {spec.version} as revision {number}" + (
            f" (a copy of revision {source})" if source else ""
        )
    new = AgentUpgradeState(
        upgrade.name,
        number,
        kept,
        RolloutPhase.PROGRESSING,
        "NewRevision",
        message,
        started_at=now,
        changed_at=now,
    )
    return AgentPlan(new, (Event("Normal", "RolloutStarted", message),))


def retry_plan(upgrade: AgentUpgrade, state: AgentUpgradeState, now: float) -> AgentPlan:
    """``rollout resume`` after a rollback: the same version again, as a new revision."""
    return _new_revision(upgrade, state, now, retry=state.revision)


@dataclass(slots=True)
class _Sorted:
    done: list[str] = field(default_factory=list)
    updating: list[str] = field(default_factory=list)
    new_failed: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    up_to_date: list[str] = field(default_factory=list)
    candidates: list[str] = field(default_factory=list)  # pool, connected, not sent
    unreported: list[str] = field(default_factory=list)  # connected, report not in yet
    waiting: int = 0
    pool: int = 0


def _sort(
    upgrade: AgentUpgrade,
    state: AgentUpgradeState,
    devices: Sequence[AgentDeviceView],
    releases: Releases,
    hub_version: str,
    now: float,
) -> _Sorted:
    out = _Sorted()
    revision = state.current
    deadline = upgrade.spec.rollout.progress_deadline_s
    for d in devices:
        sent = state.sent.get(d.name)
        if sent is not None and sent.revision == revision.number:
            out.pool += 1
            if d.name in state.failed:
                continue
            if came_back(d, upgrade.name, revision, sent):
                out.done.append(d.name)
                continue
            why = failure(d, upgrade.name, revision, sent, deadline, now)
            if why:
                out.new_failed[d.name] = why
            else:
                out.updating.append(d.name)
            continue
        if up_to_date(d, revision.version):
            out.up_to_date.append(d.name)
            continue
        if reports_later(d):
            out.unreported.append(d.name)
            continue
        why = refusal(d, revision.version, releases, hub_version)
        if why:
            out.refused[d.name] = why
            continue
        out.pool += 1
        out.waiting += 1
        if d.connected:
            out.candidates.append(d.name)
        else:
            out.skipped[d.name] = "not connected"
    return out


def _progress(
    upgrade: AgentUpgrade, state: AgentUpgradeState, s: _Sorted, failed: Mapping[str, str]
) -> AgentProgress:
    rollout = upgrade.spec.rollout
    return AgentProgress(
        selected=s.pool + len(s.refused) + len(s.up_to_date),
        pool=s.pool,
        done=tuple(s.done),
        updating=tuple(s.updating),
        failed=dict(failed),
        refused=dict(s.refused),
        skipped=dict(s.skipped),
        up_to_date=tuple(s.up_to_date),
        waiting=s.waiting,
        max_unavailable=unavailable_of(rollout.max_unavailable, s.pool),
        threshold=threshold_of(rollout.failure_threshold, s.pool),
        step_target=step_target(rollout.steps, state.step, s.pool),
    )


def _step(
    upgrade: AgentUpgrade,
    state: AgentUpgradeState,
    devices: Sequence[AgentDeviceView],
    releases: Releases,
    hub_version: str,
    now: float,
) -> AgentPlan:
    if state.phase is RolloutPhase.ROLLED_BACK:
        return _hold_rollback(upgrade, state, devices, releases, hub_version, now)
    s = _sort(upgrade, state, devices, releases, hub_version, now)
    failed = {**state.failed, **s.new_failed}
    progress = _progress(upgrade, state, s, failed)
    version = state.current.version
    events: list[Event] = [
        Event("Warning", "DeviceFailed", f"device {d}: edged {version}: {why}")
        for d, why in sorted(s.new_failed.items())
    ]
    if state.phase is not RolloutPhase.COMPLETE and len(failed) >= progress.threshold:
        return _roll_back(upgrade, state, failed, devices, releases, progress, events, now)
    stop = upgrade.metadata.annotations.get(ROOT_STOP)
    if stop:  # a regional hub's root stopped its waves (hub.decide.agentwaves): even Complete
        return _roll_back(
            upgrade, state, failed, devices, releases, progress, events, now, stopped=stop
        )
    new = state
    if s.new_failed:
        new = replace(new, failed=failed, changed_at=now)
    steps = upgrade.spec.rollout.steps
    sent_now = s.pool - s.waiting  # devices of the pool sent this revision
    if new.phase is RolloutPhase.PROGRESSING:
        # steps passed: enough devices sent, none still updating
        while (
            new.step < len(steps)
            and sent_now >= step_target(steps, new.step, s.pool)
            and not s.updating
            and not s.unreported
        ):
            passed = _step_text(steps, new.step)
            new = replace(
                new,
                step=new.step + 1,
                reason="CanaryStepPassed",
                message=f"{passed} passed: {len(s.done)} device(s) came back healthy on "
                f"{version}; now {_step_text(steps, new.step + 1)}",
                changed_at=now,
            )
            events.append(Event("Normal", "CanaryStepPassed", new.message))
        if sent_now >= s.pool and not s.updating and not s.unreported and new.step >= len(steps):
            new = replace(
                new,
                phase=RolloutPhase.COMPLETE,
                reason="RolloutComplete",
                message=f"edged {version} (revision {new.revision}) came back healthy on "
                f"{len(s.done)} of {s.pool} device(s)"
                + (
                    f"; {len(failed)} failed, under the threshold: {named(failed)}"
                    if failed
                    else ""
                )
                + (f"; {len(s.refused)} refused" if s.refused else ""),
                changed_at=now,
            )
            events.append(Event("Normal", "RolloutComplete", new.message))
    if new.phase in (RolloutPhase.PROGRESSING, RolloutPhase.COMPLETE):
        target = step_target(steps, new.step, s.pool)
        room = min(progress.max_unavailable - len(s.updating), target - sent_now)
        chosen = s.candidates[: max(0, room)]
        if chosen:
            by_name = {d.name: d for d in devices}
            sent = dict(new.sent)
            for name in chosen:
                d = by_name[name]
                committed = d.report.committed_version if d.report is not None else ""
                sent[name] = SentAgent(new.revision, now, committed, d.serving)
            total = sent_now + len(chosen)
            new = replace(new, sent=sent, changed_at=now)
            if new.phase is RolloutPhase.PROGRESSING:
                new = replace(
                    new,
                    reason="RollingUpdate",
                    message=f"edged {version} sent to {total} of {s.pool} device(s) "
                    f"({_step_text(steps, new.step)})",
                )
            events.append(
                Event("Normal", "DevicesUpdated", f"edged {version} sent to {named(chosen)}")
            )
            s.updating.extend(chosen)
            s.candidates = s.candidates[len(chosen) :]
            s.waiting -= len(chosen)
            progress = _progress(upgrade, new, s, failed)
    return AgentPlan(None if new == state else new, tuple(events), progress)


def _roll_back(
    upgrade: AgentUpgrade,
    state: AgentUpgradeState,
    failed: Mapping[str, str],
    devices: Sequence[AgentDeviceView],
    releases: Releases,
    progress: AgentProgress,
    events: list[Event],
    now: float,
    *,
    stopped: str = "",
) -> AgentPlan:
    version = state.current.version
    rollback, _ = rollback_targets(state, devices, releases, {})
    held = hold_targets(state, devices, rollback, {})
    if stopped:
        message = (
            f"edged {version} (revision {state.revision}) stopped by the root hub: "
            f"{stopped[:MAX_STOP_TEXT]}; every updated device goes back to the release it had "
            "committed"
        )
    else:
        message = (
            f"edged {version} (revision {state.revision}) failed on {len(failed)} device(s), "
            f"the failure threshold is {progress.threshold}: {named(failed)}; stopped, every "
            "updated device goes back to the release it had committed"
        )
    new = replace(
        state,
        phase=RolloutPhase.ROLLED_BACK,
        reason="StoppedByRoot" if stopped else "FailureThresholdReached",
        message=message,
        changed_at=now,
        failed=dict(failed),
        rollback=rollback,
        held=held,
    )
    events.append(Event("Warning", "RolledBack", message))
    return AgentPlan(new, tuple(events), progress)


def rollback_targets(
    state: AgentUpgradeState,
    devices: Sequence[AgentDeviceView],
    releases: Releases,
    known: Mapping[str, str],
) -> tuple[dict[str, str], dict[str, str]]:
    """The devices sent the release that committed it, each with the release to send it back
    to (``known``: those decided before, kept), and those that cannot be sent back (why)."""
    out = dict(known)
    blocked: dict[str, str] = {}
    version = state.current.version
    for d in devices:
        sent = state.sent.get(d.name)
        if d.name in out or sent is None or sent.revision != state.revision:
            continue
        a = d.report
        if a is None or a.committed_version != version:
            continue  # not committed: its launcher keeps (or goes back to) its committed one
        back = sent.from_version
        if not back or back == version:
            blocked[d.name] = "no earlier committed release known"
            continue
        out[d.name] = back  # still on the device (module doc): held by the hub or not
    return out, blocked


def hold_targets(
    state: AgentUpgradeState,
    devices: Sequence[AgentDeviceView],
    rollback: Mapping[str, str],
    known: Mapping[str, str],
) -> dict[str, str]:
    """Rolled back: the devices sent the release that did not commit it, each held at the
    release it had committed when it was sent, so that a trial aborts (RolledBackByHub) and
    an install never switches (a trial edged the hub asks nothing commits once healthy).
    ``known``: those held before, kept until settled on that release (:func:`settled_on`)
    or sent back (``rollback``: it committed the rejected version after all). Not held: one
    already back on it with nothing in flight after trying this version (it rolled back or
    refused by itself), or whose earlier release is not known."""
    version = state.current.version
    out: dict[str, str] = {}
    for d in devices:
        if d.name in rollback:
            continue
        if d.name in known:
            if not settled_on(d, known[d.name]):
                out[d.name] = known[d.name]
            continue
        sent = state.sent.get(d.name)
        if sent is None or sent.revision != state.revision:
            continue
        a = d.report
        back = sent.from_version
        if not back or back == version or (a is not None and a.committed_version == version):
            continue
        if (
            a is not None
            and a.upgrade == state.upgrade
            and a.upgrade_revision == state.revision
            and a.phase in FAILED_PHASES
            and a.version == back
            and a.committed_version == back
        ):
            continue  # this attempt ended on the device (rolled back, refused): nothing to abort
        out[d.name] = back
    return out


def _hold_rollback(
    upgrade: AgentUpgrade,
    state: AgentUpgradeState,
    devices: Sequence[AgentDeviceView],
    releases: Releases,
    hub_version: str,
    now: float,
) -> AgentPlan:
    """Rolled back: a device that commits the rejected version late is sent back too. The
    counts are what the devices report now (done: came back on the rejected version, before
    being sent back); the failures are those that stopped it."""
    rollback, blocked = rollback_targets(state, devices, releases, state.rollback)
    held = {
        n: v
        for n, v in hold_targets(state, devices, rollback, state.held).items()
        if n in state.held  # only those held at the rollback: none is added later
    }
    s = _sort(upgrade, state, devices, releases, hub_version, now)
    progress = replace(_progress(upgrade, state, s, state.failed), rollback_blocked=blocked)
    if rollback == dict(state.rollback) and held == dict(state.held):
        return AgentPlan(None, (), progress)
    added = sorted(set(rollback) - set(state.rollback))
    new = replace(state, rollback=rollback, held=held, changed_at=now)
    events = []
    if added:
        events.append(Event(
            "Warning",
            "DevicesRolledBack",
            f"{named(added)} committed edged {state.current.version} after the rollback: sent "
            "back to the release each had committed",
        ))  # fmt: skip
    return AgentPlan(new, tuple(events), progress)


# -- status -----------------------------------------------------------------------------------


def upgrade_status(
    upgrade: AgentUpgrade, state: AgentUpgradeState | None, progress: AgentProgress
) -> dict[str, Any]:
    """An AgentUpgrade's ``status``: its rollout (phase, revision, version, canary step), the
    devices' counts, every failed device with its reason, the devices sent back, and the
    ``Progressing`` condition (Kubernetes' words: RolloutPaused, RolledBack...)."""
    from edgefleet.api.conditions import Condition, ConditionStatus
    from edgefleet.timestamps import rfc3339

    if state is None:
        return {"phase": "Pending", "message": "no revision yet", **progress.to_json()}
    steps = upgrade.spec.rollout.steps
    if state.phase is RolloutPhase.ROLLED_BACK:
        condition = Condition("Progressing", ConditionStatus.FALSE, "RolledBack", state.message)
    elif state.phase is RolloutPhase.PAUSED:
        condition = Condition(
            "Progressing", ConditionStatus.UNKNOWN, "RolloutPaused", state.message
        )
    elif state.phase is RolloutPhase.COMPLETE:
        condition = Condition("Progressing", ConditionStatus.TRUE, "RolloutComplete", state.message)
    else:
        condition = Condition(
            "Progressing", ConditionStatus.TRUE, state.reason or "RollingUpdate", state.message
        )
    return {
        "phase": state.phase.value,
        "reason": state.reason,
        "message": state.message,
        "revision": state.revision,
        "version": state.current.version,
        "startedAt": rfc3339(state.started_at) if state.started_at else None,
        "changedAt": rfc3339(state.changed_at) if state.changed_at else None,
        "step": min(state.step + 1, len(steps)) if steps else 0,
        "stepCount": len(steps),
        "pastLastStep": state.step >= len(steps),
        "steps": [f"{w}%" for w in steps],
        **progress.to_json(),
        "failedDevices": dict(sorted(state.failed.items())),
        "rollbackDevices": dict(sorted(state.rollback.items())),
        **({"leavingDevices": dict(sorted(state.leaving.items()))} if state.leaving else {}),
        **({"heldDevices": dict(sorted(state.held.items()))} if state.held else {}),
        "conditions": [condition.to_json()],
    }


# -- apply ----------------------------------------------------------------------------------


def version_refusal(version: str, hub_version: str) -> str | None:
    """Why an AgentUpgrade to ``version`` is refused by a hub of ``hub_version`` (None: it
    is not): a version outside the window the hub accepts would cut the devices off."""
    verdict = check_skew(version, hub_version)
    if verdict.allowed:
        return None
    return (
        f"spec.version: {version} is outside the versions this hub accepts "
        f"({verdict.reason}: {verdict.message}): the upgraded devices could no longer sync; "
        "upgrade the hub first"
    )


# -- what a device is sent -------------------------------------------------------------------


def desired_agent(
    state: AgentUpgradeState, device: str, report: AgentReport | None, releases: Releases
) -> DesiredAgentSpec | None:
    """The release ``device`` is sent for this upgrade (None: none; it keeps its committed
    one): the revision's version once sent it (not after it failed), its previous release
    after a rollback when it had committed the rejected one, or when it left the selector
    before committing (``leaving``)."""
    revision = state.current
    if state.phase is RolloutPhase.ROLLED_BACK or device in state.leaving:
        version = state.leaving.get(device) or state.rollback.get(device) or state.held.get(device)
        if version is None:
            return None
        back = release_for(releases, version, report)
        # the release it came from is still on the device: by version when the hub does not
        # hold it (the base install's edged), the device switches and never fetches
        return DesiredAgentSpec(
            version,
            back.envelope if back is not None else b"",
            state.upgrade,
            revision.number,
            revision.deadline_s,
            revision.max_tries,
        )
    sent = state.sent.get(device)
    if sent is None or sent.revision != state.revision or device in state.failed:
        return None
    version = revision.version
    record = release_for(releases, version, report)
    if record is None:
        return None
    return DesiredAgentSpec(
        version,
        record.envelope,
        state.upgrade,
        revision.number,
        revision.deadline_s,
        revision.max_tries,
    )


def desired_agent_of(
    states: Mapping[str, AgentUpgradeState],
    device: str,
    report: AgentReport | None,
    releases: Releases,
) -> DesiredAgentSpec | None:
    """The release ``device`` is sent by the upgrades (the first by name that sends one)."""
    for name in sorted(states):
        spec = desired_agent(states[name], device, report, releases)
        if spec is not None:
            return spec
    return None
