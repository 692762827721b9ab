import datetime

from edgefleet.v1 import common_pb2 as _common_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PushAgentReleaseResponse(_message.Message):
    __slots__ = ("version", "arch", "python_abi", "sha256", "length", "stored")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    PYTHON_ABI_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    version: str
    arch: str
    python_abi: str
    sha256: str
    length: int
    stored: bool
    def __init__(self, version: _Optional[str] = ..., arch: _Optional[str] = ..., python_abi: _Optional[str] = ..., sha256: _Optional[str] = ..., length: _Optional[int] = ..., stored: _Optional[bool] = ...) -> None: ...

class ListAgentReleasesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AgentRelease(_message.Message):
    __slots__ = ("version", "arch", "python_abi", "sha256", "length", "pushed_at", "signers")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    PYTHON_ABI_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    PUSHED_AT_FIELD_NUMBER: _ClassVar[int]
    SIGNERS_FIELD_NUMBER: _ClassVar[int]
    version: str
    arch: str
    python_abi: str
    sha256: str
    length: int
    pushed_at: _timestamp_pb2.Timestamp
    signers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[str] = ..., arch: _Optional[str] = ..., python_abi: _Optional[str] = ..., sha256: _Optional[str] = ..., length: _Optional[int] = ..., pushed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., signers: _Optional[_Iterable[str]] = ...) -> None: ...

class ListAgentReleasesResponse(_message.Message):
    __slots__ = ("releases",)
    RELEASES_FIELD_NUMBER: _ClassVar[int]
    releases: _containers.RepeatedCompositeFieldContainer[AgentRelease]
    def __init__(self, releases: _Optional[_Iterable[_Union[AgentRelease, _Mapping]]] = ...) -> None: ...

class DeviceLogsRequest(_message.Message):
    __slots__ = ("device_name", "workload", "tail")
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    device_name: str
    workload: str
    tail: int
    def __init__(self, device_name: _Optional[str] = ..., workload: _Optional[str] = ..., tail: _Optional[int] = ...) -> None: ...

class DeviceLogsResponse(_message.Message):
    __slots__ = ("lines",)
    LINES_FIELD_NUMBER: _ClassVar[int]
    lines: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, lines: _Optional[_Iterable[str]] = ...) -> None: ...

class ApplyRequest(_message.Message):
    __slots__ = ("documents", "dry_run", "check_resource_version")
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    CHECK_RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    documents: _containers.RepeatedScalarFieldContainer[bytes]
    dry_run: bool
    check_resource_version: bool
    def __init__(self, documents: _Optional[_Iterable[bytes]] = ..., dry_run: _Optional[bool] = ..., check_resource_version: _Optional[bool] = ...) -> None: ...

class ApplyResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ApplyResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ApplyResult, _Mapping]]] = ...) -> None: ...

class ApplyResult(_message.Message):
    __slots__ = ("kind", "name", "outcome", "resource_version", "warnings")
    class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OUTCOME_UNSPECIFIED: _ClassVar[ApplyResult.Outcome]
        CREATED: _ClassVar[ApplyResult.Outcome]
        CONFIGURED: _ClassVar[ApplyResult.Outcome]
        UNCHANGED: _ClassVar[ApplyResult.Outcome]
    OUTCOME_UNSPECIFIED: ApplyResult.Outcome
    CREATED: ApplyResult.Outcome
    CONFIGURED: ApplyResult.Outcome
    UNCHANGED: ApplyResult.Outcome
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    outcome: ApplyResult.Outcome
    resource_version: int
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., outcome: _Optional[_Union[ApplyResult.Outcome, str]] = ..., resource_version: _Optional[int] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("kind", "name")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("kind", "label_selector", "limit", "continue_token")
    KIND_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    kind: str
    label_selector: str
    limit: int
    continue_token: str
    def __init__(self, kind: _Optional[str] = ..., label_selector: _Optional[str] = ..., limit: _Optional[int] = ..., continue_token: _Optional[str] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("items", "resource_version", "continue_token", "remaining_item_count")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REMAINING_ITEM_COUNT_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[_common_pb2.Object]
    resource_version: int
    continue_token: str
    remaining_item_count: int
    def __init__(self, items: _Optional[_Iterable[_Union[_common_pb2.Object, _Mapping]]] = ..., resource_version: _Optional[int] = ..., continue_token: _Optional[str] = ..., remaining_item_count: _Optional[int] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("kind", "name", "force")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    force: bool
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class CordonRequest(_message.Message):
    __slots__ = ("device_name",)
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    device_name: str
    def __init__(self, device_name: _Optional[str] = ...) -> None: ...

class CordonResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RevokeDeviceRequest(_message.Message):
    __slots__ = ("device_name",)
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    device_name: str
    def __init__(self, device_name: _Optional[str] = ...) -> None: ...

class RevokeDeviceResponse(_message.Message):
    __slots__ = ("serials",)
    SERIALS_FIELD_NUMBER: _ClassVar[int]
    serials: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, serials: _Optional[_Iterable[str]] = ...) -> None: ...

class RevokeRegionRequest(_message.Message):
    __slots__ = ("region",)
    REGION_FIELD_NUMBER: _ClassVar[int]
    region: str
    def __init__(self, region: _Optional[str] = ...) -> None: ...

class RevokeRegionResponse(_message.Message):
    __slots__ = ("serials",)
    SERIALS_FIELD_NUMBER: _ClassVar[int]
    serials: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, serials: _Optional[_Iterable[str]] = ...) -> None: ...

class ListEventsRequest(_message.Message):
    __slots__ = ("kind", "name", "limit")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    limit: int
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListEventsResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, events: _Optional[_Iterable[bytes]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("kind", "resource_version")
    KIND_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    kind: str
    resource_version: int
    def __init__(self, kind: _Optional[str] = ..., resource_version: _Optional[int] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("type", "object")
    class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        TYPE_UNSPECIFIED: _ClassVar[WatchEvent.Type]
        ADDED: _ClassVar[WatchEvent.Type]
        MODIFIED: _ClassVar[WatchEvent.Type]
        DELETED: _ClassVar[WatchEvent.Type]
    TYPE_UNSPECIFIED: WatchEvent.Type
    ADDED: WatchEvent.Type
    MODIFIED: WatchEvent.Type
    DELETED: WatchEvent.Type
    TYPE_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    type: WatchEvent.Type
    object: _common_pb2.Object
    def __init__(self, type: _Optional[_Union[WatchEvent.Type, str]] = ..., object: _Optional[_Union[_common_pb2.Object, _Mapping]] = ...) -> None: ...

class PushArtifactRequest(_message.Message):
    __slots__ = ("header", "chunk", "file")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    header: ArtifactHeader
    chunk: bytes
    file: FileStart
    def __init__(self, header: _Optional[_Union[ArtifactHeader, _Mapping]] = ..., chunk: _Optional[bytes] = ..., file: _Optional[_Union[FileStart, _Mapping]] = ...) -> None: ...

class FileStart(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ArtifactHeader(_message.Message):
    __slots__ = ("signed_metadata", "delegated_targets", "delegated_role")
    SIGNED_METADATA_FIELD_NUMBER: _ClassVar[int]
    DELEGATED_TARGETS_FIELD_NUMBER: _ClassVar[int]
    DELEGATED_ROLE_FIELD_NUMBER: _ClassVar[int]
    signed_metadata: bytes
    delegated_targets: bytes
    delegated_role: str
    def __init__(self, signed_metadata: _Optional[bytes] = ..., delegated_targets: _Optional[bytes] = ..., delegated_role: _Optional[str] = ...) -> None: ...

class PushArtifactResponse(_message.Message):
    __slots__ = ("sha256", "length", "stored", "extras", "reused_bytes")
    class ExtrasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SHA256_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    EXTRAS_FIELD_NUMBER: _ClassVar[int]
    REUSED_BYTES_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    length: int
    stored: bool
    extras: _containers.ScalarMap[str, str]
    reused_bytes: bool
    def __init__(self, sha256: _Optional[str] = ..., length: _Optional[int] = ..., stored: _Optional[bool] = ..., extras: _Optional[_Mapping[str, str]] = ..., reused_bytes: _Optional[bool] = ...) -> None: ...

class CreateTokenRequest(_message.Message):
    __slots__ = ("ttl", "single_use", "description", "labels", "no_device_labels", "device_label_prefix", "for_region")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TTL_FIELD_NUMBER: _ClassVar[int]
    SINGLE_USE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    NO_DEVICE_LABELS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_LABEL_PREFIX_FIELD_NUMBER: _ClassVar[int]
    FOR_REGION_FIELD_NUMBER: _ClassVar[int]
    ttl: _duration_pb2.Duration
    single_use: bool
    description: str
    labels: _containers.ScalarMap[str, str]
    no_device_labels: bool
    device_label_prefix: str
    for_region: str
    def __init__(self, ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., single_use: _Optional[bool] = ..., description: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., no_device_labels: _Optional[bool] = ..., device_label_prefix: _Optional[str] = ..., for_region: _Optional[str] = ...) -> None: ...

class CreateTokenResponse(_message.Message):
    __slots__ = ("token", "expires", "ca_hash", "root_hash")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_FIELD_NUMBER: _ClassVar[int]
    CA_HASH_FIELD_NUMBER: _ClassVar[int]
    ROOT_HASH_FIELD_NUMBER: _ClassVar[int]
    token: str
    expires: _timestamp_pb2.Timestamp
    ca_hash: str
    root_hash: str
    def __init__(self, token: _Optional[str] = ..., expires: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ca_hash: _Optional[str] = ..., root_hash: _Optional[str] = ...) -> None: ...

class RolloutActionRequest(_message.Message):
    __slots__ = ("name", "action", "to_revision", "kind", "full")
    class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ACTION_UNSPECIFIED: _ClassVar[RolloutActionRequest.Action]
        PAUSE: _ClassVar[RolloutActionRequest.Action]
        RESUME: _ClassVar[RolloutActionRequest.Action]
        UNDO: _ClassVar[RolloutActionRequest.Action]
        PROMOTE: _ClassVar[RolloutActionRequest.Action]
        ABORT: _ClassVar[RolloutActionRequest.Action]
        RESTART: _ClassVar[RolloutActionRequest.Action]
    ACTION_UNSPECIFIED: RolloutActionRequest.Action
    PAUSE: RolloutActionRequest.Action
    RESUME: RolloutActionRequest.Action
    UNDO: RolloutActionRequest.Action
    PROMOTE: RolloutActionRequest.Action
    ABORT: RolloutActionRequest.Action
    RESTART: RolloutActionRequest.Action
    NAME_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TO_REVISION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    name: str
    action: RolloutActionRequest.Action
    to_revision: int
    kind: str
    full: bool
    def __init__(self, name: _Optional[str] = ..., action: _Optional[_Union[RolloutActionRequest.Action, str]] = ..., to_revision: _Optional[int] = ..., kind: _Optional[str] = ..., full: _Optional[bool] = ...) -> None: ...

class RolloutActionResponse(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class ListRevisionsRequest(_message.Message):
    __slots__ = ("name", "kind")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ...) -> None: ...

class ListRevisionsResponse(_message.Message):
    __slots__ = ("revisions", "rollout")
    REVISIONS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    revisions: _containers.RepeatedScalarFieldContainer[bytes]
    rollout: bytes
    def __init__(self, revisions: _Optional[_Iterable[bytes]] = ..., rollout: _Optional[bytes] = ...) -> None: ...

class PushRollbackAllowanceRequest(_message.Message):
    __slots__ = ("envelope",)
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    envelope: bytes
    def __init__(self, envelope: _Optional[bytes] = ...) -> None: ...

class PushRollbackAllowanceResponse(_message.Message):
    __slots__ = ("name", "version", "stored")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    stored: bool
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., stored: _Optional[bool] = ...) -> None: ...

class CreateDashboardTokenRequest(_message.Message):
    __slots__ = ("ttl",)
    TTL_FIELD_NUMBER: _ClassVar[int]
    ttl: _duration_pb2.Duration
    def __init__(self, ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class CreateDashboardTokenResponse(_message.Message):
    __slots__ = ("token", "expires", "port")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    token: str
    expires: _timestamp_pb2.Timestamp
    port: int
    def __init__(self, token: _Optional[str] = ..., expires: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., port: _Optional[int] = ...) -> None: ...
