"""An AgentUpgrade's rollout, decided: pure, tested as tables (issue 32, docs/agent-updates.md
"The AgentUpgrade kind"). :mod:`hub.controllers.agentupgrade` applies it. The record and the
planner's plain data are in :mod:`hub.decide.agentrevisions`; who is refused and what each
device is sent in :mod:`hub.decide.agentdesired`; the status in
:mod:`hub.decide.agentupgradestatus`.

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
  workload that served on it when it was sent serves again (all replicas ready); once seen
  done it stays done (``SentAgent.done_at``: a device that came back healthy and is away
  later is not failed by the deadline). It
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
  and its reason. Under the threshold, a failed device whose attempt has not ended is held
  as below (:func:`failed_holds`): it never commits the version late. Rollback semantics: a
  device whose attempt ended on the device (it
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

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from edgefleet.api.agentupgrades import AgentUpgrade
from edgefleet.api.quantities import IntOrPercent
from hub.decide.agentdesired import refusal, reports_later, up_to_date
from hub.decide.agentrevisions import (
    MAX_NAMED,
    MAX_REVISIONS,
    AgentDeviceView,
    AgentPlan,
    AgentProgress,
    AgentRevision,
    AgentUpgradeState,
    Event,
    Releases,
    SentAgent,
    named,
)
from hub.decide.regionslice import ROOT_REVISION, ROOT_STOP
from hub.decide.revisions import RolloutPhase

COMMITTED = "Committed"

MAX_STOP_TEXT = 512
FAILED_PHASES = ("RolledBack", "Failed")


# -- the pieces ------------------------------------------------------------------------------


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
    if sent.done_at:  # it came back healthy: away or not serving later is not the upgrade's
        return ""
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
    if state is None or not takes_up(upgrade, state):
        return _new_revision(upgrade, state, now)
    left = _leave(state, devices, others or {}, now)
    step = _step(
        upgrade, left.state or state, sorted(devices, key=lambda d: d.name), releases,
        hub_version, now,
    )  # fmt: skip
    if left.state is None:
        return step
    return AgentPlan(step.state or left.state, (*left.events, *step.events), step.progress)


def template_of(upgrade: AgentUpgrade) -> tuple[str, int, int]:
    """What makes a revision of ``upgrade`` (module doc): its version and commit settings."""
    spec = upgrade.spec
    return spec.version, spec.commit.deadline_s, spec.commit.max_tries


def root_revision_of(upgrade: AgentUpgrade) -> int:
    """At a regional hub, the root's revision ``upgrade`` was sent with (its annotation,
    :mod:`hub.controllers.agentwaves`); 0: none."""
    raw = str(upgrade.metadata.annotations.get(ROOT_REVISION) or "")
    return int(raw[:9]) if raw.isdigit() else 0


def takes_up(upgrade: AgentUpgrade, state: AgentUpgradeState | None) -> bool:
    """Whether the rollout record ``state`` is of ``upgrade`` as applied now. A manifest just
    written with another version or commit settings (an apply, an undo, a root's next
    revision put by the region's slice) has no revision of its own until the controller's
    next pass: until then the record, its phase and its failures are the previous
    revision's, and nothing may present them as the new one's (a region's report to its root:
    :mod:`hub.controllers.parentlink.regionreport`). At a regional hub the root's revision
    counts too: the root's undo to a version this region rolled back in an earlier root
    revision (not sent to it in between) is a new revision here, never that rollback again
    (a record that names no root revision, made before records carried it, takes any)."""
    if state is None:
        return False
    current = state.current
    root = root_revision_of(upgrade)
    return current.template == template_of(upgrade) and (
        not current.root_revision or current.root_revision == root
    )


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
    template = template_of(upgrade)
    source = retry or next((r.number for r in revisions if r.template == template), 0)
    revision = AgentRevision(
        number,
        spec.version,
        spec.commit.deadline_s,
        spec.commit.max_tries,
        now,
        source,
        root_revision_of(upgrade),
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
    newly_done: list[str] = field(default_factory=list)  # came back healthy, not recorded yet
    updating: list[str] = field(default_factory=list)
    new_failed: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    up_to_date: list[str] = field(default_factory=list)
    candidates: list[str] = field(default_factory=list)  # pool, connected, not sent
    unreported: list[str] = field(default_factory=list)  # connected, report not in yet
    # the hub holds no release of the version for any platform (not pushed yet, or pushed and
    # not read yet): its devices wait as unreported ones do, never refused, so that the
    # release arriving later goes through the canary steps, not past a Complete with 0 of 0
    release_missing: bool = False
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
    held = any(r.version == revision.version for r in releases.values())
    for d in devices:
        sent = state.sent.get(d.name)
        if sent is not None and sent.revision == revision.number:
            out.pool += 1
            if d.name in state.failed:
                continue
            if came_back(d, upgrade.name, revision, sent):
                out.done.append(d.name)
                if not sent.done_at:
                    out.newly_done.append(d.name)
                continue
            why = failure(d, upgrade.name, revision, sent, deadline, now)
            if why:
                out.new_failed[d.name] = why
            elif sent.done_at:  # came back healthy before; away (or not serving) now
                out.done.append(d.name)
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
        if why.startswith("NoReleaseForPlatform") and not held:
            out.unreported.append(d.name)
            out.release_missing = True
            continue
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
    if s.newly_done:  # recorded: a device done stays done when it is away later
        sent = dict(new.sent)
        for name in s.newly_done:
            sent[name] = replace(sent[name], done_at=now)
        new = replace(new, sent=sent)
    holds = failed_holds(new, devices)
    if holds != dict(new.held):
        newly = sorted(set(holds) - set(new.held))
        new = replace(new, held=holds, changed_at=now)
        if newly:
            events.append(
                Event(
                    "Normal",
                    "DevicesHeld",
                    f"{named(newly)} failed on {version} without ending the attempt: held at "
                    "the release each had committed, so that it does not commit "
                    f"{version} late",
                )
            )
    steps = upgrade.spec.rollout.steps
    sent_now = s.pool - s.waiting  # devices of the pool sent this revision
    if (
        s.release_missing
        and new.phase is RolloutPhase.PROGRESSING
        and new.reason != "ReleaseMissing"
    ):
        new = replace(
            new,
            reason="ReleaseMissing",
            message=f"the hub holds no release of edged {version}: the rollout waits for it "
            "(edgectl agent push)",
            changed_at=now,
        )
        events.append(Event("Warning", "ReleaseMissing", new.message))
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


def failed_holds(state: AgentUpgradeState, devices: Sequence[AgentDeviceView]) -> dict[str, str]:
    """While the rollout goes on (under its threshold): the devices counted failed (past
    their progress deadline: still installing, on trial, or away) whose attempt has not ended
    on the device, each held at the release it had committed when it was sent, as a rollback
    holds them (:func:`hold_targets`): a failed device never commits the version late, the
    hub's count and the device agree. Kept until settled on that release."""
    failed = [d for d in devices if d.name in state.failed]
    known = {n: v for n, v in state.held.items() if n in state.failed}
    return hold_targets(state, failed, {}, known)


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
