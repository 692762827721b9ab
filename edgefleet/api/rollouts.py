"""The ``spec.rollout`` section of a ModelDeployment: how a new revision reaches the fleet
(surge and unavailability, canary steps with their analysis, waves across regions)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgefleet.api.fieldsyntax import fraction, positive, step_percent
from edgefleet.api.meta import (
    dns_label,
)
from edgefleet.api.quantities import (
    IntOrPercent,
    format_duration,
    parse_duration,
    parse_int_or_percent,
    parse_percent,
)
from edgefleet.api.validating import (
    Reader,
    int_in,
    within,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class CanaryAnalysis:
    """When a canary step fails: validation accuracy below ``minAccuracy``, error rate up by
    more than ``maxErrorRateIncrease`` over the stable revision's, or latency p95 above
    ``maxLatencyP95``; figures over the last ``window``, once ``minRequests`` were answered."""

    min_accuracy: float | None = None
    max_error_rate_increase: float | None = None
    max_latency_p95_s: float | None = None
    min_requests: int = 20
    window_s: float = 60.0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.min_accuracy is not None:
            out["minAccuracy"] = self.min_accuracy
        if self.max_error_rate_increase is not None:
            out["maxErrorRateIncrease"] = self.max_error_rate_increase
        if self.max_latency_p95_s is not None:
            out["maxLatencyP95"] = format_duration(self.max_latency_p95_s)
        if self.min_requests != CanaryAnalysis().min_requests:
            out["minRequests"] = self.min_requests
        out["window"] = format_duration(self.window_s)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class CanaryStep:
    """One canary step: send the new revision to ``weight`` percent of the targeted devices,
    or pause (``pause_s`` seconds; ``None``: until ``edgectl rollout resume``)."""

    weight: int | None = None
    pause: bool = False
    pause_s: float | None = None

    def to_dict(self) -> Any:
        if not self.pause:
            return f"{self.weight}%"
        return {
            "pause": {} if self.pause_s is None else {"duration": format_duration(self.pause_s)}
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Canary:
    """Canary steps: weights (percentages of the targeted devices, strictly increasing) and
    pauses, in order."""

    steps: tuple[CanaryStep, ...]
    analysis: CanaryAnalysis | None = None

    @property
    def weights(self) -> tuple[int, ...]:
        return tuple(s.weight for s in self.steps if s.weight is not None)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"steps": [step.to_dict() for step in self.steps]}
        if self.analysis is not None:
            out["analysis"] = self.analysis.to_dict()
        return out


MAX_WAVES = 20


@dataclass(frozen=True, slots=True, kw_only=True)
class Wave:
    """One wave of a root hub's rollout (federation): the regions given the new revision
    together, each rolling it out with its own rollout settings, before the next wave; a
    percentage of the devices of every region not given it yet; or a pause (``pause_s``
    seconds; ``None``: until ``edgectl rollout resume``). The regions of the deployment no
    wave names follow after the last wave."""

    regions: tuple[str, ...] = ()
    pause: bool = False
    pause_s: float | None = None
    # every region not given the new revision yet gets it on this percentage of its devices
    percent: int | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.percent is not None:
            return {"percent": f"{self.percent}%"}
        if not self.pause:
            return {"regions": list(self.regions)}
        return {
            "pause": {} if self.pause_s is None else {"duration": format_duration(self.pause_s)}
        }


_QUARTER = IntOrPercent(25, percent=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class Rollout:
    """``spec.rollout``: how a new revision replaces the old one."""

    max_unavailable: IntOrPercent = _QUARTER
    max_surge: IntOrPercent = _QUARTER
    canary: Canary | None = None
    progress_deadline_s: int | None = None  # no progress for this long: rolled back
    # a root hub (federation): the regions a new revision goes to, wave by wave
    waves: tuple[Wave, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "maxUnavailable": self.max_unavailable.to_yaml(),
            "maxSurge": self.max_surge.to_yaml(),
        }
        if self.canary is not None:
            out["canary"] = self.canary.to_dict()
        if self.waves:
            out["waves"] = [w.to_dict() for w in self.waves]
        if self.progress_deadline_s is not None:
            out["progressDeadlineSeconds"] = self.progress_deadline_s
        return out


def _read_canary_step(r: Reader, path: str, item: object) -> CanaryStep | None:
    """A step: ``"5%"`` (``{setWeight: 5%}``), ``{pause: {}}`` or ``{pause: {duration: 60s}}``."""
    if not isinstance(item, Mapping):
        return r.problems.convert(path, item, lambda v: CanaryStep(weight=step_percent(v)), None)
    s = r.problems.reader(item, path)
    if s is None:
        return None
    if s.has("setWeight") == s.has("pause"):
        s.problems.add(path, "must have exactly one of setWeight or pause")
        s.ignore("setWeight", "pause")
        return None
    if s.has("setWeight"):
        weight = s.required("setWeight", step_percent, None)
        return None if weight is None else CanaryStep(weight=weight)
    p = s.section("pause")
    duration = None if p is None else p.optional("duration", _pause_duration, None)
    return CanaryStep(pause=True, pause_s=duration)


_pause_duration = within(parse_duration, positive("0s"))


def _read_canary(r: Reader) -> Canary:
    steps: list[CanaryStep] = []
    for path, item in r.items("steps"):
        step = _read_canary_step(r, path, item)
        if step is not None:
            steps.append(step)
    if not r.has("steps"):
        r.problems.add(r.at("steps"), "required field is missing")
    elif r.raw("steps") == []:
        r.problems.add(r.at("steps"), "must list at least one step")
    weights = [s.weight for s in steps if s.weight is not None]
    if any(later <= earlier for earlier, later in itertools.pairwise(weights)):
        r.problems.add(r.at("steps"), "must be strictly increasing percentages")
    analysis = None
    a = r.section("analysis")
    if a is not None:
        analysis = CanaryAnalysis(
            min_accuracy=a.optional("minAccuracy", fraction, None),
            max_error_rate_increase=a.optional("maxErrorRateIncrease", fraction, None),
            max_latency_p95_s=a.optional("maxLatencyP95", _pause_duration, None),
            min_requests=a.optional("minRequests", int_in(1, 1_000_000), 20),
            window_s=a.optional(
                "window", within(parse_duration, positive("0s")), CanaryAnalysis().window_s
            ),
        )
    return Canary(steps=tuple(steps), analysis=analysis)


_wave_percent = within(
    parse_percent, lambda v: "must be from 1% to 99%" if not 0 < v < 100 else None
)


def _read_wave(r: Reader, path: str, item: object, seen: dict[str, str]) -> Wave | None:
    """A wave: ``{regions: [eu-west, ...]}``, ``{percent: 25%}`` (that percentage of the
    devices of every region not given the new revision yet) or ``{pause: {}}`` /
    ``{pause: {duration: 10m}}``."""
    w = r.problems.reader(item, path)
    if w is None:
        return None
    has_regions, has_pause, has_percent = w.has("regions"), w.has("pause"), w.has("percent")
    regions = w.list_of("regions", dns_label, unique=True) or []
    p = w.section("pause")
    duration = None if p is None else p.optional("duration", _pause_duration, None)
    percent = w.optional("percent", _wave_percent, None)
    if has_regions + has_pause + has_percent != 1:
        w.problems.add(path, "must have exactly one of regions, percent or pause")
        return None
    if has_percent:
        return None if percent is None else Wave(percent=percent)
    if has_pause:
        return Wave(pause=True, pause_s=duration)
    if w.raw("regions") == []:
        w.problems.add(w.at("regions"), "must list at least one region")
    raw = w.raw("regions")
    for i, region in enumerate(raw if isinstance(raw, list) else []):
        if region not in regions:
            continue  # not a region name: said above
        if region in seen and seen[region] != path:
            w.problems.add(f"{w.at('regions')}[{i}]", f"{region!r} is already in {seen[region]}")
        seen.setdefault(region, path)
    return Wave(regions=tuple(regions)) if regions else None


def _read_waves(r: Reader) -> tuple[Wave, ...]:
    waves: list[Wave] = []
    seen: dict[str, str] = {}
    items = r.items("waves")
    if r.raw("waves") == []:
        r.problems.add(r.at("waves"), "must list at least one wave")
    if len(items) > MAX_WAVES:
        r.problems.add(r.at("waves"), f"at most {MAX_WAVES} waves, got {len(items)}")
        return ()
    for path, item in items:
        wave = _read_wave(r, path, item, seen)
        if wave is not None:
            waves.append(wave)
    if waves and all(w.pause for w in waves):
        r.problems.add(r.at("waves"), "must have at least one wave of regions or a percent")
    percents = [w.percent for w in waves if w.percent is not None]
    if any(later <= earlier for earlier, later in itertools.pairwise(percents)):
        r.problems.add(r.at("waves"), "percent waves must be strictly increasing percentages")
    return tuple(waves)


def read_rollout(r: Reader | None) -> Rollout:
    default = Rollout()
    if r is None:
        return default
    canary = r.section("canary")
    rollout = Rollout(
        max_unavailable=r.optional("maxUnavailable", parse_int_or_percent, default.max_unavailable),
        max_surge=r.optional("maxSurge", parse_int_or_percent, default.max_surge),
        canary=None if canary is None else _read_canary(canary),
        progress_deadline_s=r.optional("progressDeadlineSeconds", int_in(1, 30 * 86400), None),
        waves=_read_waves(r),
    )
    if rollout.max_unavailable.value == 0 and rollout.max_surge.value == 0:
        r.problems.add(r.at("maxUnavailable"), "must not be 0 when maxSurge is 0")
    return rollout
