"""The ``ModelDeployment`` kind: the model, its runtime, replicas, resources, probes, scaling,
power and priority (``spec.placement`` in :mod:`edgefleet.api.placement`, ``spec.rollout`` in
:mod:`edgefleet.api.rollouts`), read from an untyped document and written back.

``to_dict()`` renders the canonical document (every default spelled out, quantities in
canonical form) that parses back to an equal object; it is deterministic, so it serves to
persist state and to hash revisions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import time
from enum import StrEnum
from typing import Any, ClassVar

from edgefleet.api.fieldsyntax import (
    at_most,
    clock_time,
    execution_provider,
    plain_number,
    seconds,
    sha256_digest,
    version_string,
)
from edgefleet.api.meta import (
    ObjectMeta,
    SpecObject,
    dns_label,
    label_value,
)
from edgefleet.api.networking import NetworkPolicy, read_network
from edgefleet.api.placement import Placement, PlacementStrategy, read_placement
from edgefleet.api.priorities import PRIORITY_CLASSES
from edgefleet.api.quantities import (
    format_cpu,
    format_duration,
    format_memory,
    parse_cpu,
    parse_duration,
    parse_memory,
    parse_percent,
)
from edgefleet.api.rollouts import Rollout, read_rollout
from edgefleet.api.secrets import (
    SecretMount,
    read_secret_mounts,
)
from edgefleet.api.validating import (
    Reader,
    field_path,
    int_in,
    non_empty_str,
    one_of,
    within,
)

RESTARTED_AT = "edgefleet.io/restartedAt"
"""The annotation ``edgectl rollout restart`` puts on the revision it makes (kubectl's
``kubectl.kubernetes.io/restartedAt``): part of the hub's revision template
(``hub.decide.revisions``) and of the revision edged computes (``edged.workloads``), so the
same model and settings start new workers."""


class Precision(StrEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRef:
    """``spec.model``: which artifact. ``path`` is kept raw (relative to the manifest's folder)."""

    name: str
    version: str
    path: str | None = None
    sha256: str | None = None
    # Static manifests: the signed metadata (default ``<path>.metadata.json``) and an optional
    # signed rollback allowance, both relative to the manifest's folder (see docs/trust.md).
    metadata: str | None = None
    rollback_allowance: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "version": self.version}
        if self.path is not None:
            out["path"] = self.path
        if self.sha256 is not None:
            out["sha256"] = self.sha256
        if self.metadata is not None:
            out["metadata"] = self.metadata
        if self.rollback_allowance is not None:
            out["rollbackAllowance"] = self.rollback_allowance
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeSpec:
    """``spec.runtime``: how ONNX Runtime serves the model. Delays are in seconds."""

    max_batch_size: int = 1
    max_queue_delay: float = 0.002
    precision: Precision | None = None
    execution_providers: tuple[str, ...] = ("CPUExecutionProvider",)
    intra_op_threads: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "maxBatchSize": self.max_batch_size,
            "maxQueueDelay": format_duration(self.max_queue_delay),
        }
        if self.precision is not None:
            out["precision"] = self.precision.value
        out["executionProviders"] = list(self.execution_providers)
        if self.intra_op_threads is not None:
            out["intraOpThreads"] = self.intra_op_threads
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Replicas:
    """``spec.replicas``: exactly one of ``per_device`` and ``total`` is set."""

    per_device: int | None = 1
    total: int | None = None

    def count_on_device(self) -> int:
        """Replicas to run on one device: ``per_device`` if set, else ``total``."""
        if self.per_device is not None:
            return self.per_device
        return self.total or 0

    def to_dict(self) -> dict[str, Any]:
        if self.per_device is not None:
            return {"perDevice": self.per_device}
        return {"total": self.total or 0}


@dataclass(frozen=True, slots=True, kw_only=True)
class Resources:
    """``spec.resources`` per replica: CPU in millicores, memory in bytes."""

    cpu_millis: int | None = None
    memory_bytes: int | None = None
    accelerator: str | None = None
    # ``accelerator: {anyOf: [gpu, npu]}``: acceptable accelerators in order of preference;
    # ``accelerator`` is then the first (what a device that is not told otherwise uses).
    accelerator_any_of: tuple[str, ...] = ()

    @property
    def accelerators(self) -> tuple[str, ...]:
        """The acceptable accelerators in order (empty: none needed)."""
        if self.accelerator_any_of:
            return self.accelerator_any_of
        return (self.accelerator,) if self.accelerator is not None else ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.cpu_millis is not None:
            out["cpu"] = format_cpu(self.cpu_millis)
        if self.memory_bytes is not None:
            out["memory"] = format_memory(self.memory_bytes)
        if len(self.accelerator_any_of) > 1:
            out["accelerator"] = {"anyOf": list(self.accelerator_any_of)}
        elif self.accelerator is not None:
            out["accelerator"] = self.accelerator
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    """A health probe; times in seconds."""

    timeout_s: float
    period_s: float
    failure_threshold: int = 3

    def to_dict(self) -> dict[str, Any]:
        return {
            "timeoutSeconds": plain_number(self.timeout_s),
            "periodSeconds": plain_number(self.period_s),
            "failureThreshold": self.failure_threshold,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Probes:
    """``spec.probes``: startup, readiness and liveness of each worker."""

    startup: Probe = Probe(timeout_s=60.0, period_s=1.0)
    readiness: Probe = Probe(timeout_s=1.0, period_s=5.0)
    liveness: Probe = Probe(timeout_s=5.0, period_s=10.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "startup": self.startup.to_dict(),
            "readiness": self.readiness.to_dict(),
            "liveness": self.liveness.to_dict(),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Scaling:
    """``spec.scaling``: autoscaling bounds and triggers: of the replicas on each device (edged)
    for ``replicas.perDevice``, of the fleet's count (the hub) for ``replicas.total``.

    Kubernetes HPA semantics: up when the requests in flight per ready replica stay above
    ``queue_depth_up``, down when the workers' CPU stays below ``cpu_down_below`` percent of
    what they may use; a change is made only when every recommendation over the window
    (``scale_up_window_s`` up, ``scale_down_window_s`` down) agrees with it.
    """

    max_replicas: int
    min_replicas: int = 1
    queue_depth_up: int | None = None
    cpu_down_below: int | None = None  # percent
    scale_up_window_s: float = 15.0
    scale_down_window_s: float = 300.0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "minReplicas": self.min_replicas,
            "maxReplicas": self.max_replicas,
        }
        if self.queue_depth_up is not None:
            out["queueDepthUp"] = self.queue_depth_up
        if self.cpu_down_below is not None:
            out["cpuDownBelow"] = f"{self.cpu_down_below}%"
        out["scaleUpWindow"] = format_duration(self.scale_up_window_s)
        out["scaleDownWindow"] = format_duration(self.scale_down_window_s)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class PowerWindow:
    """From ``start`` to ``end`` (local time; may wrap past midnight) serve at ``precision``."""

    start: time
    end: time
    precision: Precision

    def to_dict(self) -> dict[str, Any]:
        return {
            "from": self.start.strftime("%H:%M"),
            "to": self.end.strftime("%H:%M"),
            "precision": self.precision.value,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class LowBattery:
    """On battery with less than ``below_percent`` charge left, serve at ``precision``."""

    below_percent: int
    precision: Precision

    def to_dict(self) -> dict[str, Any]:
        return {"below": f"{self.below_percent}%", "precision": self.precision.value}


@dataclass(frozen=True, slots=True, kw_only=True)
class Power:
    """``spec.power``: a schedule of reduced-power windows (device local time) and the
    precision to serve at on a low battery. A low battery wins over a window; either wins over
    ``runtime.precision``. Each names a precision variant of the artifact."""

    schedule: tuple[PowerWindow, ...] = ()
    low_battery: LowBattery | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schedule": [w.to_dict() for w in self.schedule]}
        if self.low_battery is not None:
            out["lowBattery"] = self.low_battery.to_dict()
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelDeploymentSpec:
    """``spec`` of a ModelDeployment."""

    model: ModelRef
    runtime: RuntimeSpec = RuntimeSpec()
    replicas: Replicas = Replicas()
    resources: Resources = Resources()
    placement: Placement = field(default_factory=Placement)
    probes: Probes = Probes()
    rollout: Rollout = Rollout()  # noqa: RUF009 (frozen: one shared default is safe, as before)
    scaling: Scaling | None = None
    power: Power | None = None
    # Higher wins: the hub's scheduler places it first and preempts lower ones for it
    # (replicas.total); on a device, edged evicts lower ones first under memory pressure and
    # steers the kernel's OOM killer by it. None: the class's, else 0.
    priority: int | None = None
    priority_class_name: str | None = None

    @property
    def effective_priority(self) -> int:
        """``priority``, else the built-in class's, else 0 (a PriorityClass of one's own is
        resolved by the hub, which sends devices its value as ``priority``)."""
        if self.priority is not None:
            return self.priority
        return PRIORITY_CLASSES.get(self.priority_class_name or "default", 0)

    network: NetworkPolicy | None = None  # worker egress (edgefleet/api/networking.py)
    secrets: tuple[SecretMount, ...] = ()  # Secrets given to the workers (api/secrets.py)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": self.model.to_dict(),
            "runtime": self.runtime.to_dict(),
            "replicas": self.replicas.to_dict(),
            "resources": self.resources.to_dict(),
            "placement": self.placement.to_dict(),
            "probes": self.probes.to_dict(),
            "rollout": self.rollout.to_dict(),
        }
        if self.scaling is not None:
            out["scaling"] = self.scaling.to_dict()
        if self.power is not None:
            out["power"] = self.power.to_dict()
        if self.priority is not None:
            out["priority"] = self.priority
        if self.network is not None:
            out["network"] = self.network.to_dict()
        if self.priority_class_name is not None:
            out["priorityClassName"] = self.priority_class_name
        if self.secrets:
            out["secrets"] = [m.to_dict() for m in self.secrets]
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelDeployment(SpecObject):
    """Run a model on the devices that match, kept so by the hub and by edged."""

    KIND: ClassVar[str] = "ModelDeployment"

    metadata: ObjectMeta
    spec: ModelDeploymentSpec


def _read_model(r: Reader | None) -> ModelRef:
    if r is None:
        return ModelRef(name="", version="")
    return ModelRef(
        name=r.required("name", dns_label, ""),
        version=r.required("version", version_string, ""),
        path=r.optional("path", non_empty_str, None),
        sha256=r.optional("sha256", sha256_digest, None),
        metadata=r.optional("metadata", non_empty_str, None),
        rollback_allowance=r.optional("rollbackAllowance", non_empty_str, None),
    )


def _read_runtime(r: Reader | None) -> RuntimeSpec:
    default = RuntimeSpec()
    if r is None:
        return default
    providers = r.list_of("executionProviders", execution_provider, unique=True)
    if providers is not None and not providers and r.raw("executionProviders") == []:
        r.problems.add(r.at("executionProviders"), "must list at least one execution provider")
    return RuntimeSpec(
        max_batch_size=r.optional("maxBatchSize", int_in(1, 1024), default.max_batch_size),
        max_queue_delay=r.optional(
            "maxQueueDelay", within(parse_duration, at_most(1.0, "1s")), default.max_queue_delay
        ),
        precision=r.optional("precision", one_of(Precision), default.precision),
        execution_providers=tuple(providers) if providers else default.execution_providers,
        intra_op_threads=r.optional("intraOpThreads", int_in(1, 256), default.intra_op_threads),
    )


def _read_replicas(r: Reader | None) -> Replicas:
    if r is None:
        return Replicas()
    per_device = r.optional("perDevice", int_in(0, 64), None)
    total = r.optional("total", int_in(0, 100_000), None)
    if r.has("perDevice") and r.has("total"):
        r.problems.add(r.path, "set exactly one of perDevice and total, not both")
    elif not r.has("perDevice") and not r.has("total"):
        r.problems.add(r.path, "set one of perDevice and total")
    return Replicas(per_device=per_device, total=total)


def _read_resources(r: Reader | None) -> Resources:
    if r is None:
        return Resources()
    any_of: tuple[str, ...] = ()
    raw = r.raw("accelerator")
    if isinstance(raw, Mapping):
        acc = r.section("accelerator")
        if acc is not None:
            any_of = tuple(acc.list_of("anyOf", label_value, unique=True) or ())
            if not any_of:
                r.problems.add(acc.at("anyOf"), "must list at least one accelerator")
        accelerator = any_of[0] if any_of else None
    else:
        accelerator = r.optional("accelerator", label_value, None)
    return Resources(
        cpu_millis=r.optional("cpu", parse_cpu, None),
        memory_bytes=r.optional("memory", parse_memory, None),
        accelerator=accelerator,
        accelerator_any_of=any_of if len(any_of) > 1 else (),
    )


def _priority_class(value: object) -> str:
    """A built-in class or the name of a PriorityClass (which the hub checks exists)."""
    return dns_label(value)


def _read_probe(r: Reader | None, default: Probe) -> Probe:
    if r is None:
        return default
    return Probe(
        timeout_s=r.optional("timeoutSeconds", seconds, default.timeout_s),
        period_s=r.optional("periodSeconds", seconds, default.period_s),
        failure_threshold=r.optional(
            "failureThreshold", int_in(1, 1000), default.failure_threshold
        ),
    )


def _read_probes(r: Reader | None) -> Probes:
    default = Probes()
    if r is None:
        return default
    return Probes(
        startup=_read_probe(r.section("startup"), default.startup),
        readiness=_read_probe(r.section("readiness"), default.readiness),
        liveness=_read_probe(r.section("liveness"), default.liveness),
    )


def _read_scaling(r: Reader | None) -> Scaling | None:
    if r is None:
        return None
    min_replicas = r.optional("minReplicas", int_in(0, 100_000), 1)
    max_replicas = r.required("maxReplicas", int_in(1, 100_000), None)
    if max_replicas is not None and min_replicas > max_replicas:
        r.problems.add(r.at("minReplicas"), f"must not exceed maxReplicas ({max_replicas})")
    default = Scaling(max_replicas=1)
    return Scaling(
        min_replicas=min_replicas,
        max_replicas=max_replicas or 1,
        queue_depth_up=r.optional("queueDepthUp", int_in(1, 1_000_000), None),
        cpu_down_below=r.optional("cpuDownBelow", _cpu_percent, None),
        scale_up_window_s=r.optional("scaleUpWindow", _window, default.scale_up_window_s),
        scale_down_window_s=r.optional("scaleDownWindow", _window, default.scale_down_window_s),
    )


_window = within(parse_duration, at_most(3600.0, "1h"))


_cpu_percent = within(
    parse_percent, lambda v: "must be between 1% and 100%" if not 0 < v <= 100 else None
)


_priority = int_in(-2_147_483_648, 1_000_000_000)


def _read_power(r: Reader | None) -> Power | None:
    if r is None:
        return None
    windows = []
    for path, item in r.items("schedule"):
        w = r.problems.reader(item, path)
        if w is None:
            continue
        start = w.required("from", clock_time, None)
        end = w.required("to", clock_time, None)
        if start is not None and start == end:
            w.problems.add(w.at("to"), 'must differ from "from"')
        precision = w.required("precision", one_of(Precision), Precision.FP32)
        windows.append(PowerWindow(start=start or time(0), end=end or time(0), precision=precision))
    low_battery = None
    b = r.section("lowBattery")
    if b is not None:
        low_battery = LowBattery(
            below_percent=b.required("below", _battery_percent, 20),
            precision=b.required("precision", one_of(Precision), Precision.FP32),
        )
    return Power(schedule=tuple(windows), low_battery=low_battery)


_battery_percent = within(
    parse_percent, lambda v: "must be between 1% and 100%" if not 0 < v <= 100 else None
)


def read_model_deployment(metadata: ObjectMeta, r: Reader | None) -> ModelDeployment:
    if r is None:
        spec = ModelDeploymentSpec(model=ModelRef(name="", version=""))
    else:
        spec = ModelDeploymentSpec(
            model=_read_model(r.required_section("model")),
            runtime=_read_runtime(r.section("runtime")),
            replicas=_read_replicas(r.section("replicas")),
            resources=_read_resources(r.section("resources")),
            placement=read_placement(r.section("placement")),
            probes=_read_probes(r.section("probes")),
            rollout=read_rollout(r.section("rollout")),
            scaling=_read_scaling(r.section("scaling")),
            power=_read_power(r.section("power")),
            priority=r.optional("priority", _priority, None),
            priority_class_name=r.optional("priorityClassName", _priority_class, None),
            network=read_network(r.section("network")),
            secrets=read_secret_mounts(r),
        )
        if r.has("priority") and r.has("priorityClassName"):
            r.problems.add(r.path, "set at most one of priority and priorityClassName")
        if spec.replicas.per_device is not None:
            _check_total_only(r, spec)
        _check_wave_regions(r, spec)
        _refuse_unbuilt(r, spec)
    return ModelDeployment(metadata=metadata, spec=spec)


def _check_wave_regions(r: Reader, spec: ModelDeploymentSpec) -> None:
    """A wave may name only regions the deployment goes to (``placement.regions``, if set)."""
    placed = spec.placement.regions
    if not placed:
        return
    for i, wave in enumerate(spec.rollout.waves):
        for j, region in enumerate(wave.regions):
            if region not in placed:
                r.problems.add(
                    f"{r.path}.rollout.waves[{i}].regions[{j}]",
                    f"{region!r} is not in placement.regions ({', '.join(placed)})",
                )


def _check_total_only(r: Reader, spec: ModelDeploymentSpec) -> None:
    """What only the scheduler acts on is refused for ``perDevice`` (every matching device
    runs it: nothing to choose). A priority applies to both: edged's eviction order."""
    placement = spec.placement
    only = "applies to replicas.total only (perDevice runs on every matching device)"
    if placement.deployment_affinity:
        r.problems.add(f"{r.path}.placement.deploymentAffinity", only)
    if placement.deployment_anti_affinity:
        r.problems.add(f"{r.path}.placement.deploymentAntiAffinity", only)
    if placement.strategy is not PlacementStrategy.SPREAD:
        r.problems.add(f"{r.path}.placement.strategy", only)
    if placement.max_latency_p95_s is not None:
        r.problems.add(f"{r.path}.placement.maxLatencyP95", only)


def _refuse_unbuilt(r: Reader, spec: ModelDeploymentSpec) -> None:
    """What is parsed but not done yet is refused, never accepted and ignored."""
    if spec.scaling is not None and spec.scaling.min_replicas == 0:
        r.problems.add(
            field_path(r.at("scaling"), "minReplicas"),
            "not supported yet: scaling to zero needs requests that wait for a replica to "
            "start, which edged does not do; use at least 1",
        )
