"""Device identity (key file, and TPM through a real swtpm) and attestation evidence checked by
the pure verifier: good evidence, a stale nonce, a bad signature, a changed measurement, and a
TPM quote from swtpm that verifies."""

from __future__ import annotations

import base64
import copy
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from edged.trust.attesting import Attester, digest_file
from edged.trust.identity import FileIdentity, TpmIdentity, load_or_create_identity
from edgefleet.launching import free_port_pair
from edgefleet.trust.envelopes import EVIDENCE_TYPE, canonical_json, pae
from edgefleet.trust.evidence import (
    Policy,
    expected_pcr,
    measurement_digest,
    parse_quote,
    verify_evidence,
)

NOW = 1_900_000_000.0
NONCE = b"n" * 32
MODEL = "ab" * 32


@pytest.fixture
def swtpm(tmp_path: Path) -> Iterator[str]:
    """A real software TPM on free ports; fails (does not skip) when swtpm is missing."""
    exe = shutil.which("swtpm")
    assert exe, "swtpm is not installed (Debian package swtpm; scripts/install-system-deps)"
    state = tmp_path / "tpmstate"
    state.mkdir()
    port = free_port_pair()
    proc = subprocess.Popen(
        [
            exe,
            "socket",
            "--tpm2",
            "--tpmstate",
            f"dir={state}",
            "--server",
            f"type=tcp,port={port}",
            "--ctrl",
            f"type=tcp,port={port + 1}",
            "--flags",
            "not-need-init,startup-clear",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
            assert time.monotonic() < deadline, "swtpm did not start"
            time.sleep(0.05)
    yield f"swtpm:host=127.0.0.1,port={port}"
    proc.terminate()
    proc.wait(10)


def csr_ok(pem: bytes, ident: Any) -> x509.CertificateSigningRequest:
    csr = x509.load_pem_x509_csr(pem)
    assert csr.is_signature_valid
    assert csr.subject.rfc4514_string() == "CN=device-1"
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    assert (
        csr.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
        == ident.public_key_pem()
    )
    return csr


def test_file_identity_is_created_once_with_mode_0600(tmp_path: Path) -> None:
    ident = load_or_create_identity(tmp_path, tpm="off")
    assert isinstance(ident, FileIdentity)
    key = tmp_path / "identity" / "key.pem"
    assert key.stat().st_mode & 0o777 == 0o600
    again = load_or_create_identity(tmp_path, tpm="off")
    assert again.public_key_pem() == ident.public_key_pem()
    csr = csr_ok(ident.build_csr("device-1", dns_names=["device-1.fleet"]), ident)
    san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["device-1.fleet"]


def test_identity_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    from edged.trust.identity import DeviceKeyError

    load_or_create_identity(tmp_path, tpm="off")
    (tmp_path / "identity" / "key.pem").chmod(0o644)
    with pytest.raises(DeviceKeyError, match="chmod 600"):
        load_or_create_identity(tmp_path, tpm="off")


def policy(**kw: Any) -> Policy:
    base: dict[str, Any] = dict(
        allowed_code=frozenset({"c0de"}),
        allowed_config=frozenset({None}),
        trust_root=None,
        allowed_models=frozenset({MODEL}),
    )
    base.update(kw)
    return Policy(**base)


def evidence_of(ident: Any, root: Path | None = None, nonce: bytes = NONCE) -> dict[str, Any]:
    return Attester(ident, code_digest="c0de").answer(
        nonce, now=NOW, config_path=None, trust_root_path=root, model_digests=[MODEL]
    )


@pytest.fixture
def file_ident(tmp_path: Path) -> FileIdentity:
    ident = load_or_create_identity(tmp_path, tpm="off")
    assert isinstance(ident, FileIdentity)
    return ident


def verify(
    ev: dict[str, Any],
    ident: Any,
    *,
    nonce: bytes = NONCE,
    now: float = NOW,
    pol: Policy | None = None,
) -> tuple[bool, tuple[str, ...]]:
    v = verify_evidence(
        ev,
        expected_nonce=nonce,
        identity_public_key=ident.public_key_pem(),
        policy=pol or policy(),
        now=now,
    )
    return v.trusted, v.reasons


def test_good_evidence_is_trusted(file_ident: FileIdentity, tmp_path: Path) -> None:
    root = tmp_path / "root.json"
    root.write_text("{}")
    pol = policy(trust_root=digest_file(root))
    assert verify(evidence_of(file_ident, root), file_ident, pol=pol) == (True, ())


def test_stale_nonce(file_ident: FileIdentity) -> None:
    ev = evidence_of(file_ident, nonce=b"old" * 8)
    trusted, reasons = verify(ev, file_ident)
    assert not trusted and [r.split(":")[0] for r in reasons] == ["NonceMismatch"]


def test_the_device_clock_is_not_a_freshness_check(file_ident: FileIdentity) -> None:
    """The nonce proves freshness (the hub times the answer on its own clock): a device clock
    that is off either way does not matter; a time that is not a finite number is refused,
    even signed by the device (a hostile device says "nan" to dodge checks)."""
    for skew in (-86400.0, 6.0, 86400.0):
        assert verify(evidence_of(file_ident), file_ident, now=NOW + skew) == (True, ())
    for bad in ("nan", float("inf"), "1900000000", True, None):
        ev = evidence_of(file_ident)
        ev["statement"]["time"] = bad
        ev["signature"] = base64.b64encode(
            file_ident.sign(pae(EVIDENCE_TYPE, canonical_json(ev["statement"])))
        ).decode()
        trusted, reasons = verify(ev, file_ident)
        assert not trusted and reasons[0].startswith("EvidenceMalformed: statement.time"), bad


def test_bad_signature(file_ident: FileIdentity, tmp_path: Path) -> None:
    other = load_or_create_identity(tmp_path / "other", tpm="off")
    trusted, reasons = verify(evidence_of(other), file_ident)
    assert not trusted and reasons[0].startswith("BadSignature")


def test_changed_measurement(file_ident: FileIdentity) -> None:
    ev = evidence_of(file_ident)
    ev["statement"]["measurements"]["models"] = ["cd" * 32]  # claims another model
    trusted, reasons = verify(ev, file_ident)
    names = [r.split(":")[0] for r in reasons]
    assert not trusted and names == ["BadSignature", "ModelNotAllowed"]


def test_measurement_outside_the_policy(file_ident: FileIdentity) -> None:
    trusted, reasons = verify(
        evidence_of(file_ident),
        file_ident,
        pol=policy(allowed_code=frozenset({"other"}), require_tpm=True),
    )
    assert not trusted
    assert [r.split(":")[0] for r in reasons] == ["NoTpmQuote", "CodeNotAllowed"]


def test_tpm_identity_csr_and_quote_verify(swtpm: str, tmp_path: Path) -> None:
    ident = load_or_create_identity(tmp_path, tpm=swtpm)
    try:
        assert isinstance(ident, TpmIdentity)
        assert not (tmp_path / "identity" / "key.pem").exists()  # nothing secret on disk
        csr_ok(ident.build_csr("device-1"), ident)
        ev = evidence_of(ident)
        q = parse_quote(base64.b64decode(ev["tpm"]["attest"]))
        assert q.extra_data == NONCE
        # A genuine quote, but by the identity key, which no EK vouches for: not TPM proof.
        assert [r.split(":")[0] for r in verify(ev, ident, pol=policy(require_tpm=True))[1]] == [
            "QuoteKeyNotEkBound"
        ]

        # The same key again (derived from the TPM's seed): same public key.
        again = TpmIdentity(swtpm)
        assert again.public_key_pem() == ident.public_key_pem()
        again.close()

        # A replayed quote for another nonce, a changed PCR claim, a forged quote signature.
        trusted, reasons = verify(ev, ident, nonce=b"x" * 32, pol=policy())
        assert not trusted
        assert {"NonceMismatch", "QuoteNonceMismatch"} <= {r.split(":")[0] for r in reasons}
        bad = copy.deepcopy(ev)
        bad["tpm"]["pcrValue"] = "00" * 32
        names = {r.split(":")[0] for r in verify(bad, ident)[1]}
        assert names == {"QuotePcrDigestMismatch", "PcrMeasurementMismatch", "QuoteKeyNotEkBound"}
        bad = copy.deepcopy(ev)
        bad["tpm"]["s"] = format(int(bad["tpm"]["s"], 16) ^ 1, "x")
        assert [r.split(":")[0] for r in verify(bad, ident)[1]] == [
            "QuoteSignatureInvalid",
            "QuoteKeyNotEkBound",
        ]
        # Measurements changed after the quote, re-signed with... nothing: both checks fail.
        bad = copy.deepcopy(ev)
        bad["statement"]["measurements"]["code"] = "c0de"
        bad["statement"]["measurements"]["models"] = []
        names = {r.split(":")[0] for r in verify(bad, ident)[1]}
        assert {"BadSignature", "PcrMeasurementMismatch"} <= names
    finally:
        ident.close()


def fabricated_quote(nonce: bytes, pcr: int, value: bytes) -> bytes:
    """A TPMS_ATTEST made up in software: right magic, type, nonce and PCR digest."""
    import hashlib
    import struct

    out = struct.pack(">IH", 0xFF544347, 0x8018)
    out += struct.pack(">H", 0)  # qualifiedSigner
    out += struct.pack(">H", len(nonce)) + nonce
    out += b"\x00" * (8 + 4 + 4 + 1 + 8)  # clockInfo, firmwareVersion
    bits = bytearray(3)
    bits[pcr // 8] |= 1 << (pcr % 8)
    out += struct.pack(">IHB", 1, 0x000B, 3) + bytes(bits)
    digest = hashlib.sha256(value).digest()
    return out + struct.pack(">H", len(digest)) + digest


def test_a_fabricated_quote_from_a_device_without_a_tpm_is_refused(
    file_ident: FileIdentity,
) -> None:
    """The attack of the review: a file-key device writes a quote that checks out in every
    field and signs it with its own key. It must not pass for TPM evidence."""
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

    ev = evidence_of(file_ident)
    value = expected_pcr(measurement_digest(ev["statement"]["measurements"]))
    attest = fabricated_quote(NONCE, 23, value)
    r, s_ = decode_dss_signature(file_ident.sign(attest))
    ev["tpm"] = {
        "pcr": 23,
        "pcrValue": value.hex(),
        "attest": base64.b64encode(attest).decode(),
        "r": format(r, "x"),
        "s": format(s_, "x"),
    }
    ev["statement"]["identityKind"] = "tpm"
    ev["signature"] = base64.b64encode(
        file_ident.sign(pae(EVIDENCE_TYPE, canonical_json(ev["statement"])))
    ).decode()
    v = verify_evidence(
        ev,
        expected_nonce=NONCE,
        identity_public_key=file_ident.public_key_pem(),
        policy=policy(require_tpm=True),
        now=NOW,
    )
    assert not v.trusted and not v.tpm_attested
    assert [r.split(":")[0] for r in v.reasons] == ["QuoteKeyNotEkBound"]


def test_secrets_sealed_to_a_tpm_identity_key_are_refused_as_not_supported_yet(
    swtpm: str, tmp_path: Path
) -> None:
    """A TPM identity key is a signing key: the TPM does no ECDH with it, so a secret sealed
    to it cannot be opened. The refusal says so (not an AttributeError deep in the device's
    desired-state handling, nor a silently missing file), and the workload is refused with it;
    edged's identity for secrets is the file key whatever trust.tpm says."""
    from edged.trust.identity import DeviceKeyError
    from edged.trust.secrets import SecretVolumes
    from edgefleet.sealing import public_key_of, seal_for_device

    ident = load_or_create_identity(tmp_path / "tpm", tpm=swtpm)
    try:
        assert isinstance(ident, TpmIdentity)
        key = public_key_of(ident.public_key_pem())
        sealed = seal_for_device(key, "dev-1", "tls", 1, {"token": b"never-opened"})
        with pytest.raises(DeviceKeyError, match="not supported yet"):
            ident.exchange(key)
        vols = SecretVolumes(
            tmp_path / "secrets",
            data_dir=tmp_path / "tpm",
            device_name="dev-1",
            allow_non_tmpfs=True,
            identity=ident,
        )
        problems = vols.update([sealed], {"web": ("tls",)})
        assert problems["web"].startswith(
            "secret tls version 1: opening secrets with a TPM-held identity key"
        )
        assert "not supported yet" in problems["web"]
        assert not (tmp_path / "secrets" / "web" / "tls").exists()
    finally:
        ident.close()
    # without an identity given, the device opens with its file key (what the hub seals to)
    file_ident = load_or_create_identity(tmp_path / "file", tpm="off")
    assert isinstance(file_ident, FileIdentity)
    sealed = seal_for_device(
        public_key_of(file_ident.public_key_pem()), "dev-1", "tls", 1, {"token": b"opened"}
    )
    vols = SecretVolumes(
        tmp_path / "secrets2", data_dir=tmp_path / "file", device_name="dev-1", allow_non_tmpfs=True
    )
    assert vols.update([sealed], {"web": ("tls",)}) == {}
    assert (tmp_path / "secrets2" / "web" / "tls" / "token").read_bytes() == b"opened"
