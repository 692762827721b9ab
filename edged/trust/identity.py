"""The device identity: an ECDSA P-256 key pair whose private key never leaves the device.

In a TPM when one is present (``trust.tpm``: ``auto`` uses ``/dev/tpmrm0`` if it is there and
accessible; or a TCTI string such as ``swtpm:host=127.0.0.1,port=2321``): the key is a primary
key of the owner hierarchy made from a fixed template, so the TPM derives the same key every
time from its seed and nothing secret is ever written to disk. Otherwise a key file
``D/identity/key.pem`` (PKCS#8, mode 0600). Both are P-256, so CSRs and evidence look the same.

:func:`load_or_create_identity` is what ``edged enroll`` (the hub issue) and the attester call.
``Identity.build_csr`` builds the certificate signing request DER by hand around the identity's
signature (one code path for both kinds; a TPM key cannot be handed to ``cryptography``'s
builder).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from edgefleet.errors import EdgefleetError
from edgefleet.logs import get_logger
from edgefleet.persisting import write_atomic

log = get_logger(__name__)

TPM_DEVICE = "/dev/tpmrm0"
# userwithauth|sign|fixedtpm|fixedparent|sensitivedataorigin|noda: a P-256 signing key that
# cannot be duplicated out of the TPM.
TPM_TEMPLATE = "ecc256:ecdsa-sha256"
TPM_ATTRIBUTES = "userwithauth|sign|fixedtpm|fixedparent|sensitivedataorigin|noda"
ATTEST_PCR = 23  # resettable (debug) PCR that evidence measurements are extended into


class DeviceKeyError(EdgefleetError):
    """The device identity key cannot be created or used."""


class Identity(Protocol):
    kind: str  # "tpm" or "file"

    def public_key_pem(self) -> bytes: ...

    def sign(self, data: bytes) -> bytes:
        """An ECDSA P-256 / SHA-256 signature over ``data``, DER-encoded."""
        ...

    def build_csr(self, common_name: str, *, dns_names: Sequence[str] = ()) -> bytes:
        """A PEM PKCS#10 certificate signing request for this key."""
        ...

    def close(self) -> None: ...


def resolve_tcti(setting: str) -> str | None:
    """The TCTI to use for ``trust.tpm`` (``auto`` | ``off`` | a TCTI), or None for a file key."""
    if setting == "off":
        return None
    if setting == "auto":
        if os.path.exists(TPM_DEVICE) and os.access(TPM_DEVICE, os.R_OK | os.W_OK):
            return f"device:{TPM_DEVICE}"
        return None
    return setting


# -- DER by hand (just what a CSR needs) ---------------------------------------------------------


def _der_len(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    b = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(b)]) + b


def _tlv(tag: int, body: bytes) -> bytes:
    return bytes([tag]) + _der_len(len(body)) + body


def _oid(dotted: str) -> bytes:
    parts = [int(p) for p in dotted.split(".")]
    body = bytearray([40 * parts[0] + parts[1]])
    for part in parts[2:]:
        chunk = [part & 0x7F]
        rest = part >> 7
        while rest:
            chunk.append(0x80 | (rest & 0x7F))
            rest >>= 7
        body += bytes(reversed(chunk))
    return _tlv(0x06, bytes(body))


ECDSA_WITH_SHA256 = "1.2.840.10045.4.3.2"
EXTENSION_REQUEST = "1.2.840.113549.1.9.14"
SUBJECT_ALT_NAME = "2.5.29.17"


def build_csr_der(
    public_key_pem: bytes, sign: Any, common_name: str, dns_names: Sequence[str]
) -> bytes:
    """A PKCS#10 CSR: ``sign(tbs) -> DER ECDSA signature`` signs CertificationRequestInfo."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        PublicFormat,
        load_pem_public_key,
    )
    from cryptography.x509.oid import NameOID

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]).public_bytes()
    spki = load_pem_public_key(public_key_pem).public_bytes(
        Encoding.DER, PublicFormat.SubjectPublicKeyInfo
    )
    attrs = b""
    if dns_names:
        san = x509.SubjectAlternativeName([x509.DNSName(d) for d in dns_names]).public_bytes()
        ext = _tlv(0x30, _oid(SUBJECT_ALT_NAME) + _tlv(0x04, san))
        attrs = _tlv(0x30, _oid(EXTENSION_REQUEST) + _tlv(0x31, _tlv(0x30, ext)))
    info = _tlv(0x30, _tlv(0x02, b"\x00") + name + spki + _tlv(0xA0, attrs))
    alg = _tlv(0x30, _oid(ECDSA_WITH_SHA256))
    sig = sign(info)
    return _tlv(0x30, info + alg + _tlv(0x03, b"\x00" + sig))


def _pem(der: bytes, label: str) -> bytes:
    import base64

    b64 = base64.encodebytes(der).replace(b"\n", b"")
    lines = [b64[i : i + 64] for i in range(0, len(b64), 64)]
    return b"-----BEGIN %b-----\n%b\n-----END %b-----\n" % (
        label.encode(),
        b"\n".join(lines),
        label.encode(),
    )


# -- the file key ---------------------------------------------------------------------------------


class FileIdentity:
    kind = "file"

    def __init__(self, key: Any, path: Path) -> None:
        self._key = key
        self.path = path

    def public_key_pem(self) -> bytes:
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        pem: bytes = self._key.public_key().public_bytes(
            Encoding.PEM, PublicFormat.SubjectPublicKeyInfo
        )
        return pem

    def sign(self, data: bytes) -> bytes:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        sig: bytes = self._key.sign(data, ec.ECDSA(hashes.SHA256()))
        return sig

    def build_csr(self, common_name: str, *, dns_names: Sequence[str] = ()) -> bytes:
        der = build_csr_der(self.public_key_pem(), self.sign, common_name, dns_names)
        return _pem(der, "CERTIFICATE REQUEST")

    def exchange(self, peer_public_key: Any) -> bytes:
        """ECDH with ``peer_public_key`` (opens the secrets the hub sealed to this key)."""
        from cryptography.hazmat.primitives.asymmetric import ec

        shared: bytes = self._key.exchange(ec.ECDH(), peer_public_key)
        return shared

    def close(self) -> None:
        pass


def _load_or_create_file_key(path: Path) -> FileIdentity:
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
        load_pem_private_key,
    )

    if path.exists():
        if path.stat().st_mode & 0o077:
            raise DeviceKeyError(f"{path} is readable by others: chmod 600 it")
        key = load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
            raise DeviceKeyError(f"{path} is not an ECDSA P-256 key")
        return FileIdentity(key, path)
    key = ec.generate_private_key(ec.SECP256R1())
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(path, key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    log.info("device identity key created", kind="file", path=str(path))
    return FileIdentity(key, path)


# -- the TPM key ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Quote:
    attest: bytes  # TPMS_ATTEST as the TPM signed it
    r: bytes
    s: bytes
    pcrs: dict[int, bytes]  # the selected PCR values (sha256 bank)


class TpmIdentity:
    kind = "tpm"

    def __init__(self, tcti: str) -> None:
        from tpm2_pytss import ESAPI, TPM2B_PUBLIC

        self.tcti = tcti
        try:
            self._esapi = ESAPI(tcti)
            template = TPM2B_PUBLIC.parse(TPM_TEMPLATE, objectAttributes=TPM_ATTRIBUTES)
            self._handle, public, *_ = self._esapi.create_primary(None, template)
        except Exception as exc:  # tpm2-pytss raises TSS2_Exception and friends
            raise DeviceKeyError(f"TPM ({tcti}): {exc}") from exc
        self._public_pem: bytes = public.to_pem()

    def public_key_pem(self) -> bytes:
        return self._public_pem

    def _sign_digest(self, digest: bytes) -> tuple[bytes, bytes]:
        from tpm2_pytss import (
            TPM2_ALG,
            TPM2_RH,
            TPM2_ST,
            TPM2B_DIGEST,
            TPMT_SIG_SCHEME,
            TPMT_TK_HASHCHECK,
        )

        ticket = TPMT_TK_HASHCHECK(tag=TPM2_ST.HASHCHECK, hierarchy=TPM2_RH.NULL)
        sig = self._esapi.sign(
            self._handle, TPM2B_DIGEST(digest), TPMT_SIG_SCHEME(scheme=TPM2_ALG.NULL), ticket
        )
        return bytes(sig.signature.ecdsa.signatureR), bytes(sig.signature.ecdsa.signatureS)

    def sign(self, data: bytes) -> bytes:
        from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

        r, s = self._sign_digest(hashlib.sha256(data).digest())
        return encode_dss_signature(int.from_bytes(r, "big"), int.from_bytes(s, "big"))

    def build_csr(self, common_name: str, *, dns_names: Sequence[str] = ()) -> bytes:
        der = build_csr_der(self._public_pem, self.sign, common_name, dns_names)
        return _pem(der, "CERTIFICATE REQUEST")

    def exchange(self, peer_public_key: Any) -> bytes:
        """Refused: this key is a TPM *signing* key (its template has ``sign``, not
        ``decrypt``), so the TPM will not do ECDH with it (TPM2_ECDH_ZGen), and secrets sealed
        to it cannot be opened. edged's identity is the file key (the TLS key, which also opens
        the secrets); the TPM holds the attestation key."""
        raise DeviceKeyError(
            f"opening secrets with a TPM-held identity key ({self.tcti}) is not supported yet: "
            "the key is a TPM signing key and cannot do ECDH; edged's identity (TLS and "
            "secrets) is the file key D/identity/key.pem"
        )

    def measure_and_quote(self, measurement: bytes, nonce: bytes, pcr: int = ATTEST_PCR) -> Quote:
        """Reset ``pcr``, extend it with ``measurement`` (32 bytes), quote it with ``nonce``."""
        from tpm2_pytss import (
            ESYS_TR,
            TPM2_ALG,
            TPM2B_DATA,
            TPML_DIGEST_VALUES,
            TPML_PCR_SELECTION,
            TPMT_HA,
            TPMT_SIG_SCHEME,
        )

        handle = getattr(ESYS_TR, f"PCR{pcr}")
        self._esapi.pcr_reset(handle)
        ha = TPMT_HA(hashAlg=TPM2_ALG.SHA256)
        ha.digest.sha256 = measurement
        self._esapi.pcr_extend(handle, TPML_DIGEST_VALUES([ha]))
        selection = TPML_PCR_SELECTION.parse(f"sha256:{pcr}")
        attest, sig = self._esapi.quote(
            self._handle, selection, TPM2B_DATA(nonce), TPMT_SIG_SCHEME(scheme=TPM2_ALG.NULL)
        )
        _, _, values = self._esapi.pcr_read(selection)
        return Quote(
            attest=bytes(attest),
            r=bytes(sig.signature.ecdsa.signatureR),
            s=bytes(sig.signature.ecdsa.signatureS),
            pcrs={pcr: bytes(values.digests[0])},
        )

    def close(self) -> None:
        try:
            self._esapi.flush_context(self._handle)
        finally:
            self._esapi.close()


def load_or_create_identity(data_dir: Path, *, tpm: str = "auto") -> FileIdentity | TpmIdentity:
    """The device's identity: in the TPM that ``tpm`` selects, else ``D/identity/key.pem``.

    The public key is also written to ``D/identity/public.pem`` (for people and the hub)."""
    tcti = resolve_tcti(tpm)
    ident: FileIdentity | TpmIdentity
    if tcti is not None:
        ident = TpmIdentity(tcti)
    else:
        ident = _load_or_create_file_key(Path(data_dir) / "identity" / "key.pem")
    pub = Path(data_dir) / "identity" / "public.pem"
    if not pub.exists() or pub.read_bytes() != ident.public_key_pem():
        write_atomic(pub, ident.public_key_pem(), mode=0o644)
    return ident
