"""Sealing secret values: at rest in the hub's store, and in transit to one device.

* **At rest** (:func:`seal_at_rest`, :func:`open_at_rest`): AES-256-GCM with the hub's secret
  key (``D/secrets.key``, 32 random bytes, 0600), a random 96-bit nonce per seal, and the
  secret's name and version as associated data (a sealed value moved to another name or
  version does not open).
* **To a device** (:func:`seal_for_device`, :func:`open_from_hub`): ECIES over the device's
  identity key (P-256, the key its certificate names): an ephemeral P-256 key, ECDH, HKDF-SHA256
  (salt: the ephemeral public point, info: a label and the device's public point) to an
  AES-256-GCM key, used once; associated data binds the device's name, the secret's name and
  version, so a sealed secret replayed to another device, under another name, or as another
  version does not open. Only the holder of the device's private key opens it. A secret with
  ``spec.requireTpm`` is sealed with that flag in the associated data too, so the flag the
  device acts on (it refuses to open one without a TPM attestation key) cannot be dropped
  without the seal failing.

The plaintext of both is :func:`encode_values` (canonical JSON of key -> base64). Nothing here
logs, and errors never carry a value. ``cryptography`` is imported inside the functions.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from edgefleet.errors import EdgefleetError

KEY_BYTES = 32
NONCE_BYTES = 12
_AT_REST = b"edgefleet secret at rest v1"
_TO_DEVICE = b"edgefleet secret to device v1"


class SealError(EdgefleetError):
    """A sealed secret does not open (wrong key, wrong binding, altered bytes)."""


def encode_values(data: Mapping[str, bytes]) -> bytes:
    return orjson.dumps(
        {k: base64.b64encode(v).decode() for k, v in sorted(data.items())},
        option=orjson.OPT_SORT_KEYS,
    )


def decode_values(plain: bytes) -> dict[str, bytes]:
    try:
        doc = orjson.loads(plain)
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        return {str(k): base64.b64decode(str(v), validate=True) for k, v in sorted(doc.items())}
    except ValueError:
        raise SealError("the opened secret is not a set of values") from None


def _aad(*parts: str | int) -> bytes:
    return b"\x00".join(str(p).encode() for p in parts)


def new_key() -> bytes:
    return os.urandom(KEY_BYTES)


@dataclass(frozen=True, slots=True)
class SealedAtRest:
    nonce: bytes
    ciphertext: bytes

    def to_json(self) -> dict[str, str]:
        return {
            "nonce": base64.b64encode(self.nonce).decode(),
            "ciphertext": base64.b64encode(self.ciphertext).decode(),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> SealedAtRest:
        return cls(base64.b64decode(doc["nonce"]), base64.b64decode(doc["ciphertext"]))


def seal_at_rest(key: bytes, name: str, version: int, data: Mapping[str, bytes]) -> SealedAtRest:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(NONCE_BYTES)
    aad = _aad(_AT_REST.decode(), name, version)
    return SealedAtRest(nonce, AESGCM(key).encrypt(nonce, encode_values(data), aad))


def open_at_rest(key: bytes, name: str, version: int, sealed: SealedAtRest) -> dict[str, bytes]:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        plain = AESGCM(key).decrypt(
            sealed.nonce, sealed.ciphertext, _aad(_AT_REST.decode(), name, version)
        )
    except (InvalidTag, ValueError):
        raise SealError(
            f"secret {name} version {version} does not open with this hub's key"
        ) from None
    return decode_values(plain)


@dataclass(frozen=True, slots=True)
class SealedForDevice:
    """One secret version sealed to one device (``DesiredState.secrets``)."""

    name: str
    version: int
    ephemeral_public: bytes  # X9.62 uncompressed point, 65 bytes
    nonce: bytes
    ciphertext: bytes
    require_tpm: bool = False  # the Secret's spec.requireTpm, bound in the associated data

    def to_json(self) -> dict[str, Any]:
        b64 = base64.b64encode
        return {
            "name": self.name,
            "version": self.version,
            "ephemeralPublic": b64(self.ephemeral_public).decode(),
            "nonce": b64(self.nonce).decode(),
            "ciphertext": b64(self.ciphertext).decode(),
            **({"requireTpm": True} if self.require_tpm else {}),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> SealedForDevice:
        b64 = base64.b64decode
        return cls(
            str(doc["name"]),
            int(doc["version"]),
            b64(doc["ephemeralPublic"]),
            b64(doc["nonce"]),
            b64(doc["ciphertext"]),
            doc.get("requireTpm") is True,
        )


def _point(public_key: Any) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    point: bytes = public_key.public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)
    return point


def _transit_key(shared: bytes, ephemeral: bytes, device_point: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    hkdf = HKDF(
        algorithm=hashes.SHA256(), length=KEY_BYTES, salt=ephemeral, info=_TO_DEVICE + device_point
    )
    return hkdf.derive(shared)


def public_key_of(pem: bytes) -> Any:
    """The P-256 public key in a PEM certificate or SubjectPublicKeyInfo; SealError otherwise."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        if b"CERTIFICATE" in pem:
            key: Any = x509.load_pem_x509_certificate(pem).public_key()
        else:
            key = load_pem_public_key(pem)
    except ValueError as exc:
        raise SealError(f"not a public key or certificate: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise SealError("the device's key is not a P-256 key: secrets cannot be sealed to it")
    return key


def _device_aad(device: str, name: str, version: int, require_tpm: bool) -> bytes:
    # the flag only when set: seals made before it existed open as they did
    parts: tuple[str | int, ...] = (_TO_DEVICE.decode(), device, name, version)
    return _aad(*parts, "requireTpm") if require_tpm else _aad(*parts)


def seal_for_device(
    device_public_key: Any,
    device: str,
    name: str,
    version: int,
    data: Mapping[str, bytes],
    *,
    require_tpm: bool = False,
) -> SealedForDevice:
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    ephemeral = ec.generate_private_key(ec.SECP256R1())
    shared = ephemeral.exchange(ec.ECDH(), device_public_key)
    eph_point = _point(ephemeral.public_key())
    key = _transit_key(shared, eph_point, _point(device_public_key))
    nonce = os.urandom(NONCE_BYTES)
    aad = _device_aad(device, name, version, require_tpm)
    return SealedForDevice(
        name,
        version,
        eph_point,
        nonce,
        AESGCM(key).encrypt(nonce, encode_values(data), aad),
        require_tpm,
    )


def open_from_hub(
    exchange: Callable[[Any], bytes],
    device_public_key: Any,
    device: str,
    sealed: SealedForDevice,
) -> dict[str, bytes]:
    """The values of ``sealed``; ``exchange(peer_public_key)`` is the device key's ECDH (the
    private key never leaves its holder). SealError when it does not open."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        peer = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), sealed.ephemeral_public)
        key = _transit_key(exchange(peer), sealed.ephemeral_public, _point(device_public_key))
        plain = AESGCM(key).decrypt(
            sealed.nonce,
            sealed.ciphertext,
            _device_aad(device, sealed.name, sealed.version, sealed.require_tpm),
        )
    except (InvalidTag, ValueError):
        raise SealError(
            f"secret {sealed.name} version {sealed.version} does not open with this device's "
            "key (sealed for another device, name or version, or altered)"
        ) from None
    return decode_values(plain)
