"""DSSE envelopes over canonical JSON, and threshold signature checks (see docs/trust.md).

An envelope is ``{"payloadType": T, "payload": base64(P), "signatures": [{"keyid", "sig"}]}``;
each signature is an Ed25519 signature over ``PAE(T, P)``:
``b"DSSEv1 " + len(T) + b" " + T + b" " + len(P) + b" " + P`` (lengths in ASCII decimal).
Payloads are canonical JSON: sorted keys, no whitespace, UTF-8.

A key id is the SHA-256 (hex) of the raw 32-byte Ed25519 public key.

``cryptography`` is imported only inside the functions that sign or verify, so that importing
this module costs edged nothing while it is idle.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from edgefleet.errors import TrustError

KeyId = str

ARTIFACT_TYPE = "application/vnd.edgefleet.artifact+json"
ROOT_TYPE = "application/vnd.edgefleet.root+json"
ROLLBACK_TYPE = "application/vnd.edgefleet.rollback+json"
EVIDENCE_TYPE = "application/vnd.edgefleet.evidence+json"


def canonical_json(doc: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8 (orjson never escapes non-ASCII)."""
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is actually signed."""
    t = payload_type.encode()
    return b"DSSEv1 %d %b %d %b" % (len(t), t, len(payload), payload)


def key_id(public_raw: bytes) -> KeyId:
    return hashlib.sha256(public_raw).hexdigest()


@dataclass(frozen=True, slots=True)
class Envelope:
    payload_type: str
    payload: bytes
    signatures: tuple[tuple[KeyId, bytes], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "payloadType": self.payload_type,
            "payload": base64.b64encode(self.payload).decode(),
            "signatures": [
                {"keyid": k, "sig": base64.b64encode(s).decode()} for k, s in self.signatures
            ],
        }

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.to_json(), option=orjson.OPT_INDENT_2)

    def with_signature(self, keyid: KeyId, sig: bytes) -> Envelope:
        kept = tuple((k, s) for k, s in self.signatures if k != keyid)
        return Envelope(self.payload_type, self.payload, (*kept, (keyid, sig)))


def parse_envelope(doc: object, *, what: str) -> Envelope:
    """An envelope from decoded JSON; ``TrustError("MalformedEnvelope")`` naming ``what``."""

    def bad(msg: str) -> TrustError:
        return TrustError("MalformedEnvelope", f"{what}: {msg}")

    if not isinstance(doc, dict):
        raise bad("is not a JSON object")
    ptype, payload, sigs = doc.get("payloadType"), doc.get("payload"), doc.get("signatures")
    if not isinstance(ptype, str) or not isinstance(payload, str) or not isinstance(sigs, list):
        raise bad("needs payloadType (string), payload (base64 string) and signatures (list)")
    try:
        raw = base64.b64decode(payload, validate=True)
        parsed = []
        for s in sigs:
            if not isinstance(s, dict) or not isinstance(s.get("keyid"), str):
                raise bad("each signature needs a keyid and a sig")
            sig = s.get("sig")
            if not isinstance(sig, str):
                raise bad("each signature needs a keyid and a sig")
            parsed.append((s["keyid"], base64.b64decode(sig, validate=True)))
    except binascii.Error:
        raise bad("payload or sig is not valid base64") from None
    return Envelope(ptype, raw, tuple(parsed))


def parse_envelope_bytes(data: bytes, *, what: str) -> Envelope:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise TrustError("MalformedEnvelope", f"{what}: is not valid JSON") from None
    return parse_envelope(doc, what=what)


def decode_payload(env: Envelope, *, expected_type: str, what: str) -> dict[str, Any]:
    if env.payload_type != expected_type:
        raise TrustError(
            "WrongPayloadType",
            f"{what}: payloadType is {env.payload_type!r}, expected {expected_type!r}",
        )
    try:
        doc = orjson.loads(env.payload)
    except orjson.JSONDecodeError:
        raise TrustError("MalformedMetadata", f"{what}: payload is not valid JSON") from None
    if not isinstance(doc, dict):
        raise TrustError("MalformedMetadata", f"{what}: payload is not a JSON object")
    return doc


def sign_envelope(
    payload_type: str, doc: Mapping[str, Any], private_keys: Iterable[Any]
) -> Envelope:
    """An envelope over the canonical JSON of ``doc``, signed by each Ed25519 private key."""
    env = Envelope(payload_type, canonical_json(doc), ())
    for key in private_keys:
        env = add_signature(env, key)
    return env


def add_signature(env: Envelope, private_key: Any) -> Envelope:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    raw = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return env.with_signature(key_id(raw), private_key.sign(pae(env.payload_type, env.payload)))


def signature_is_valid(public_raw: bytes, signature: bytes, message: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(public_raw).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def valid_signers(
    env: Envelope, keys: Mapping[KeyId, bytes], allowed: Iterable[KeyId]
) -> frozenset[KeyId]:
    """The distinct allowed key ids with a valid signature on ``env`` (a key counts once)."""
    allowed_set = frozenset(allowed)
    message = pae(env.payload_type, env.payload)
    good: set[KeyId] = set()
    for kid, sig in env.signatures:
        if kid in good or kid not in allowed_set or kid not in keys:
            continue
        if signature_is_valid(keys[kid], sig, message):
            good.add(kid)
    return frozenset(good)


def require_threshold(
    env: Envelope,
    keys: Mapping[KeyId, bytes],
    allowed: Iterable[KeyId],
    threshold: int,
    *,
    what: str,
) -> frozenset[KeyId]:
    """Raise ``UnknownKey`` (no signature by any allowed key) or ``SignatureThresholdNotMet``."""
    allowed_set = frozenset(allowed)
    good = valid_signers(env, keys, allowed_set)
    if len(good) >= threshold:
        return good
    if not any(kid in allowed_set for kid, _ in env.signatures):
        raise TrustError(
            "UnknownKey",
            f"{what}: signed only by keys the trust root does not allow "
            f"({', '.join(k[:12] for k, _ in env.signatures) or 'no signatures'})",
        )
    raise TrustError(
        "SignatureThresholdNotMet",
        f"{what}: {len(good)} valid signature(s) by allowed keys, {threshold} required",
    )
