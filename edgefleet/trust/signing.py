"""Publisher side: key pairs, signed artifact metadata, trust roots and rollback allowances.

Used by ``edgectl keys generate``, ``edgectl models sign``, ``edgectl trust root ...`` and
``edgectl rollback allow``, and by the hub (``hub init`` makes the quickstart's root,
``edgectl models push`` signs before uploading). Every function here returns data or writes
exactly the files it names; keys are Ed25519 (``cryptography``), PEM on disk, the private key
mode 0600.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from edgefleet.errors import TrustError
from edgefleet.persisting import write_atomic
from edgefleet.trust.documents import ROLE_ARTIFACTS, ROLE_ROOT, format_time, parse_root
from edgefleet.trust.envelopes import (
    ARTIFACT_TYPE,
    ROLLBACK_TYPE,
    ROOT_TYPE,
    Envelope,
    KeyId,
    add_signature,
    decode_payload,
    key_id,
    parse_envelope_bytes,
    sign_envelope,
)
from edgefleet.trust.versions import require_comparable_version

CHUNK = 1 << 20
DAY = 86400.0


# -- keys -----------------------------------------------------------------------------------


def generate_key_pair(prefix: Path) -> KeyId:
    """Write ``PREFIX.key`` (PKCS#8 PEM, mode 0600) and ``PREFIX.pub``; return the key id."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
        PublicFormat,
    )

    key = Ed25519PrivateKey.generate()
    priv = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    pub = key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    prefix = Path(prefix)
    write_atomic(prefix.with_name(prefix.name + ".key"), priv, mode=0o600)
    write_atomic(prefix.with_name(prefix.name + ".pub"), pub, mode=0o644)
    return key_id(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))


def load_private_key(path: Path) -> Any:
    """An Ed25519 private key from a PEM file (``TrustError("BadKey")`` otherwise)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise TrustError("BadKey", f"{path}: not a readable PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise TrustError("BadKey", f"{path}: not an Ed25519 key")
    return key


def load_public_key_raw(path: Path) -> bytes:
    """The raw 32 bytes of an Ed25519 public key in a PEM file (``.pub``; a ``.key`` works too)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        PublicFormat,
        load_pem_public_key,
    )

    data = Path(path).read_bytes()
    if b"PRIVATE KEY" in data:
        pub = load_private_key(path).public_key()
    else:
        try:
            pub = load_pem_public_key(data)
        except ValueError as exc:
            raise TrustError("BadKey", f"{path}: not a PEM public key ({exc})") from None
    if not isinstance(pub, Ed25519PublicKey):
        raise TrustError("BadKey", f"{path}: not an Ed25519 key")
    raw: bytes = pub.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return raw


def parse_duration_days(text: str) -> float:
    """``90d``, ``12h``, ``30m`` or seconds, to seconds."""
    units = {"d": DAY, "h": 3600.0, "m": 60.0, "s": 1.0}
    t = text.strip()
    try:
        if t and t[-1] in units:
            return float(t[:-1]) * units[t[-1]]
        return float(t)
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90d, 12h)") from None


# -- artifacts ------------------------------------------------------------------------------


def describe_file(path: Path, role: str) -> dict[str, Any]:
    h = hashlib.sha256()
    length = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            length += len(chunk)
    return {"sha256": h.hexdigest(), "length": length, "role": role}


def build_artifact_metadata(
    model: Path,
    *,
    name: str,
    version: str,
    extras: Sequence[Path] = (),
    precision: str | None = None,
    expires_in_s: float = 90 * DAY,
    metadata_version: int | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The metadata payload for a model file and its extras (hashes every file). A version
    that cannot be compared (``dev``) is refused: devices would refuse it anyway."""
    require_comparable_version(version, what=f"{name} --version")
    now = time.time() if now is None else now
    files = {Path(model).name: describe_file(model, "model")}
    for extra in extras:
        if Path(extra).name in files:
            raise ValueError(f"two files named {Path(extra).name!r}")
        files[Path(extra).name] = describe_file(extra, "extra")
    return {
        "_type": "artifact",
        "name": name,
        "version": version,
        "precision": precision,
        # Default: seconds since the epoch, so that a later signing is always higher.
        "metadataVersion": metadata_version if metadata_version is not None else int(now),
        "created": format_time(now),
        "expires": format_time(now + expires_in_s),
        "files": files,
    }


def sign_artifact(
    model: Path,
    *,
    name: str,
    version: str,
    keys: Iterable[Path],
    extras: Sequence[Path] = (),
    precision: str | None = None,
    expires_in_s: float = 90 * DAY,
    metadata_version: int | None = None,
    out: Path | None = None,
    now: float | None = None,
) -> tuple[Path, Envelope]:
    """Sign ``model`` (+ extras) with each key; write the envelope to ``out`` (default
    ``MODEL.metadata.json``) and return where it went and the envelope."""
    doc = build_artifact_metadata(
        model,
        name=name,
        version=version,
        extras=extras,
        precision=precision,
        expires_in_s=expires_in_s,
        metadata_version=metadata_version,
        now=now,
    )
    env = sign_envelope(ARTIFACT_TYPE, doc, [load_private_key(k) for k in keys])
    target = out or Path(model).with_name(Path(model).name + ".metadata.json")
    write_atomic(target, env.to_bytes(), mode=0o644)
    return target, env


def sign_rollback_allowance(
    *,
    name: str,
    version: str,
    sha256: str,
    keys: Iterable[Path],
    expires_in_s: float = 7 * DAY,
    now: float | None = None,
) -> Envelope:
    """Allow devices to go back to ``name`` ``version`` — exactly the model file whose
    digest is ``sha256`` (the one in that version's signed metadata)."""
    require_comparable_version(version, what=f"{name} --version")
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise ValueError(f"sha256 must be 64 lowercase hexadecimal digits, got {sha256!r}")
    now = time.time() if now is None else now
    doc = {
        "_type": "rollback",
        "name": name,
        "version": version,
        "sha256": sha256,
        "expires": format_time(now + expires_in_s),
    }
    return sign_envelope(ROLLBACK_TYPE, doc, [load_private_key(k) for k in keys])


# -- trust roots ----------------------------------------------------------------------------


def build_root(
    *,
    root_keys: Sequence[bytes],
    artifact_keys: Sequence[bytes],
    threshold: int = 1,
    root_threshold: int | None = None,
    version: int = 1,
    expires_in_s: float = 365 * DAY,
    now: float | None = None,
) -> dict[str, Any]:
    """A root payload from raw public keys; ``threshold`` applies to artifacts (and to root
    unless ``root_threshold`` is given). Validated by parsing it back."""
    now = time.time() if now is None else now
    keys = {
        key_id(k): {"keytype": "ed25519", "scheme": "ed25519", "public": k.hex()}
        for k in (*root_keys, *artifact_keys)
    }
    doc = {
        "_type": "root",
        "version": version,
        "expires": format_time(now + expires_in_s),
        "keys": keys,
        "roles": {
            ROLE_ROOT: {
                "keyids": sorted({key_id(k) for k in root_keys}),
                "threshold": root_threshold or threshold,
            },
            ROLE_ARTIFACTS: {
                "keyids": sorted({key_id(k) for k in artifact_keys}),
                "threshold": threshold,
            },
        },
    }
    parse_root(doc)
    return doc


def create_root(
    *,
    root_keys: Sequence[Path],
    artifact_keys: Sequence[Path],
    threshold: int = 1,
    root_threshold: int | None = None,
    expires_in_s: float = 365 * DAY,
    out: Path | None = None,
    now: float | None = None,
) -> Envelope:
    """A version-1 root signed by every given root private key (``root_keys`` are ``.key``
    files; ``artifact_keys`` public ``.pub`` files). Written to ``out`` when given."""
    privs = [load_private_key(k) for k in root_keys]
    doc = build_root(
        root_keys=[load_public_key_raw(k) for k in root_keys],
        artifact_keys=[load_public_key_raw(k) for k in artifact_keys],
        threshold=threshold,
        root_threshold=root_threshold,
        expires_in_s=expires_in_s,
        now=now,
    )
    env = sign_envelope(ROOT_TYPE, doc, privs)
    if out is not None:
        write_atomic(out, env.to_bytes(), mode=0o644)
    return env


def rotate_root(
    current: Path,
    *,
    root_keys: Sequence[Path],
    artifact_keys: Sequence[Path],
    threshold: int = 1,
    root_threshold: int | None = None,
    expires_in_s: float = 365 * DAY,
    now: float | None = None,
) -> Envelope:
    """The next root (version + 1) with new root keys (private ``root_keys``) and artifact
    keys. It still needs the old root keys' signatures: ``sign_root(env, old_keys)``."""
    old_env = parse_envelope_bytes(Path(current).read_bytes(), what=str(current))
    old = parse_root(decode_payload(old_env, expected_type=ROOT_TYPE, what=str(current)))
    doc = build_root(
        root_keys=[load_public_key_raw(k) for k in root_keys],
        artifact_keys=[load_public_key_raw(k) for k in artifact_keys],
        threshold=threshold,
        root_threshold=root_threshold,
        version=old.version + 1,
        expires_in_s=expires_in_s,
        now=now,
    )
    return sign_envelope(ROOT_TYPE, doc, [load_private_key(k) for k in root_keys])


def sign_root(env: Envelope, keys: Iterable[Path]) -> Envelope:
    """Add signatures (e.g. the old root keys' on a rotated root)."""
    for k in keys:
        env = add_signature(env, load_private_key(k))
    return env


def write_envelope(env: Envelope, out: Path) -> None:
    write_atomic(out, env.to_bytes(), mode=0o644)


def read_envelope(path: Path) -> Envelope:
    return parse_envelope_bytes(Path(path).read_bytes(), what=str(path))


def file_mode_ok(path: Path) -> bool:
    return (os.stat(path).st_mode & 0o077) == 0
