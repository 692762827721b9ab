"""Every metric of the hub, in one registry (:mod:`edgefleet.metrics`): :class:`HubMetrics`.

Here in state, below the controllers and the API, so that whoever counts (the device writer's
events, the projector's placements, a controller) needs no upper wing. Served by
:mod:`hub.api.observability` (``/metrics``); the table is in ``docs/observability.md``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from edgefleet.metrics import Registry
from hub.decide.devices import Device, DevicePhase
from hub.state.cache import Cache
from hub.state.sessions import Sessions

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

    def render(self) -> str:
        if self._cache is not None:
            self.devices_by_agent.replace(agent_versions(self._cache.devices.values()))
            self.agent_upgrade_devices.replace(agent_upgrade_series(self._cache))
        return self.registry.render()


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
