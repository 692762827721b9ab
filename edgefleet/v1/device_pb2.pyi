import datetime

from edgefleet.v1 import common_pb2 as _common_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeviceMessage(_message.Message):
    __slots__ = ("hello", "status", "ack", "heartbeat", "attestation_evidence", "log_lines")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    ATTESTATION_EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    LOG_LINES_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    status: Status
    ack: Ack
    heartbeat: Heartbeat
    attestation_evidence: AttestationEvidence
    log_lines: DeviceLogLines
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., status: _Optional[_Union[Status, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., attestation_evidence: _Optional[_Union[AttestationEvidence, _Mapping]] = ..., log_lines: _Optional[_Union[DeviceLogLines, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("device_name", "inventory", "labels", "health", "applied_generation", "edged_version")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    INVENTORY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    APPLIED_GENERATION_FIELD_NUMBER: _ClassVar[int]
    EDGED_VERSION_FIELD_NUMBER: _ClassVar[int]
    device_name: str
    inventory: _struct_pb2.Struct
    labels: _containers.ScalarMap[str, str]
    health: _common_pb2.Health
    applied_generation: int
    edged_version: str
    def __init__(self, device_name: _Optional[str] = ..., inventory: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., health: _Optional[_Union[_common_pb2.Health, _Mapping]] = ..., applied_generation: _Optional[int] = ..., edged_version: _Optional[str] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ("workloads", "health", "observed_generation", "compliance", "labels", "agent")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKLOADS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_GENERATION_FIELD_NUMBER: _ClassVar[int]
    COMPLIANCE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    workloads: _containers.RepeatedCompositeFieldContainer[WorkloadStatus]
    health: _common_pb2.Health
    observed_generation: int
    compliance: DeviceCompliance
    labels: _containers.ScalarMap[str, str]
    agent: AgentStatus
    def __init__(self, workloads: _Optional[_Iterable[_Union[WorkloadStatus, _Mapping]]] = ..., health: _Optional[_Union[_common_pb2.Health, _Mapping]] = ..., observed_generation: _Optional[int] = ..., compliance: _Optional[_Union[DeviceCompliance, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., agent: _Optional[_Union[AgentStatus, _Mapping]] = ...) -> None: ...

class AgentStatus(_message.Message):
    __slots__ = ("version", "slot", "committed_version", "phase", "desired_version", "reason", "message", "tries", "changed_at", "arch", "python_abi", "launcher", "bytes_done", "bytes_total", "upgrade", "upgrade_revision")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    DESIRED_VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRIES_FIELD_NUMBER: _ClassVar[int]
    CHANGED_AT_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    PYTHON_ABI_FIELD_NUMBER: _ClassVar[int]
    LAUNCHER_FIELD_NUMBER: _ClassVar[int]
    BYTES_DONE_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    UPGRADE_FIELD_NUMBER: _ClassVar[int]
    UPGRADE_REVISION_FIELD_NUMBER: _ClassVar[int]
    version: str
    slot: str
    committed_version: str
    phase: str
    desired_version: str
    reason: str
    message: str
    tries: int
    changed_at: _timestamp_pb2.Timestamp
    arch: str
    python_abi: str
    launcher: bool
    bytes_done: int
    bytes_total: int
    upgrade: str
    upgrade_revision: int
    def __init__(self, version: _Optional[str] = ..., slot: _Optional[str] = ..., committed_version: _Optional[str] = ..., phase: _Optional[str] = ..., desired_version: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., tries: _Optional[int] = ..., changed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., arch: _Optional[str] = ..., python_abi: _Optional[str] = ..., launcher: _Optional[bool] = ..., bytes_done: _Optional[int] = ..., bytes_total: _Optional[int] = ..., upgrade: _Optional[str] = ..., upgrade_revision: _Optional[int] = ...) -> None: ...

class DeviceCompliance(_message.Message):
    __slots__ = ("checked", "compliant", "action", "findings", "quarantined", "processes_checked", "opens_watched", "opens_watch_reason")
    CHECKED_FIELD_NUMBER: _ClassVar[int]
    COMPLIANT_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_CHECKED_FIELD_NUMBER: _ClassVar[int]
    OPENS_WATCHED_FIELD_NUMBER: _ClassVar[int]
    OPENS_WATCH_REASON_FIELD_NUMBER: _ClassVar[int]
    checked: bool
    compliant: bool
    action: str
    findings: _containers.RepeatedCompositeFieldContainer[ComplianceFinding]
    quarantined: str
    processes_checked: bool
    opens_watched: bool
    opens_watch_reason: str
    def __init__(self, checked: _Optional[bool] = ..., compliant: _Optional[bool] = ..., action: _Optional[str] = ..., findings: _Optional[_Iterable[_Union[ComplianceFinding, _Mapping]]] = ..., quarantined: _Optional[str] = ..., processes_checked: _Optional[bool] = ..., opens_watched: _Optional[bool] = ..., opens_watch_reason: _Optional[str] = ...) -> None: ...

class ComplianceFinding(_message.Message):
    __slots__ = ("kind", "subject", "message")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    subject: str
    message: str
    def __init__(self, kind: _Optional[str] = ..., subject: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class WorkloadStatus(_message.Message):
    __slots__ = ("name", "revision", "ready_replicas", "desired_replicas", "conditions", "model_version", "revisions", "sizing", "replica_sandboxes", "last_termination", "restart_count", "model_config")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    READY_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    DESIRED_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    REVISIONS_FIELD_NUMBER: _ClassVar[int]
    SIZING_FIELD_NUMBER: _ClassVar[int]
    REPLICA_SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    LAST_TERMINATION_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    MODEL_CONFIG_FIELD_NUMBER: _ClassVar[int]
    name: str
    revision: str
    ready_replicas: int
    desired_replicas: int
    conditions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Condition]
    model_version: str
    revisions: _containers.RepeatedCompositeFieldContainer[RevisionStatus]
    sizing: WorkloadSizing
    replica_sandboxes: _containers.RepeatedCompositeFieldContainer[ReplicaSandbox]
    last_termination: ReplicaTermination
    restart_count: int
    model_config: ModelConfigStatus
    def __init__(self, name: _Optional[str] = ..., revision: _Optional[str] = ..., ready_replicas: _Optional[int] = ..., desired_replicas: _Optional[int] = ..., conditions: _Optional[_Iterable[_Union[_common_pb2.Condition, _Mapping]]] = ..., model_version: _Optional[str] = ..., revisions: _Optional[_Iterable[_Union[RevisionStatus, _Mapping]]] = ..., sizing: _Optional[_Union[WorkloadSizing, _Mapping]] = ..., replica_sandboxes: _Optional[_Iterable[_Union[ReplicaSandbox, _Mapping]]] = ..., last_termination: _Optional[_Union[ReplicaTermination, _Mapping]] = ..., restart_count: _Optional[int] = ..., model_config: _Optional[_Union[ModelConfigStatus, _Mapping]] = ...) -> None: ...

class ModelConfigStatus(_message.Message):
    __slots__ = ("digest", "error")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    digest: str
    error: str
    def __init__(self, digest: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class ReplicaTermination(_message.Message):
    __slots__ = ("replica", "reason", "message", "exit_code", "signal", "finished_at")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    replica: str
    reason: str
    message: str
    exit_code: int
    signal: int
    finished_at: _timestamp_pb2.Timestamp
    def __init__(self, replica: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WorkloadSizing(_message.Message):
    __slots__ = ("current_replicas", "desired_replicas", "min_replicas", "max_replicas", "last_decision", "evicted_replicas", "priority", "effective_max_batch_size", "queue_depth", "cpu_percent")
    CURRENT_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    DESIRED_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MIN_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MAX_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LAST_DECISION_FIELD_NUMBER: _ClassVar[int]
    EVICTED_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    current_replicas: int
    desired_replicas: int
    min_replicas: int
    max_replicas: int
    last_decision: ScalingDecision
    evicted_replicas: int
    priority: int
    effective_max_batch_size: int
    queue_depth: float
    cpu_percent: float
    def __init__(self, current_replicas: _Optional[int] = ..., desired_replicas: _Optional[int] = ..., min_replicas: _Optional[int] = ..., max_replicas: _Optional[int] = ..., last_decision: _Optional[_Union[ScalingDecision, _Mapping]] = ..., evicted_replicas: _Optional[int] = ..., priority: _Optional[int] = ..., effective_max_batch_size: _Optional[int] = ..., queue_depth: _Optional[float] = ..., cpu_percent: _Optional[float] = ...) -> None: ...

class ScalingDecision(_message.Message):
    __slots__ = ("from_replicas", "to_replicas", "reason", "message", "at")
    FROM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TO_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    from_replicas: int
    to_replicas: int
    reason: str
    message: str
    at: _timestamp_pb2.Timestamp
    def __init__(self, from_replicas: _Optional[int] = ..., to_replicas: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ReplicaSandbox(_message.Message):
    __slots__ = ("replica", "revision", "mode", "landlock_abi", "filesystem", "network", "no_new_privs", "seccomp", "scoped", "connect_ports", "uid", "problems", "separate_uid", "connect_to")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    LANDLOCK_ABI_FIELD_NUMBER: _ClassVar[int]
    FILESYSTEM_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    NO_NEW_PRIVS_FIELD_NUMBER: _ClassVar[int]
    SECCOMP_FIELD_NUMBER: _ClassVar[int]
    SCOPED_FIELD_NUMBER: _ClassVar[int]
    CONNECT_PORTS_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    SEPARATE_UID_FIELD_NUMBER: _ClassVar[int]
    CONNECT_TO_FIELD_NUMBER: _ClassVar[int]
    replica: str
    revision: str
    mode: str
    landlock_abi: int
    filesystem: bool
    network: bool
    no_new_privs: bool
    seccomp: bool
    scoped: bool
    connect_ports: _containers.RepeatedScalarFieldContainer[int]
    uid: int
    problems: _containers.RepeatedScalarFieldContainer[str]
    separate_uid: bool
    connect_to: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, replica: _Optional[str] = ..., revision: _Optional[str] = ..., mode: _Optional[str] = ..., landlock_abi: _Optional[int] = ..., filesystem: _Optional[bool] = ..., network: _Optional[bool] = ..., no_new_privs: _Optional[bool] = ..., seccomp: _Optional[bool] = ..., scoped: _Optional[bool] = ..., connect_ports: _Optional[_Iterable[int]] = ..., uid: _Optional[int] = ..., problems: _Optional[_Iterable[str]] = ..., separate_uid: _Optional[bool] = ..., connect_to: _Optional[_Iterable[str]] = ...) -> None: ...

class RevisionStatus(_message.Message):
    __slots__ = ("revision", "model_version", "sha256", "phase", "ready_replicas", "reason", "message", "wanted", "metrics", "validation", "bytes_done", "bytes_total", "benchmark")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    READY_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    WANTED_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_FIELD_NUMBER: _ClassVar[int]
    BYTES_DONE_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BENCHMARK_FIELD_NUMBER: _ClassVar[int]
    revision: str
    model_version: str
    sha256: str
    phase: str
    ready_replicas: int
    reason: str
    message: str
    wanted: bool
    metrics: RevisionMetrics
    validation: RevisionValidation
    bytes_done: int
    bytes_total: int
    benchmark: RevisionBenchmark
    def __init__(self, revision: _Optional[str] = ..., model_version: _Optional[str] = ..., sha256: _Optional[str] = ..., phase: _Optional[str] = ..., ready_replicas: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., wanted: _Optional[bool] = ..., metrics: _Optional[_Union[RevisionMetrics, _Mapping]] = ..., validation: _Optional[_Union[RevisionValidation, _Mapping]] = ..., bytes_done: _Optional[int] = ..., bytes_total: _Optional[int] = ..., benchmark: _Optional[_Union[RevisionBenchmark, _Mapping]] = ...) -> None: ...

class RevisionBenchmark(_message.Message):
    __slots__ = ("p95_seconds", "runs")
    P95_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    p95_seconds: float
    runs: int
    def __init__(self, p95_seconds: _Optional[float] = ..., runs: _Optional[int] = ...) -> None: ...

class RevisionMetrics(_message.Message):
    __slots__ = ("requests", "errors", "latency_p95_seconds", "latency_window_seconds", "window_requests")
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_P95_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: int
    errors: int
    latency_p95_seconds: float
    latency_window_seconds: float
    window_requests: int
    def __init__(self, requests: _Optional[int] = ..., errors: _Optional[int] = ..., latency_p95_seconds: _Optional[float] = ..., latency_window_seconds: _Optional[float] = ..., window_requests: _Optional[int] = ...) -> None: ...

class RevisionValidation(_message.Message):
    __slots__ = ("accuracy", "samples", "correct", "reason", "message")
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    accuracy: float
    samples: int
    correct: int
    reason: str
    message: str
    def __init__(self, accuracy: _Optional[float] = ..., samples: _Optional[int] = ..., correct: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("generation",)
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    generation: int
    def __init__(self, generation: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AttestationEvidence(_message.Message):
    __slots__ = ("nonce", "evidence")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    evidence: bytes
    def __init__(self, nonce: _Optional[bytes] = ..., evidence: _Optional[bytes] = ...) -> None: ...

class HubMessage(_message.Message):
    __slots__ = ("desired_state", "attestation_challenge", "heartbeat_ack", "log_request")
    DESIRED_STATE_FIELD_NUMBER: _ClassVar[int]
    ATTESTATION_CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_ACK_FIELD_NUMBER: _ClassVar[int]
    LOG_REQUEST_FIELD_NUMBER: _ClassVar[int]
    desired_state: DesiredState
    attestation_challenge: AttestationChallenge
    heartbeat_ack: HeartbeatAck
    log_request: DeviceLogRequest
    def __init__(self, desired_state: _Optional[_Union[DesiredState, _Mapping]] = ..., attestation_challenge: _Optional[_Union[AttestationChallenge, _Mapping]] = ..., heartbeat_ack: _Optional[_Union[HeartbeatAck, _Mapping]] = ..., log_request: _Optional[_Union[DeviceLogRequest, _Mapping]] = ...) -> None: ...

class DeviceLogRequest(_message.Message):
    __slots__ = ("request_id", "workload", "tail")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    workload: str
    tail: int
    def __init__(self, request_id: _Optional[int] = ..., workload: _Optional[str] = ..., tail: _Optional[int] = ...) -> None: ...

class DeviceLogLines(_message.Message):
    __slots__ = ("request_id", "lines")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    lines: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_id: _Optional[int] = ..., lines: _Optional[_Iterable[str]] = ...) -> None: ...

class DesiredState(_message.Message):
    __slots__ = ("generation", "manifests", "artifact_metadata", "rollback_allowances", "heartbeat_interval", "trust_roots", "secrets", "agent", "model_configs")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    MANIFESTS_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_METADATA_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_ALLOWANCES_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    TRUST_ROOTS_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    MODEL_CONFIGS_FIELD_NUMBER: _ClassVar[int]
    generation: int
    manifests: _containers.RepeatedScalarFieldContainer[bytes]
    artifact_metadata: _containers.RepeatedScalarFieldContainer[bytes]
    rollback_allowances: _containers.RepeatedScalarFieldContainer[bytes]
    heartbeat_interval: _duration_pb2.Duration
    trust_roots: _containers.RepeatedScalarFieldContainer[bytes]
    secrets: _containers.RepeatedCompositeFieldContainer[SealedSecret]
    agent: DesiredAgent
    model_configs: _containers.RepeatedCompositeFieldContainer[ModelConfigDocument]
    def __init__(self, generation: _Optional[int] = ..., manifests: _Optional[_Iterable[bytes]] = ..., artifact_metadata: _Optional[_Iterable[bytes]] = ..., rollback_allowances: _Optional[_Iterable[bytes]] = ..., heartbeat_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., trust_roots: _Optional[_Iterable[bytes]] = ..., secrets: _Optional[_Iterable[_Union[SealedSecret, _Mapping]]] = ..., agent: _Optional[_Union[DesiredAgent, _Mapping]] = ..., model_configs: _Optional[_Iterable[_Union[ModelConfigDocument, _Mapping]]] = ...) -> None: ...

class ModelConfigDocument(_message.Message):
    __slots__ = ("workload", "document", "digest")
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    workload: str
    document: bytes
    digest: str
    def __init__(self, workload: _Optional[str] = ..., document: _Optional[bytes] = ..., digest: _Optional[str] = ...) -> None: ...

class DesiredAgent(_message.Message):
    __slots__ = ("version", "signed_metadata", "upgrade", "upgrade_revision", "commit_deadline", "max_tries")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SIGNED_METADATA_FIELD_NUMBER: _ClassVar[int]
    UPGRADE_FIELD_NUMBER: _ClassVar[int]
    UPGRADE_REVISION_FIELD_NUMBER: _ClassVar[int]
    COMMIT_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    MAX_TRIES_FIELD_NUMBER: _ClassVar[int]
    version: str
    signed_metadata: bytes
    upgrade: str
    upgrade_revision: int
    commit_deadline: _duration_pb2.Duration
    max_tries: int
    def __init__(self, version: _Optional[str] = ..., signed_metadata: _Optional[bytes] = ..., upgrade: _Optional[str] = ..., upgrade_revision: _Optional[int] = ..., commit_deadline: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_tries: _Optional[int] = ...) -> None: ...

class SealedSecret(_message.Message):
    __slots__ = ("name", "version", "ephemeral_public_key", "nonce", "ciphertext", "require_tpm")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EPHEMERAL_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    CIPHERTEXT_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_TPM_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    ephemeral_public_key: bytes
    nonce: bytes
    ciphertext: bytes
    require_tpm: bool
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., ephemeral_public_key: _Optional[bytes] = ..., nonce: _Optional[bytes] = ..., ciphertext: _Optional[bytes] = ..., require_tpm: _Optional[bool] = ...) -> None: ...

class AttestationChallenge(_message.Message):
    __slots__ = ("nonce", "pcr_selection")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    PCR_SELECTION_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    pcr_selection: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, nonce: _Optional[bytes] = ..., pcr_selection: _Optional[_Iterable[int]] = ...) -> None: ...

class HeartbeatAck(_message.Message):
    __slots__ = ("heartbeat_interval",)
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval: _duration_pb2.Duration
    def __init__(self, heartbeat_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class RenewCertificateRequest(_message.Message):
    __slots__ = ("csr_pem",)
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    csr_pem: bytes
    def __init__(self, csr_pem: _Optional[bytes] = ...) -> None: ...

class RenewCertificateResponse(_message.Message):
    __slots__ = ("certificate_chain_pem",)
    CERTIFICATE_CHAIN_PEM_FIELD_NUMBER: _ClassVar[int]
    certificate_chain_pem: bytes
    def __init__(self, certificate_chain_pem: _Optional[bytes] = ...) -> None: ...

class ActivateAttestationKeyRequest(_message.Message):
    __slots__ = ("secret", "sealing_key_public", "sealing_key_attest", "sealing_key_signature_r", "sealing_key_signature_s")
    SECRET_FIELD_NUMBER: _ClassVar[int]
    SEALING_KEY_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    SEALING_KEY_ATTEST_FIELD_NUMBER: _ClassVar[int]
    SEALING_KEY_SIGNATURE_R_FIELD_NUMBER: _ClassVar[int]
    SEALING_KEY_SIGNATURE_S_FIELD_NUMBER: _ClassVar[int]
    secret: bytes
    sealing_key_public: bytes
    sealing_key_attest: bytes
    sealing_key_signature_r: bytes
    sealing_key_signature_s: bytes
    def __init__(self, secret: _Optional[bytes] = ..., sealing_key_public: _Optional[bytes] = ..., sealing_key_attest: _Optional[bytes] = ..., sealing_key_signature_r: _Optional[bytes] = ..., sealing_key_signature_s: _Optional[bytes] = ...) -> None: ...

class ActivateAttestationKeyResponse(_message.Message):
    __slots__ = ("sealing_key_recorded", "sealing_key_refused")
    SEALING_KEY_RECORDED_FIELD_NUMBER: _ClassVar[int]
    SEALING_KEY_REFUSED_FIELD_NUMBER: _ClassVar[int]
    sealing_key_recorded: bool
    sealing_key_refused: str
    def __init__(self, sealing_key_recorded: _Optional[bool] = ..., sealing_key_refused: _Optional[str] = ...) -> None: ...

class FetchArtifactRequest(_message.Message):
    __slots__ = ("sha256", "offset")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    offset: int
    def __init__(self, sha256: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class ArtifactChunk(_message.Message):
    __slots__ = ("offset", "data")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...
