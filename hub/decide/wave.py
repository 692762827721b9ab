"""Federated rollouts in waves: pure decisions at a root hub, tested as tables.

A ModelDeployment at a root hub with ``spec.rollout.waves`` rolls a new revision out region by
region (docs/federation.md, "Rollouts in waves"). The root keeps one :class:`WaveState` per
deployment (``/waves/NAME``), written in the same transaction as each new revision the root
makes (:func:`start`), so a root restarted at any moment resumes from it:

* the regions a wave has *released* are sent the new revision (the deployment's manifest as
  applied); every other region is sent the *stable* one (:func:`region_manifest`: the stable
  revision's template with the deployment's own placement and rollout settings), so a region
  not yet in a wave changes nothing. Inside a region its own rollout settings apply
  (``maxSurge``, ``canary`` steps and their analysis);
* :func:`plan_waves` takes the next step from the state and what each region last reported of
  the deployment (:class:`RegionView`): a wave of regions is released, then passes when each of
  its regions reports its rollout of the new revision (identified by its template hash)
  Complete; a ``pause`` waits its duration, or (none given) is ``Paused`` until ``rollout
  resume``; after the last wave the regions no wave named follow, and when they are all
  Complete the rollout is Complete and the new revision is the stable one;
* a released region whose own rollout of the new revision was **rolled back** (a device
  refused or failed it, its canary analysis failed, its progress deadline passed) fails the
  wave: every region is sent the stable revision again, and the event names the region and
  its figures (its rollout's message);
* a region of the current wave that is not connected, or has not reported the deployment,
  holds the wave (neither a pass nor a failure): the state's reason says
  ``RegionUnreachable`` and which region, until it is back;
* a wave of regions whose regions have not all finished (Complete, or held at a percent
  wave's weight) within the deployment's ``progressDeadlineSeconds`` fails like a region that
  rolled back (reason ``ProgressDeadlineExceeded``, naming the regions that did not finish and
  their figures). The deadline counts from the wave's start, or from when it could last go on
  (its regions sent the new revision, reachable again after ``RegionUnreachable``, or an
  operator's resume), the later; a pause wave, a paused rollout, a wave held for the analysis
  window and a wave waiting for an unreachable region are not bounded by it.

Every step is a new state (or none) and events, written by :mod:`hub.controllers.wave` with a
compare-and-swap; no I/O, no clock here. What ``edgectl`` shows of it: :mod:`hub.decide.wavestatus`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from edgefleet.api import CanaryAnalysis, Wave
from hub.decide import regionslice
from hub.decide.analysis import Analysis, Figures, Sample, Verdict, analyze
from hub.decide.revisions import with_live_fields
from hub.decide.rollout import (
    MAX_WEIGHT,
    Event,
    Revision,
    RolloutPhase,
    RolloutState,
    template_hash,
)
from hub.decide.weighing import MAX_REQUESTS_PER_DEVICE_S, Counts, screen, weigh


class WavePhase(StrEnum):
    PROGRESSING = "Progressing"
    PAUSED = "Paused"
    COMPLETE = "Complete"
    ROLLED_BACK = "RolledBack"


MAX_HISTORY = 64
"""Wave outcomes kept in a state (one per wave passed or failed)."""


@dataclass(frozen=True, slots=True)
class WaveState:
    """Where a deployment's rollout across regions stands; stored at ``/waves/NAME``."""

    deployment: str
    revision: int  # the root's revision being rolled out
    stable: int  # the root's revision the other regions keep, and go back to
    stable_manifest: Mapping[str, Any]  # that revision's manifest (kept: it may be pruned)
    version: str = ""  # the new revision's model version (for messages)
    stable_version: str = ""
    released: frozenset[str] = frozenset()  # regions sent the new revision
    phase: WavePhase = WavePhase.COMPLETE
    step: int = 0  # index in spec.rollout.waves (== len: the remaining regions)
    step_at: float = 0.0
    reason: str = ""
    message: str = ""
    started_at: float = 0.0
    changed_at: float = 0.0
    history: tuple[Mapping[str, Any], ...] = ()  # {wave, outcome, at, message, regions}
    ready_at: float = 0.0  # every region of the wave done: analysed from then (0: not yet)
    # regions sent the new revision on a percentage of their devices (a percent wave), not
    # released whole yet: region -> the percentage
    weights: Mapping[str, int] = field(default_factory=dict)
    # the current wave's progress deadline counts from here or from ``step_at``, the later:
    # set when its regions are sent the new revision, are reachable again, or it is resumed
    deadline_from: float = 0.0

    def sends_new(self, region: str) -> bool:
        """Whether ``region`` is sent the new revision now (on some of its devices, maybe)."""
        if self.phase is WavePhase.COMPLETE:
            return True
        if self.phase is WavePhase.ROLLED_BACK:
            return False
        return region in self.released or region in self.weights

    def weight_for(self, region: str) -> int | None:
        """The percentage of its devices ``region`` may give the new revision (None: all)."""
        if self.phase in (WavePhase.COMPLETE, WavePhase.ROLLED_BACK) or region in self.released:
            return None
        return self.weights.get(region)

    def to_json(self) -> dict[str, Any]:
        return {
            "deployment": self.deployment,
            "revision": self.revision,
            "stable": self.stable,
            "stableManifest": dict(self.stable_manifest),
            "version": self.version,
            "stableVersion": self.stable_version,
            "released": sorted(self.released),
            "phase": self.phase.value,
            "step": self.step,
            "stepAt": self.step_at,
            "reason": self.reason,
            "message": self.message,
            "startedAt": self.started_at,
            "changedAt": self.changed_at,
            "history": [dict(h) for h in self.history],
            "readyAt": self.ready_at,
            "weights": dict(sorted(self.weights.items())),
            "deadlineFrom": self.deadline_from,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> WaveState:
        return cls(
            deployment=str(doc["deployment"]),
            revision=int(doc["revision"]),
            stable=int(doc["stable"]),
            stable_manifest=dict(doc.get("stableManifest", {})),
            version=str(doc.get("version", "")),
            stable_version=str(doc.get("stableVersion", "")),
            released=frozenset(doc.get("released", ())),
            phase=WavePhase(doc.get("phase", WavePhase.COMPLETE.value)),
            step=int(doc.get("step", 0)),
            step_at=float(doc.get("stepAt", 0.0)),
            reason=str(doc.get("reason", "")),
            message=str(doc.get("message", "")),
            started_at=float(doc.get("startedAt", 0.0)),
            changed_at=float(doc.get("changedAt", 0.0)),
            history=tuple(dict(h) for h in doc.get("history", ())),
            ready_at=float(doc.get("readyAt", 0.0)),
            weights={str(k): int(v) for k, v in doc.get("weights", {}).items()},
            deadline_from=float(doc.get("deadlineFrom", 0.0)),
        )


# -- what each region is sent ---------------------------------------------------------------


def without_waves(manifest: Mapping[str, Any]) -> Mapping[str, Any]:
    """The manifest without ``spec.rollout.waves``: a region rolls out on its own settings."""
    rollout = manifest.get("spec", {}).get("rollout")
    if not isinstance(rollout, Mapping) or "waves" not in rollout:
        return manifest
    spec = dict(manifest["spec"])
    spec["rollout"] = {k: v for k, v in rollout.items() if k != "waves"}
    return {**manifest, "spec": spec}


def stable_of(manifest: Mapping[str, Any], stable: Mapping[str, Any]) -> dict[str, Any]:
    """The deployment as a region not (or no longer) in a wave gets it: the stable revision's
    template (model, runtime, labels...) with the deployment's own metadata, placement,
    replicas, scaling and rollout settings (:data:`hub.decide.revisions.LIVE_FIELDS`)."""
    spec = with_live_fields(stable, manifest)["spec"]
    metadata = dict(manifest.get("metadata", {}))
    labels = stable.get("metadata", {}).get("labels")
    if labels:
        metadata["labels"] = labels
    else:
        metadata.pop("labels", None)
    return {**manifest, "metadata": metadata, "spec": spec}


def region_manifest(
    manifest: Mapping[str, Any], state: WaveState | None, region: str
) -> Mapping[str, Any]:
    """What ``region`` is sent of a ModelDeployment (``manifest`` as applied at the root):
    the stable revision, the new one, or the new one capped at a wave's percentage of the
    region's devices (:data:`hub.decide.rollout.MAX_WEIGHT`, which the region's rollout honours)."""
    if state is not None and not state.sends_new(region) and state.stable_manifest:
        manifest = stable_of(manifest, state.stable_manifest)
    weight = state.weight_for(region) if state is not None else None
    if weight is not None:
        metadata = dict(manifest.get("metadata", {}))
        metadata["annotations"] = {
            **(metadata.get("annotations") or {}),
            MAX_WEIGHT: str(weight),
        }
        manifest = {**manifest, "metadata": metadata}
    return without_waves(manifest)


def expected_template(manifest: Mapping[str, Any], region: str) -> str:
    """The template hash ``region``'s revision of ``manifest`` has (its overrides applied)."""
    return template_hash(regionslice.with_overrides(manifest, region))


# -- a new revision --------------------------------------------------------------------------


def start(
    before: WaveState | None,
    rollout: RolloutState | None,
    revision: Revision,
    revisions: Mapping[int, Revision],
    waves: Sequence[Wave],
    now: float,
) -> tuple[WaveState, tuple[Event, ...]]:
    """The state once the root made ``revision``: from the stable revision of the rollout in
    waves before it (or of the root's own rollout ``rollout``, for a deployment that had none),
    in waves when the deployment has them, else at once to every region. ``revisions``: the
    deployment's revisions the root keeps."""
    version = revision.model[1]
    name = revision.deployment
    stable: int | None = None
    stable_manifest: Mapping[str, Any] = {}
    if before is not None:
        stable = before.revision if before.phase is WavePhase.COMPLETE else before.stable
        kept = revisions.get(stable)
        if kept is not None:
            stable_manifest = kept.manifest
        elif stable == before.stable:
            stable_manifest = before.stable_manifest
    elif rollout is not None:
        stable = rollout.revision if rollout.phase is RolloutPhase.COMPLETE else rollout.stable
        kept = revisions.get(stable)
        stable_manifest = kept.manifest if kept is not None else {}
    if (
        not waves
        or stable is None
        or not stable_manifest
        or stable == revision.number
        or template_hash(stable_manifest) == revision.template  # back to the stable template
    ):
        done = WaveState(
            name,
            revision.number,
            revision.number,
            dict(revision.manifest),
            version=version,
            stable_version=version,
            phase=WavePhase.COMPLETE,
            reason="AllRegions",
            message=f"revision {revision.number} ({version}) sent to every region",
            started_at=now,
            changed_at=now,
            step_at=now,
        )
        return done, ()
    stable_version = str(stable_manifest.get("spec", {}).get("model", {}).get("version", ""))
    state = WaveState(
        name,
        revision.number,
        stable,
        dict(stable_manifest),
        version=version,
        stable_version=stable_version,
        phase=WavePhase.PROGRESSING,
        step=0,
        step_at=now,
        reason="WavesStarted",
        message=f"rolling out revision {revision.number} ({version}) from revision {stable} "
        f"({stable_version}) in {len(waves)} wave(s)",
        started_at=now,
        changed_at=now,
    )
    return state, (Event("Normal", "WavesStarted", state.message),)


# -- the next step ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RevisionFigures:
    """What one revision did in a region (its report's ``revision_figures``): counters added
    up over the devices where it serves, the highest latency p95, the lowest accuracy."""

    template: str
    devices: int = 0
    requests: int = 0
    errors: int = 0
    latency_p95_s: float | None = None
    accuracy: float | None = None
    accuracy_devices: int = 0
    validation_problems: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RegionSide:
    """One region's figures of one revision, with the root's samples of its counters."""

    region: str
    figures: RevisionFigures
    samples: Sequence[Sample] = ()


def side_figures(observed: Sequence[RegionSide], now: float, window: float) -> Figures:
    """One side of the analysis across regions (the regions given the new revision, or the
    others on the stable one), as :func:`hub.decide.analysis.figures` is for devices: each
    region's requests and errors over the window from the samples of its counters, bounded
    by its devices (:data:`hub.decide.weighing.MAX_REQUESTS_PER_DEVICE_S` each: a region above is
    left out, ``excluded``), weighed with no region heavier than the heaviest other one; the
    highest p95, the lowest accuracy; a device without accuracy named ``region/device``."""
    devices = measured = 0
    p95: float | None = None
    accuracy: float | None = None
    problems: dict[str, str] = {}
    members: list[Counts] = []
    excluded: dict[str, str] = {}
    for o in observed:
        f = o.figures
        counted = screen(o.samples, now, window, MAX_REQUESTS_PER_DEVICE_S * max(1, f.devices))
        why = counted if isinstance(counted, str) else _implausible(f)
        if why or isinstance(counted, str):
            excluded[o.region] = why
            continue
        members.append(Counts(o.region, counted[0], counted[1], f.latency_p95_s))
        devices += f.devices
        if f.latency_p95_s is not None:
            p95 = f.latency_p95_s if p95 is None else max(p95, f.latency_p95_s)
        if f.accuracy is not None:
            accuracy = f.accuracy if accuracy is None else min(accuracy, f.accuracy)
        measured += f.accuracy_devices
        problems.update({f"{o.region}/{d}": why for d, why in f.validation_problems.items()})
    requests, errors = weigh(members)
    return Figures(
        devices, requests, errors, p95, accuracy, measured, problems, tuple(members), excluded
    )


def _implausible(f: RevisionFigures) -> str:
    """Why a region's latency, accuracy or counts cannot be true ("" when they can)."""
    if f.latency_p95_s is not None and not 0.0 <= f.latency_p95_s <= 1e6:  # also NaN
        return f"latency p95 {f.latency_p95_s} s"
    if f.accuracy is not None and not 0.0 <= f.accuracy <= 1.0:
        return f"accuracy {f.accuracy}"
    if not 0 <= f.accuracy_devices <= f.devices:
        return f"{f.accuracy_devices} devices with an accuracy of {f.devices}"
    return ""


def analyze_regions(
    spec: CanaryAnalysis, canary: Sequence[RegionSide], stable: Sequence[RegionSide], now: float
) -> Analysis:
    """The analysis across regions: :func:`hub.decide.analysis.analyze` over the two sides."""
    return analyze(
        spec, side_figures(canary, now, spec.window_s), side_figures(stable, now, spec.window_s)
    )


@dataclass(frozen=True, slots=True)
class RegionView:
    """What the root knows now of one region and the deployment there."""

    name: str
    connected: bool = False
    reported: bool = False  # its last report has the deployment
    reported_at: float | None = None  # when the root received its last report (any replica)
    template: str = ""  # the template hash of the revision its rollout is rolling out
    stable_template: str = ""  # its rollout's stable revision's
    phase: str = ""  # its rollout's phase
    reason: str = ""
    message: str = ""
    desired: int = 0
    updated: int = 0
    ready: int = 0
    available: int = 0
    failing: Mapping[str, str] | None = None
    revisions: Mapping[str, RevisionFigures] = field(default_factory=dict)  # by template

    def figures(self) -> dict[str, Any]:
        return {
            "desiredDevices": self.desired,
            "updatedDevices": self.updated,
            "readyDevices": self.ready,
            "availableDevices": self.available,
            "failing": dict(sorted((self.failing or {}).items())),
            "rollout": {"phase": self.phase, "reason": self.reason, "message": self.message},
        }

    def text(self) -> str:
        return (
            f"{self.updated} of {self.desired} devices updated, {self.ready} ready, "
            f"rollout {self.phase or 'not reported'}"
            + (f" ({self.reason}: {self.message})" if self.message else "")
        )


@dataclass(frozen=True, slots=True)
class WaveStep:
    state: WaveState | None = None
    events: tuple[Event, ...] = ()


def wave_text(waves: Sequence[Wave], step: int) -> str:
    if step >= len(waves):
        return "the remaining regions"
    w = waves[step]
    if w.percent is not None:
        what = f"{w.percent}% of every region not given it yet"
    elif w.pause:
        what = "a pause" + (f" of {w.pause_s:g} s" if w.pause_s is not None else "")
    else:
        what = ", ".join(w.regions)
    return f"wave {step + 1} of {len(waves)} ({what})"


def wave_regions(
    waves: Sequence[Wave], step: int, placed: Sequence[str], released: frozenset[str] = frozenset()
) -> list[str]:
    """The regions of wave ``step``: those it names that the deployment goes to; of a percent
    wave, the placed regions not ``released`` whole; past the last wave, the placed regions
    no wave names."""
    if step >= len(waves):
        named = {r for w in waves for r in w.regions}
        return [r for r in placed if r not in named]
    if waves[step].percent is not None:
        return [r for r in placed if r not in released]
    return [r for r in waves[step].regions if r in placed]


def region_done(view: RegionView | None, expected: str, held: bool = False) -> bool:
    """Whether the region's rollout of ``expected`` is Complete (``held``: or held at the
    percentage of a percent wave, every device given it ready on it)."""
    if view is None or not view.reported or view.template != expected:
        return False
    if view.phase == RolloutPhase.COMPLETE.value:
        return True
    return held and view.phase == RolloutPhase.PROGRESSING.value and view.reason == "WeightHeld"


def plan_waves(
    waves: Sequence[Wave],
    state: WaveState,
    placed: Sequence[str],
    expected: Mapping[str, str],
    views: Mapping[str, RegionView],
    now: float,
    analysis: Analysis | None = None,
    deadline_s: float | None = None,
) -> WaveStep:
    """The next step of a rollout in waves (see the module doc). ``waves``: the deployment's
    ``spec.rollout.waves`` now; ``placed``: the enrolled regions it goes to, sorted;
    ``expected``: region -> the template hash of the new revision there; ``views``: region ->
    what it last said; ``analysis``: the analysis across regions now (None: the deployment
    has no ``canary.analysis``); ``deadline_s``: the deployment's ``progressDeadlineSeconds``
    (None: a wave is not bounded)."""
    if state.phase in (WavePhase.COMPLETE, WavePhase.ROLLED_BACK):
        return WaveStep()
    if not waves:
        return _complete(state, placed, "the waves were removed from the deployment", now)
    for region in sorted(state.released | frozenset(state.weights)):
        v = views.get(region)
        if (
            v is not None
            and v.reported
            and v.template == expected.get(region)
            and v.phase == RolloutPhase.ROLLED_BACK.value
        ):
            return _roll_back(state, waves, region, v, now)
    if analysis is not None and analysis.verdict is Verdict.FAIL:
        return _analysis_failed(state, waves, analysis, now)
    if state.phase is WavePhase.PAUSED:
        return WaveStep()  # until rollout resume (a failure above still rolls back)
    i = state.step
    if i < len(waves) and waves[i].pause:
        return _pause(state, waves, now)
    regions = wave_regions(waves, i, placed, state.released)
    percent = waves[i].percent if i < len(waves) else None
    if percent is not None:
        new = [r for r in regions if state.weights.get(r) != percent]
        if new:
            moved = replace(
                state,
                weights={**state.weights, **dict.fromkeys(new, percent)},
                changed_at=now,
                deadline_from=now,
                reason="WaveStarted",
                message=f"{wave_text(waves, i)}: revision {state.revision} ({state.version}) "
                f"sent to {percent}% of the devices of {', '.join(new)}",
            )
            return WaveStep(moved, (Event("Normal", "WaveStarted", moved.message),))
    new = [r for r in regions if r not in state.released] if percent is None else []
    if new:
        moved = replace(
            state,
            released=state.released | frozenset(new),
            changed_at=now,
            deadline_from=now,
            reason="WaveStarted",
            message=f"{wave_text(waves, i)}: revision {state.revision} ({state.version}) sent "
            f"to {', '.join(new)}",
        )
        return WaveStep(moved, (Event("Normal", "WaveStarted", moved.message),))
    away = [r for r in regions if not (views.get(r) and views[r].connected)]
    unreported = [r for r in regions if r not in away and not views[r].reported]
    if away or unreported:
        why = "; ".join(
            [f"region {r} is unreachable (not connected to the root)" for r in away]
            + [f"region {r} has not reported the deployment yet" for r in unreported]
        )
        message = f"{wave_text(waves, i)} waits, neither passed nor failed: {why}"
        if state.reason == "RegionUnreachable" and state.message == message:
            return WaveStep()
        held = replace(state, reason="RegionUnreachable", message=message, changed_at=now)
        return WaveStep(held, (Event("Warning", "WaveWaiting", message),))
    unfinished = [
        r
        for r in regions
        if not region_done(views.get(r), expected.get(r, ""), percent is not None)
    ]
    if unfinished:
        if state.reason == "RegionUnreachable":  # back: the condition is cleared
            going = replace(
                state,
                reason="WaveProgressing",
                message=f"{wave_text(waves, i)}: every region of the wave is reachable again",
                changed_at=now,
                deadline_from=now,  # the deadline counts again from now
            )
            return WaveStep(going, (Event("Normal", "WaveProgressing", going.message),))
        since = max(state.step_at, state.deadline_from)
        if deadline_s is not None and now - since > deadline_s:
            return _deadline_exceeded(state, waves, deadline_s, unfinished, views, now)
        return WaveStep()
    figures = {r: views[r].figures() for r in regions}
    summary = "; ".join(f"{r}: {views[r].text()}" for r in regions) or "no region in it"
    if i >= len(waves):
        return _complete(state, placed, summary, now, figures)
    if analysis is not None:  # held for the window, passing, before the next wave
        if not state.ready_at:
            ready = replace(
                state,
                ready_at=now,
                changed_at=now,
                reason="WaveReady",
                message=f"{wave_text(waves, i)}: every region of the wave completed; analysing "
                f"across regions for {analysis.window_s:g} s",
            )
            return WaveStep(ready, (Event("Normal", "WaveReady", ready.message),))
        if analysis.verdict is not Verdict.PASS or now - state.ready_at < analysis.window_s:
            return WaveStep()
        summary += f"; analysis across regions: {analysis.message}"
    return _next(state, waves, f"passed ({summary})", figures, now, analysis)


def _record(
    state: WaveState,
    outcome: str,
    message: str,
    regions: Mapping[str, Any],
    now: float,
    analysis: Analysis | None = None,
) -> tuple[Mapping[str, Any], ...]:
    entry: dict[str, Any] = {
        "wave": state.step + 1,
        "outcome": outcome,
        "at": now,
        "message": message,
        "regions": dict(regions),
    }
    if analysis is not None:
        entry["analysis"] = analysis.to_json()
    return (*state.history, entry)[-MAX_HISTORY:]


def _next(
    state: WaveState,
    waves: Sequence[Wave],
    why: str,
    figures: Mapping[str, Any],
    now: float,
    analysis: Analysis | None = None,
) -> WaveStep:
    message = f"{wave_text(waves, state.step)} {why}; now at {wave_text(waves, state.step + 1)}"
    moved = replace(
        state,
        step=state.step + 1,
        step_at=now,
        ready_at=0.0,
        changed_at=now,
        reason="WavePassed",
        message=message,
        history=_record(state, "Passed", message, figures, now, analysis),
    )
    return WaveStep(moved, (Event("Normal", "WavePassed", message),))


def _pause(state: WaveState, waves: Sequence[Wave], now: float) -> WaveStep:
    wave = waves[state.step]
    if state.phase is WavePhase.PAUSED:
        return WaveStep()  # until rollout resume
    if wave.pause_s is None:
        paused = replace(
            state,
            phase=WavePhase.PAUSED,
            reason="WavePause",
            message=f"paused at {wave_text(waves, state.step)} until edgectl rollout resume",
            changed_at=now,
        )
        return WaveStep(paused, (Event("Normal", "WavePaused", paused.message),))
    if now - state.step_at >= wave.pause_s:
        return _next(state, waves, "is over", {}, now)
    return WaveStep()


def pause(state: WaveState, now: float) -> WaveState | None:
    """An operator's ``rollout pause`` at the root: no further wave starts (None: not
    Progressing). A region of a released wave that fails still rolls every region back."""
    if state.phase is not WavePhase.PROGRESSING:
        return None
    return replace(
        state,
        phase=WavePhase.PAUSED,
        reason="Paused",
        message="paused by an operator",
        changed_at=now,
    )


def resume(waves: Sequence[Wave], state: WaveState, now: float) -> WaveState | None:
    """An operator's ``rollout resume`` at the root: past a pause wave, on from where an
    operator paused, or (after a rollback) the same revision again from the first wave (None:
    none of these)."""
    if state.phase is WavePhase.ROLLED_BACK and state.revision != state.stable:
        return replace(
            state,
            phase=WavePhase.PROGRESSING,
            released=frozenset(),
            step=0,
            step_at=now,
            started_at=now,
            changed_at=now,
            reason="Retried",
            message=f"revision {state.revision} ({state.version}) retried from the first wave "
            "by an operator",
            history=(),
            ready_at=0.0,
            weights={},
            deadline_from=now,
        )
    if state.phase is not WavePhase.PAUSED:
        return None
    if state.reason != "WavePause":
        return replace(
            state,
            phase=WavePhase.PROGRESSING,
            changed_at=now,
            deadline_from=now,
            reason="Resumed",
            message=f"resumed by an operator at {wave_text(waves, state.step)}",
        )
    message = f"resumed by an operator after {wave_text(waves, state.step)}"
    return replace(
        state,
        phase=WavePhase.PROGRESSING,
        step=state.step + 1,
        step_at=now,
        changed_at=now,
        reason="Resumed",
        message=message,
        history=_record(state, "Passed", message, {}, now),
    )


def _complete(
    state: WaveState,
    placed: Sequence[str],
    why: str,
    now: float,
    figures: Mapping[str, Any] | None = None,
) -> WaveStep:
    message = (
        f"revision {state.revision} ({state.version}) serves in every region "
        f"({', '.join(placed) or 'none enrolled'}): {why}"
    )
    done = replace(
        state,
        phase=WavePhase.COMPLETE,
        stable=state.revision,
        released=frozenset(placed),
        reason="RolloutComplete",
        message=message,
        changed_at=now,
        history=_record(state, "Passed", message, figures or {}, now),
    )
    return WaveStep(done, (Event("Normal", "RolloutComplete", message),))


def _roll_back(
    state: WaveState, waves: Sequence[Wave], region: str, view: RegionView, now: float
) -> WaveStep:
    back = sorted(state.released | frozenset(state.weights))
    message = (
        f"revision {state.revision} ({state.version}) failed in region {region} at "
        f"{wave_text(waves, state.step)}: {view.text()}; every region "
        f"({', '.join(back)}) is sent revision {state.stable} ({state.stable_version}) again"
    )
    new = replace(
        state,
        phase=WavePhase.ROLLED_BACK,
        reason="RegionFailed",
        message=message,
        changed_at=now,
        history=_record(state, "Failed", message, {region: view.figures()}, now),
    )
    return WaveStep(new, (Event("Warning", "RolledBack", message),))


def _deadline_exceeded(
    state: WaveState,
    waves: Sequence[Wave],
    deadline_s: float,
    unfinished: Sequence[str],
    views: Mapping[str, RegionView],
    now: float,
) -> WaveStep:
    back = sorted(state.released | frozenset(state.weights))
    figures = "; ".join(f"{r}: {views[r].text()}" for r in unfinished)
    message = (
        f"revision {state.revision} ({state.version}) did not pass "
        f"{wave_text(waves, state.step)} within progressDeadlineSeconds {deadline_s:g} s: "
        f"not finished in {', '.join(unfinished)} ({figures}); every region "
        f"({', '.join(back)}) is sent revision {state.stable} ({state.stable_version}) again"
    )
    new = replace(
        state,
        phase=WavePhase.ROLLED_BACK,
        reason="ProgressDeadlineExceeded",
        message=message,
        changed_at=now,
        history=_record(state, "Failed", message, {r: views[r].figures() for r in unfinished}, now),
    )
    return WaveStep(new, (Event("Warning", "RolledBack", message),))


def _analysis_failed(
    state: WaveState, waves: Sequence[Wave], analysis: Analysis, now: float
) -> WaveStep:
    back = sorted(state.released | frozenset(state.weights))
    why = "; ".join(c.message for c in analysis.failed)
    message = (
        f"revision {state.revision} ({state.version}) failed the analysis across regions at "
        f"{wave_text(waves, state.step)} (regions given it: {', '.join(back)}): {why}; every "
        f"region is sent revision {state.stable} ({state.stable_version}) again"
    )
    new = replace(
        state,
        phase=WavePhase.ROLLED_BACK,
        reason="AnalysisFailed",
        message=message,
        changed_at=now,
        history=_record(state, "Failed", message, {}, now, analysis),
    )
    return WaveStep(new, (Event("Warning", "RolledBack", message),))
