"""The signed documents of the trust system, parsed into frozen dataclasses (pure, no I/O).

* :class:`Root` — the fleet trust root: keys by id, roles ``root`` and ``artifacts`` (key ids
  and a threshold each), a version and an expiry.
* :class:`ArtifactMetadata` — a publisher's description of one artifact version: name,
  version, precision, every file's sha256 and length, created/expires, metadata version.
* :class:`RollbackAllowance` — permission to install an older model version: name, version,
  the sha256 of its model file, expiry.

Times are RFC 3339 UTC strings in documents (``2030-01-01T00:00:00Z``) and float epoch
seconds in the dataclasses. Every parse error is a ``TrustError("MalformedMetadata")`` that
names the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from edgefleet.errors import TrustError
from edgefleet.trust.envelopes import KeyId

ROLE_ROOT = "root"
ROLE_ARTIFACTS = "artifacts"
FILE_ROLES = ("model", "extra")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def format_time(epoch: float) -> str:
    return datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: object, field: str, what: str) -> float:
    if isinstance(value, str) and value.endswith("Z"):
        try:
            return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
        except ValueError:
            pass
    raise _bad(
        what, field, f"must be an RFC 3339 UTC time such as 2030-01-01T00:00:00Z, got {value!r}"
    )


def _bad(what: str, field: str, msg: str) -> TrustError:
    return TrustError("MalformedMetadata", f"{what}: {field}: {msg}")


def _str(doc: Mapping[str, Any], field: str, what: str) -> str:
    v = doc.get(field)
    if not isinstance(v, str) or not v:
        raise _bad(what, field, "must be a non-empty string")
    return v


def _int(doc: Mapping[str, Any], field: str, what: str, minimum: int = 1) -> int:
    v = doc.get(field)
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise _bad(what, field, f"must be an integer >= {minimum}")
    return v


def _type(doc: Mapping[str, Any], expected: str, what: str) -> None:
    if doc.get("_type") != expected:
        raise _bad(what, "_type", f"must be {expected!r}")


@dataclass(frozen=True, slots=True)
class RoleSpec:
    keyids: frozenset[KeyId]
    threshold: int


@dataclass(frozen=True, slots=True)
class Root:
    version: int
    expires: float
    keys: Mapping[KeyId, bytes]  # raw Ed25519 public keys
    roles: Mapping[str, RoleSpec]

    def role(self, name: str) -> RoleSpec:
        return self.roles[name]


def parse_root(doc: Mapping[str, Any], *, what: str = "trust root") -> Root:
    _type(doc, "root", what)
    version = _int(doc, "version", what)
    expires = parse_time(doc.get("expires"), "expires", what)
    raw_keys = doc.get("keys")
    if not isinstance(raw_keys, dict):
        raise _bad(what, "keys", "must be an object of key id -> key")
    keys: dict[KeyId, bytes] = {}
    from edgefleet.trust.envelopes import key_id

    for kid, k in raw_keys.items():
        if not isinstance(k, dict) or k.get("keytype") != "ed25519":
            raise _bad(what, f"keys.{kid}", 'must be {"keytype": "ed25519", "public": HEX}')
        try:
            raw = bytes.fromhex(str(k.get("public", "")))
        except ValueError:
            raw = b""
        if len(raw) != 32:
            raise _bad(what, f"keys.{kid}.public", "must be 64 hexadecimal digits")
        if key_id(raw) != kid:
            raise _bad(what, f"keys.{kid}", "key id is not the sha256 of the public key")
        keys[kid] = raw
    raw_roles = doc.get("roles")
    if not isinstance(raw_roles, dict):
        raise _bad(what, "roles", "must be an object")
    roles: dict[str, RoleSpec] = {}
    for name in (ROLE_ROOT, ROLE_ARTIFACTS):
        r = raw_roles.get(name)
        if not isinstance(r, dict):
            raise _bad(what, f"roles.{name}", "is required")
        ids = r.get("keyids")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            raise _bad(what, f"roles.{name}.keyids", "must be a non-empty list of key ids")
        for i in ids:
            if i not in keys:
                raise _bad(what, f"roles.{name}.keyids", f"{i} is not in keys")
        threshold = _int(r, "threshold", f"{what}: roles.{name}")
        if threshold > len(set(ids)):
            raise _bad(what, f"roles.{name}.threshold", f"{threshold} is more than its keys")
        roles[name] = RoleSpec(frozenset(ids), threshold)
    return Root(version, expires, keys, roles)


@dataclass(frozen=True, slots=True)
class FileInfo:
    sha256: str
    length: int
    role: str  # "model" or "extra"


@dataclass(frozen=True, slots=True)
class ArtifactMetadata:
    name: str
    version: str
    precision: str | None
    metadata_version: int
    created: float
    expires: float
    files: Mapping[str, FileInfo]  # by file name

    def model_file(self) -> tuple[str, FileInfo]:
        return next((n, f) for n, f in self.files.items() if f.role == "model")


def parse_artifact(doc: Mapping[str, Any], *, what: str = "artifact metadata") -> ArtifactMetadata:
    _type(doc, "artifact", what)
    files: dict[str, FileInfo] = {}
    raw_files = doc.get("files")
    if not isinstance(raw_files, dict) or not raw_files:
        raise _bad(what, "files", "must be a non-empty object of file name -> file")
    for fname, f in raw_files.items():
        at = f"files.{fname}"
        if not isinstance(f, dict) or "/" in fname or fname in ("", ".", ".."):
            raise _bad(what, at, "must be a plain file name with sha256, length and role")
        sha = f.get("sha256")
        if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
            raise _bad(what, f"{at}.sha256", "must be 64 lowercase hexadecimal digits")
        if f.get("role") not in FILE_ROLES:
            raise _bad(what, f"{at}.role", f"must be one of {', '.join(FILE_ROLES)}")
        files[fname] = FileInfo(sha, _int(f, "length", what, minimum=0), str(f["role"]))
    if sum(1 for f in files.values() if f.role == "model") != 1:
        raise _bad(what, "files", "must have exactly one file with role model")
    precision = doc.get("precision")
    if precision is not None and not isinstance(precision, str):
        raise _bad(what, "precision", "must be a string or null")
    return ArtifactMetadata(
        name=_str(doc, "name", what),
        version=_str(doc, "version", what),
        precision=precision,
        metadata_version=_int(doc, "metadataVersion", what),
        created=parse_time(doc.get("created"), "created", what),
        expires=parse_time(doc.get("expires"), "expires", what),
        files=files,
    )


@dataclass(frozen=True, slots=True)
class RollbackAllowance:
    name: str
    version: str
    sha256: str  # of the model file: the allowance names these exact bytes
    expires: float


def parse_rollback(
    doc: Mapping[str, Any], *, what: str = "rollback allowance"
) -> RollbackAllowance:
    _type(doc, "rollback", what)
    sha = doc.get("sha256")
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise _bad(
            what,
            "sha256",
            "must be the model file's sha256, 64 lowercase hexadecimal digits (an allowance "
            "binds name, version and bytes)",
        )
    return RollbackAllowance(
        name=_str(doc, "name", what),
        version=_str(doc, "version", what),
        sha256=sha,
        expires=parse_time(doc.get("expires"), "expires", what),
    )
