"""Typed manifests: the ``ModelDeployment`` kind, read from untyped documents and written back.

:func:`parse_manifest` turns a YAML/JSON document into frozen dataclasses and reports every
problem at once, each with its full field path; unknown fields are always problems, and null
for an optional field means its default. ``to_dict()`` renders the canonical document (every
default spelled out, quantities in canonical form) that parses back to an equal object; it is
deterministic, so it serves to persist state and to hash revisions.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import time
from enum import StrEnum
from typing import Any, ClassVar, TypeAlias

from edgefleet.api.baselines import SecurityBaseline, read_security_baseline
from edgefleet.api.meta import (
    API_VERSION,
    ObjectMeta,
    SpecObject,
    dns_label,
    label_key,
    label_value,
    read_metadata,
)
from edgefleet.api.networking import NetworkPolicy, read_network
from edgefleet.api.priorities import PriorityClass, read_priority_class
from edgefleet.api.quantities import (
    IntOrPercent,
    describe,
    format_cpu,
    format_duration,
    format_memory,
    parse_cpu,
    parse_duration,
    parse_int_or_percent,
    parse_memory,
    parse_percent,
)
from edgefleet.api.secrets import (
    Secret,
    SecretMount,
    check_embedded_keys,
    read_secret,
    read_secret_mounts,
)
from edgefleet.api.validating import (
    Problems,
    Reader,
    as_bool,
    field_path,
    int_in,
    matching,
    non_empty_str,
    number_in,
    one_of,
    within,
)
from edgefleet.errors import ValidationError

# ---------------------------------------------------------------------------------------------
# Types


class Precision(StrEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"


class TolerationOperator(StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class SelectorOperator(StrEnum):
    """``placement.matchExpressions[].operator``: Kubernetes' set-based selector operators."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class PlacementStrategy(StrEnum):
    """How the scheduler scores devices: least allocated first, or most allocated first."""

    SPREAD = "Spread"
    BIN_PACK = "BinPack"


PRIORITY_CLASSES: Mapping[str, int] = {
    "system-critical": 1_000_000_000,
    "critical": 1_000_000,
    "high": 1000,
    "default": 0,
    "low": -1000,
}
"""The built-in ``spec.priorityClassName`` values and their priorities (a ``PriorityClass``
object of one's own, :mod:`edgefleet.api.priorities`, adds more; the hub resolves those)."""


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
class Toleration:
    """Tolerates device taints, as in Kubernetes. An empty key with Exists tolerates all."""

    key: str = ""
    operator: TolerationOperator = TolerationOperator.EQUAL
    value: str = ""
    effect: TaintEffect | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.key:
            out["key"] = self.key
        out["operator"] = self.operator.value
        if self.value:
            out["value"] = self.value
        if self.effect is not None:
            out["effect"] = self.effect.value
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class TopologySpread:
    """Spread replicas over the values of the device label ``key``."""

    key: str
    min_per_domain: int = 1
    max_skew: int | None = None  # hard: no domain more than this above the emptiest one

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "minPerDomain": self.min_per_domain}
        if self.max_skew is not None:
            out["maxSkew"] = self.max_skew
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class SelectorRequirement:
    """One of ``placement.matchExpressions``: a set-based label requirement."""

    key: str
    operator: SelectorOperator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        have = labels.get(self.key)
        if self.operator is SelectorOperator.IN:
            return have is not None and have in self.values
        if self.operator is SelectorOperator.NOT_IN:
            return have is None or have not in self.values
        if self.operator is SelectorOperator.EXISTS:
            return have is not None
        return have is None

    def describe(self) -> str:
        if self.operator in (SelectorOperator.IN, SelectorOperator.NOT_IN):
            return f"{self.key} {self.operator.value} ({','.join(self.values)})"
        return f"{self.key} {self.operator.value}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "operator": self.operator.value}
        if self.values:
            out["values"] = list(self.values)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """``spec.placement``: which devices may run the model (used by the hub's scheduler)."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[SelectorRequirement, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    regions: tuple[str, ...] = ()
    zones: tuple[str, ...] = ()
    topology_spread: TopologySpread | None = None
    # not on a device without every one of these deployments / with any one of them
    deployment_affinity: tuple[str, ...] = ()
    deployment_anti_affinity: tuple[str, ...] = ()
    strategy: PlacementStrategy = PlacementStrategy.SPREAD
    # not on a device whose self-benchmark of the model (a p95, measured when a revision
    # starts there) is above this; a device not measured yet may be placed, and is left when
    # its figure is over
    max_latency_p95_s: float | None = None
    # only on TPM-attested devices (an attestation key bound to the TPM's EK, last evidence
    # trusted); the device refuses it too when it holds no such key (docs/trust.md)
    require_tpm: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.require_tpm:
            out["requireTpm"] = True
        if self.node_selector:
            out["nodeSelector"] = dict(sorted(self.node_selector.items()))
        if self.match_expressions:
            out["matchExpressions"] = [e.to_dict() for e in self.match_expressions]
        if self.tolerations:
            out["tolerations"] = [t.to_dict() for t in self.tolerations]
        if self.regions:
            out["regions"] = list(self.regions)
        if self.zones:
            out["zones"] = list(self.zones)
        if self.topology_spread is not None:
            out["topologySpread"] = self.topology_spread.to_dict()
        if self.deployment_affinity:
            out["deploymentAffinity"] = list(self.deployment_affinity)
        if self.deployment_anti_affinity:
            out["deploymentAntiAffinity"] = list(self.deployment_anti_affinity)
        if self.strategy is not PlacementStrategy.SPREAD:
            out["strategy"] = self.strategy.value
        if self.max_latency_p95_s is not None:
            out["maxLatencyP95"] = format_duration(self.max_latency_p95_s)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    """A health probe; times in seconds."""

    timeout_s: float
    period_s: float
    failure_threshold: int = 3

    def to_dict(self) -> dict[str, Any]:
        return {
            "timeoutSeconds": _plain_number(self.timeout_s),
            "periodSeconds": _plain_number(self.period_s),
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
    rollout: Rollout = Rollout()
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


# -- DeviceHealthPolicy (discovery) ----------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceHealthPolicySpec:
    """``spec`` of a DeviceHealthPolicy: when the device is fit to take workloads.

    Unset bounds are not checked. ``hysteresis_percent`` widens a bound once the device is out
    of it: it is back only past the bound by that share (85 °C, 5%: back at 80.75 °C or less).
    """

    min_uptime_s: float | None = None
    min_available_memory_bytes: int | None = None
    max_cpu_temperature_c: float | None = None
    min_disk_free_bytes: int | None = None
    required_accelerators: tuple[str, ...] = ()
    required_labels: Mapping[str, str] = field(default_factory=dict)
    hysteresis_percent: int = 5

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.min_uptime_s is not None:
            out["minUptime"] = format_duration(self.min_uptime_s)
        if self.min_available_memory_bytes is not None:
            out["minAvailableMemory"] = format_memory(self.min_available_memory_bytes)
        if self.max_cpu_temperature_c is not None:
            out["maxCpuTemperature"] = _plain_number(self.max_cpu_temperature_c)
        if self.min_disk_free_bytes is not None:
            out["minDiskFree"] = format_memory(self.min_disk_free_bytes)
        if self.required_accelerators:
            out["requiredAccelerators"] = list(self.required_accelerators)
        if self.required_labels:
            out["requiredLabels"] = dict(sorted(self.required_labels.items()))
        out["hysteresis"] = f"{self.hysteresis_percent}%"
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceHealthPolicy(SpecObject):
    """When this device reports itself schedulable (evaluated by edged; nothing is killed)."""

    KIND: ClassVar[str] = "DeviceHealthPolicy"

    metadata: ObjectMeta
    spec: DeviceHealthPolicySpec


Manifest: TypeAlias = (
    ModelDeployment | DeviceHealthPolicy | SecurityBaseline | Secret | PriorityClass
)
"""Any manifest kind."""


def _plain_number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


# ---------------------------------------------------------------------------------------------
# Field syntax

_version_text = matching(
    r"[A-Za-z0-9][A-Za-z0-9._+-]*",
    'a version such as "2.4.1": letters, digits, ".", "_", "+" and "-"',
    max_length=128,
)


def _version(value: object) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise ValueError(
            f'must be a string, got the number {value!r}: write it in quotes (version: "{value}"); '
            "YAML reads unquoted numbers as numbers, so 2.40 would become 2.4"
        )
    return _version_text(value)


_sha256_text = matching(r"[0-9a-fA-F]{64}", "a SHA-256 digest: 64 hexadecimal digits")


def _sha256(value: object) -> str:
    return _sha256_text(value).lower()


def _toleration_key(value: object) -> str:
    return "" if value == "" else label_key(value)


_execution_provider = matching(
    r"[A-Za-z][A-Za-z0-9_]*ExecutionProvider",
    'an ONNX Runtime execution provider such as "CUDAExecutionProvider"',
)


def _at_most(limit: float, text: str) -> Callable[[float], str | None]:
    return lambda v: f"must be at most {text}, got {format_duration(v)}" if v > limit else None


def _positive(text: str) -> Callable[[float], str | None]:
    return lambda v: f"must be more than {text}" if v <= 0 else None


_clock_text = matching(r"(?:[01]\d|2[0-3]):[0-5]\d", 'a time of day "HH:MM" (00:00 to 23:59)')


def _clock_time(value: object) -> time:
    if isinstance(value, int) and not isinstance(value, bool):
        raise ValueError(
            f'must be a time "HH:MM" in quotes, got the number {value}: YAML reads an unquoted '
            "time such as 06:00 as a number of minutes"
        )
    text = _clock_text(value)
    return time(int(text[:2]), int(text[3:]))


_seconds = number_in(above=0, high=86400)
_fraction = number_in(0, 1)
_step_percent = within(parse_percent, lambda v: "must be more than 0%" if v == 0 else None)


# ---------------------------------------------------------------------------------------------
# Reading


def _read_model(r: Reader | None) -> ModelRef:
    if r is None:
        return ModelRef(name="", version="")
    return ModelRef(
        name=r.required("name", dns_label, ""),
        version=r.required("version", _version, ""),
        path=r.optional("path", non_empty_str, None),
        sha256=r.optional("sha256", _sha256, None),
        metadata=r.optional("metadata", non_empty_str, None),
        rollback_allowance=r.optional("rollbackAllowance", non_empty_str, None),
    )


def _read_runtime(r: Reader | None) -> RuntimeSpec:
    default = RuntimeSpec()
    if r is None:
        return default
    providers = r.list_of("executionProviders", _execution_provider, unique=True)
    if providers is not None and not providers and r.raw("executionProviders") == []:
        r.problems.add(r.at("executionProviders"), "must list at least one execution provider")
    return RuntimeSpec(
        max_batch_size=r.optional("maxBatchSize", int_in(1, 1024), default.max_batch_size),
        max_queue_delay=r.optional(
            "maxQueueDelay", within(parse_duration, _at_most(1.0, "1s")), default.max_queue_delay
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


def _read_requirement(r: Reader) -> SelectorRequirement:
    key = r.required("key", label_key, "")
    operator = r.required("operator", one_of(SelectorOperator), SelectorOperator.EXISTS)
    values = tuple(r.list_of("values", label_value, unique=True) or ())
    if operator in (SelectorOperator.IN, SelectorOperator.NOT_IN):
        if not values:
            r.problems.add(r.at("values"), f"must list at least one value for {operator.value}")
    elif r.has("values"):
        r.problems.add(r.at("values"), f"must be empty when operator is {operator.value}")
    return SelectorRequirement(key=key, operator=operator, values=values)


def _read_toleration(r: Reader) -> Toleration:
    key = r.optional("key", _toleration_key, "")
    operator = r.optional("operator", one_of(TolerationOperator), TolerationOperator.EQUAL)
    value = r.optional("value", label_value, "")
    if operator is TolerationOperator.EXISTS and value:
        r.problems.add(r.at("value"), "must be empty when operator is Exists")
    if operator is TolerationOperator.EQUAL and key == "" and r.raw("key") in (None, ""):
        r.problems.add(r.at("key"), "required when operator is Equal")
    return Toleration(
        key=key,
        operator=operator,
        value=value,
        effect=r.optional("effect", one_of(TaintEffect), None),
    )


def _latency_bound(value: object) -> float:
    seconds = parse_duration(value)
    if not 0 < seconds <= 60:
        raise ValueError(f"must be more than 0 and at most 60s, got {describe(value)}")
    return seconds


def _read_placement(r: Reader | None) -> Placement:
    if r is None:
        return Placement()
    tolerations = []
    for path, item in r.items("tolerations"):
        item_reader = r.problems.reader(item, path)
        if item_reader is not None:
            tolerations.append(_read_toleration(item_reader))
    expressions = []
    for path, item in r.items("matchExpressions"):
        item_reader = r.problems.reader(item, path)
        if item_reader is not None:
            expressions.append(_read_requirement(item_reader))
    spread = r.section("topologySpread")
    return Placement(
        node_selector=r.string_map("nodeSelector", label_key, label_value) or {},
        match_expressions=tuple(expressions),
        tolerations=tuple(tolerations),
        regions=tuple(r.list_of("regions", dns_label, unique=True) or ()),
        zones=tuple(r.list_of("zones", label_value, unique=True) or ()),
        topology_spread=None
        if spread is None
        else TopologySpread(
            key=spread.required("key", label_key, ""),
            min_per_domain=spread.optional("minPerDomain", int_in(1, None), 1),
            max_skew=spread.optional("maxSkew", int_in(1, None), None),
        ),
        deployment_affinity=tuple(r.list_of("deploymentAffinity", dns_label, unique=True) or ()),
        deployment_anti_affinity=tuple(
            r.list_of("deploymentAntiAffinity", dns_label, unique=True) or ()
        ),
        max_latency_p95_s=r.optional("maxLatencyP95", _latency_bound, None),
        strategy=r.optional("strategy", one_of(PlacementStrategy), PlacementStrategy.SPREAD),
        require_tpm=r.optional("requireTpm", as_bool, False),
    )


def _priority_class(value: object) -> str:
    """A built-in class or the name of a PriorityClass (which the hub checks exists)."""
    return dns_label(value)


def _read_probe(r: Reader | None, default: Probe) -> Probe:
    if r is None:
        return default
    return Probe(
        timeout_s=r.optional("timeoutSeconds", _seconds, default.timeout_s),
        period_s=r.optional("periodSeconds", _seconds, default.period_s),
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


def _read_canary_step(r: Reader, path: str, item: object) -> CanaryStep | None:
    """A step: ``"5%"`` (``{setWeight: 5%}``), ``{pause: {}}`` or ``{pause: {duration: 60s}}``."""
    if not isinstance(item, Mapping):
        return r.problems.convert(path, item, lambda v: CanaryStep(weight=_step_percent(v)), None)
    s = r.problems.reader(item, path)
    if s is None:
        return None
    if s.has("setWeight") == s.has("pause"):
        s.problems.add(path, "must have exactly one of setWeight or pause")
        s.ignore("setWeight", "pause")
        return None
    if s.has("setWeight"):
        weight = s.required("setWeight", _step_percent, None)
        return None if weight is None else CanaryStep(weight=weight)
    p = s.section("pause")
    duration = None if p is None else p.optional("duration", _pause_duration, None)
    return CanaryStep(pause=True, pause_s=duration)


_pause_duration = within(parse_duration, _positive("0s"))


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
            min_accuracy=a.optional("minAccuracy", _fraction, None),
            max_error_rate_increase=a.optional("maxErrorRateIncrease", _fraction, None),
            max_latency_p95_s=a.optional("maxLatencyP95", _pause_duration, None),
            min_requests=a.optional("minRequests", int_in(1, 1_000_000), 20),
            window_s=a.optional(
                "window", within(parse_duration, _positive("0s")), CanaryAnalysis().window_s
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


def _read_rollout(r: Reader | None) -> Rollout:
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


_window = within(parse_duration, _at_most(3600.0, "1h"))
_cpu_percent = within(
    parse_percent, lambda v: "must be between 1% and 100%" if not 0 < v <= 100 else None
)
# Kubernetes' range for user priorities (PriorityClass.value), so a value carries over
_priority = int_in(-2_147_483_648, 1_000_000_000)


def _read_power(r: Reader | None) -> Power | None:
    if r is None:
        return None
    windows = []
    for path, item in r.items("schedule"):
        w = r.problems.reader(item, path)
        if w is None:
            continue
        start = w.required("from", _clock_time, None)
        end = w.required("to", _clock_time, None)
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


def _read_model_deployment(metadata: ObjectMeta, r: Reader | None) -> ModelDeployment:
    if r is None:
        spec = ModelDeploymentSpec(model=ModelRef(name="", version=""))
    else:
        spec = ModelDeploymentSpec(
            model=_read_model(r.required_section("model")),
            runtime=_read_runtime(r.section("runtime")),
            replicas=_read_replicas(r.section("replicas")),
            resources=_read_resources(r.section("resources")),
            placement=_read_placement(r.section("placement")),
            probes=_read_probes(r.section("probes")),
            rollout=_read_rollout(r.section("rollout")),
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


_celsius = number_in(-50, 200)
_hysteresis = within(parse_percent, lambda v: "must be at most 50%" if v > 50 else None)


def _read_device_health_policy(metadata: ObjectMeta, r: Reader | None) -> DeviceHealthPolicy:
    if r is None:
        return DeviceHealthPolicy(metadata=metadata, spec=DeviceHealthPolicySpec())
    spec = DeviceHealthPolicySpec(
        min_uptime_s=r.optional("minUptime", parse_duration, None),
        min_available_memory_bytes=r.optional("minAvailableMemory", parse_memory, None),
        max_cpu_temperature_c=r.optional("maxCpuTemperature", _celsius, None),
        min_disk_free_bytes=r.optional("minDiskFree", parse_memory, None),
        required_accelerators=tuple(
            r.list_of("requiredAccelerators", label_value, unique=True) or ()
        ),
        required_labels=r.string_map("requiredLabels", label_key, label_value) or {},
        hysteresis_percent=r.optional("hysteresis", _hysteresis, 5),
    )
    return DeviceHealthPolicy(metadata=metadata, spec=spec)


_KINDS: dict[str, Callable[[ObjectMeta, Reader | None], Manifest]] = {
    ModelDeployment.KIND: _read_model_deployment,
    DeviceHealthPolicy.KIND: _read_device_health_policy,
    SecurityBaseline.KIND: read_security_baseline,
    Secret.KIND: read_secret,
    PriorityClass.KIND: read_priority_class,
}
SUPPORTED_KINDS: tuple[str, ...] = tuple(_KINDS)


def _kind(value: object) -> str:
    if not isinstance(value, str) or value not in _KINDS:
        raise ValueError(
            f"must be a supported kind ({', '.join(SUPPORTED_KINDS)}), got {describe(value)}"
        )
    return value


def _api_version(value: object) -> str:
    if value != API_VERSION:
        raise ValueError(f'must be "{API_VERSION}", got {describe(value)}')
    return API_VERSION


def read_manifest(problems: Problems, doc: object) -> Manifest | None:
    """Read ``doc`` into ``problems``; the manifest, or ``None`` if its kind is unknown."""
    r = problems.reader(doc)
    if r is None:
        return None
    check_embedded_keys(problems, doc)
    r.required("apiVersion", _api_version, API_VERSION)
    kind = r.required("kind", _kind, None)
    r.ignore("status")  # added by the hub; not part of the desired state
    metadata = read_metadata(r.required_section("metadata"))
    if kind is None:
        r.ignore("spec")
        return None
    # a SecurityBaseline may leave out its spec (every default); the other kinds need one
    spec = r.section("spec") if kind == SecurityBaseline.KIND else r.required_section("spec")
    return _KINDS[kind](metadata, spec)


def parse_manifest(doc: object, *, source: str = "") -> Manifest:
    """A typed manifest from a decoded document; :class:`ValidationError` lists every problem."""
    problems = Problems()
    manifest = read_manifest(problems, doc)
    problems.raise_if_any(ValidationError, source=source)
    assert manifest is not None  # every path that returns None records a problem
    return manifest
