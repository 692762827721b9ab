"""Secrets at the hub: sealed at rest, versioned, sealed again to each device that needs one.

* The hub's secret key is ``D/secrets.key`` (32 random bytes, 0600, made at the first
  ``hub serve`` or ``hub init``; a file readable by others is refused). Hub replicas on etcd
  must hold the same file (copied like ``ca.key``). :class:`SecretKeys` is the hub's key
  ring: ``secrets.key`` seals, and ``secrets.key.next`` (a rotation under way) and
  ``secrets.key.old`` (the key before the last rotation) open too; each record names the key
  it is sealed under (``keyId``). A rotation (``hub secrets rotate-key``:
  :mod:`hub.state.secretkeys`) changes the files under a running hub, which reads them again.
* A Secret is stored under ``/objects/Secret/NAME`` like every kind, its manifest *redacted*
  (``spec.keys`` only) and beside it ``"secret": {"version", "keys", "nonce",
  "ciphertext"}`` (AES-256-GCM, the name and version as associated data:
  :mod:`edgefleet.sealing`). Its version starts at 1 and grows by one with every apply that
  changes a value; an apply with the same values is unchanged.
* :func:`hub.decide.desired.secret_refs` (pure, importable from here) says which secrets (name,
  version) a device is owed: those its workloads mount, none when a SecurityBaseline requires
  attestation and the device's last verdict is not Trusted, and those with ``spec.requireTpm``
  only when the device is TPM-attested (:func:`hub.decide.placement.tpm_attested`; a deployment
  mounting one is not placed on other devices: :func:`hub.decide.placement.secret_tpm_mismatch`).
  The references are part of the desired state's digest, so a new version is a new generation.
  :func:`seal_for` seals them to the device's certificate key when the state is sent (never
  stored so).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgefleet.api import ModelDeployment
from edgefleet.api.secrets import Secret
from edgefleet.errors import EdgefleetError
from edgefleet.logs import get_logger
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
from hub.decide.desired import secret_refs

__all__ = ["secret_refs"]  # decided in hub.decide.desired, importable from here as before

log = get_logger(__name__)

KEY_FILE = "secrets.key"
NEXT_KEY_FILE = "secrets.key.next"  # made by a rotation before anything is sealed under it
OLD_KEY_FILE = "secrets.key.old"  # the key before the last rotation (backups made before it)
MAX_SECRETS = 256
"""The most Secrets one hub holds (each at most 64 KiB: api/secrets.py)."""


class SecretKeyError(EdgefleetError):
    """The hub's secret key cannot be read or made."""


def read_key(path: Path) -> bytes:
    """A key file: 0600 (or stricter) and :data:`KEY_BYTES` bytes, else SecretKeyError."""
    if path.stat().st_mode & 0o077:
        raise SecretKeyError(f"{path} is readable by others: chmod 600 it")
    key = path.read_bytes()
    if len(key) != KEY_BYTES:
        raise SecretKeyError(f"{path} must hold {KEY_BYTES} bytes, it holds {len(key)}")
    return key


def load_or_create_key(data_dir: Path) -> bytes:
    """``D/secrets.key``, made (0600) when missing."""
    path = Path(data_dir) / KEY_FILE
    if not path.exists():
        write_atomic(path, new_key(), mode=0o600)
    return read_key(path)


def key_id(key: bytes) -> str:
    """A key's name in the records sealed under it (a digest: it reveals nothing of the key)."""
    return hashlib.sha256(b"edgefleet secrets key id\x00" + key).hexdigest()[:16]


class SecretKeys:
    """The hub's key ring for Secrets at rest (module doc): :attr:`current` seals; every key
    this ring has seen opens. With a data directory, the key files are read again when one of
    them changes (a rotation by ``hub secrets rotate-key`` while the hub serves); a key once
    read is never dropped from memory, so the records a running hub holds keep opening."""

    def __init__(self, current: bytes = b"", *, data_dir: Path | None = None) -> None:
        self._dir = Path(data_dir) if data_dir is not None else None
        self._stamp: tuple[object, ...] | None = None
        self._by_id: dict[str, bytes] = {}
        self.current = b""
        self.current_id = ""
        if current:
            self._add(current, current=True)

    @classmethod
    def load(cls, data_dir: Path, *, create: bool = True) -> SecretKeys:
        """The key ring of ``data_dir`` (``secrets.key`` made when missing and ``create``)."""
        if create:
            load_or_create_key(data_dir)
        keys = cls(data_dir=data_dir)
        keys.refresh(strict=True)
        return keys

    def _add(self, key: bytes, *, current: bool = False) -> None:
        self._by_id[key_id(key)] = key
        if current:
            self.current, self.current_id = key, key_id(key)

    def _files(self) -> tuple[Path, Path, Path]:
        assert self._dir is not None
        return (self._dir / KEY_FILE, self._dir / NEXT_KEY_FILE, self._dir / OLD_KEY_FILE)

    def _stamp_now(self) -> tuple[object, ...]:
        out: list[object] = []
        for path in self._files():
            try:
                st = path.stat()
                out.append((st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode))
            except FileNotFoundError:
                out.append(None)
        return tuple(out)

    def refresh(self, *, strict: bool = False) -> None:
        """Read the key files again if one changed. A file that cannot be read is an error
        with ``strict`` (at start); otherwise it is logged and the keys held are kept."""
        if self._dir is None:
            return
        stamp = self._stamp_now()  # before reading: a change while reading is seen next time
        if stamp == self._stamp:
            return
        current_path, *others = self._files()
        try:
            current = read_key(current_path)
            extra = []
            for path in others:
                try:
                    extra.append(read_key(path))
                except FileNotFoundError:
                    continue
        except (OSError, SecretKeyError) as exc:
            if strict:
                raise SecretKeyError(f"the hub's secret keys: {exc}") from None
            log.error("secret keys unreadable", error=str(exc))
            return
        for key in extra:
            self._add(key)
        self._add(current, current=True)
        self._stamp = stamp

    def open(self, record: SecretRecord) -> dict[str, bytes]:
        """The values of ``record``, with the key it names (the files read again when it is
        not known); a record that names none is tried with each. SealError when none opens."""
        key = self._by_id.get(record.key_id)
        if key is None and record.key_id:
            self.refresh()
            key = self._by_id.get(record.key_id)
        for candidate in [key] if key is not None else list(self._by_id.values()):
            try:
                return record.open(candidate)
            except SealError:
                continue
        raise SealError(
            f"secret {record.name} version {record.version} does not open with any of this "
            f"hub's keys (sealed under {record.key_id or 'an unnamed key'}; secrets.key, "
            "secrets.key.next and secrets.key.old are read)"
        )


@dataclass(frozen=True, slots=True)
class SecretRecord:
    """A Secret as the hub keeps it: values sealed with the hub's key."""

    name: str
    version: int
    keys: tuple[str, ...]
    sealed: SealedAtRest
    size: int = 0  # bytes of the values together
    key_id: str = ""  # the hub key it is sealed under (:func:`key_id`; "": before keys had ids)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "keys": list(self.keys),
            "size": self.size,
            **self.sealed.to_json(),
            **({"keyId": self.key_id} if self.key_id else {}),
        }

    @classmethod
    def from_json(cls, name: str, doc: Mapping[str, Any]) -> SecretRecord:
        return cls(
            name,
            int(doc["version"]),
            tuple(str(k) for k in doc["keys"]),
            SealedAtRest.from_json(doc),
            int(doc.get("size", 0)),
            str(doc.get("keyId", "")),
        )

    def open(self, key: bytes) -> dict[str, bytes]:
        return open_at_rest(key, self.name, self.version, self.sealed)


def record_of(value: Mapping[str, Any], name: str) -> SecretRecord | None:
    """The sealed record stored beside a Secret's manifest (``None`` for other kinds)."""
    doc = value.get("secret")
    return SecretRecord.from_json(name, doc) if isinstance(doc, Mapping) else None


def plan_record(
    keys: SecretKeys, secret: Secret, stored: SecretRecord | None
) -> tuple[SecretRecord, bool]:
    """The record to store for ``secret`` and whether its values changed (a new version),
    given what is stored. Same values: the stored record itself (same version, same bytes).
    A new one is sealed under the current key (the files read again first)."""
    keys.refresh()
    key = keys.current
    if len(key) != KEY_BYTES:
        raise SecretKeyError("this hub has no secret key (D/secrets.key): Secrets are refused")
    try:
        same = stored is not None and keys.open(stored) == dict(secret.data)
    except SealError:  # sealed under a key not held (a restored store): applying re-seals
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
        keys.current_id,
    )
    return record, True


def mounted_by(deployments: Iterable[ModelDeployment]) -> set[str]:
    return {m.name for d in deployments for m in d.spec.secrets}


def seal_for(
    device: str,
    device_public_key: Any,
    refs: Iterable[tuple[str, int]],
    records: Mapping[str, SecretRecord],
    keys: SecretKeys,
    *,
    tpm_secrets: Collection[str] = frozenset(),
    tpm_key: Any = None,
) -> list[SealedForDevice]:
    """Each referenced secret sealed to the device's key (a version that moved on meanwhile is
    sent at its new version: the newer state follows). One of ``tpm_secrets`` is sealed to
    the device's TPM sealing key ``tpm_key`` instead, with its ``requireTpm`` bound in (only
    that TPM opens it); without ``tpm_key`` it is not sealed at all."""
    out = []
    for name, _ in refs:
        record = records.get(name)
        if record is None:
            continue
        tpm = name in tpm_secrets
        if tpm and tpm_key is None:
            continue
        out.append(
            seal_for_device(
                tpm_key if tpm else device_public_key,
                device,
                name,
                record.version,
                keys.open(record),
                require_tpm=tpm,
            )
        )
    return out
