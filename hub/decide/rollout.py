"""Revisions and rolling updates across devices: pure decisions, tested as tables.

A **revision** of a ModelDeployment is what devices are sent: its manifest as applied, except
for how it is placed, scaled and rolled out (``spec.placement``, ``spec.replicas``,
``spec.scaling``, ``spec.rollout``: :data:`hub.decide.revisions.LIVE_FIELDS`), whose change
restarts no worker. Each change of that *template* is a new revision, numbered from 1 and kept
in the store (:mod:`hub.controllers.rollout`), so ``edgectl rollout history`` lists them, each
with how its rollout ended (:class:`hub.decide.revisions.Outcome`), and a device can be sent an
older one. A change of the other fields alone is no revision and no rollout.

A **rollout** moves the targeted devices from the *stable* revision to a new one. Its state
(:class:`RolloutState`, one store record per deployment) names the devices assigned the new
revision so far; every other targeted device keeps the stable revision. :func:`plan_rollout`
decides the next step from that state and what devices report, with ``now`` passed in:

* a new template: a new revision and a new rollout from the current stable revision (the
  first revision of a deployment goes everywhere at once: nothing serves that could be
  protected); the stable revision's template applied again (an apply, or ``rollout undo``
  after a rollback) is no new revision: the stable one is current again, every device is sent
  it, and the revision left keeps its outcome (rolled back, or Aborted if it was still going);
  it is Complete once every targeted device serves it, and a device refusing it (a downgrade
  below what it accepted since) holds it, saying why and what permits it (:func:`_reverting`);
  an older template than the stable one is a new revision, "a copy" of it (its workers restart);
* a device assigned the new revision that reports it **Refused** or **Failed**: the rollout is
  rolled back (every device is sent the stable revision again) and says which device failed
  and why; an older template applied again (``rollout undo``) is a new rollout like any other;
* a step that would send devices another revision outside the budget (a rollback, the
  stable template applied again, a new template while devices run the one it replaces) holds
  each device ready on what it runs there, and releases them within the budget
  (:func:`hub.decide.rolloutholds.hold`);
* otherwise, while not paused, more devices are assigned (those held first, then in name
  order), within the budget:
  edged switches a device without downtime (the new replicas start beside the old ones), so
  a device being updated is a *surge* while its stable revision still serves. At any moment,
  ``updating + unavailable <= maxSurge + maxUnavailable`` where *updating* counts assigned
  devices whose new revision is not ready yet and *unavailable* the other eligible devices
  on which nothing serves; ``maxSurge`` rounds up and ``maxUnavailable`` down (Kubernetes'
  rule; both 0 after rounding is 1 unavailable). Percentages are of the targeted devices;
* devices that are not connected or outside their health policy are **skipped**: not
  assigned, not counted as progress or in the budget, and listed with the reason; while away
  they keep the stable revision (so never one that was rolled back meanwhile), and when they
  return they are assigned within the budget like the others;
* when every targeted device serves the new revision with all replicas ready, the rollout is
  Complete and the new revision is the stable one (a device away holds completion: the
  rollout says it waits for it, rather than letting it switch unbudgeted on its return).

With ``spec.rollout.canary`` the devices are given the new revision step by step: each
``setWeight`` step raises how many of the targeted devices may have it (the percentage,
rounded up, at least one), still within the budget; when they are all ready on it, the step
is marked ready and held for the analysis ``window`` while :func:`hub.decide.analysis.analyze`
passes (not enough data: it waits), then the next step starts. A ``pause`` step waits its
duration, or (none given) sets the rollout Paused until ``rollout resume``. After the last
step the rest of the devices follow (100%). An analysis that **fails** at any moment rolls the
rollout back, its message naming the check and its figures; so does
``progressDeadlineSeconds`` without progress (a step of any kind) while Progressing.

Every step only *adds* device names to the state (or moves the step index on) and is written
with a compare-and-swap, so a hub killed at any moment resumes from the store and never takes
a step twice.

The records (:class:`Revision`, :class:`RolloutState`, templates, :func:`prune`) are in
:mod:`hub.decide.revisions`; the steps are decided here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from edgefleet.api import Canary, IntOrPercent, ModelDeployment
from hub.decide.analysis import Analysis, Verdict
from hub.decide.devices import Device, DevicePhase, RevisionPhase
from hub.decide.revisions import (
    ABORTED,
    MAX_REVISIONS,
    OUTCOME_MESSAGE_CHARS,
    Outcome,
    Revision,
    RolloutPhase,
    RolloutState,
    prune,
    template_hash,
    template_of,
    with_restart,
)
from hub.decide.status import BROKEN, describe_failure, revisions_of, wanted_revision

# kept in hub.decide.revisions, importable from here as before
__all__ = [
    "MAX_REVISIONS",
    "Revision",
    "RolloutPhase",
    "RolloutState",
    "prune",
    "template_hash",
    "template_of",
]


class TargetPhase(StrEnum):
    """How far a device got with the revision being rolled out (from its report)."""

    ABSENT = "Absent"  # not reported yet
    PROGRESSING = "Progressing"  # fetching, verifying, loading
    SERVING = "Serving"  # serves, not every replica ready yet
    READY = "Ready"  # serves with every replica ready
    BROKEN = "Broken"  # Refused or Failed


@dataclass(frozen=True, slots=True)
class DeviceView:
    """What the rollout needs to know of one targeted device."""

    name: str
    eligible: bool = True  # connected and within its health policy
    skip_reason: str = ""
    target: TargetPhase = TargetPhase.ABSENT
    broken_reason: str = ""  # why the new revision is Refused or Failed there
    serving: bool = False  # some revision of the deployment serves there
    # it serves nothing because every revision it reports failed or was refused there (a
    # device still starting its first revision, or not reporting it yet, is not down)
    down: bool = False


def view_device(
    device: Device, deployment: str, version: str, sha256: str | None, *, fresh: bool = True
) -> DeviceView:
    """A targeted device as the rollout of ``version`` (artifact ``sha256``) sees it.
    ``fresh``: whether the device's report was made after it received the revision
    (:func:`hub.controllers.rollout.fresh_report`); a report from before says nothing of it yet:
    one that
    shows the version serving (the old revision still draining, or a copy of it) or refused
    (the previous attempt) counts as still progressing, never as ready nor broken."""
    if device.phase is not DevicePhase.READY:
        eligible, why = False, f"device is {device.phase.value}"
    elif not device.health.schedulable:
        reasons = "; ".join(device.health.reasons) or "unschedulable"
        eligible, why = False, f"outside its health policy: {reasons}"
    else:
        eligible, why = True, ""
    report = device.workloads.get(deployment)
    if report is None:
        return DeviceView(device.name, eligible, why)
    revisions = revisions_of(report)
    serving = any(r.serves for r in revisions)
    down = bool(revisions) and all(r.phase in BROKEN for r in revisions)
    rev = wanted_revision(revisions, version, sha256)
    if rev is None:
        return DeviceView(device.name, eligible, why, serving=serving, down=down)
    if rev.phase in BROKEN:
        target, broken = TargetPhase.BROKEN, describe_failure(rev)
    elif rev.serves:
        full = report.desired_replicas > 0 and rev.ready_replicas >= report.desired_replicas
        target, broken = (TargetPhase.READY if full else TargetPhase.SERVING), ""
    elif rev.phase is RevisionPhase.DRAINING:
        target, broken = TargetPhase.ABSENT, ""
    else:
        target, broken = TargetPhase.PROGRESSING, ""
    if not fresh and target is not TargetPhase.ABSENT:
        target, broken = TargetPhase.PROGRESSING, ""
    elif report.config_error and target is not TargetPhase.ABSENT:
        # the revision's model configuration, refused by the device (its own check, a write
        # that failed): the revision is broken there, as a refused artifact is
        target, broken = TargetPhase.BROKEN, f"ModelConfigRefused: {report.config_error}"
    return DeviceView(device.name, eligible, why, target, broken, serving, down)


@dataclass(frozen=True, slots=True)
class Budget:
    surge: int
    unavailable: int

    @property
    def total(self) -> int:
        return self.surge + self.unavailable


def resolve_budget(max_surge: IntOrPercent, max_unavailable: IntOrPercent, targeted: int) -> Budget:
    """Counts from counts or percentages of ``targeted`` devices (Kubernetes' fenceposts)."""
    surge = max_surge.resolve(targeted, round_up=True)
    unavailable = max_unavailable.resolve(targeted, round_up=False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return Budget(surge, unavailable)


@dataclass(frozen=True, slots=True)
class Progress:
    """The counts of one rollout at one moment (shown in status; checked by tests)."""

    targeted: int
    updated: int  # assigned the new revision
    ready: int  # assigned, and the new revision serves with every replica ready
    updating: int  # assigned, not ready yet (nor broken)
    unavailable: int  # eligible, not assigned, nothing serves
    skipped: Mapping[str, str] = field(default_factory=dict)  # device -> why
    budget: Budget = Budget(0, 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "targetedDevices": self.targeted,
            "updatedDevices": self.updated,
            "readyDevices": self.ready,
            "updatingDevices": self.updating,
            "unavailableDevices": self.unavailable,
            "skipped": dict(sorted(self.skipped.items())),
            "maxSurge": self.budget.surge,
            "maxUnavailable": self.budget.unavailable,
        }


def measure(state: RolloutState, devices: Sequence[DeviceView], budget: Budget) -> Progress:
    updated = ready = updating = unavailable = 0
    skipped: dict[str, str] = {}
    for d in devices:
        if d.name in state.updated:
            updated += 1
            if d.target is TargetPhase.READY:
                ready += 1
            elif d.target is not TargetPhase.BROKEN:
                updating += 1
        elif not d.eligible:
            skipped[d.name] = d.skip_reason
        elif not d.serving:
            unavailable += 1
    return Progress(len(devices), updated, ready, updating, unavailable, skipped, budget)


@dataclass(frozen=True, slots=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Step:
    """What to write: a new revision (or None) and the new state (None: nothing changes)."""

    revision: Revision | None = None
    state: RolloutState | None = None
    events: tuple[Event, ...] = ()
    progress: Progress | None = None


def plan_rollout(
    dep: ModelDeployment,
    manifest: Mapping[str, Any],
    revisions: Mapping[int, Revision],
    state: RolloutState | None,
    devices: Sequence[DeviceView],
    now: float,
    model_pushed: bool = True,
    analysis: Analysis | None = None,
    max_weight: int | None = None,
    placed: bool = True,
    views_of: Mapping[int, Sequence[DeviceView]] | None = None,
) -> Step:
    """The next step of ``dep``'s rollout (see the module doc). ``manifest``: its canonical
    manifest as applied; ``revisions``: its stored revisions by number; ``devices``: the
    targeted devices; ``model_pushed``: whether the current revision's model can be sent
    (no device is given it before); ``analysis``: the canary analysis now (None: no
    ``canary.analysis``, or no canary device serves yet); ``max_weight``: the percentage of
    the targeted devices the new revision may go to at most (a root hub's wave,
    :func:`max_weight_of`; None: no cap): reached, the rollout is held there. ``placed``:
    whether ``devices`` is known to be whole: the projector has placed what was marked before
    the current revision was made (False: the rollout takes no step forward, and is never
    complete, on a set of targeted devices that may still grow: a revision applied before the
    last one was projected would otherwise complete on no device and reach them all at once).
    ``views_of``: the targeted devices as seen for each other revision they may run (the
    stable one, those devices are held on), by number: with it, a step that would switch
    devices outside the budget holds them (:func:`hub.decide.rolloutholds.hold`); None: no
    holds (pure tests of the steps alone)."""
    step = _plan(
        dep, manifest, revisions, state, devices, now, model_pushed, analysis, max_weight, placed
    )
    if views_of is not None and state is not None:
        rollout = dep.spec.rollout
        budget = resolve_budget(rollout.max_surge, rollout.max_unavailable, len(devices))
        from hub.decide.rolloutholds import hold  # it builds on this module's types

        step = hold(step, state, {**views_of, state.revision: devices}, budget)
    return _with_outcomes(_with_previous(step, state, revisions), state, revisions, now)


def _with_outcomes(
    step: Step, before: RolloutState | None, revisions: Mapping[int, Revision], now: float
) -> Step:
    """A step that leaves the current revision for another (a new one, or the stable one
    again) keeps how the one left ended (:class:`Outcome`: as it stood, or Aborted if its
    rollout was still going); outcomes of revisions pruned go with them."""
    new = step.state
    if new is None or before is None:
        return step
    outcomes = dict(before.outcomes)
    if new.revision != before.revision:
        outcomes[before.revision] = _ended(before, new, now)
    outcomes.pop(new.revision, None)  # the current revision's is the state itself
    kept = dict(revisions)
    if step.revision is not None:
        kept[step.revision.number] = step.revision
    for number in [*prune(kept.values(), new), *(n for n in outcomes if n not in kept)]:
        outcomes.pop(number, None)
    if outcomes == new.outcomes:
        return step
    return replace(step, state=replace(new, outcomes=outcomes))


def _ended(before: RolloutState, after: RolloutState, now: float) -> Outcome:
    """How ``before``'s revision ended when ``after`` took its place."""
    if before.phase in (RolloutPhase.PROGRESSING, RolloutPhase.PAUSED):
        why = f"its template was replaced during its rollout: revision {after.revision}'s " + (
            "(the stable one) applied again" if after.revision == before.stable else "applied"
        )
        return Outcome(ABORTED, "Superseded", why, now)
    message = before.message[:OUTCOME_MESSAGE_CHARS]
    return Outcome(before.phase.value, before.reason, message, before.changed_at)


def _with_previous(
    step: Step, before: RolloutState | None, revisions: Mapping[int, Revision]
) -> Step:
    """A rollout that completes with another model than the stable one's: that stable
    revision becomes ``previous`` (what every device ran just before)."""
    new = step.state
    if new is None or before is None or new.stable == before.stable:
        return step
    old, now_stable = revisions.get(before.stable), revisions.get(new.stable)
    if step.revision is not None and step.revision.number == new.stable:
        now_stable = step.revision
    if old is None or now_stable is None or old.model == now_stable.model:
        return step
    return replace(step, state=replace(new, previous=before.stable))


def _plan(
    dep: ModelDeployment,
    manifest: Mapping[str, Any],
    revisions: Mapping[int, Revision],
    state: RolloutState | None,
    devices: Sequence[DeviceView],
    now: float,
    model_pushed: bool,
    analysis: Analysis | None,
    max_weight: int | None,
    placed: bool = True,
) -> Step:
    name = dep.metadata.name
    if state is not None:  # every revision since the last rollout restart carries it
        manifest = with_restart(manifest, state.restarted_at)
    wanted = template_hash(manifest)
    current = revisions.get(state.revision) if state is not None else None
    rollout = dep.spec.rollout
    budget = resolve_budget(rollout.max_surge, rollout.max_unavailable, len(devices))
    if current is None or current.template != wanted:
        restart = (
            current is not None
            and state is not None
            and template_hash(with_restart(current.manifest, state.restarted_at)) == wanted
        )
        stable = revisions.get(state.stable) if state is not None else None
        if (
            not restart
            and state is not None
            and stable is not None
            and stable.template == wanted
            and not rollout.waves  # a root's waves move regions back with a new revision
        ):
            return _back_to_stable(state, stable, current, devices, budget, now)
        return _new_revision(name, manifest, wanted, revisions, state, now, restart=restart)
    assert state is not None
    if state.phase in (RolloutPhase.COMPLETE, RolloutPhase.ROLLED_BACK):
        return Step(progress=measure(state, devices, budget))
    if state.revision == state.stable:  # the stable template applied again: every device has it
        return _reverting(state, current, devices, budget, now, placed)
    broken = sorted(
        (d.name, d.broken_reason)
        for d in devices
        if d.name in state.updated and d.target is TargetPhase.BROKEN
    )
    if broken:
        return _roll_back(state, current, broken, devices, budget, now)
    canary = rollout.canary
    if (
        canary is not None
        and analysis is not None
        and analysis.verdict is Verdict.FAIL
        and not state.full  # promoted in full: the analysis no longer decides it
    ):
        why = "; ".join(c.message for c in analysis.failed)
        return _give_up(
            state,
            current,
            "AnalysisFailed",
            f"failed the canary analysis at {_step_text(canary, state.step)}: {why}",
            devices,
            budget,
            now,
        )
    deadline = rollout.progress_deadline_s
    since = _progress_since(state, canary)
    held = state.reason == "WeightHeld"  # by the root's waves: not a lack of progress
    if (
        deadline is not None
        and state.phase is RolloutPhase.PROGRESSING
        and not held
        and now - since > deadline
    ):
        waiting = f" ({analysis.message})" if analysis is not None else ""
        return _give_up(
            state,
            current,
            "ProgressDeadlineExceeded",
            f"made no progress for {deadline} s (progressDeadlineSeconds)"
            + (f" at {_step_text(canary, state.step)}" if canary is not None else "")
            + waiting,
            devices,
            budget,
            now,
        )
    progress = measure(state, devices, budget)
    if not placed:
        return Step(progress=progress)  # wait: the targeted devices are not all known yet
    eligible = [d for d in devices if d.eligible]
    if devices and not eligible:
        return Step(progress=progress)  # wait: nobody could take a step
    cap = canary_target(max_weight, len(devices)) if max_weight is not None else len(devices)
    if cap < len(devices):
        weight = canary_weight(canary, state.step) if canary is not None else 100
        if canary_target(weight, len(devices)) > cap:  # held below what it would do
            return _capped(state, current, devices, budget, cap, max_weight or 0, now,
                           model_pushed)  # fmt: skip
    if canary is not None:
        return _canary_step(state, current, devices, budget, canary, analysis, now, model_pushed)
    if all(d.name in state.updated and d.target is TargetPhase.READY for d in devices):
        return _complete(state, current, devices, budget, now)
    if state.phase is RolloutPhase.PAUSED or not model_pushed:
        return Step(progress=progress)
    return _assign(state, current, devices, budget, len(devices), now)


MAX_WEIGHT = "federation.edgefleet.io/max-weight"
"""An annotation a root hub puts on a ModelDeployment it sends a region during a wave of a
percentage (hub.decide.wave): the region's rollout gives the new revision to that percentage of
its targeted devices at most, and holds there (reason ``WeightHeld``)."""


def max_weight_of(manifest: Mapping[str, Any]) -> int | None:
    """The cap of :data:`MAX_WEIGHT` on ``manifest`` (None: none, or not a percentage)."""
    value = (manifest.get("metadata", {}).get("annotations") or {}).get(MAX_WEIGHT)
    if not isinstance(value, str) or not value.isdigit() or not 1 <= int(value) <= 100:
        return None
    return int(value)


def _capped(
    state: RolloutState,
    current: Revision,
    devices: Sequence[DeviceView],
    budget: Budget,
    cap: int,
    weight: int,
    now: float,
    model_pushed: bool,
) -> Step:
    """A rollout held at a root hub's wave weight: devices assigned up to ``cap``; once they
    are all ready on the new revision, the rollout says so (``WeightHeld``) and waits."""
    progress = measure(state, devices, budget)
    assigned = [d for d in devices if d.name in state.updated]
    if len(state.updated) >= cap and all(d.target is TargetPhase.READY for d in assigned):
        if state.reason == "WeightHeld":
            return Step(progress=progress)
        held = replace(
            state,
            reason="WeightHeld",
            message=f"revision {state.revision} ({_version(current)}) ready on "
            f"{len(state.updated)} of {len(devices)} devices, held at {weight}% by the root "
            "hub's waves",
            changed_at=now,
            progress_at=now,
        )
        return Step(state=held, events=(Event("Normal", "WeightHeld", held.message),),
                    progress=progress)  # fmt: skip
    if state.phase is RolloutPhase.PAUSED or not model_pushed:
        return Step(progress=progress)
    return _assign(state, current, devices, budget, cap, now)


def _progress_since(state: RolloutState, canary: Canary | None) -> float:
    """Since when the rollout made no progress (progressDeadlineSeconds): its last step; a
    timed pause, and the analysis window of a step whose devices are ready, are not lack of
    progress."""
    since = state.progress_at or state.started_at
    if canary is None:
        return since
    if state.step < len(canary.steps) and canary.steps[state.step].pause:
        return math.inf  # pausing is what it was asked to do
    if state.step_ready_at and canary.analysis is not None:
        since = max(since, state.step_ready_at + canary.analysis.window_s)
    return since


def _complete(
    state: RolloutState,
    current: Revision,
    devices: Sequence[DeviceView],
    budget: Budget,
    now: float,
) -> Step:
    done = replace(
        state,
        phase=RolloutPhase.COMPLETE,
        stable=state.revision,
        reason="RolloutComplete",
        message=f"revision {state.revision} ({_version(current)}) serves on every "
        f"targeted device ({len(devices)})",
        changed_at=now,
        progress_at=now,
    )
    event = Event("Normal", "RolloutComplete", done.message)
    return Step(state=done, events=(event,), progress=measure(done, devices, budget))


def _assign(
    state: RolloutState,
    current: Revision,
    devices: Sequence[DeviceView],
    budget: Budget,
    target: int,
    now: float,
) -> Step:
    """Give the new revision to more devices (held ones first, then in name order), within
    the budget and up to
    ``target`` devices in all."""
    progress = measure(state, devices, budget)
    returning = len(state.returning - state.updated)  # switching back, within the budget (hold)
    room = min(
        budget.total - progress.updating - progress.unavailable - returning,
        target - progress.updated,
    )
    # devices held on another revision first (hold): they switch to this one directly
    candidates = sorted(
        (d.name for d in devices if d.eligible and d.name not in state.updated),
        key=lambda name: (name not in state.held, name),
    )
    chosen = candidates[: max(0, room)]
    if not chosen:
        # a device that serves nothing already costs no availability when it is switched (it
        # goes from unavailable to updating: their sum stays as it was), as Kubernetes scales
        # unhealthy old pods down first: without this, a fleet down on a broken revision was
        # held there by its own unavailability, the fix made no progress and was rolled back
        # to the broken revision (found by the soak harness, seed 3: docs/soak.md). Only a
        # device down in its own report: one still starting the previous revision (or that
        # has not reported it yet) may serve in a moment, and switching it too exceeded the
        # budget in the devices' own view (seed 35: two devices switching at once, budget 1)
        idle = [d.name for d in devices
                if d.eligible and d.name not in state.updated and d.down]  # fmt: skip
        chosen = idle[: max(0, target - progress.updated)]
    if not chosen:
        return Step(progress=progress)
    moved = replace(
        state,
        updated=state.updated | frozenset(chosen),
        changed_at=now,
        progress_at=now,
        steps=state.steps + 1,
        reason="RollingUpdate",
        message=f"revision {state.revision} ({_version(current)}) sent to "
        f"{len(state.updated) + len(chosen)} of {len(devices)} devices",
    )
    event = Event(
        "Normal",
        "DevicesUpdated",
        f"revision {state.revision} ({_version(current)}) sent to {', '.join(chosen)}",
    )
    return Step(state=moved, events=(event,), progress=measure(moved, devices, budget))


def canary_weight(canary: Canary, step: int) -> int:
    """The percentage of targeted devices the new revision goes to at ``step`` (the weight
    of the last setWeight at or before it; 100 past the last step)."""
    if step >= len(canary.steps):
        return 100
    weights = [s.weight for s in canary.steps[: step + 1] if s.weight is not None]
    return weights[-1] if weights else 0


def canary_target(weight: int, targeted: int) -> int:
    """How many of ``targeted`` devices ``weight`` percent is: rounded up, at least one."""
    if weight <= 0 or targeted == 0:
        return 0
    return min(targeted, max(1, math.ceil(weight * targeted / 100)))


def _step_text(canary: Canary | None, step: int) -> str:
    if canary is None:
        return "the rollout"
    if step >= len(canary.steps):
        return "the end of the canary steps (100%)"
    s = canary.steps[step]
    what = (
        f"{s.weight}%"
        if not s.pause
        else "a pause" + (f" of {s.pause_s:g} s" if s.pause_s is not None else "")
    )
    return f"step {step + 1} of {len(canary.steps)} ({what})"


def _canary_step(
    state: RolloutState,
    current: Revision,
    devices: Sequence[DeviceView],
    budget: Budget,
    canary: Canary,
    analysis: Analysis | None,
    now: float,
    model_pushed: bool,
) -> Step:
    """A canary's next step: pauses, then each weight's devices given the new revision within
    the budget, all ready on it, held for the analysis window with the analysis passing."""
    progress = measure(state, devices, budget)
    i = state.step
    if i < len(canary.steps) and canary.steps[i].pause:
        pause = canary.steps[i]
        if state.phase is RolloutPhase.PAUSED:
            return Step(progress=progress)  # until rollout resume
        if pause.pause_s is None:
            paused = replace(
                state,
                phase=RolloutPhase.PAUSED,
                reason="CanaryPause",
                message=f"paused at {_step_text(canary, i)} until edgectl rollout resume",
                changed_at=now,
            )
            event = Event("Normal", "CanaryPaused", paused.message)
            return Step(state=paused, events=(event,), progress=progress)
        if now - state.step_at >= pause.pause_s:
            return _next_step(state, current, devices, budget, canary, now, "paused")
        return Step(progress=progress)
    weight = canary_weight(canary, i)
    target = canary_target(weight, len(devices))
    assigned = [d for d in devices if d.name in state.updated]
    if len(state.updated) >= target and all(d.target is TargetPhase.READY for d in assigned):
        if i >= len(canary.steps):
            return _complete(state, current, devices, budget, now)
        if not state.step_ready_at:
            ready = replace(
                state,
                step_ready_at=now,
                progress_at=now,
                changed_at=now,
                reason="CanaryStepReady",
                message=f"{_step_text(canary, i)}: revision {state.revision} "
                f"({_version(current)}) ready on {len(state.updated)} of {len(devices)} devices"
                + (", analysing" if canary.analysis is not None else ""),
            )
            return Step(state=ready, progress=progress)
        window = canary.analysis.window_s if canary.analysis is not None else 0.0
        if canary.analysis is not None and (
            analysis is None
            or analysis.verdict is not Verdict.PASS
            or now - state.step_ready_at < window
        ):
            return Step(progress=progress)  # analysing: the window, or enough data
        why = analysis.message if analysis is not None else "no analysis"
        return _next_step(state, current, devices, budget, canary, now, why)
    if state.phase is RolloutPhase.PAUSED or not model_pushed:
        return Step(progress=progress)
    return _assign(state, current, devices, budget, target, now)


def _next_step(
    state: RolloutState,
    current: Revision,
    devices: Sequence[DeviceView],
    budget: Budget,
    canary: Canary,
    now: float,
    why: str,
) -> Step:
    done = _step_text(canary, state.step)
    moved = replace(
        state,
        step=state.step + 1,
        step_at=now,
        step_ready_at=0.0,
        progress_at=now,
        changed_at=now,
        reason="CanaryStepPassed",
        message=f"{done} passed ({why}); now at {_step_text(canary, state.step + 1)}",
    )
    event = Event("Normal", "CanaryStepPassed", moved.message)
    return Step(state=moved, events=(event,), progress=measure(moved, devices, budget))


def _version(rev: Revision) -> str:
    return rev.model[1]


def _new_revision(
    name: str,
    manifest: Mapping[str, Any],
    wanted: str,
    revisions: Mapping[int, Revision],
    state: RolloutState | None,
    now: float,
    *,
    restart: bool = False,
) -> Step:
    """A new revision of ``manifest`` (``restart``: the current one's template again, with
    the new restartedAt of ``rollout restart``)."""
    number = max(revisions, default=0) + 1
    source = next((r.number for r in revisions.values() if r.template == wanted), 0)
    revision = Revision(name, number, wanted, dict(manifest), now, source)
    version = _version(revision)
    if state is None:  # the first revision: nothing serves that a rollout could protect
        new = RolloutState(
            name,
            number,
            number,
            phase=RolloutPhase.COMPLETE,
            reason="FirstRevision",
            message=f"revision {number} ({version}) sent to every placed device",
            started_at=now,
            changed_at=now,
            step_at=now,
            progress_at=now,
        )
        return Step(revision, new, (Event("Normal", "RevisionCreated", new.message),))
    stable = state.revision if state.phase is RolloutPhase.COMPLETE else state.stable
    new = RolloutState(
        name,
        number,
        stable,
        phase=RolloutPhase.PROGRESSING,
        reason="NewRevision",
        message=f"rolling out revision {number} ({version}) from revision {stable}"
        + (f" (a copy of revision {source})" if source else "")
        + (f" (a restart of revision {state.revision})" if restart else ""),
        started_at=now,
        changed_at=now,
        step_at=now,
        progress_at=now,
        previous=state.previous,
        restarted_at=state.restarted_at,
    )
    return Step(revision, new, (Event("Normal", "RolloutStarted", new.message),))


def _back_to_stable(
    state: RolloutState,
    stable: Revision,
    current: Revision | None,
    devices: Sequence[DeviceView],
    budget: Budget,
    now: float,
) -> Step:
    """The stable revision's template applied again (an apply, ``rollout undo`` after a
    rollback): no new revision, the stable one is the current one again and every device is
    sent it (those given the other one go back, as in a rollback)."""
    left = f"revision {state.revision} ({_version(current)})" if current else "the rollout"
    new = RolloutState(
        state.deployment,
        stable.number,
        stable.number,
        phase=RolloutPhase.PROGRESSING,
        reason="StableTemplate",
        message=f"revision {stable.number} ({_version(stable)}) applied again, no new "
        f"revision: {left} is left and every device is sent revision {stable.number}",
        started_at=now,
        changed_at=now,
        step_at=now,
        progress_at=now,
        previous=state.previous,
        restarted_at=state.restarted_at,
    )
    event = Event("Normal", "RolloutReverted", new.message)
    return Step(state=new, events=(event,), progress=measure(new, devices, budget))


DOWNGRADE_REFUSALS = ("MetadataRollback", "ModelVersionRollback")
"""How a device refuses to go below what it accepted without a signed rollback allowance
(edgefleet.trust.verifying; docs/trust.md)."""


def _reverting(
    state: RolloutState,
    current: Revision,
    devices: Sequence[DeviceView],
    budget: Budget,
    now: float,
    placed: bool,
) -> Step:
    """The stable revision's template applied again (:func:`_back_to_stable`): every device is
    sent it at once, and the rollout is Complete once every targeted device serves it, all
    replicas ready. A device that refuses or fails it holds the rollout Progressing (reason
    ``RevisionRefused``, a Warning event), named with why, and for a downgrade it refuses
    (``MetadataRollback``, ``ModelVersionRollback``) what would permit it: there is nothing
    before the stable revision to roll back to, and no deadline gives up on it. A device
    that refuses it keeps serving what it ran (edged keeps the previous good version)."""
    progress = measure(state, devices, budget)
    refused = sorted((d.name, d.broken_reason) for d in devices if d.target is TargetPhase.BROKEN)
    if refused:
        version = _version(current)
        first = "; ".join(f"{d}: {r}" for d, r in refused[:3])
        more = f" and {len(refused) - 3} more" if len(refused) > 3 else ""
        message = (
            f"revision {state.revision} ({version}) applied again is refused or failed on "
            f"{len(refused)} of {len(devices)} device(s) ({first}{more}); they keep serving "
            "what they ran"
        )
        if any(why in r for _, r in refused for why in DOWNGRADE_REFUSALS):
            name = current.model[0]
            message += (
                f". A device does not go back below the model version or signed metadata it "
                f"accepted without a rollback allowance (docs/trust.md): sign {version} again "
                f"(edgectl models push MODEL_FILE --name {name} --version {version}, with "
                f"--allow-rollback 7d where the hub keeps a TUF repository) and, without TUF, "
                f"allow it (edgectl rollback allow --name {name} --version {version} --sha256 "
                f"SHA256 --key PUBLISHER_KEY --out F, then edgectl rollback push F); or apply "
                f"a newer version"
            )
        if (state.reason, state.message) == ("RevisionRefused", message):
            return Step(progress=progress)
        held = replace(state, reason="RevisionRefused", message=message, changed_at=now)
        event = Event("Warning", "RevisionRefused", message)
        return Step(state=held, events=(event,), progress=progress)
    if placed and all(d.target is TargetPhase.READY for d in devices):
        return _complete(state, current, devices, budget, now)
    return Step(progress=progress)


def _give_up(
    state: RolloutState,
    current: Revision,
    reason: str,
    why: str,
    devices: Sequence[DeviceView],
    budget: Budget,
    now: float,
) -> Step:
    new = replace(
        state,
        phase=RolloutPhase.ROLLED_BACK,
        reason=reason,
        message=f"revision {state.revision} ({_version(current)}) {why}; every device is back "
        f"on revision {state.stable}",
        changed_at=now,
        failed=given_up_on(
            state, devices, f"{reason}: revision {state.revision} ({_version(current)}) {why}"
        ),
    )
    event = Event("Warning", "RolledBack", new.message)
    return Step(state=new, events=(event,), progress=measure(new, devices, budget))


def given_up_on(state: RolloutState, devices: Sequence[DeviceView], why: str) -> dict[str, str]:
    """The devices a rollout given up (analysis, deadline) is rolled back for, each with
    ``why``: those given the new revision that are not ready on it, else all of them."""
    given = [d for d in devices if d.name in state.updated]
    behind = [d.name for d in given if d.target is not TargetPhase.READY]
    return dict.fromkeys(sorted(behind or (d.name for d in given)), why)


def _roll_back(
    state: RolloutState,
    current: Revision,
    broken: list[tuple[str, str]],
    devices: Sequence[DeviceView],
    budget: Budget,
    now: float,
) -> Step:
    first = "; ".join(f"{d}: {r}" for d, r in broken[:3])
    more = f" and {len(broken) - 3} more" if len(broken) > 3 else ""
    new = replace(
        state,
        phase=RolloutPhase.ROLLED_BACK,
        reason="RevisionFailed",
        message=f"revision {state.revision} ({_version(current)}) failed on {len(broken)} "
        f"device(s) ({first}{more}); every device is back on revision {state.stable}",
        changed_at=now,
        failed=dict(broken),
    )
    event = Event("Warning", "RolledBack", new.message)
    return Step(state=new, events=(event,), progress=measure(new, devices, budget))
