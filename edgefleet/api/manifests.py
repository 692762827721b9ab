"""The manifest kinds and the entry that reads any of them: :func:`parse_manifest` turns a
YAML/JSON document into the frozen dataclasses of its kind and reports every problem at once,
each with its full field path; unknown fields are always problems, and null for an optional
field means its default.

One module per kind: :mod:`~edgefleet.api.deployments` (ModelDeployment, with its
:mod:`~edgefleet.api.placement` and :mod:`~edgefleet.api.rollouts` sections),
:mod:`~edgefleet.api.healthpolicies`, :mod:`~edgefleet.api.baselines`,
:mod:`~edgefleet.api.secrets`, :mod:`~edgefleet.api.priorities`; the field syntax they share
in :mod:`~edgefleet.api.fieldsyntax`. The kinds' types are re-exported here (and from
:mod:`edgefleet.api`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

from edgefleet.api.agentupgrades import AgentUpgrade, read_agent_upgrade
from edgefleet.api.baselines import SecurityBaseline, read_security_baseline
from edgefleet.api.deployments import (
    LowBattery,
    ModelDeployment,
    ModelDeploymentSpec,
    ModelRef,
    Power,
    PowerWindow,
    Precision,
    Probe,
    Probes,
    Replicas,
    Resources,
    RuntimeSpec,
    Scaling,
    read_model_deployment,
)
from edgefleet.api.healthpolicies import (
    DeviceHealthPolicy,
    DeviceHealthPolicySpec,
    read_device_health_policy,
)
from edgefleet.api.meta import (
    API_VERSION,
    ObjectMeta,
    read_metadata,
)
from edgefleet.api.modelconfigs import ModelConfig, read_model_config
from edgefleet.api.placement import (
    Placement,
    PlacementStrategy,
    SelectorOperator,
    SelectorRequirement,
    TaintEffect,
    Toleration,
    TolerationOperator,
    TopologySpread,
)
from edgefleet.api.priorities import (
    PRIORITY_CLASSES,
    PriorityClass,
    read_priority_class,
)
from edgefleet.api.quantities import (
    describe,
)
from edgefleet.api.rollouts import (
    MAX_WAVES,
    Canary,
    CanaryAnalysis,
    CanaryStep,
    Rollout,
    Wave,
)
from edgefleet.api.secrets import (
    Secret,
    check_embedded_keys,
    read_secret,
)
from edgefleet.api.validating import (
    Problems,
    Reader,
)
from edgefleet.errors import ValidationError

__all__ = [
    "MAX_WAVES",
    "PRIORITY_CLASSES",
    "SUPPORTED_KINDS",
    "AgentUpgrade",
    "Canary",
    "CanaryAnalysis",
    "CanaryStep",
    "DeviceHealthPolicy",
    "DeviceHealthPolicySpec",
    "LowBattery",
    "Manifest",
    "ModelConfig",
    "ModelDeployment",
    "ModelDeploymentSpec",
    "ModelRef",
    "Placement",
    "PlacementStrategy",
    "Power",
    "PowerWindow",
    "Precision",
    "Probe",
    "Probes",
    "Replicas",
    "Resources",
    "Rollout",
    "RuntimeSpec",
    "Scaling",
    "SelectorOperator",
    "SelectorRequirement",
    "TaintEffect",
    "Toleration",
    "TolerationOperator",
    "TopologySpread",
    "Wave",
    "parse_manifest",
    "read_manifest",
]


Manifest: TypeAlias = (
    ModelDeployment
    | DeviceHealthPolicy
    | SecurityBaseline
    | Secret
    | PriorityClass
    | AgentUpgrade
    | ModelConfig
)
"""Any manifest kind."""


_KINDS: dict[str, Callable[[ObjectMeta, Reader | None], Manifest]] = {
    ModelDeployment.KIND: read_model_deployment,
    DeviceHealthPolicy.KIND: read_device_health_policy,
    SecurityBaseline.KIND: read_security_baseline,
    Secret.KIND: read_secret,
    PriorityClass.KIND: read_priority_class,
    AgentUpgrade.KIND: read_agent_upgrade,
    ModelConfig.KIND: read_model_config,
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
