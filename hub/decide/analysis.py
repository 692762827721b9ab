"""Canary analysis: pure decisions over what devices report per revision, tested as tables.

Devices report, per revision of a workload (:class:`hub.decide.devices.RevisionReport`), the
requests
and errors its workers answered since it started serving there (counters), the latency p95
over the device's recent window, and the accuracy on the artifact's validation set, computed
when the revision started. The rollout controller keeps a short history of the counters per
device (:class:`History`, bounded) so that error rates are over the analysis ``window``:
the newest sample less the newest one at least a window old (or the oldest there is).

:func:`analyze` compares the *canary* (the devices given the new revision, serving it) with
the *stable* revision on the other targeted devices:

* ``minAccuracy``: every canary device must report an accuracy of at least it; one below
  fails at once, a validation set that could not be evaluated (or is missing) fails too;
  until every canary device reported, the check waits;
* ``maxErrorRateIncrease``: the canary's error rate over the window minus the stable
  revision's; with fewer than ``minRequests`` canary requests in the window the check waits;
  with fewer than ``minRequests`` stable requests the stable rate counts as 0 (said so);
* ``maxLatencyP95``: the highest p95 a canary device reports (of devices that answered a
  request in their latency window) against the threshold; waits for ``minRequests``.

Any check failing fails the analysis; any waiting makes it wait; otherwise it passes.

No single device decides the error rate (:mod:`hub.decide.weighing`): each device's counters are
screened (impossible ones leave the device out of the analysis, named in
:attr:`Figures.excluded`), each side's rate weighs every device by its requests but none more
than the heaviest other one, and the error rate check (and a passing latency check) is
decided only where leaving out any one device (the canary's only device excepted: it *is*
the canary) decides it the same; otherwise it waits, naming the device. ``minAccuracy`` and
``maxLatencyP95`` stay worst-device checks: one device below (above) fails the canary, so a
device can make a rollout go back, never go on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from edgefleet.api import CanaryAnalysis
from hub.decide.devices import RevisionReport
from hub.decide.weighing import (
    Counts,
    replicas_bound,
    screen,
    weigh,
    without_each,
    worst_latency_without_each,
)

HISTORY_SAMPLES = 64
"""Samples kept per device and revision; taken at most every ``window / 32`` seconds, so
they cover two windows."""


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    requests: int
    errors: int


class History:
    """Counter samples per key (device, revision), bounded: :data:`HISTORY_SAMPLES` per key,
    keys not seen in a pass forgotten by :meth:`keep`."""

    def __init__(self, per_key: int = HISTORY_SAMPLES) -> None:
        self._samples: dict[Hashable, deque[Sample]] = {}
        self._per_key = per_key

    def record(self, key: Hashable, sample: Sample, spacing: float) -> None:
        """Add ``sample``; while it is within ``spacing`` seconds of the sample before the
        newest, it replaces the newest instead (the newest counters are always there, and
        the samples kept stay about ``spacing`` apart)."""
        got = self._samples.get(key)
        if got is None:
            got = self._samples[key] = deque(maxlen=self._per_key)
        if len(got) >= 2 and sample.at - got[-2].at < spacing:
            got[-1] = sample
        else:
            got.append(sample)

    def samples(self, key: Hashable) -> Sequence[Sample]:
        return tuple(self._samples.get(key, ()))

    def keep(self, keys: Iterable[Hashable]) -> None:
        wanted = set(keys)
        for key in [k for k in self._samples if k not in wanted]:
            del self._samples[key]

    def __len__(self) -> int:
        return len(self._samples)


@dataclass(frozen=True, slots=True)
class Figures:
    """What one side (canary or stable) did over the window."""

    devices: int = 0
    requests: int = 0
    errors: int = 0
    latency_p95_s: float | None = None  # the highest a device reports; None: none measured
    accuracy: float | None = None  # the lowest a device reports
    accuracy_devices: int = 0  # devices that reported an accuracy
    validation_problems: Mapping[str, str] = field(default_factory=dict)  # device -> why
    # each counted device's (or region's) own figures, for the decision no one of them makes
    # alone (empty: figures given whole, decided as they are)
    members: tuple[Counts, ...] = ()
    excluded: Mapping[str, str] = field(default_factory=dict)  # impossible figures: who -> why

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None

    def to_json(self) -> dict[str, Any]:
        return {
            "devices": self.devices,
            "requests": self.requests,
            "errors": self.errors,
            "errorRate": self.error_rate,
            "latencyP95Seconds": self.latency_p95_s,
            "accuracy": self.accuracy,
            "accuracyDevices": self.accuracy_devices,
            "validationProblems": dict(sorted(self.validation_problems.items())),
            "excluded": dict(sorted(self.excluded.items())),
        }


@dataclass(frozen=True, slots=True)
class Observed:
    """One device's revision as the analysis sees it: its report and its counter samples."""

    device: str
    report: RevisionReport
    samples: Sequence[Sample] = ()


def implausible(report: RevisionReport) -> str:
    """Why a report's latency or accuracy cannot be true ("" when they can): what the hub's
    input checks refuse already, checked again where it decides."""
    p95 = report.latency_p95_s
    if p95 is not None and not 0.0 <= p95 <= 1e6:  # also NaN
        return f"latency p95 {p95} s"
    if report.accuracy is not None and not 0.0 <= report.accuracy <= 1.0:
        return f"accuracy {report.accuracy}"
    return ""


def figures(observed: Iterable[Observed], now: float, window: float) -> Figures:
    """The figures of one side over the last ``window`` seconds (pure): a device whose
    figures are impossible is left out (``excluded``), the others' requests and errors are
    weighed (:func:`hub.decide.weighing.weigh`), the highest p95 and the lowest accuracy kept."""
    measured = 0
    p95: float | None = None
    accuracy: float | None = None
    problems: dict[str, str] = {}
    members: list[Counts] = []
    excluded: dict[str, str] = {}
    for o in observed:
        rep = o.report
        counted = screen(o.samples, now, window, replicas_bound(rep.ready_replicas))
        why = counted if isinstance(counted, str) else implausible(rep)
        if why or isinstance(counted, str):
            excluded[o.device] = why
            continue
        latency = rep.latency_p95_s if rep.window_requests > 0 else None
        members.append(Counts(o.device, counted[0], counted[1], latency))
        if latency is not None:
            p95 = latency if p95 is None else max(p95, latency)
        if rep.validation_reason:
            problems[o.device] = rep.validation_reason + (
                f": {rep.validation_message}" if rep.validation_message else ""
            )
        elif rep.accuracy is not None:
            measured += 1
            accuracy = rep.accuracy if accuracy is None else min(accuracy, rep.accuracy)
    requests, errors = weigh(members)
    return Figures(
        len(members), requests, errors, p95, accuracy, measured, problems, tuple(members), excluded
    )


class Verdict(StrEnum):
    PASS = "Pass"
    WAIT = "Wait"  # not enough data yet
    FAIL = "Fail"


@dataclass(frozen=True, slots=True)
class Check:
    name: str  # accuracy | errorRate | latencyP95
    verdict: Verdict
    value: float | None
    threshold: float
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict.value,
            "value": self.value,
            "threshold": self.threshold,
            "message": self.message,
        }


@dataclass(frozen=True, slots=True)
class Analysis:
    verdict: Verdict
    checks: tuple[Check, ...]
    canary: Figures
    stable: Figures
    window_s: float

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.verdict is Verdict.FAIL)

    @property
    def message(self) -> str:
        chosen = self.failed or tuple(c for c in self.checks if c.verdict is Verdict.WAIT)
        return "; ".join(c.message for c in chosen or self.checks) or "no checks"

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "message": self.message,
            "windowSeconds": self.window_s,
            "checks": [c.to_json() for c in self.checks],
            "canary": self.canary.to_json(),
            "stable": self.stable.to_json(),
        }


def _pct(x: float) -> str:
    return f"{x * 100:.2f}%"


def analyze(spec: CanaryAnalysis, canary: Figures, stable: Figures) -> Analysis:
    """The verdict on the canary (see the module doc): pure, no clock."""
    checks = []
    if spec.min_accuracy is not None:
        checks.append(_accuracy(spec.min_accuracy, canary))
    if spec.max_error_rate_increase is not None:
        check = _error_rate(spec.max_error_rate_increase, spec.min_requests, canary, stable)
        checks.append(_alone(check, spec, canary, stable))
    if spec.max_latency_p95_s is not None:
        check = _latency(spec.max_latency_p95_s, spec.min_requests, canary)
        checks.append(
            check if check.verdict is Verdict.FAIL else _alone(check, spec, canary, stable)
        )
    if any(c.verdict is Verdict.FAIL for c in checks):
        verdict = Verdict.FAIL
    elif any(c.verdict is Verdict.WAIT for c in checks):
        verdict = Verdict.WAIT
    else:
        verdict = Verdict.PASS
    return Analysis(verdict, tuple(checks), canary, stable, spec.window_s)


def _without(side: Figures, totals: tuple[int, int], p95: float | None) -> Figures:
    """``side`` with one member left out, as a check reads it (its totals given)."""
    return replace(side, devices=side.devices - 1, requests=totals[0], errors=totals[1],
                   latency_p95_s=p95, members=())  # fmt: skip


CHECK_TEXT = {"errorRate": "error rate", "latencyP95": "latency p95"}


def _check(name: str, spec: CanaryAnalysis, canary: Figures, stable: Figures) -> Check:
    if name == "errorRate":
        assert spec.max_error_rate_increase is not None
        return _error_rate(spec.max_error_rate_increase, spec.min_requests, canary, stable)
    assert spec.max_latency_p95_s is not None
    return _latency(spec.max_latency_p95_s, spec.min_requests, canary)


def _alone(check: Check, spec: CanaryAnalysis, canary: Figures, stable: Figures) -> Check:
    """``check`` as it is where leaving out any one device (or region) of either side gives
    the same verdict; else Wait, naming the first (by name) that alone decides it. The
    canary's only member is never left out: it is the canary."""
    if check.verdict is Verdict.WAIT:
        return check
    leaving: list[tuple[str, Figures, Figures]] = []
    if len(canary.members) > 1:
        totals = without_each(canary.members)
        worst = worst_latency_without_each(canary.members)
        leaving += [(n, _without(canary, t, worst[n]), stable) for n, t in totals.items()]
    if check.name == "errorRate":
        for n, t in without_each(stable.members).items():
            leaving.append((n, canary, _without(stable, t, stable.latency_p95_s)))
    for name, c, s in sorted(leaving, key=lambda x: x[0]):
        other = _check(check.name, spec, c, s)
        if other.verdict is not check.verdict:
            return Check(
                check.name,
                Verdict.WAIT,
                check.value,
                check.threshold,
                f"{CHECK_TEXT[check.name]} inconclusive: {name} alone decides it "
                f"({check.verdict.value} with it, {other.verdict.value} without), so it waits: "
                f"{check.message}",
            )
    return check


def _accuracy(threshold: float, canary: Figures) -> Check:
    if canary.validation_problems:
        device, why = sorted(canary.validation_problems.items())[0]
        return Check(
            "accuracy",
            Verdict.FAIL,
            None,
            threshold,
            f"accuracy: no accuracy on {device} ({why}); minAccuracy {threshold} needs a "
            "validation set in the artifact",
        )
    if canary.accuracy is not None and canary.accuracy < threshold:
        return Check(
            "accuracy",
            Verdict.FAIL,
            canary.accuracy,
            threshold,
            f"accuracy {canary.accuracy:.4f} on the validation set is below minAccuracy "
            f"{threshold}",
        )
    if canary.devices == 0 or canary.accuracy_devices < canary.devices:
        return Check(
            "accuracy",
            Verdict.WAIT,
            canary.accuracy,
            threshold,
            f"accuracy: {canary.accuracy_devices} of {canary.devices} canary devices reported "
            "their validation accuracy",
        )
    assert canary.accuracy is not None
    return Check(
        "accuracy",
        Verdict.PASS,
        canary.accuracy,
        threshold,
        f"accuracy {canary.accuracy:.4f} >= minAccuracy {threshold}",
    )


def _error_rate(threshold: float, min_requests: int, canary: Figures, stable: Figures) -> Check:
    rate = canary.error_rate
    if rate is None or canary.requests < min_requests:
        return Check(
            "errorRate",
            Verdict.WAIT,
            rate,
            threshold,
            f"error rate: {canary.requests} canary requests in the window, waiting for "
            f"{min_requests}",
        )
    base = stable.error_rate if stable.requests >= min_requests else None
    increase = rate - (base or 0.0)
    against = (
        f"stable {_pct(base)} ({stable.errors}/{stable.requests})"
        if base is not None
        else f"stable not measured ({stable.requests} requests), counted as 0%"
    )
    figures = (
        f"error rate {_pct(rate)} ({canary.errors}/{canary.requests}) vs {against}: "
        f"+{_pct(increase) if increase >= 0 else _pct(0.0)}"
    )
    if increase > threshold:
        return Check(
            "errorRate",
            Verdict.FAIL,
            increase,
            threshold,
            f"{figures}, above maxErrorRateIncrease {_pct(threshold)}",
        )
    return Check(
        "errorRate",
        Verdict.PASS,
        increase,
        threshold,
        f"{figures}, within maxErrorRateIncrease {_pct(threshold)}",
    )


def _latency(threshold: float, min_requests: int, canary: Figures) -> Check:
    p95 = canary.latency_p95_s
    if p95 is None or canary.requests < min_requests:
        return Check(
            "latencyP95",
            Verdict.WAIT,
            p95,
            threshold,
            f"latency p95: {canary.requests} canary requests in the window, waiting for "
            f"{min_requests}",
        )
    text = f"latency p95 {p95 * 1000:.1f} ms"
    limit = f"maxLatencyP95 {threshold * 1000:.1f} ms"
    if p95 > threshold:
        return Check("latencyP95", Verdict.FAIL, p95, threshold, f"{text} above {limit}")
    return Check("latencyP95", Verdict.PASS, p95, threshold, f"{text} within {limit}")


# -- the analysis over time (kept in the store: hub.controllers.rollout, storekeys.ANALYSIS)
# ---------------
TIMELINE_SAMPLES = 240
"""Samples kept per deployment (all its revisions together), oldest dropped first."""


def timeline_period(window_s: float) -> float:
    """Seconds between two samples of a rollout's analysis kept over time: a tenth of the
    window, from 1 s to 30 s (240 samples cover at least 4 minutes, at most 2 hours)."""
    return min(30.0, max(1.0, window_s / 10))


@dataclass(frozen=True, slots=True)
class TimelineSample:
    """The analysis of one pass, as plotted over time: each side's figures and each check's
    threshold and verdict. ``limits`` are what the canary's figure is held to at that moment:
    ``accuracy`` (minAccuracy), ``latencyP95Seconds`` (maxLatencyP95) and ``errorRate`` (the
    stable revision's rate, or 0 when it has too few requests, plus maxErrorRateIncrease)."""

    at: float
    revision: int
    stable_revision: int
    step: int
    verdict: str
    canary: Mapping[str, float | None]
    stable: Mapping[str, float | None]
    limits: Mapping[str, float]
    verdicts: Mapping[str, str]  # check name -> Pass | Wait | Fail

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "revision": self.revision,
            "stableRevision": self.stable_revision,
            "step": self.step,
            "verdict": self.verdict,
            "canary": dict(self.canary),
            "stable": dict(self.stable),
            "limits": dict(self.limits),
            "verdicts": dict(self.verdicts),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TimelineSample:
        return cls(
            at=float(doc["at"]),
            revision=int(doc["revision"]),
            stable_revision=int(doc.get("stableRevision", 0)),
            step=int(doc.get("step", 0)),
            verdict=str(doc.get("verdict", "")),
            canary=dict(doc.get("canary", {})),
            stable=dict(doc.get("stable", {})),
            limits={str(k): float(v) for k, v in doc.get("limits", {}).items()},
            verdicts={str(k): str(v) for k, v in doc.get("verdicts", {}).items()},
        )


TIMELINE_FIGURES = ("errorRate", "latencyP95Seconds", "accuracy", "requests", "devices")
CHECK_FIGURE = {"errorRate": "errorRate", "latencyP95": "latencyP95Seconds", "accuracy": "accuracy"}


def _side(f: Figures) -> dict[str, float | None]:
    doc = f.to_json()
    return {k: doc[k] for k in TIMELINE_FIGURES}


def timeline_sample(
    spec: CanaryAnalysis,
    analysis: Analysis,
    *,
    at: float,
    revision: int,
    stable_revision: int,
    step: int,
) -> TimelineSample:
    """The sample of ``analysis`` to keep over time (pure)."""
    limits: dict[str, float] = {}
    if spec.min_accuracy is not None:
        limits["accuracy"] = spec.min_accuracy
    if spec.max_latency_p95_s is not None:
        limits["latencyP95Seconds"] = spec.max_latency_p95_s
    if spec.max_error_rate_increase is not None:
        stable = analysis.stable
        base = stable.error_rate if stable.requests >= spec.min_requests else None
        limits["errorRate"] = (base or 0.0) + spec.max_error_rate_increase
    return TimelineSample(
        at=at,
        revision=revision,
        stable_revision=stable_revision,
        step=step,
        verdict=analysis.verdict.value,
        canary=_side(analysis.canary),
        stable=_side(analysis.stable),
        limits=limits,
        verdicts={CHECK_FIGURE[c.name]: c.verdict.value for c in analysis.checks},
    )


def timeline_due(last: TimelineSample | None, sample: TimelineSample, period: float) -> bool:
    """Whether ``sample`` is kept: the first of its revision, a verdict that changed (a
    failure is always kept, it ends the rollout), or ``period`` seconds after the last one."""
    if last is None or last.revision != sample.revision:
        return True
    if last.verdict != sample.verdict or last.verdicts != sample.verdicts:
        return True
    return sample.at - last.at >= period
