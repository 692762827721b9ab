"""Binding a device's TPM attestation key (AK) to its endorsement key (EK): the hub's side.

At enrollment a device with a TPM sends its EK certificate (from the TPM's NV memory, made by
the TPM's manufacturer), its EK public area and the public area of an attestation key it just
made in the TPM. The hub

1. checks the EK certificate against the manufacturer CAs it is configured with
   (:func:`verify_ek_certificate`) and that the EK public area is the certified key;
2. checks the AK is what an attestation key must be (:func:`check_attestation_key`): an ECC
   P-256 ECDSA/SHA-256 key, **restricted** (it signs only what the TPM itself produced,
   quotes, never an arbitrary digest), fixedTPM, fixedParent, sensitiveDataOrigin, not a
   decryption key;
3. makes a credential (TPM2_MakeCredential, in software: :func:`make_ak_challenge`): a random
   secret that only the TPM holding that EK can recover, and only for a key of that exact
   name loaded in the same TPM (ActivateCredential). The device proves the binding by sending
   the secret back; the hub then records the AK and from then on accepts only quotes by it.

Everything here is pure over its inputs (``now`` passed in) apart from the randomness of the
secret. tpm2-pytss (the ``tpm`` extra) does the TPM structure (un)marshalling and
MakeCredential; ``cryptography`` the certificates. Errors are ``TrustError`` with a reason:
``EkCertificateUntrusted``, ``EkMismatch``, ``AttestationKeyInvalid``, ``TpmUnsupported``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from edgefleet.errors import TrustError

MAX_TPM_BLOB = 8 * 1024  # an EK certificate is about 1 KiB, a public area a few hundred bytes


def _tpm() -> Any:
    try:
        import tpm2_pytss
    except ImportError:
        raise TrustError(
            "TpmUnsupported", "tpm2-pytss is not installed (pip install 'edgefleet[tpm]')"
        ) from None
    return tpm2_pytss


def _bounded(data: bytes, what: str) -> bytes:
    if not data or len(data) > MAX_TPM_BLOB:
        raise TrustError("AttestationKeyInvalid", f"{what}: 1 to {MAX_TPM_BLOB} bytes")
    return data


def unmarshal_public(data: bytes, what: str) -> Any:
    """A TPM2B_PUBLIC from its marshalled bytes (the whole buffer must be used)."""
    t = _tpm()
    try:
        public, used = t.TPM2B_PUBLIC.unmarshal(_bounded(data, what))
    except Exception as exc:  # tpm2-pytss raises several kinds
        raise TrustError("AttestationKeyInvalid", f"{what}: not a TPM2B_PUBLIC: {exc}") from None
    if used != len(data):
        raise TrustError("AttestationKeyInvalid", f"{what}: trailing bytes after TPM2B_PUBLIC")
    return public


def load_ca_certificates(pems: Iterable[bytes]) -> list[Any]:
    from cryptography import x509

    out = []
    for pem in pems:
        out += x509.load_pem_x509_certificates(pem)
    return out


def ek_sha256(cert_der: bytes) -> str:
    """What identifies a TPM: the sha256 (hex) of its EK certificate's SubjectPublicKeyInfo
    (DER). Call after :func:`verify_ek_certificate` accepted the certificate."""
    import hashlib

    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    cert = x509.load_der_x509_certificate(_bounded(cert_der, "ek_certificate"))
    spki = cert.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(spki).hexdigest()


def verify_ek_certificate(cert_der: bytes, cas: list[Any], ek_public: bytes, *, now: float) -> Any:
    """The EK certificate is issued by one of ``cas`` (the manufacturers' CAs the hub trusts),
    valid at ``now``, and certifies the RSA key of ``ek_public``. Returns the EK public area."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import rsa

    try:
        cert = x509.load_der_x509_certificate(_bounded(cert_der, "ek_certificate"))
    except ValueError as exc:
        raise TrustError(
            "EkCertificateUntrusted", f"ek_certificate: not DER X.509: {exc}"
        ) from None
    from cryptography.exceptions import InvalidSignature

    issuer = None
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):  # other issuer, bad signature
            continue
        issuer = ca
        break
    if issuer is None:
        raise TrustError(
            "EkCertificateUntrusted",
            f"the EK certificate (issuer {cert.issuer.rfc4514_string()}) is not issued by a "
            "manufacturer CA this hub trusts (D/ek-cas/)",
        )
    for c in (cert, issuer):
        if not c.not_valid_before_utc.timestamp() <= now <= c.not_valid_after_utc.timestamp():
            raise TrustError(
                "EkCertificateUntrusted", f"{c.subject.rfc4514_string()}: not valid now"
            )
    public = unmarshal_public(ek_public, "ek_public")
    key = cert.public_key()
    area = public.publicArea
    t = _tpm()
    if not isinstance(key, rsa.RSAPublicKey) or area.type != t.TPM2_ALG.RSA:
        raise TrustError("EkMismatch", "only RSA 2048 endorsement keys are supported")
    numbers = key.public_numbers()
    modulus = bytes(area.unique.rsa)
    exponent = area.parameters.rsaDetail.exponent or 65537
    if int.from_bytes(modulus, "big") != numbers.n or exponent != numbers.e:
        raise TrustError("EkMismatch", "ek_public is not the key the EK certificate certifies")
    return public


_AK_REQUIRED = ("RESTRICTED", "SIGN_ENCRYPT", "FIXEDTPM", "FIXEDPARENT", "SENSITIVEDATAORIGIN")


@dataclass(frozen=True, slots=True)
class AttestationKey:
    public: Any  # TPM2B_PUBLIC
    name: bytes  # the TPM name (nameAlg || digest of the public area)
    pem: str  # SubjectPublicKeyInfo, what quotes are verified with


def check_attestation_key(ak_public: bytes) -> AttestationKey:
    """The AK is a restricted ECC P-256 ECDSA/SHA-256 signing key that never left its TPM."""
    t = _tpm()
    public = unmarshal_public(ak_public, "ak_public")
    area = public.publicArea
    attrs = area.objectAttributes
    missing = [a for a in _AK_REQUIRED if not attrs & getattr(t.TPMA_OBJECT, a)]
    problems = [f"attribute {a.lower()} is not set" for a in missing]
    if attrs & t.TPMA_OBJECT.DECRYPT:
        problems.append("it is a decryption key")
    if area.type != t.TPM2_ALG.ECC or area.parameters.eccDetail.curveID != t.TPM2_ECC.NIST_P256:
        problems.append("it is not an ECC P-256 key")
    scheme = area.parameters.eccDetail.scheme
    if scheme.scheme != t.TPM2_ALG.ECDSA or scheme.details.ecdsa.hashAlg != t.TPM2_ALG.SHA256:
        problems.append("its scheme is not ECDSA with SHA-256")
    if area.nameAlg != t.TPM2_ALG.SHA256:
        problems.append("its name algorithm is not SHA-256")
    if problems:
        raise TrustError(
            "AttestationKeyInvalid", "ak_public is not an attestation key: " + "; ".join(problems)
        )
    return AttestationKey(public, bytes(public.get_name()), public.to_pem().decode())


@dataclass(frozen=True, slots=True)
class AkChallenge:
    secret_sha256: str  # what the hub keeps
    credential_blob: bytes  # TPM2B_ID_OBJECT, marshalled
    encrypted_secret: bytes  # TPM2B_ENCRYPTED_SECRET, marshalled


def make_ak_challenge(ek_public: Any, ak: AttestationKey) -> tuple[bytes, AkChallenge]:
    """TPM2_MakeCredential in software: a fresh secret for the TPM of ``ek_public`` to
    release only to the key named ``ak.name``. Returns the secret and what to send."""
    t = _tpm()
    from tpm2_pytss.utils import make_credential

    secret = os.urandom(32)
    blob, enc = make_credential(ek_public, t.TPM2B_DIGEST(secret), t.TPM2B_NAME(ak.name))
    return secret, AkChallenge(
        hashlib.sha256(secret).hexdigest(), bytes(blob.marshal()), bytes(enc.marshal())
    )


# -- the sealing key: secrets that only the TPM opens ---------------------------------------------

_SEALING_REQUIRED = ("DECRYPT", "FIXEDTPM", "FIXEDPARENT", "SENSITIVEDATAORIGIN")
SEALING_QUALIFIER = b"edgefleet sealing key v1\x00"


def sealing_qualifying_data(activation_secret: bytes) -> bytes:
    """What the AK's certification of the sealing key must carry as ``extraData``: bound to
    this enrollment's credential (only the TPM that activated it knows the secret)."""
    return hashlib.sha256(SEALING_QUALIFIER + activation_secret).digest()


def check_sealing_key(
    public_bytes: bytes,
    attest: bytes,
    r: bytes,
    s: bytes,
    *,
    ak_pem: str,
    qualifying_data: bytes,
) -> str:
    """The PEM of a device's TPM sealing key, once proven: an ECC P-256 decryption key (ECDH,
    never a signing key) that never left its TPM (fixedTPM, fixedParent,
    sensitiveDataOrigin), certified (TPM2_Certify) by the EK-bound attestation key ``ak_pem``
    with ``qualifying_data``. A restricted AK signs only what its TPM produced, so the
    certification proves the key is in the same TPM as the AK. TrustError
    ``SealingKeyInvalid`` otherwise."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    t = _tpm()

    def bad(why: str) -> TrustError:
        return TrustError("SealingKeyInvalid", f"the TPM sealing key is refused: {why}")

    try:
        public = unmarshal_public(public_bytes, "sealing_key_public")
    except TrustError as exc:
        raise bad(str(exc)) from None
    area = public.publicArea
    attrs = area.objectAttributes
    problems = [
        f"attribute {a.lower()} is not set"
        for a in _SEALING_REQUIRED
        if not attrs & getattr(t.TPMA_OBJECT, a)
    ]
    if attrs & t.TPMA_OBJECT.SIGN_ENCRYPT or attrs & t.TPMA_OBJECT.RESTRICTED:
        problems.append("it is a signing or restricted key")
    if area.type != t.TPM2_ALG.ECC or area.parameters.eccDetail.curveID != t.TPM2_ECC.NIST_P256:
        problems.append("it is not an ECC P-256 key")
    if area.nameAlg != t.TPM2_ALG.SHA256:
        problems.append("its name algorithm is not SHA-256")
    if problems:
        raise bad("; ".join(problems))
    try:
        parsed, used = t.TPMS_ATTEST.unmarshal(_bounded(attest, "sealing_key_attest"))
    except Exception as exc:
        raise bad(f"the certification is not a TPMS_ATTEST: {exc}") from None
    if used != len(attest):
        raise bad("the certification has trailing bytes")
    if parsed.magic != t.TPM2_GENERATED.VALUE or parsed.type != t.TPM2_ST.ATTEST_CERTIFY:
        raise bad("the certification is not a TPM-generated TPM2_Certify")
    if bytes(parsed.attested.certify.name) != bytes(public.get_name()):
        raise bad("the certification names another key")
    if bytes(parsed.extraData) != qualifying_data:
        raise bad("the certification is not for this enrollment (qualifying data)")
    if len(r) > 66 or len(s) > 66:
        raise bad("the signature is malformed")
    ak = load_pem_public_key(ak_pem.encode())
    assert isinstance(ak, ec.EllipticCurvePublicKey)
    signature = encode_dss_signature(int.from_bytes(r, "big"), int.from_bytes(s, "big"))
    try:
        ak.verify(signature, attest, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise bad("the certification is not signed by the attestation key") from None
    pem: bytes = public.to_pem()
    return pem.decode()
