from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class EnrollRequest(_message.Message):
    __slots__ = ("token", "csr_pem", "name", "labels", "ek_certificate", "ek_public", "ak_public", "hostname")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    EK_CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    EK_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    AK_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    token: str
    csr_pem: bytes
    name: str
    labels: _containers.ScalarMap[str, str]
    ek_certificate: bytes
    ek_public: bytes
    ak_public: bytes
    hostname: str
    def __init__(self, token: _Optional[str] = ..., csr_pem: _Optional[bytes] = ..., name: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., ek_certificate: _Optional[bytes] = ..., ek_public: _Optional[bytes] = ..., ak_public: _Optional[bytes] = ..., hostname: _Optional[str] = ...) -> None: ...

class EnrollResponse(_message.Message):
    __slots__ = ("certificate_chain_pem", "ca_certificate_pem", "trust_root", "device_name", "ak_credential_blob", "ak_encrypted_secret", "ak_refused", "hub_addresses")
    CERTIFICATE_CHAIN_PEM_FIELD_NUMBER: _ClassVar[int]
    CA_CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    TRUST_ROOT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    AK_CREDENTIAL_BLOB_FIELD_NUMBER: _ClassVar[int]
    AK_ENCRYPTED_SECRET_FIELD_NUMBER: _ClassVar[int]
    AK_REFUSED_FIELD_NUMBER: _ClassVar[int]
    HUB_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    certificate_chain_pem: bytes
    ca_certificate_pem: bytes
    trust_root: bytes
    device_name: str
    ak_credential_blob: bytes
    ak_encrypted_secret: bytes
    ak_refused: str
    hub_addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, certificate_chain_pem: _Optional[bytes] = ..., ca_certificate_pem: _Optional[bytes] = ..., trust_root: _Optional[bytes] = ..., device_name: _Optional[str] = ..., ak_credential_blob: _Optional[bytes] = ..., ak_encrypted_secret: _Optional[bytes] = ..., ak_refused: _Optional[str] = ..., hub_addresses: _Optional[_Iterable[str]] = ...) -> None: ...
