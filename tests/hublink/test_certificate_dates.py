"""The certificate's dates read without cryptography (edged/hublink/files.py): the same as
cryptography reads them, for UTCTime and GeneralizedTime; anything malformed is a ValueError."""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from edged.hublink.files import LinkFiles, certificate_dates


def make_cert(not_before: dt.datetime, not_after: dt.datetime) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dev-0")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("dev-0")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


UTC = dt.UTC


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (dt.datetime(2026, 12, 6, 23, 0, 5, tzinfo=UTC), dt.datetime(2027, 3, 6, 1, 2, tzinfo=UTC)),
        # after 2049: GeneralizedTime (RFC 5280 4.1.2.5)
        (dt.datetime(1999, 1, 1, tzinfo=UTC), dt.datetime(2061, 7, 4, 12, 0, 59, tzinfo=UTC)),
    ],
)
def test_dates_as_cryptography_reads_them(before: dt.datetime, after: dt.datetime) -> None:
    pem = make_cert(before, after)
    cert = x509.load_pem_x509_certificate(pem)
    got = certificate_dates(pem)
    assert got == (cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp())
    assert got == (before.timestamp(), after.timestamp())


def test_a_chain_gives_the_first_certificate() -> None:
    leaf = make_cert(dt.datetime(2026, 1, 1, tzinfo=UTC), dt.datetime(2026, 2, 1, tzinfo=UTC))
    ca = make_cert(dt.datetime(2020, 1, 1, tzinfo=UTC), dt.datetime(2030, 1, 1, tzinfo=UTC))
    assert certificate_dates(leaf + ca)[1] == dt.datetime(2026, 2, 1, tzinfo=UTC).timestamp()


def test_validity_starts_when_received(tmp_path: Path) -> None:
    files = LinkFiles(tmp_path)
    files.dir.mkdir()
    before = dt.datetime(2020, 1, 1, tzinfo=UTC)
    after = dt.datetime(2099, 1, 1, tzinfo=UTC)
    files.certificate.write_bytes(make_cert(before, after))
    start, end = files.certificate_validity()
    assert end == after.timestamp() == files.certificate_not_after()
    assert start == pytest.approx(files.certificate.stat().st_mtime)


BEGIN, END = b"-----BEGIN CERTIFICATE-----\n", b"\n-----END CERTIFICATE-----\n"


def _corrupt() -> list[bytes]:
    pem = make_cert(dt.datetime(2026, 1, 1, tzinfo=UTC), dt.datetime(2027, 1, 1, tzinfo=UTC))
    der = base64.b64decode(b"".join(pem.split(b"\n")[1:-2]))

    def wrap(d: bytes) -> bytes:
        return BEGIN + base64.b64encode(d) + END

    return [
        b"",
        b"not a certificate",
        b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n",
        wrap(der[:40]),  # cut inside the validity
        wrap(der[:3]),
        wrap(b"\x31" + der[1:]),  # a SET, not a SEQUENCE
        wrap(b"\x30\x85\xff\xff\xff\xff\xff"),  # a 5-byte length
        wrap(b"\x30\x84\x7f\xff\xff\xff"),  # longer than what follows
        wrap(der.replace(b"Z\x17", b"X\x17", 1)),  # notBefore not ending in Z
        b"-----BEGIN CERTIFICATE-----\n" + b"A" * (2 << 20) + b"\n-----END CERTIFICATE-----\n",
    ]


@pytest.mark.parametrize("pem", _corrupt())
def test_malformed_is_a_value_error(pem: bytes) -> None:
    with pytest.raises(ValueError):
        certificate_dates(pem)
