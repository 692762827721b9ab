"""Every metric of the hub, in one registry (:mod:`edgefleet.metrics`): :class:`HubMetrics`.

Here in state, below the controllers and the API, so that whoever counts (the device writer's
events, the projector's placements, a controller) needs no upper wing. Served by
:mod:`hub.api.observability` (``/metrics``); the table is in ``docs/observability.md``.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from edgefleet.metrics import Gauge, Registry
from hub.decide import fleetmetrics, modelconfigs
from hub.decide.devices import Device, DevicePhase
from hub.decide.fleetmetrics import Families, RegionView
from hub.decide.revisions import with_config
from hub.decide.status import deployment_status
from hub.state.cache import Cache
from hub.state.regionmapping import region_deployment_json
from hub.state.sessions import Sessions

if TYPE_CHECKING:
    from hub.state.regions import Regions

MAX_AGENT_VERSION_SERIES = 32
SYNC_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)
STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
ROLLOUT_STEP_REASONS = frozenset(
    {"RevisionCreated", "RolloutStarted", "DevicesUpdated", "RolloutComplete", "RolledBack",
     "Paused", "Resumed", "Retried", "CanaryPaused", "CanaryStepPassed"}
)  # fmt: skip
"""Reasons of the ModelDeployment events that record a rollout's step (:mod:`hub.decide.rollout`,
:mod:`hub.controllers.rollout`)."""
AGENT_UPGRADE_STEP_REASONS = frozenset(
    {"RolloutStarted", "DevicesUpdated", "CanaryStepPassed", "RolloutComplete", "RolledBack",
     "DeviceFailed", "DevicesRolledBack", "Paused", "Resumed", "RolloutUndo"}
)  # fmt: skip
"""Reasons of the AgentUpgrade events that record its rollout's steps
(:mod:`hub.decide.agentupgrade`, :mod:`hub.controllers.agentupgrade`)."""
MAX_AGENT_UPGRADE_SERIES = 64
FLEET_MIN_INTERVAL_S = 10.0
"""The deployments' series served on /metrics are computed again at most this often..."""
FLEET_COST_FACTOR = 10.0
"""... and at most once per this many times what their last computation took."""

_D, _R = ("deployment",), ("region", "deployment")
FLEET_FAMILIES: dict[str, tuple[tuple[str, ...], str]] = {
    **{
        f"hub_deployment_devices_{w}": (_D, f"Devices of the deployment: {why}")
        for w, why in (
            ("desired", "placed on (desiredDevices)"),
            ("updated", "where its own version serves (updatedDevices)"),
            ("ready", "updated, every replica ready (readyDevices)"),
            ("available", "connected, serving what they are sent (availableDevices)"),
        )
    },
    **{
        f"hub_deployment_replicas_{w}": (_D, f"Replicas of the deployment: {why}")
        for w, why in (
            ("desired", "what the spec asks (perDevice on each device placed, or total)"),
            ("updated", "ready replicas of its own version"),
            ("ready", "ready replicas of every revision that serves"),
            ("available", "ready replicas on connected devices of what they are sent"),
        )
    },
    "hub_deployment_generation": (
        _D, "The revision the applied spec makes (ahead of the observed one until the rollout "
        "controller takes it)"),
    "hub_deployment_observed_generation": (
        _D, "The revision the rollout controller acts on (0: none yet)"),
    "hub_deployment_rollout_phase": (
        ("deployment", "phase"), "The rollout's phase, one series per phase (1: the one it is in; "
        "all 0: no rollout yet)"),
    "hub_deployment_rollout_reason": (
        ("deployment", "reason"), "Why the rollout is in its phase (RevisionFailed, "
        "AnalysisFailed, ProgressDeadlineExceeded, Aborted...; Other: a word the hub does not "
        "write); always 1"),
    "hub_deployment_rollout_stable_revision": (
        _D, "The revision the devices not updated keep, and go back to on a rollback"),
    "hub_deployment_rollout_steps_taken": (
        _D, "How many times the current rollout assigned devices the new revision"),
    "hub_deployment_rollout_changed_timestamp_seconds": (
        _D, "When the rollout's phase or step last changed (Unix seconds)"),
    "hub_deployment_rollout_canary_step": (
        _D, "The canary's current step, from 1 (as status.rollout.canary.step)"),
    "hub_deployment_rollout_canary_weight_percent": (
        _D, "The share of the targeted devices the canary's current step gives the new revision"),
    "hub_deployment_analysis_timestamp_seconds": (
        _D, "When the last canary analysis kept was taken (Unix seconds)"),
    "hub_deployment_analysis_revision": (_D, "The revision the last canary analysis judged"),
    "hub_deployment_analysis_verdict": (
        ("deployment", "verdict"), "The last canary analysis' verdict, one series per verdict "
        "(Pass, Wait, Fail)"),
    "hub_deployment_analysis_figure": (
        ("deployment", "side", "figure"), "The last canary analysis' figures of the canary and "
        "the stable side (errorRate, latencyP95Seconds, accuracy, requests, devices)"),
    "hub_deployment_analysis_limit": (
        ("deployment", "figure"), "What the last canary analysis held the canary's figure to"),
    "hub_deployment_analysis_check": (
        ("deployment", "check", "verdict"), "Each check of the last canary analysis, one series "
        "per verdict"),
    "hub_deployment_series_omitted": (
        (), f"Deployments not exported one by one (past the first {fleetmetrics.MAX_DEPLOYMENTS}"
        " by name)"),
    "hub_device_ready": (("device",), "1 while the device is Ready (heartbeats arrive)"),
    "hub_device_attestation": (
        ("device", "state"), "The device's attestation, one series per state (Unknown, Trusted, "
        "Untrusted)"),
    "hub_device_agent_info": (
        ("device", "version"), "The edged version the device last stated (unknown: never "
        "connected); always 1"),
    "hub_device_last_report_age_seconds": (
        ("device",), "Seconds since the hub last heard from the device"),
    "hub_device_series_omitted": (
        (), f"Devices not exported one by one (past the first {fleetmetrics.MAX_DEVICES} by "
        "name)"),
    "hub_region_connected": (("region",), "1 while the region's hub streams to this root"),
    "hub_region_report_age_seconds": (("region",), "Seconds since the region's last report"),
    "hub_region_devices": (
        ("region", "phase"), "The region's devices by phase, as its last report says"),
    **{
        f"hub_region_deployment_devices_{w}": (
            _R, f"The region's {w} devices of the deployment, as its last report says")
        for w in fleetmetrics.DEPLOYMENT_DEVICES
    },
    "hub_region_deployment_rollout_phase": (
        ("region", "deployment", "phase"), "The region's rollout phase of the deployment, one "
        "series per phase"),
    "hub_region_deployment_rollout_reason": (
        ("region", "deployment", "reason"), "Why the region's rollout of the deployment is in "
        "its phase, as its report says (Other: not a single word); always 1"),
    "hub_region_deployment_series_omitted": (
        (), f"(region, deployment) pairs not exported (past the first "
        f"{fleetmetrics.MAX_REGION_DEPLOYMENTS})"),
}  # fmt: skip
"""The fleet's state (:mod:`hub.decide.fleetmetrics`): label names and help of each gauge."""


class HubMetrics:
    """The hub's metrics. ``watch(cache, sessions)`` adds those read from the hub's state."""

    def __init__(self) -> None:
        r = self.registry = Registry()
        self.devices = r.gauge("hub_devices", "Enrolled devices by phase", ("phase",))
        self.devices_cordoned = r.gauge("hub_devices_cordoned", "Cordoned devices")
        self.devices_revoked = r.gauge("hub_devices_revoked", "Revoked devices")
        self.devices_out_of_sync = r.gauge(
            "hub_devices_out_of_sync",
            "Devices that have not acknowledged their newest desired state",
        )
        self.devices_by_agent = r.gauge(
            "hub_devices_by_agent_version",
            "Enrolled devices by the edged version they last stated (refused: outside the "
            "hub's version window; unknown: never connected; other: past the "
            f"{MAX_AGENT_VERSION_SERIES} most common)",
            ("agent_version",),
        )
        self._cache: Cache | None = None
        self.regions: Regions | None = None  # a root's regions (hub.wiring sets them)
        self.last_seen: Mapping[str, float] | None = None  # the device servicer's (hub.server)
        self.clock: Callable[[], float] = time.time
        # the deployments' series as /metrics last computed them (render_served)
        self._computing = asyncio.Lock()
        self._deployments: Families | None = None
        self._deployments_at = 0.0  # time.monotonic()
        self._deployments_cost = 0.0  # seconds of computing, yields left out
        self.min_interval_s, self.cost_factor = FLEET_MIN_INTERVAL_S, FLEET_COST_FACTOR
        self.streams = r.gauge("hub_device_streams", "Open device Sync streams")
        self.objects = r.gauge("hub_objects", "Applied objects by kind", ("kind",))
        self.requests = r.counter(
            "hub_grpc_requests_total",
            "gRPC calls by method and status code (streams: when they end)",
            ("method", "code"),
        )
        self.request_seconds = r.histogram(
            "hub_grpc_request_duration_seconds",
            "Duration of unary and client-streaming gRPC calls",
            ("method",),
        )
        self.enrollments = r.counter(
            "hub_enrollments_total",
            "Enrollment attempts by outcome (OK, or the status code of the refusal)",
            ("code",),
        )
        self.sync_seconds = r.histogram(
            "hub_sync_latency_seconds",
            "From sending a device a desired state to its acknowledgement (verified and "
            "persisted on the device, downloads included)",
            buckets=SYNC_BUCKETS,
        )
        self.events = r.counter(
            "hub_events_total", "Events recorded, by object kind, type and reason",
            ("kind", "type", "reason"),
        )  # fmt: skip
        self.rollout_steps = r.counter(
            "hub_rollout_steps_total",
            "Rollout steps taken, by the event that records them (RevisionCreated, "
            "RolloutStarted, DevicesUpdated, RolloutComplete, RolledBack, an operator's action)",
            ("reason",),
        )
        self.agent_upgrade_steps = r.counter(
            "hub_agent_upgrade_steps_total",
            "AgentUpgrade rollout steps taken, by the event that records them (RolloutStarted, "
            "DevicesUpdated, CanaryStepPassed, DeviceFailed, RolledBack, RolloutComplete...)",
            ("reason",),
        )
        self.agent_upgrade_devices = r.gauge(
            "hub_agent_upgrade_devices",
            "Devices of each AgentUpgrade's current revision: sent the release (sent), failed "
            "(failed), sent back to their previous release after a rollback (rolledBack); at "
            f"most {MAX_AGENT_UPGRADE_SERIES} upgrades",
            ("upgrade", "state"),
        )
        self.placements = r.gauge(
            "hub_placements", "Deployments placed on devices (one per device and deployment)"
        )
        self.placement_changes = r.counter(
            "hub_placement_changes_total",
            "Deployments placed on a device (placed) or taken off one (removed)",
            ("change",),
        )
        self.store_operations = r.counter(
            "hub_store_operations_total", "Store operations by result", ("operation", "result")
        )
        self.store_seconds = r.histogram(
            "hub_store_operation_duration_seconds",
            "Duration of store operations",
            ("operation",),
            buckets=STORE_BUCKETS,
        )
        # the fleet's state, read when scraped (fleet_series)
        self.fleet: dict[str, Gauge] = {
            name: r.gauge(name, help, labels) for name, (labels, help) in FLEET_FAMILIES.items()
        }

    def count_event(self, event: Mapping[str, Any]) -> None:
        """An event was recorded (:class:`hub.state.writer.DeviceWriter` calls this)."""
        kind, reason = str(event["object"]["kind"]), str(event["reason"])
        self.events.labels(kind=kind, type=event["type"], reason=reason).inc()
        if kind == "ModelDeployment" and reason in ROLLOUT_STEP_REASONS:
            self.rollout_steps.labels(reason=reason).inc()
        elif kind == "AgentUpgrade" and reason in AGENT_UPGRADE_STEP_REASONS:
            self.agent_upgrade_steps.labels(reason=reason).inc()

    def count_placements(self, placed: int, removed: int) -> None:
        """The projector wrote desired states (:class:`hub.state.projector.Projector` calls
        this)."""
        if placed:
            self.placement_changes.labels(change="placed").inc(placed)
        if removed:
            self.placement_changes.labels(change="removed").inc(removed)

    def watch(self, cache: Cache, sessions: Sessions) -> None:
        self._cache = cache

        def in_phase(phase: DevicePhase) -> Callable[[], float]:
            return lambda: sum(1 for d in cache.devices.values() if d.phase is phase)

        for phase in DevicePhase:
            self.devices.labels(phase=phase.value).set_function(in_phase(phase))
        self.devices_cordoned.set_function(
            lambda: sum(1 for d in cache.devices.values() if d.cordoned)
        )
        self.devices_revoked.set_function(
            lambda: sum(1 for d in cache.devices.values() if d.revoked)
        )

        def out_of_sync() -> float:
            return sum(
                1
                for name, desired in cache.desired.items()
                if (d := cache.devices.get(name)) is not None
                and d.generation_acked < desired.generation
            )

        self.devices_out_of_sync.set_function(out_of_sync)
        self.streams.set_function(lambda: len(sessions))
        self.placements.set_function(
            lambda: sum(len(r.deployments) for r in cache.desired.values())
        )

        def of_kind(kind: str) -> Callable[[], float]:
            return lambda: len(list(cache.objects_of(kind)))

        for kind in ("ModelDeployment", "DeviceHealthPolicy", "SecurityBaseline", "AgentUpgrade"):
            self.objects.labels(kind=kind).set_function(of_kind(kind))

    def render(self, *, deployments: Families | None = None) -> str:
        """The exposition, everything read now (``deployments``: the deployments' series as
        :meth:`render_served` computed them)."""
        if self._cache is not None:
            self.devices_by_agent.replace(agent_versions(self._cache.devices.values()))
            self.agent_upgrade_devices.replace(agent_upgrade_series(self._cache))
            self._fleet(self._cache, deployments)
        return self.registry.render()

    async def render_served(self) -> str:
        """The exposition as ``/metrics`` serves it: as :meth:`render`, but the deployments'
        series (what costs, in proportion to the placements) are computed yielding to the
        event loop between deployments, by one scrape at a time, and again only once the
        last computation is :data:`FLEET_MIN_INTERVAL_S` old, or :data:`FLEET_COST_FACTOR`
        times what it took if that is longer (so they never take more than a tenth of the
        hub's core); devices and regions are read at every scrape."""
        if self._cache is None:
            return self.render()
        cache = self._cache
        async with self._computing:
            age = time.monotonic() - self._deployments_at
            due = max(self.min_interval_s, self.cost_factor * self._deployments_cost)
            if self._deployments is None or age >= due:
                computed: Families = {}
                cost = 0.0
                families = deployment_families(cache)
                while True:
                    started = time.perf_counter()
                    got = next(families, None)
                    cost += time.perf_counter() - started
                    if got is None:
                        break
                    merge(computed, got)
                    await asyncio.sleep(0)
                self._deployments, self._deployments_cost = computed, cost
                self._deployments_at = time.monotonic()
        return self.render(deployments=self._deployments)

    def _fleet(self, cache: Cache, deployments: Families | None) -> None:
        """The fleet's state now, from the cache (the store's) and the regions."""
        families = fleet_series(cache, self.regions, self.last_seen, self.clock(), deployments)
        for name, gauge in self.fleet.items():
            series = families.get(name, {})
            if gauge.labelnames:
                gauge.replace(series)
            else:
                gauge.set(series.get((), 0.0))


def agent_versions(devices: Iterable[Device]) -> dict[tuple[str, ...], float]:
    """Devices per edged version (:attr:`HubMetrics.devices_by_agent`), at most
    :data:`MAX_AGENT_VERSION_SERIES` series and ``other``: a version is what a device says,
    so the series are bounded here, not by the devices."""
    counts = Counter(
        "refused" if d.agent_refused else (d.agent_version or "unknown") for d in devices
    )
    common = counts.most_common(MAX_AGENT_VERSION_SERIES)
    series: dict[tuple[str, ...], float] = {(version,): n for version, n in common}
    rest = sum(counts.values()) - sum(n for _, n in common)
    if rest:
        series[("other",)] = series.get(("other",), 0) + rest
    return series


def agent_upgrade_series(cache: Cache) -> dict[tuple[str, ...], float]:
    """:attr:`HubMetrics.agent_upgrade_devices`: per upgrade (the first
    :data:`MAX_AGENT_UPGRADE_SERIES` by name), its current revision's devices sent, failed and
    sent back."""
    series: dict[tuple[str, ...], float] = {}
    for name in sorted(cache.agent_upgrades)[:MAX_AGENT_UPGRADE_SERIES]:
        state = cache.agent_upgrades[name]
        sent = sum(1 for s in state.sent.values() if s.revision == state.revision)
        series[(name, "sent")] = sent
        series[(name, "failed")] = len(state.failed)
        series[(name, "rolledBack")] = len(state.rollback)
    return series


def fleet_series(
    cache: Cache,
    regions: Regions | None,
    last_seen: Mapping[str, float] | None,
    now: float,
    deployments: Families | None = None,
) -> Families:
    """Every series of :data:`FLEET_FAMILIES` (:mod:`hub.decide.fleetmetrics`), from the cache:
    the deployments' (``deployments``, else :func:`deployment_families` now), the devices, and
    a root's regions as they last reported."""
    out: Families = {}
    if deployments is None:
        deployments = {}
        for families in deployment_families(cache):
            merge(deployments, families)
    merge(out, deployments)
    devices_families, omitted = fleetmetrics.device_series(
        list(cache.devices.values()), now, last_seen
    )
    merge(out, devices_families)
    out["hub_device_series_omitted"] = {(): float(omitted)}
    if regions is not None:
        region_families, omitted = fleetmetrics.region_series(region_views(regions))
        merge(out, region_families)
        out["hub_region_deployment_series_omitted"] = {(): float(omitted)}
    return out


def merge(into: Families, families: Families) -> None:
    for name, series in families.items():
        into.setdefault(name, {}).update(series)


def deployment_families(cache: Cache) -> Iterator[Families]:
    """Each deployment's series in turn (the first :data:`fleetmetrics.MAX_DEPLOYMENTS` by
    name), then how many were left out: its status over the devices it is placed on (those
    only: the cost is what the placements count, not deployments times devices), its rollout
    and its last canary analysis as stored. A caller may yield to the event loop between two;
    a deployment deleted meanwhile is skipped."""
    names = sorted(cache.deployments)
    for name in names[: fleetmetrics.MAX_DEPLOYMENTS]:
        dep = cache.deployments.get(name)
        stored = cache.stored.get(("ModelDeployment", name))
        if dep is None or stored is None:
            continue
        model = cache.models.get((dep.spec.model.name, dep.spec.model.version))
        sha = model.sha256 if model is not None else None
        devices = [d for n in sorted(cache.desired.holding(name)) if (d := cache.devices.get(n))]
        assigned_models: dict[str, tuple[str, str | None]] = {}
        for device in devices:
            revision = cache.revision_for(name, device.name)
            if revision is not None:
                sent = cache.models.get(revision.model)
                assigned_models[device.name] = (revision.model[1], sent.sha256 if sent else None)
        status = deployment_status(
            dep,
            devices,
            {d.name: (name,) for d in devices},
            model_sha256=sha,
            assigned_models=assigned_models,
        )
        replicas = fleetmetrics.replica_counts(
            dep,
            devices,
            model_sha256=sha,
            assigned_models=assigned_models,
            total=cache.scaled_totals.get(name),
        )
        samples = cache.analysis.get(name)
        last = max(samples.values(), key=lambda s: s.at) if samples else None
        configs = (o.manifest for o in cache.objects_of(modelconfigs.KIND))
        yield fleetmetrics.deployment_series(
            dep,
            with_config(stored.manifest, modelconfigs.config_text(configs, dep.spec.model.name)),
            status,
            replicas,
            cache.rollouts.get(name),
            cache.revisions.get(name, {}),
            last,
        )
    omitted = max(0, len(names) - fleetmetrics.MAX_DEPLOYMENTS)
    yield {"hub_deployment_series_omitted": {(): float(omitted)}}


def region_views(regions: Regions) -> list[RegionView]:
    """What the root knows of each region now (:class:`hub.state.regions.Regions`)."""
    views = []
    for line in regions.summary():
        name = str(line["region"])
        state = regions.regions.get(name)
        report = regions.seen(state).report if state is not None else None
        views.append(
            RegionView(
                name,
                bool(line["connected"]),
                line.get("reportAgeSeconds"),
                line.get("devicesByPhase") if line.get("devices") is not None else None,
                {d.name: region_deployment_json(d) for d in report.deployments}
                if report is not None
                else None,
            )
        )
    return views
