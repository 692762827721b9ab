"""The edgefleet API objects: manifests (typed, validated) and the quantities in them.

``load_manifest_file(path)`` or ``parse_manifest(doc)`` give frozen dataclasses, or raise
:class:`edgefleet.errors.ValidationError` listing every problem with its field path.
"""

from edgefleet.api.agentupgrades import AgentUpgrade, AgentUpgradeSpec
from edgefleet.api.baselines import SecurityBaseline, SecurityBaselineSpec
from edgefleet.api.conditions import Condition, ConditionStatus
from edgefleet.api.deployments import (
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
)
from edgefleet.api.healthpolicies import (
    DeviceHealthPolicy,
    DeviceHealthPolicySpec,
)
from edgefleet.api.loading import (
    MAX_FILE_BYTES,
    load_documents,
    load_manifest_file,
    load_manifests,
    parse_documents,
)
from edgefleet.api.manifests import (
    SUPPORTED_KINDS,
    Manifest,
    parse_manifest,
    read_manifest,
)
from edgefleet.api.meta import API_VERSION, ObjectMeta
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
    PreemptionPolicy,
    PriorityClass,
    PriorityClassSpec,
)
from edgefleet.api.quantities import (
    IntOrPercent,
    format_cpu,
    format_duration,
    format_memory,
    parse_cpu,
    parse_duration,
    parse_int_or_percent,
    parse_memory,
    parse_percent,
)
from edgefleet.api.rollouts import (
    Canary,
    CanaryAnalysis,
    CanaryStep,
    Rollout,
    Wave,
)
from edgefleet.api.secrets import Secret, SecretMount

__all__ = [
    "API_VERSION",
    "MAX_FILE_BYTES",
    "PRIORITY_CLASSES",
    "SUPPORTED_KINDS",
    "AgentUpgrade",
    "AgentUpgradeSpec",
    "Canary",
    "CanaryAnalysis",
    "CanaryStep",
    "Condition",
    "ConditionStatus",
    "DeviceHealthPolicy",
    "DeviceHealthPolicySpec",
    "IntOrPercent",
    "Manifest",
    "ModelDeployment",
    "ModelDeploymentSpec",
    "ModelRef",
    "ObjectMeta",
    "Placement",
    "PlacementStrategy",
    "Power",
    "PowerWindow",
    "Precision",
    "PreemptionPolicy",
    "PriorityClass",
    "PriorityClassSpec",
    "Probe",
    "Probes",
    "Replicas",
    "Resources",
    "Rollout",
    "RuntimeSpec",
    "Scaling",
    "Secret",
    "SecretMount",
    "SecurityBaseline",
    "SecurityBaselineSpec",
    "SelectorOperator",
    "SelectorRequirement",
    "TaintEffect",
    "Toleration",
    "TolerationOperator",
    "TopologySpread",
    "Wave",
    "format_cpu",
    "format_duration",
    "format_memory",
    "load_documents",
    "load_manifest_file",
    "load_manifests",
    "parse_cpu",
    "parse_documents",
    "parse_duration",
    "parse_int_or_percent",
    "parse_manifest",
    "parse_memory",
    "parse_percent",
    "read_manifest",
]
