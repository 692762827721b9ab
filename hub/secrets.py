"""Secrets at the hub: sealed at rest, versioned, sealed again to each device that needs one.

* The hub's secret key is ``D/secrets.key`` (32 random bytes, 0600, made at the first
  ``hub serve`` or ``hub init``; a file readable by others is refused). Hub replicas on etcd
  must hold the same file (copied like ``ca.key``).
* A Secret is stored under ``/objects/Secret/NAME`` like every kind, its manifest *redacted*
  (``spec.keys`` only) and beside it ``"secret": {"version", "keys", "nonce",
  "ciphertext"}`` (AES-256-GCM, the name and version as associated data:
  :mod:`edgefleet.sealing`). Its version starts at 1 and grows by one with every apply that
  changes a value; an apply with the same values is unchanged.
* :func:`secret_refs` (pure) says which secrets (name, version) a device is owed: those its
  workloads mount, none when a SecurityBaseline requires attestation and the device's last
  verdict is not Trusted. The references are part of the desired state's digest, so a new
  version is a new generation. :func:`seal_for` seals them to the device's certificate key
  when the state is sent (never stored so).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgefleet.api import ModelDeployment
from edgefleet.api.secrets import Secret
from edgefleet.errors import EdgefleetError
from edgefleet.persisting import write_atomic
from edgefleet.sealing import (
    KEY_BYTES,
    SealedAtRest,
    SealedForDevice,
    SealError,
    new_key,
    open_at_rest,
    seal_at_rest,
    seal_for_device,
)

KEY_FILE = "secrets.key"
MAX_SECRETS = 256
"""The most Secrets one hub holds (each at most 64 KiB: api/secrets.py)."""


class SecretKeyError(EdgefleetError):
    """The hub's secret key cannot be read or made."""


def load_or_create_key(data_dir: Path) -> bytes:
    """``D/secrets.key``, made (0600) when missing."""
    path = Path(data_dir) / KEY_FILE
    if not path.exists():
        write_atomic(path, new_key(), mode=0o600)
    if path.stat().st_mode & 0o077:
        raise SecretKeyError(f"{path} is readable by others: chmod 600 it")
    key = path.read_bytes()
    if len(key) != KEY_BYTES:
        raise SecretKeyError(f"{path} must hold {KEY_BYTES} bytes, it holds {len(key)}")
    return key


@dataclass(frozen=True, slots=True)
class SecretRecord:
    """A Secret as the hub keeps it: values sealed with the hub's key."""

    name: str
    version: int
    keys: tuple[str, ...]
    sealed: SealedAtRest
    size: int = 0  # bytes of the values together

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "keys": list(self.keys),
            "size": self.size,
            **self.sealed.to_json(),
        }

    @classmethod
    def from_json(cls, name: str, doc: Mapping[str, Any]) -> SecretRecord:
        return cls(
            name,
            int(doc["version"]),
            tuple(str(k) for k in doc["keys"]),
            SealedAtRest.from_json(doc),
            int(doc.get("size", 0)),
        )

    def open(self, key: bytes) -> dict[str, bytes]:
        return open_at_rest(key, self.name, self.version, self.sealed)


def record_of(value: Mapping[str, Any], name: str) -> SecretRecord | None:
    """The sealed record stored beside a Secret's manifest (``None`` for other kinds)."""
    doc = value.get("secret")
    return SecretRecord.from_json(name, doc) if isinstance(doc, Mapping) else None


def plan_record(
    key: bytes, secret: Secret, stored: SecretRecord | None
) -> tuple[SecretRecord, bool]:
    """The record to store for ``secret`` and whether its values changed (a new version),
    given what is stored. Same values: the stored record itself (same version, same bytes)."""
    if len(key) != KEY_BYTES:
        raise SecretKeyError("this hub has no secret key (D/secrets.key): Secrets are refused")
    try:
        same = stored is not None and stored.open(key) == dict(secret.data)
    except SealError:  # sealed under another key (a restored store): applying again re-seals
        same = False
    if same and stored is not None:
        return stored, False
    version = stored.version + 1 if stored is not None else 1
    record = SecretRecord(
        secret.name,
        version,
        secret.keys,
        seal_at_rest(key, secret.name, version, secret.data),
        sum(len(v) for v in secret.data.values()),
    )
    return record, True


def mounted_by(deployments: Iterable[ModelDeployment]) -> set[str]:
    return {m.name for d in deployments for m in d.spec.secrets}


def secret_refs(
    mounted: Iterable[str],
    records: Mapping[str, SecretRecord],
    *,
    require_attestation: bool,
    trusted: bool,
) -> tuple[tuple[str, int], ...]:
    """Pure: the (name, version) of every secret a device is sent: mounted by a workload it
    runs, existing, and — when attestation is required — only to a trusted device."""
    if require_attestation and not trusted:
        return ()
    return tuple(sorted((name, records[name].version) for name in set(mounted) if name in records))


def seal_for(
    device: str,
    device_public_key: Any,
    refs: Iterable[tuple[str, int]],
    records: Mapping[str, SecretRecord],
    key: bytes,
) -> list[SealedForDevice]:
    """Each referenced secret sealed to the device's key (a version that moved on meanwhile is
    sent at its new version: the newer state follows)."""
    out = []
    for name, _ in refs:
        record = records.get(name)
        if record is None:
            continue
        out.append(
            seal_for_device(device_public_key, device, name, record.version, record.open(key))
        )
    return out
