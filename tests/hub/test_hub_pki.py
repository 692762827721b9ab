"""The hub CA with real keys and certificates: identities, CSR signing, CA pins, key files."""

from __future__ import annotations

import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID

from edgefleet.errors import CaPinMismatch, CsrRejected, IdentityError, PkiError
from hub import pki

NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.fixture(scope="module")
def ca() -> pki.CertifiedKey:
    return pki.create_ca("eu-frankfurt", now=NOW)


def _csr(key: ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey, cn: str = "evil") -> bytes:
    builder = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier("spiffe://edgefleet/eu-frankfurt/admin/root")]
            ),
            critical=False,
        )
    )
    algorithm = None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    return builder.sign(key, algorithm).public_bytes(serialization.Encoding.PEM)


def test_ca_is_a_ten_year_p256_ca(ca: pki.CertifiedKey) -> None:
    cert = ca.certificate
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.not_valid_after_utc - NOW == timedelta(days=3650)
    cert.verify_directly_issued_by(cert)


def test_serving_certificate_names_every_san(ca: pki.CertifiedKey) -> None:
    hub = pki.Identity(pki.Role.HUB, "hub-1", "eu-frankfurt")
    served = pki.issue_serving_certificate(
        ca, hub, ["localhost", "127.0.0.1", "::1", "hub.example"], now=NOW
    )
    sans = served.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert sans.value.get_values_for_type(x509.DNSName) == ["localhost", "hub.example"]
    assert [str(ip) for ip in sans.value.get_values_for_type(x509.IPAddress)] == [
        "127.0.0.1",
        "::1",
    ]
    assert pki.identity_from_certificate(served.certificate) == hub
    served.certificate.verify_directly_issued_by(ca.certificate)
    with pytest.raises(PkiError, match="neither an IP address nor a DNS name"):
        pki.issue_serving_certificate(ca, hub, ["bad name!"], now=NOW)


@pytest.mark.parametrize("role", list(pki.Role))
def test_client_identity_round_trips_through_der_and_pem(
    ca: pki.CertifiedKey, role: pki.Role
) -> None:
    identity = pki.Identity(role, "name-1", "eu-frankfurt")
    issued = pki.issue_client_certificate(ca, identity, now=NOW)
    der = issued.certificate.public_bytes(serialization.Encoding.DER)
    assert pki.identity_from_certificate(der) == identity
    assert pki.identity_from_certificate(pki.certificate_pem(issued.certificate)) == identity
    cn = issued.certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert cn == "name-1"
    assert identity.uri == f"spiffe://edgefleet/eu-frankfurt/{role.value}/name-1"


def test_device_csr_signing_forces_the_identity(ca: pki.CertifiedKey) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    device = pki.Identity(pki.Role.DEVICE, "camera-7", "eu-frankfurt")
    cert = pki.sign_device_csr(ca, _csr(key), device, now=NOW)
    assert pki.identity_from_certificate(cert) == device  # not the CSR's admin URI
    assert cert.public_key() == key.public_key()
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.not_valid_after_utc - NOW == timedelta(days=7)
    assert cert.not_valid_before_utc < NOW
    other = pki.sign_device_csr(ca, _csr(key), device, now=NOW)
    assert cert.serial_number != other.serial_number
    ed = pki.sign_device_csr(ca, _csr(ed25519.Ed25519PrivateKey.generate()), device, now=NOW)
    assert isinstance(ed.public_key(), ed25519.Ed25519PublicKey)


def test_bad_csrs_are_rejected(ca: pki.CertifiedKey) -> None:
    device = pki.Identity(pki.Role.DEVICE, "d", "eu-frankfurt")
    with pytest.raises(CsrRejected, match="not a PEM"):
        pki.sign_device_csr(ca, b"garbage", device)
    good = _csr(ec.generate_private_key(ec.SECP256R1()))
    tampered = x509.load_pem_x509_csr(good)
    # Swap the signed body's key for another one: the signature no longer verifies.
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    der = tampered.public_bytes(serialization.Encoding.DER)
    old_spki = tampered.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    new_spki = other.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    forged = x509.load_der_x509_csr(der.replace(old_spki, new_spki)).public_bytes(
        serialization.Encoding.PEM
    )
    with pytest.raises(CsrRejected, match="does not verify"):
        pki.sign_device_csr(ca, forged, device)
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rsa_csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([]))
        .sign(rsa_key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )
    with pytest.raises(CsrRejected, match="P-256"):
        pki.sign_device_csr(ca, rsa_csr, device)
    with pytest.raises(PkiError, match="device"):
        pki.sign_device_csr(ca, good, pki.Identity(pki.Role.ADMIN, "a", "eu-frankfurt"))


def test_identity_needs_a_single_well_formed_uri(ca: pki.CertifiedKey) -> None:
    with pytest.raises(IdentityError, match="name"):
        pki.Identity(pki.Role.DEVICE, "Not_A_Label", "eu")
    served = pki.issue_serving_certificate(
        ca, pki.Identity(pki.Role.HUB, "h", "eu-frankfurt"), ["localhost"], now=NOW
    )
    key = ec.generate_private_key(ec.SECP256R1())
    for uri in ("spiffe://edgefleet/eu/robot/x", "spiffe://edgefleet/eu/device"):
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([]))
            .issuer_name(x509.Name([]))
            .public_key(key.public_key())
            .serial_number(1)
            .not_valid_before(NOW)
            .not_valid_after(NOW + timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        with pytest.raises(IdentityError, match="expected"):
            pki.identity_from_certificate(cert)
    with pytest.raises(IdentityError, match="no subject alternative names"):
        pki.identity_from_certificate(ca.certificate)
    assert pki.identity_from_certificate(served.certificate).role is pki.Role.HUB


def test_ca_pin(ca: pki.CertifiedKey) -> None:
    pin = pki.ca_pin(ca.certificate)
    assert pin.startswith("sha256:") and len(pin) == 7 + 64
    pki.verify_ca_pin(ca.certificate, pin.upper().replace("SHA256:", "sha256:"))
    other = pki.create_ca("eu-frankfurt", now=NOW)
    with pytest.raises(CaPinMismatch, match="not the pinned"):
        pki.verify_ca_pin(other.certificate, pin)
    with pytest.raises(PkiError, match="64 hex digits"):
        pki.verify_ca_pin(ca.certificate, "sha256:abc")


def test_key_files_are_private_and_load_back(ca: pki.CertifiedKey, tmp_path: Path) -> None:
    pki.write_private_key(tmp_path / "ca.key", ca.key)
    pki.write_certificate(tmp_path / "ca.crt", ca.certificate)
    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "ca.crt").stat().st_mode) == 0o644
    loaded = pki.load_certified_key(tmp_path / "ca.crt", tmp_path / "ca.key")
    assert loaded.certificate == ca.certificate
    other = pki.issue_client_certificate(ca, pki.Identity(pki.Role.ADMIN, "a", "eu-frankfurt"))
    pki.write_private_key(tmp_path / "other.key", other.key)
    with pytest.raises(PkiError, match="is not the key of"):
        pki.load_certified_key(tmp_path / "ca.crt", tmp_path / "other.key")
    with pytest.raises(PkiError, match="cannot read"):
        pki.load_certified_key(tmp_path / "missing.crt", tmp_path / "ca.key")
