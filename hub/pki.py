"""The hub's certificate authority: ECDSA P-256 keys and X.509 certificates (``cryptography``).

* :func:`create_ca` — the hub CA (10 years by default).
* :func:`issue_serving_certificate` — the hub's TLS server certificate (DNS and IP SANs).
* :func:`issue_client_certificate` — admin, device or child-hub client credentials.
* :func:`sign_device_csr` — a device certificate from a CSR made with the device's own key
  (TPM-backed where there is one). Only the CSR's public key is used: subject and SANs come
  from the enrollment, CSR extensions are never copied. Short-lived (7 days by default).
* Every client certificate names its holder in a URI SAN,
  ``spiffe://edgefleet/<region>/<role>/<name>``, and by its CN; the authorization layer reads
  it back with :func:`identity_from_certificate`.
* CA pinning like kubeadm: :func:`ca_pin` is ``sha256:<hex>`` of the CA certificate's
  SubjectPublicKeyInfo (DER); :func:`verify_ca_pin` checks a presented CA against it.

Private keys are written atomically with mode 0600 (:func:`write_private_key`). Serial numbers
are random (160 bits). Functions take ``now`` so tests choose the time.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from edgefleet import pinning
from edgefleet.api.meta import dns_label
from edgefleet.errors import CsrRejected, IdentityError, PkiError
from edgefleet.persisting import write_atomic

CA_LIFETIME = timedelta(days=3650)
SERVING_LIFETIME = timedelta(days=365)
ADMIN_LIFETIME = timedelta(days=365)
DEVICE_LIFETIME = timedelta(days=7)
CHILD_HUB_LIFETIME = timedelta(days=365)  # a regional hub's federation certificate
CLOCK_SKEW = timedelta(minutes=5)
"""Certificates are valid from this long before ``now``: device clocks drift."""

SPIFFE_TRUST_DOMAIN = "edgefleet"

PrivateKey = ec.EllipticCurvePrivateKey
CsrPublicKey = ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey
_ACCEPTED_CURVES = (ec.SECP256R1, ec.SECP384R1)


class Role(StrEnum):
    """What a certificate's holder is, and so which services it may call."""

    DEVICE = "device"
    ADMIN = "admin"
    HUB = "hub"


@dataclass(frozen=True, slots=True)
class Identity:
    """Who holds a certificate: ``spiffe://edgefleet/<region>/<role>/<name>``."""

    role: Role
    name: str
    region: str

    def __post_init__(self) -> None:
        for what, value in (("name", self.name), ("region", self.region)):
            try:
                dns_label(value)
            except ValueError as exc:
                raise IdentityError(f"identity {what} {exc}") from None

    @property
    def uri(self) -> str:
        return f"spiffe://{SPIFFE_TRUST_DOMAIN}/{self.region}/{self.role.value}/{self.name}"


@dataclass(frozen=True, slots=True)
class CertifiedKey:
    """A certificate and its private key."""

    certificate: x509.Certificate
    key: PrivateKey


def now_utc() -> datetime:
    return datetime.now(UTC)


def generate_key() -> PrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _serial() -> int:
    return secrets.randbits(159) | 1 << 158  # positive, 20 bytes at most (RFC 5280)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: CsrPublicKey, now: datetime, life: timedelta
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(_serial())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + life)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def _leaf_extensions(
    builder: x509.CertificateBuilder, ca: CertifiedKey, usage: x509.ObjectIdentifier
) -> x509.CertificateBuilder:
    return (
        builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )


def create_ca(
    region: str, *, now: datetime | None = None, lifetime: timedelta = CA_LIFETIME
) -> CertifiedKey:
    """A new self-signed CA for the hub of ``region``."""
    now = now or now_utc()
    try:
        dns_label(region)
    except ValueError as exc:
        raise PkiError(f"region {exc}") from None
    key = generate_key()
    name = _name(f"edgefleet hub CA ({region})")
    certificate = (
        _builder(name, name, key.public_key(), now, lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return CertifiedKey(certificate, key)


def _ip_or_dns(value: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(value))
    except ValueError:
        pass
    if not re.fullmatch(r"[A-Za-z0-9*](?:[-A-Za-z0-9.]*[A-Za-z0-9])?", value):
        raise PkiError(
            f"subject alternative name {value!r} is neither an IP address nor a DNS name"
        )
    return x509.DNSName(value)


def uncovered_hosts(certificate: x509.Certificate, hosts: list[str]) -> list[str]:
    """The hosts (DNS names or IP addresses) the certificate's DNS and IP SANs do not cover
    (a ``*.`` DNS name covers one label); pure."""
    try:
        sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return list(hosts)
    dns = {n.lower() for n in sans.get_values_for_type(x509.DNSName)}
    ips = set(sans.get_values_for_type(x509.IPAddress))
    missing = []
    for host in hosts:
        try:
            if ipaddress.ip_address(host) in ips:
                continue
        except ValueError:
            name = host.lower().rstrip(".")
            if name in dns or ("." in name and "*." + name.split(".", 1)[1] in dns):
                continue
        missing.append(host)
    return missing


def issue_serving_certificate(
    ca: CertifiedKey,
    identity: Identity,
    sans: list[str],
    *,
    now: datetime | None = None,
    lifetime: timedelta = SERVING_LIFETIME,
) -> CertifiedKey:
    """The hub's TLS server certificate for ``sans`` (DNS names and IP addresses)."""
    if identity.role is not Role.HUB:
        raise PkiError(f"a serving certificate is for a hub, not a {identity.role.value}")
    if not sans:
        raise PkiError("a serving certificate needs at least one DNS name or IP address")
    now = now or now_utc()
    key = generate_key()
    names: list[x509.GeneralName] = [_ip_or_dns(s) for s in dict.fromkeys(sans)]
    names.append(x509.UniformResourceIdentifier(identity.uri))
    certificate = (
        _leaf_extensions(
            _builder(_name(identity.name), ca.certificate.subject, key.public_key(), now, lifetime),
            ca,
            ExtendedKeyUsageOID.SERVER_AUTH,
        )
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return CertifiedKey(certificate, key)


def _client_certificate(
    ca: CertifiedKey,
    identity: Identity,
    public_key: CsrPublicKey,
    now: datetime,
    lifetime: timedelta,
) -> x509.Certificate:
    return (
        _leaf_extensions(
            _builder(_name(identity.name), ca.certificate.subject, public_key, now, lifetime),
            ca,
            ExtendedKeyUsageOID.CLIENT_AUTH,
        )
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(identity.uri)]),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )


def issue_client_certificate(
    ca: CertifiedKey,
    identity: Identity,
    *,
    now: datetime | None = None,
    lifetime: timedelta = ADMIN_LIFETIME,
) -> CertifiedKey:
    """A new key and a client certificate naming ``identity`` (admins, child hubs, tests)."""
    key = generate_key()
    cert = _client_certificate(ca, identity, key.public_key(), now or now_utc(), lifetime)
    return CertifiedKey(cert, key)


def load_csr(csr_pem: bytes) -> x509.CertificateSigningRequest:
    """A CSR whose self-signature verifies and whose key is P-256, P-384 or Ed25519."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as exc:
        raise CsrRejected(f"not a PEM certificate signing request: {exc}") from None
    try:
        valid = csr.is_signature_valid
    except (ValueError, InvalidSignature, x509.UnsupportedGeneralNameType) as exc:
        raise CsrRejected(f"the CSR's signature cannot be checked: {exc}") from None
    if not valid:
        raise CsrRejected("the CSR's signature does not verify with its public key")
    key = csr.public_key()
    if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, _ACCEPTED_CURVES):
        return csr
    if isinstance(key, ed25519.Ed25519PublicKey):
        return csr
    raise CsrRejected("the CSR's key must be ECDSA P-256, ECDSA P-384 or Ed25519")


def sign_device_csr(
    ca: CertifiedKey,
    csr_pem: bytes,
    identity: Identity,
    *,
    now: datetime | None = None,
    lifetime: timedelta = DEVICE_LIFETIME,
) -> x509.Certificate:
    """A certificate for ``identity`` on the CSR's public key. The CSR's subject and extensions
    are ignored: what the certificate says comes only from ``identity``."""
    if identity.role is not Role.DEVICE:
        raise PkiError(f"sign_device_csr signs device certificates, not {identity.role.value}")
    public_key = load_csr(csr_pem).public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey)
    return _client_certificate(ca, identity, public_key, now or now_utc(), lifetime)


def sign_child_hub_csr(
    ca: CertifiedKey,
    csr_pem: bytes,
    identity: Identity,
    *,
    now: datetime | None = None,
    lifetime: timedelta = CHILD_HUB_LIFETIME,
) -> x509.Certificate:
    """A hub-role client certificate for a regional hub (federation, :mod:`hub.api.federation`) on
    the CSR's public key; like :func:`sign_device_csr`, only ``identity`` decides what it says."""
    if identity.role is not Role.HUB:
        raise PkiError(f"sign_child_hub_csr signs hub certificates, not {identity.role.value}")
    public_key = load_csr(csr_pem).public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey)
    return _client_certificate(ca, identity, public_key, now or now_utc(), lifetime)


def public_key_pem(certificate: x509.Certificate) -> str:
    """The certificate's public key as PEM (SubjectPublicKeyInfo)."""
    return (
        certificate.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


def identity_from_certificate(certificate: x509.Certificate | bytes) -> Identity:
    """The identity in a client certificate (DER or PEM bytes, or parsed).

    This only reads; the TLS handshake has already verified the chain to the hub CA.
    """
    cert = load_certificate(certificate) if isinstance(certificate, bytes) else certificate
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise IdentityError("the certificate has no subject alternative names") from None
    prefix = f"spiffe://{SPIFFE_TRUST_DOMAIN}/"
    uris = [
        u for u in sans.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith(prefix)
    ]
    if len(uris) != 1:
        raise IdentityError(
            f"the certificate must carry exactly one {prefix} URI, found {len(uris)}"
        )
    parts = uris[0][len(prefix) :].split("/")
    roles = {r.value: r for r in Role}
    if len(parts) != 3 or parts[1] not in roles:
        raise IdentityError(f"{uris[0]}: expected {prefix}<region>/<device|admin|hub>/<name>")
    region, role, name = parts
    return Identity(roles[role], name, region)


def identity_from_auth_context(auth_context: Mapping[str, Sequence[bytes]]) -> Identity:
    """The verified peer's identity from a grpc ``context.auth_context()`` (mutual TLS)."""
    pems = auth_context.get("x509_pem_cert") or ()
    if not pems:
        raise IdentityError("the peer presented no client certificate")
    return identity_from_certificate(pems[0])


def load_certificate(data: bytes) -> x509.Certificate:
    """A certificate from PEM or DER bytes."""
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            return x509.load_pem_x509_certificate(data)
        return x509.load_der_x509_certificate(data)
    except ValueError as exc:
        raise PkiError(f"not an X.509 certificate: {exc}") from None


def certificate_pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def private_key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


# CA pinning


def ca_pin(ca_certificate: x509.Certificate) -> str:
    """``sha256:<hex>`` of the CA's SubjectPublicKeyInfo (:mod:`edgefleet.pinning`)."""
    return pinning.spki_pin(ca_certificate.public_bytes(serialization.Encoding.DER))


def verify_ca_pin(ca_certificate: x509.Certificate, pin: str) -> None:
    """Raise CaPinMismatch unless the CA's public key hashes to ``pin``."""
    pinning.verify_pin(ca_certificate.public_bytes(serialization.Encoding.DER), pin)


# Files


def write_private_key(path: Path, key: PrivateKey) -> None:
    """Atomically, mode 0600 from the start (never readable by others, even briefly)."""
    write_atomic(path, private_key_pem(key), mode=0o600)


def write_certificate(path: Path, *certificates: x509.Certificate) -> None:
    write_atomic(path, b"".join(certificate_pem(c) for c in certificates), mode=0o644)


def load_certified_key(certificate_path: Path, key_path: Path) -> CertifiedKey:
    try:
        cert = load_certificate(certificate_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except OSError as exc:
        raise PkiError(f"cannot read {exc.filename}: {exc.strerror}") from None
    except ValueError as exc:
        raise PkiError(f"{key_path}: not a PEM private key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PkiError(f"{key_path}: expected an ECDSA key")
    if key.public_key() != cert.public_key():
        raise PkiError(f"{key_path} is not the key of {certificate_path}")
    return CertifiedKey(cert, key)
