"""CA pins, like kubeadm's discovery-token CA cert hash: ``sha256:<hex>`` of a certificate's
SubjectPublicKeyInfo (DER). The hub prints the pin of its CA with every token; a device accepts
only the CA that matches it (``edged enroll --ca-hash``)."""

from __future__ import annotations

import hashlib
import hmac
import re

from edgefleet.errors import CaPinMismatch, PkiError

PIN_PREFIX = "sha256:"


def spki_pin(der_certificate: bytes) -> str:
    """The pin of a DER certificate's public key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert = x509.load_der_x509_certificate(der_certificate)
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return PIN_PREFIX + hashlib.sha256(spki).hexdigest()


def parse_pin(pin: str) -> str:
    """The pin normalised to lower case; PkiError when it is not ``sha256:`` + 64 hex digits."""
    text = pin.strip().lower()
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", text):
        raise PkiError(f"a CA hash must be sha256: followed by 64 hex digits, got {pin!r}")
    return text


def pin_matches(der_certificate: bytes, pin: str) -> bool:
    """Whether the certificate's public key hashes to ``pin`` (an already parsed pin)."""
    return hmac.compare_digest(spki_pin(der_certificate), pin)


def verify_pin(der_certificate: bytes, pin: str) -> None:
    """Raise CaPinMismatch unless the certificate's public key hashes to ``pin``."""
    expected = parse_pin(pin)
    actual = spki_pin(der_certificate)
    if not hmac.compare_digest(actual, expected):
        raise CaPinMismatch(
            f"the hub presented a CA whose hash is {actual}, not the pinned {expected}: "
            "wrong hub, or someone in between"
        )
