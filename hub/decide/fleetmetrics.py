"""The fleet's state as Prometheus series (pure, tested as tables): per deployment, per device,
and what a root knows of its regions, read from what the hub holds (its store, through the
cache) when ``/metrics`` is scraped, never counted, so that a restarted hub shows the same
(docs/observability.md, "Fleet state").

Each function returns ``{family name: {label values: value}}``;
:class:`hub.state.metrics.HubMetrics` puts them into its gauges (``Gauge.replace``) on every
scrape. Phases and verdicts are state sets, as kube-state-metrics writes them: one series per
possible value, 1 for the one that holds and 0 for the others, so that an alert matches
``{phase="RolledBack"} == 1``.

Label values come from names operators chose (deployments, regions) or devices said (their
names were checked at enrollment, their edged version is bounded by the hub's input checks);
how many series there are is bounded here: :data:`MAX_DEPLOYMENTS`, :data:`MAX_DEVICES`,
:data:`MAX_REGION_DEPLOYMENTS`, the rest counted in ``*_series_omitted``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgefleet.api import ModelDeployment
from hub.decide.analysis import CHECK_FIGURE, TIMELINE_FIGURES, TimelineSample, Verdict
from hub.decide.devices import Device, DevicePhase, TrustState
from hub.decide.revisions import Revision, RolloutPhase, RolloutState, template_hash
from hub.decide.rollout import canary_weight
from hub.decide.status import SWITCHING, DeploymentStatus, revisions_of, wanted_revision

MAX_DEPLOYMENTS = 512
"""Deployments exported one by one (the first by name); the others are counted in
``hub_deployment_series_omitted`` and left out (about 40 series each)."""
MAX_DEVICES = 2000
"""Devices exported one by one (the first by name, 6 series each); the others are counted in
``hub_device_series_omitted``. Fleet-wide gauges (``hub_devices``...) count every device, so
alerts over the fleet use those."""
MAX_REGION_DEPLOYMENTS = 4096
"""(region, deployment) pairs a root exports (regions by name, then deployments by name); the
others are counted in ``hub_region_deployment_series_omitted``."""

Series = dict[tuple[str, ...], float]
Families = dict[str, Series]

DEPLOYMENT_DEVICES = ("desired", "updated", "ready", "available")
PHASES = tuple(p.value for p in RolloutPhase)
VERDICTS = tuple(v.value for v in Verdict)
CHECKS = tuple(sorted(set(CHECK_FIGURE.values())))
SIDES = ("canary", "stable")
MAX_REASON_CHARS = 64


def reason_label(reason: object) -> str:
    """A rollout's reason as a label value: the words the hub writes (``RevisionFailed``,
    ``AnalysisFailed``, ``Aborted``...); anything else (a region's report says what it
    likes) is ``Other``, so the values stay a small set."""
    text = str(reason or "")
    if not text:
        return "None"
    return text if text.isascii() and text.isalpha() and len(text) <= MAX_REASON_CHARS else "Other"


@dataclass(frozen=True, slots=True)
class ReplicaCounts:
    """A deployment's replicas over the devices it is placed on (see :func:`replica_counts`)."""

    desired: int = 0
    updated: int = 0
    ready: int = 0
    available: int = 0


def replica_counts(
    dep: ModelDeployment,
    devices: Iterable[Device],
    *,
    model_sha256: str | None = None,
    assigned_models: Mapping[str, tuple[str, str | None]] | None = None,
    total: int | None = None,
) -> ReplicaCounts:
    """Replicas of ``dep`` over ``devices`` (those it is placed on), in the terms of
    :func:`hub.decide.status.deployment_status`'s device counts:

    * *desired*: what the spec asks: ``perDevice`` on each device, or ``total`` (the fleet
      autoscaler's when it scaled it: ``total``);
    * *updated*: ready replicas of the deployment's own version where it serves;
    * *ready*: ready replicas of every revision that serves (old and new, as during a switch);
    * *available*: ready replicas on connected devices of the revision each is sent, or, while
      it switches to it, of the one that serves meanwhile.
    """
    name, want = dep.metadata.name, dep.spec.model.version
    per_device = dep.spec.replicas.per_device
    placed = updated = ready = available = 0
    for device in devices:
        placed += 1
        report = device.workloads.get(name)
        if report is None:
            continue
        revisions = revisions_of(report)
        ready += sum(r.ready_replicas for r in revisions if r.serves)
        current = wanted_revision(revisions, want, model_sha256)
        if current is not None and current.serves:
            updated += current.ready_replicas
        if device.phase is not DevicePhase.READY:
            continue
        version, sha = (assigned_models or {}).get(device.name, (want, model_sha256))
        rev = wanted_revision(revisions, version, sha)
        if rev is not None and rev.serves:
            available += rev.ready_replicas
        elif rev is None or rev.phase in SWITCHING:
            available += max((r.ready_replicas for r in revisions if r.serves), default=0)
    if per_device is not None:
        desired = per_device * placed
    else:
        desired = total if total is not None else (dep.spec.replicas.total or 0)
    return ReplicaCounts(desired, updated, ready, available)


def generations(
    manifest: Mapping[str, Any], revisions: Mapping[int, Revision], state: RolloutState | None
) -> tuple[int, int]:
    """(generation, observed generation), as Kubernetes means them: the revision the applied
    spec makes (the current one when its template is the one applied, else the next one the
    rollout controller will make) and the revision the rollout controller acts on (0: none
    yet). They differ only until the controller has taken a change."""
    observed = state.revision if state is not None else 0
    current = revisions.get(observed)
    if current is not None and current.template == template_hash(manifest):
        return observed, observed
    return max((*revisions, observed), default=0) + 1, observed


def deployment_series(
    dep: ModelDeployment,
    manifest: Mapping[str, Any],
    status: DeploymentStatus,
    replicas: ReplicaCounts,
    state: RolloutState | None,
    revisions: Mapping[int, Revision],
    analysis: TimelineSample | None,
) -> Families:
    """Every series of one deployment (label ``deployment`` first)."""
    name = dep.metadata.name
    key = (name,)
    out: Families = {}

    def put(family: str, value: float, *labels: str) -> None:
        out.setdefault(family, {})[(name, *labels)] = float(value)

    devices = (status.desired, status.updated, status.ready, status.available)
    for word, count in zip(DEPLOYMENT_DEVICES, devices, strict=True):
        put(f"hub_deployment_devices_{word}", count)
    for word, count in zip(
        DEPLOYMENT_DEVICES,
        (replicas.desired, replicas.updated, replicas.ready, replicas.available),
        strict=True,
    ):
        put(f"hub_deployment_replicas_{word}", count)
    generation, observed = generations(manifest, revisions, state)
    put("hub_deployment_generation", generation)
    put("hub_deployment_observed_generation", observed)
    for phase in PHASES:
        put("hub_deployment_rollout_phase", int(state is not None and state.phase == phase), phase)
    if state is not None:
        put("hub_deployment_rollout_reason", 1, reason_label(state.reason))
        put("hub_deployment_rollout_stable_revision", state.stable)
        put("hub_deployment_rollout_steps_taken", state.steps)
        if state.changed_at:
            put("hub_deployment_rollout_changed_timestamp_seconds", state.changed_at)
        canary = dep.spec.rollout.canary
        if canary is not None:
            put("hub_deployment_rollout_canary_step", min(state.step + 1, len(canary.steps)))
            put("hub_deployment_rollout_canary_weight_percent", canary_weight(canary, state.step))
    if analysis is not None:
        out.update(_analysis(key, analysis))
    return out


def _analysis(key: tuple[str, ...], sample: TimelineSample) -> Families:
    out: Families = {
        "hub_deployment_analysis_timestamp_seconds": {key: sample.at},
        "hub_deployment_analysis_revision": {key: float(sample.revision)},
        "hub_deployment_analysis_verdict": {
            (*key, v): float(sample.verdict == v) for v in VERDICTS
        },
    }
    figures: Series = {}
    for side, values in zip(SIDES, (sample.canary, sample.stable), strict=True):
        for figure in TIMELINE_FIGURES:
            value = values.get(figure)
            if isinstance(value, int | float) and not isinstance(value, bool):
                figures[(*key, side, figure)] = float(value)
    out["hub_deployment_analysis_figure"] = figures
    out["hub_deployment_analysis_limit"] = {
        (*key, figure): float(limit)
        for figure, limit in sample.limits.items()
        if figure in CHECKS  # read back from the store: only the figures checks hold
    }
    checks: Series = {}
    for check in CHECKS:
        verdict = sample.verdicts.get(check)
        if verdict is not None:
            for v in VERDICTS:
                checks[(*key, check, v)] = float(verdict == v)
    out["hub_deployment_analysis_check"] = checks
    return out


def device_series(
    devices: Sequence[Device], now: float, last_seen: Mapping[str, float] | None = None
) -> tuple[Families, int]:
    """Per device (the first :data:`MAX_DEVICES` by name): whether it is Ready, its
    attestation (a state set), its edged version (an info gauge, ``unknown`` when it never
    said) and how long since the hub last heard from it (``last_seen``: this hub's own record
    of each device's last message, newer than the stored one); and how many were left out."""
    chosen = sorted(devices, key=lambda d: d.name)
    omitted = max(0, len(chosen) - MAX_DEVICES)
    out: Families = {
        "hub_device_ready": {},
        "hub_device_attestation": {},
        "hub_device_agent_info": {},
        "hub_device_last_report_age_seconds": {},
    }
    for d in chosen[:MAX_DEVICES]:
        out["hub_device_ready"][(d.name,)] = float(d.phase is DevicePhase.READY)
        for trust in TrustState:
            out["hub_device_attestation"][(d.name, trust.value)] = float(
                d.attestation.state is trust
            )
        out["hub_device_agent_info"][(d.name, d.agent_version or "unknown")] = 1.0
        heard = max(
            (t for t in (d.last_heartbeat, (last_seen or {}).get(d.name)) if t is not None),
            default=None,
        )
        if heard is not None:
            out["hub_device_last_report_age_seconds"][(d.name,)] = round(max(0.0, now - heard), 3)
    return out, omitted


@dataclass(frozen=True, slots=True)
class RegionView:
    """What a root knows of one region now (from :class:`hub.state.regions.Regions`): its
    connection, its last report's age (None: none yet), its devices by phase and each
    deployment's figures as it reported them (``region_deployment_json``'s shape)."""

    name: str
    connected: bool
    report_age_s: float | None = None
    devices_by_phase: Mapping[str, int] | None = None
    deployments: Mapping[str, Mapping[str, Any]] | None = None


REGION_DEPLOYMENT_FIGURES = {
    "desired": "desiredDevices",
    "updated": "updatedDevices",
    "ready": "readyDevices",
    "available": "availableDevices",
}


def region_series(regions: Iterable[RegionView]) -> tuple[Families, int]:
    """Per region: connected, its report's age, its devices by phase; per region and
    deployment (at most :data:`MAX_REGION_DEPLOYMENTS` pairs) the devices its report counts
    and its rollout's phase (a state set; a phase this hub does not know is not exported);
    and how many pairs were left out."""
    out: Families = {
        "hub_region_connected": {},
        "hub_region_report_age_seconds": {},
        "hub_region_devices": {},
        **{f"hub_region_deployment_devices_{w}": {} for w in DEPLOYMENT_DEVICES},
        "hub_region_deployment_rollout_phase": {},
        "hub_region_deployment_rollout_reason": {},
    }
    pairs = omitted = 0
    for region in sorted(regions, key=lambda r: r.name):
        key = (region.name,)
        out["hub_region_connected"][key] = float(region.connected)
        if region.report_age_s is not None:
            out["hub_region_report_age_seconds"][key] = float(region.report_age_s)
        if region.devices_by_phase is not None:
            for phase in DevicePhase:
                count = region.devices_by_phase.get(phase.value, 0)
                out["hub_region_devices"][(*key, phase.value)] = float(count)
        for name, figures in sorted((region.deployments or {}).items()):
            if pairs >= MAX_REGION_DEPLOYMENTS:
                omitted += 1
                continue
            pairs += 1
            for word, field in REGION_DEPLOYMENT_FIGURES.items():
                value = figures.get(field)
                if isinstance(value, int | float):
                    out[f"hub_region_deployment_devices_{word}"][(*key, name)] = float(value)
            rollout = figures.get("rollout") or {}
            shown = rollout.get("phase")
            if shown in PHASES:
                for p in PHASES:
                    out["hub_region_deployment_rollout_phase"][(*key, name, p)] = float(shown == p)
                reason = reason_label(rollout.get("reason"))
                out["hub_region_deployment_rollout_reason"][(*key, name, reason)] = 1.0
    return out, omitted
