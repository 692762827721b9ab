"""CA pins, like kubeadm's discovery-token CA cert hash: ``sha256:<hex>`` of a certificate's
SubjectPublicKeyInfo (DER). The hub prints the pin of its CA with every token; a device accepts
only the CA that matches it (``edged enroll --ca-hash``)."""

from __future__ import annotations

import hashlib
import hmac
import re
import socket
import ssl
from typing import Any

from edgefleet.errors import CaPinMismatch, PkiError

PIN_PREFIX = "sha256:"

MAX_PRESENTED = 16
"""The most certificates a presented chain is read to (a longer one is cut): a chain is a
leaf, its CA and perhaps an intermediate; the server is not trusted yet."""


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


def fetch_presented_chain(host: str, port: int, *, timeout: float = 10.0) -> list[bytes]:
    """The certificates (DER) the server at ``host:port`` presents over TLS (ALPN h2), read
    *without* verifying them: the caller trusts one of them only if it matches a pin
    (:func:`find_pinned`). OSError when the server cannot be reached or the handshake fails;
    the caller says which port it meant."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    with (
        socket.create_connection((host, port), timeout=timeout) as raw,
        ctx.wrap_socket(raw, server_hostname=host) as tls,
    ):
        # Public from Python 3.13; the same method of the underlying object before.
        getter: Any = getattr(tls, "get_unverified_chain", None)
        if getter is None:
            getter = getattr(tls, "_sslobj").get_unverified_chain  # noqa: B009
        der = getattr(getattr(ssl, "_ssl", None), "ENCODING_DER", 2)
        chain = getter() or []
        return [c if isinstance(c, bytes) else c.public_bytes(der) for c in chain[:MAX_PRESENTED]]


def find_pinned(chain: list[bytes], pin: str) -> bytes | None:
    """The certificate of ``chain`` (DER) whose public key matches ``pin`` (already parsed,
    :func:`parse_pin`), as PEM; None when none does."""
    for der in chain:
        if pin_matches(der, pin):
            return ssl.DER_cert_to_PEM_cert(der).encode()
    return None
