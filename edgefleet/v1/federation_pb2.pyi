from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EnrollHubRequest(_message.Message):
    __slots__ = ("token", "csr_pem", "region")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    token: str
    csr_pem: bytes
    region: str
    def __init__(self, token: _Optional[str] = ..., csr_pem: _Optional[bytes] = ..., region: _Optional[str] = ...) -> None: ...

class EnrollHubResponse(_message.Message):
    __slots__ = ("certificate_chain_pem", "ca_certificate_pem", "trust_roots", "root_region", "hub_addresses")
    CERTIFICATE_CHAIN_PEM_FIELD_NUMBER: _ClassVar[int]
    CA_CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    TRUST_ROOTS_FIELD_NUMBER: _ClassVar[int]
    ROOT_REGION_FIELD_NUMBER: _ClassVar[int]
    HUB_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    certificate_chain_pem: bytes
    ca_certificate_pem: bytes
    trust_roots: _containers.RepeatedScalarFieldContainer[bytes]
    root_region: str
    hub_addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, certificate_chain_pem: _Optional[bytes] = ..., ca_certificate_pem: _Optional[bytes] = ..., trust_roots: _Optional[_Iterable[bytes]] = ..., root_region: _Optional[str] = ..., hub_addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class RenewFederationCertificateRequest(_message.Message):
    __slots__ = ("csr_pem",)
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    csr_pem: bytes
    def __init__(self, csr_pem: _Optional[bytes] = ...) -> None: ...

class RenewFederationCertificateResponse(_message.Message):
    __slots__ = ("certificate_chain_pem",)
    CERTIFICATE_CHAIN_PEM_FIELD_NUMBER: _ClassVar[int]
    certificate_chain_pem: bytes
    def __init__(self, certificate_chain_pem: _Optional[bytes] = ...) -> None: ...

class RegionMessage(_message.Message):
    __slots__ = ("hello", "applied", "report")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    hello: RegionHello
    applied: SliceApplied
    report: RegionReport
    def __init__(self, hello: _Optional[_Union[RegionHello, _Mapping]] = ..., applied: _Optional[_Union[SliceApplied, _Mapping]] = ..., report: _Optional[_Union[RegionReport, _Mapping]] = ...) -> None: ...

class RegionHello(_message.Message):
    __slots__ = ("region", "generation")
    REGION_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    region: str
    generation: int
    def __init__(self, region: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class SliceApplied(_message.Message):
    __slots__ = ("generation",)
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    generation: int
    def __init__(self, generation: _Optional[int] = ...) -> None: ...

class RootMessage(_message.Message):
    __slots__ = ("slice", "tuf")
    SLICE_FIELD_NUMBER: _ClassVar[int]
    TUF_FIELD_NUMBER: _ClassVar[int]
    slice: RegionSlice
    tuf: TufMetadataSet
    def __init__(self, slice: _Optional[_Union[RegionSlice, _Mapping]] = ..., tuf: _Optional[_Union[TufMetadataSet, _Mapping]] = ...) -> None: ...

class TufMetadataSet(_message.Message):
    __slots__ = ("files", "digest")
    FILES_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[TufMetadataFile]
    digest: str
    def __init__(self, files: _Optional[_Iterable[_Union[TufMetadataFile, _Mapping]]] = ..., digest: _Optional[str] = ...) -> None: ...

class TufMetadataFile(_message.Message):
    __slots__ = ("name", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    data: bytes
    def __init__(self, name: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class RegionSlice(_message.Message):
    __slots__ = ("generation", "objects", "models", "trust_roots", "digest", "agent_release_versions")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    TRUST_ROOTS_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    AGENT_RELEASE_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    generation: int
    objects: _containers.RepeatedScalarFieldContainer[bytes]
    models: _containers.RepeatedCompositeFieldContainer[FederatedModel]
    trust_roots: _containers.RepeatedScalarFieldContainer[bytes]
    digest: str
    agent_release_versions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, generation: _Optional[int] = ..., objects: _Optional[_Iterable[bytes]] = ..., models: _Optional[_Iterable[_Union[FederatedModel, _Mapping]]] = ..., trust_roots: _Optional[_Iterable[bytes]] = ..., digest: _Optional[str] = ..., agent_release_versions: _Optional[_Iterable[str]] = ...) -> None: ...

class FederatedModel(_message.Message):
    __slots__ = ("name", "version", "sha256", "length", "envelope", "extras", "rollback_allowance", "pushed_at")
    class ExtrasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    EXTRAS_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_ALLOWANCE_FIELD_NUMBER: _ClassVar[int]
    PUSHED_AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    sha256: str
    length: int
    envelope: bytes
    extras: _containers.ScalarMap[str, str]
    rollback_allowance: bytes
    pushed_at: float
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., sha256: _Optional[str] = ..., length: _Optional[int] = ..., envelope: _Optional[bytes] = ..., extras: _Optional[_Mapping[str, str]] = ..., rollback_allowance: _Optional[bytes] = ..., pushed_at: _Optional[float] = ...) -> None: ...

class RegionReport(_message.Message):
    __slots__ = ("generation", "deployments", "inventory", "agent_upgrades", "agent_release_versions", "agent_release_refusals")
    class AgentReleaseRefusalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENTS_FIELD_NUMBER: _ClassVar[int]
    INVENTORY_FIELD_NUMBER: _ClassVar[int]
    AGENT_UPGRADES_FIELD_NUMBER: _ClassVar[int]
    AGENT_RELEASE_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    AGENT_RELEASE_REFUSALS_FIELD_NUMBER: _ClassVar[int]
    generation: int
    deployments: _containers.RepeatedCompositeFieldContainer[RegionDeploymentStatus]
    inventory: RegionInventory
    agent_upgrades: _containers.RepeatedCompositeFieldContainer[RegionAgentUpgradeStatus]
    agent_release_versions: _containers.RepeatedScalarFieldContainer[str]
    agent_release_refusals: _containers.ScalarMap[str, str]
    def __init__(self, generation: _Optional[int] = ..., deployments: _Optional[_Iterable[_Union[RegionDeploymentStatus, _Mapping]]] = ..., inventory: _Optional[_Union[RegionInventory, _Mapping]] = ..., agent_upgrades: _Optional[_Iterable[_Union[RegionAgentUpgradeStatus, _Mapping]]] = ..., agent_release_versions: _Optional[_Iterable[str]] = ..., agent_release_refusals: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RegionAgentUpgradeStatus(_message.Message):
    __slots__ = ("name", "version", "phase", "revision", "reason", "message", "pool", "done", "updating", "failed_count", "failed", "root_revision")
    class FailedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    UPDATING_FIELD_NUMBER: _ClassVar[int]
    FAILED_COUNT_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    ROOT_REVISION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    phase: str
    revision: int
    reason: str
    message: str
    pool: int
    done: int
    updating: int
    failed_count: int
    failed: _containers.ScalarMap[str, str]
    root_revision: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., phase: _Optional[str] = ..., revision: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., pool: _Optional[int] = ..., done: _Optional[int] = ..., updating: _Optional[int] = ..., failed_count: _Optional[int] = ..., failed: _Optional[_Mapping[str, str]] = ..., root_revision: _Optional[int] = ...) -> None: ...

class RegionDeploymentStatus(_message.Message):
    __slots__ = ("name", "desired", "updated", "ready", "available", "failing", "versions", "rollout_phase", "rollout_revision", "rollout_template", "stable_template", "rollout_reason", "rollout_message", "revision_figures", "config")
    class FailingEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class VersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESIRED_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    FAILING_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_PHASE_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_REVISION_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    STABLE_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_REASON_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIGURES_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    name: str
    desired: int
    updated: int
    ready: int
    available: int
    failing: _containers.ScalarMap[str, str]
    versions: _containers.ScalarMap[str, int]
    rollout_phase: str
    rollout_revision: int
    rollout_template: str
    stable_template: str
    rollout_reason: str
    rollout_message: str
    revision_figures: _containers.RepeatedCompositeFieldContainer[RegionRevisionFigures]
    config: RegionConfigStatus
    def __init__(self, name: _Optional[str] = ..., desired: _Optional[int] = ..., updated: _Optional[int] = ..., ready: _Optional[int] = ..., available: _Optional[int] = ..., failing: _Optional[_Mapping[str, str]] = ..., versions: _Optional[_Mapping[str, int]] = ..., rollout_phase: _Optional[str] = ..., rollout_revision: _Optional[int] = ..., rollout_template: _Optional[str] = ..., stable_template: _Optional[str] = ..., rollout_reason: _Optional[str] = ..., rollout_message: _Optional[str] = ..., revision_figures: _Optional[_Iterable[_Union[RegionRevisionFigures, _Mapping]]] = ..., config: _Optional[_Union[RegionConfigStatus, _Mapping]] = ...) -> None: ...

class RegionConfigStatus(_message.Message):
    __slots__ = ("model_config", "devices", "running_desired", "not_running_devices", "not_running")
    class NotRunningEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MODEL_CONFIG_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    RUNNING_DESIRED_FIELD_NUMBER: _ClassVar[int]
    NOT_RUNNING_DEVICES_FIELD_NUMBER: _ClassVar[int]
    NOT_RUNNING_FIELD_NUMBER: _ClassVar[int]
    model_config: str
    devices: int
    running_desired: int
    not_running_devices: int
    not_running: _containers.ScalarMap[str, str]
    def __init__(self, model_config: _Optional[str] = ..., devices: _Optional[int] = ..., running_desired: _Optional[int] = ..., not_running_devices: _Optional[int] = ..., not_running: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RegionRevisionFigures(_message.Message):
    __slots__ = ("template", "devices", "requests", "errors", "latency_p95_s", "accuracy", "accuracy_devices", "validation_problems")
    class ValidationProblemsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_P95_S_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_DEVICES_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    template: str
    devices: int
    requests: int
    errors: int
    latency_p95_s: float
    accuracy: float
    accuracy_devices: int
    validation_problems: _containers.ScalarMap[str, str]
    def __init__(self, template: _Optional[str] = ..., devices: _Optional[int] = ..., requests: _Optional[int] = ..., errors: _Optional[int] = ..., latency_p95_s: _Optional[float] = ..., accuracy: _Optional[float] = ..., accuracy_devices: _Optional[int] = ..., validation_problems: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RegionInventory(_message.Message):
    __slots__ = ("total", "by_phase", "devices", "truncated")
    class ByPhaseEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    BY_PHASE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    total: int
    by_phase: _containers.ScalarMap[str, int]
    devices: _containers.RepeatedCompositeFieldContainer[RegionDevice]
    truncated: bool
    def __init__(self, total: _Optional[int] = ..., by_phase: _Optional[_Mapping[str, int]] = ..., devices: _Optional[_Iterable[_Union[RegionDevice, _Mapping]]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class RegionDevice(_message.Message):
    __slots__ = ("name", "phase", "labels", "deployments", "cordoned", "schedulable", "attestation", "last_heartbeat")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENTS_FIELD_NUMBER: _ClassVar[int]
    CORDONED_FIELD_NUMBER: _ClassVar[int]
    SCHEDULABLE_FIELD_NUMBER: _ClassVar[int]
    ATTESTATION_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    name: str
    phase: str
    labels: _containers.ScalarMap[str, str]
    deployments: _containers.RepeatedScalarFieldContainer[str]
    cordoned: bool
    schedulable: bool
    attestation: str
    last_heartbeat: float
    def __init__(self, name: _Optional[str] = ..., phase: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., deployments: _Optional[_Iterable[str]] = ..., cordoned: _Optional[bool] = ..., schedulable: _Optional[bool] = ..., attestation: _Optional[str] = ..., last_heartbeat: _Optional[float] = ...) -> None: ...

class FetchFederatedArtifactRequest(_message.Message):
    __slots__ = ("sha256", "offset")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    offset: int
    def __init__(self, sha256: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class FederatedChunk(_message.Message):
    __slots__ = ("offset", "data")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class FetchFederatedAgentReleaseRequest(_message.Message):
    __slots__ = ("version", "held_sha256")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HELD_SHA256_FIELD_NUMBER: _ClassVar[int]
    version: str
    held_sha256: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[str] = ..., held_sha256: _Optional[_Iterable[str]] = ...) -> None: ...

class FederatedAgentRelease(_message.Message):
    __slots__ = ("version", "arch", "python_abi", "sha256", "length", "envelope")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    PYTHON_ABI_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    version: str
    arch: str
    python_abi: str
    sha256: str
    length: int
    envelope: bytes
    def __init__(self, version: _Optional[str] = ..., arch: _Optional[str] = ..., python_abi: _Optional[str] = ..., sha256: _Optional[str] = ..., length: _Optional[int] = ..., envelope: _Optional[bytes] = ...) -> None: ...

class FederatedAgentReleasePart(_message.Message):
    __slots__ = ("release", "data")
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    release: FederatedAgentRelease
    data: bytes
    def __init__(self, release: _Optional[_Union[FederatedAgentRelease, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...
