"""The device's TPM attestation key (AK): made at enrollment, bound to the TPM's endorsement
key (EK) by credential activation, used to quote PCRs for every attestation challenge.

The AK is an ordinary (not primary) key under the storage root key: a restricted ECC P-256
signing key (it signs only quotes the TPM itself produced, never a digest handed to it), with
a random 32-byte auth value. Its TPM-wrapped private part, its public part and the auth value
are kept in ``D/identity/ak.json`` (mode 0600); the private part is useless outside this TPM.
A process that can open the TPM but cannot read that file cannot use the key.

The hub's side, and why this binds the AK to a genuine TPM: :mod:`edgefleet.trust.tpmbinding`.
The TLS identity key stays a file key (grpc's Python API cannot use a TPM key for TLS); the
TPM vouches for the measurements through the AK's quotes.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from edgefleet.errors import EdgefleetError
from edgefleet.logs import get_logger
from edgefleet.persisting import write_atomic

log = get_logger(__name__)

AK_FILE = Path("identity") / "ak.json"
SEALING_KEY_FILE = Path("identity") / "sealing-key.json"  # the TPM key secrets are sealed to
QUOTED_PCRS = tuple(range(8))  # measured boot (firmware, boot loader): not resettable
QUOTE_FORMAT = "ak-quote/v1"


class TpmAttestationError(EdgefleetError):
    """The TPM could not make, activate or use the attestation key."""


def _srk_template() -> Any:
    from tpm2_pytss import TPM2B_PUBLIC, TPMA_OBJECT

    return TPM2B_PUBLIC.parse(
        "ecc256:aes128cfb",
        objectAttributes=TPMA_OBJECT.RESTRICTED
        | TPMA_OBJECT.DECRYPT
        | TPMA_OBJECT.FIXEDTPM
        | TPMA_OBJECT.FIXEDPARENT
        | TPMA_OBJECT.SENSITIVEDATAORIGIN
        | TPMA_OBJECT.USERWITHAUTH
        | TPMA_OBJECT.NODA,
    )


def ak_template() -> Any:
    from tpm2_pytss import TPM2_ALG, TPM2B_PUBLIC, TPMA_OBJECT

    template = TPM2B_PUBLIC.parse(
        "ecc256:ecdsa-sha256",
        objectAttributes=TPMA_OBJECT.RESTRICTED
        | TPMA_OBJECT.SIGN_ENCRYPT
        | TPMA_OBJECT.FIXEDTPM
        | TPMA_OBJECT.FIXEDPARENT
        | TPMA_OBJECT.SENSITIVEDATAORIGIN
        | TPMA_OBJECT.USERWITHAUTH,
    )
    template.publicArea.parameters.eccDetail.symmetric.algorithm = TPM2_ALG.NULL
    return template


def sealing_key_template() -> Any:
    """An ECC P-256 decryption key for ECDH (TPM2_ECDH_ZGen), never a signing key, that cannot
    leave its TPM; used with an auth value."""
    from tpm2_pytss import TPM2B_PUBLIC, TPMA_OBJECT

    return TPM2B_PUBLIC.parse(
        "ecc256:ecdh-sha256",
        objectAttributes=TPMA_OBJECT.DECRYPT
        | TPMA_OBJECT.FIXEDTPM
        | TPMA_OBJECT.FIXEDPARENT
        | TPMA_OBJECT.SENSITIVEDATAORIGIN
        | TPMA_OBJECT.USERWITHAUTH,
    )


@dataclass(frozen=True, slots=True)
class SealingKeyMaterial:
    """A new TPM sealing key (not yet saved) and the AK's certification of it."""

    public: bytes  # TPM2B_PUBLIC, marshalled
    private: bytes  # TPM2B_PRIVATE, marshalled (wrapped by this TPM's storage key)
    auth: bytes
    attest: bytes  # TPMS_ATTEST of TPM2_Certify, as the TPM signed it
    r: bytes
    s: bytes

    def save(self, data_dir: Path) -> None:
        """``D/identity/sealing-key.json`` (0600): once the hub recorded the key."""
        doc = {
            "public": base64.b64encode(self.public).decode(),
            "private": base64.b64encode(self.private).decode(),
            "auth": base64.b64encode(self.auth).decode(),
        }
        path = Path(data_dir) / SEALING_KEY_FILE
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(path, orjson.dumps(doc), mode=0o600)


@dataclass(frozen=True, slots=True)
class EnrollmentMaterial:
    ek_certificate: bytes  # DER, from the TPM's NV memory
    ek_public: bytes  # TPM2B_PUBLIC, marshalled
    ak_public: bytes  # TPM2B_PUBLIC, marshalled


class TpmAttestationKey:
    """One open TPM session around the AK (``with`` closes it, flushing every object)."""

    def __init__(self, tcti: str, public: Any, private: Any, auth: bytes) -> None:
        from tpm2_pytss import ESAPI, ESYS_TR, TPM2B_SENSITIVE_CREATE

        self.tcti = tcti
        self.public, self.private, self._auth = public, private, auth
        self._handles: list[Any] = []
        try:
            self._esapi = ESAPI(tcti)
        except Exception as exc:  # tpm2-pytss raises TSS2_Exception and friends
            raise TpmAttestationError(f"TPM ({tcti}): {exc}") from exc
        try:
            srk, *_ = self._esapi.create_primary(
                TPM2B_SENSITIVE_CREATE(), _srk_template(), ESYS_TR.OWNER
            )
            self._handles.append(srk)
            if private is None:
                from tpm2_pytss import TPM2B_AUTH, TPMS_SENSITIVE_CREATE

                sensitive = TPM2B_SENSITIVE_CREATE(TPMS_SENSITIVE_CREATE(userAuth=TPM2B_AUTH(auth)))
                self.private, self.public, *_ = self._esapi.create(srk, sensitive, ak_template())
            self._ak = self._esapi.load(srk, self.private, self.public)
            self._handles.append(self._ak)
            self._esapi.tr_set_auth(self._ak, auth)
        except Exception as exc:
            self.close()
            raise TpmAttestationError(f"TPM ({tcti}): attestation key: {exc}") from exc

    # -- the file ---------------------------------------------------------------------------
    @classmethod
    def create(cls, data_dir: Path, tcti: str) -> TpmAttestationKey:
        """A new AK in the TPM, written to ``D/identity/ak.json`` (0600)."""
        key = cls(tcti, None, None, os.urandom(32))
        key.save(data_dir)
        log.info("attestation key created", tcti=tcti)
        return key

    @classmethod
    def load(cls, data_dir: Path, tcti: str) -> TpmAttestationKey | None:
        """The AK of ``D/identity/ak.json``, or None when there is none."""
        from tpm2_pytss import TPM2B_PRIVATE, TPM2B_PUBLIC

        path = Path(data_dir) / AK_FILE
        try:
            doc = orjson.loads(path.read_bytes())
            public, _ = TPM2B_PUBLIC.unmarshal(base64.b64decode(doc["public"]))
            private, _ = TPM2B_PRIVATE.unmarshal(base64.b64decode(doc["private"]))
            auth = base64.b64decode(doc["auth"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise TpmAttestationError(f"{path} is not an attestation key: {exc}") from None
        return cls(tcti, public, private, auth)

    def save(self, data_dir: Path) -> None:
        doc = {
            "public": base64.b64encode(bytes(self.public.marshal())).decode(),
            "private": base64.b64encode(bytes(self.private.marshal())).decode(),
            "auth": base64.b64encode(self._auth).decode(),
        }
        path = Path(data_dir) / AK_FILE
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(path, orjson.dumps(doc), mode=0o600)

    @staticmethod
    def forget(data_dir: Path) -> None:
        """Remove the AK's file, and the sealing key it certified."""
        (Path(data_dir) / AK_FILE).unlink(missing_ok=True)
        (Path(data_dir) / SEALING_KEY_FILE).unlink(missing_ok=True)

    # -- enrollment ------------------------------------------------------------------------
    def _endorsement_key(self) -> tuple[bytes, Any, Any]:
        from tpm2_pytss import ESYS_TR, TPM2B_SENSITIVE_CREATE
        from tpm2_pytss.utils import NVReadEK, create_ek_template

        cert, template = create_ek_template("EK-RSA2048", NVReadEK(self._esapi))
        if not cert:
            raise TpmAttestationError(f"TPM ({self.tcti}): no RSA EK certificate in NV memory")
        handle, public, *_ = self._esapi.create_primary(
            TPM2B_SENSITIVE_CREATE(), template, ESYS_TR.ENDORSEMENT
        )
        self._handles.append(handle)
        return bytes(cert), handle, public

    def enrollment_material(self) -> EnrollmentMaterial:
        try:
            cert, _, ek_public = self._endorsement_key()
        except TpmAttestationError:
            raise
        except Exception as exc:
            raise TpmAttestationError(f"TPM ({self.tcti}): endorsement key: {exc}") from exc
        return EnrollmentMaterial(cert, bytes(ek_public.marshal()), bytes(self.public.marshal()))

    def activate(self, credential_blob: bytes, encrypted_secret: bytes) -> bytes:
        """TPM2_ActivateCredential: the secret the hub sealed to our EK for this AK's name."""
        from tpm2_pytss import (
            ESYS_TR,
            TPM2_ALG,
            TPM2_SE,
            TPM2B_ENCRYPTED_SECRET,
            TPM2B_ID_OBJECT,
            TPMT_SYM_DEF,
        )

        try:
            blob, _ = TPM2B_ID_OBJECT.unmarshal(credential_blob)
            enc, _ = TPM2B_ENCRYPTED_SECRET.unmarshal(encrypted_secret)
            _, ek, _ = self._endorsement_key()
            session = self._esapi.start_auth_session(
                ESYS_TR.NONE,
                ESYS_TR.NONE,
                TPM2_SE.POLICY,
                TPMT_SYM_DEF(algorithm=TPM2_ALG.NULL),
                TPM2_ALG.SHA256,
            )
            self._handles.append(session)
            self._esapi.policy_secret(ESYS_TR.ENDORSEMENT, session, b"", b"", b"", 0)
            secret = self._esapi.activate_credential(
                self._ak, ek, blob, enc, session1=ESYS_TR.PASSWORD, session2=session
            )
        except Exception as exc:
            raise TpmAttestationError(f"TPM ({self.tcti}): credential activation: {exc}") from exc
        return bytes(secret)

    # -- the sealing key ---------------------------------------------------------------------
    def make_sealing_key(self, qualifying_data: bytes) -> SealingKeyMaterial:
        """A new sealing key (:func:`sealing_key_template`, random auth) under the storage
        key, certified by this AK (TPM2_Certify) with ``qualifying_data``: the hub records it
        and seals the Secrets that require a TPM to it (edgefleet.trust.tpmbinding)."""
        from tpm2_pytss import (
            TPM2_ALG,
            TPM2B_AUTH,
            TPM2B_DATA,
            TPM2B_SENSITIVE_CREATE,
            TPMS_SENSITIVE_CREATE,
            TPMT_SIG_SCHEME,
        )

        auth = os.urandom(32)
        # a TPM holds few transient objects (swtpm: 3): keep the storage key and the AK only
        while len(self._handles) > 2:
            try:
                self._esapi.flush_context(self._handles.pop())
            except Exception:  # an object already gone (a policy session ends with its use)
                pass
        try:
            srk = self._handles[0]
            sensitive = TPM2B_SENSITIVE_CREATE(TPMS_SENSITIVE_CREATE(userAuth=TPM2B_AUTH(auth)))
            private, public, *_ = self._esapi.create(srk, sensitive, sealing_key_template())
            handle = self._esapi.load(srk, private, public)
            self._handles.append(handle)
            self._esapi.tr_set_auth(handle, auth)
            attest, sig = self._esapi.certify(
                handle,
                self._ak,
                TPM2B_DATA(qualifying_data),
                TPMT_SIG_SCHEME(scheme=TPM2_ALG.NULL),
            )
        except Exception as exc:  # tpm2-pytss raises TSS2_Exception and friends
            raise TpmAttestationError(f"TPM ({self.tcti}): sealing key: {exc}") from exc
        return SealingKeyMaterial(
            bytes(public.marshal()),
            bytes(private.marshal()),
            auth,
            bytes(attest),
            bytes(sig.signature.ecdsa.signatureR),
            bytes(sig.signature.ecdsa.signatureS),
        )

    # -- attestation -----------------------------------------------------------------------
    def extend(self, pcr: int, digest: bytes) -> None:
        """TPM2_PCR_Extend of ``pcr`` (sha256 bank) with ``digest`` (edged's measurements)."""
        _pcr_extend(self._esapi, self.tcti, pcr, digest)

    def quote(self, qualifying_data: bytes, *, extra_pcr: int | None = None) -> dict[str, Any]:
        """A quote of :data:`QUOTED_PCRS` (and ``extra_pcr``, edged's measurement PCR; sha256
        bank) with ``qualifying_data`` (the digest of the signed statement: it binds the nonce
        and the measurements), for the evidence."""
        from tpm2_pytss import TPM2_ALG, TPM2B_DATA, TPML_PCR_SELECTION, TPMT_SIG_SCHEME

        quoted = (*QUOTED_PCRS, *(() if extra_pcr is None else (extra_pcr,)))
        selection = TPML_PCR_SELECTION.parse("sha256:" + ",".join(map(str, quoted)))
        try:
            attest, sig = self._esapi.quote(
                self._ak,
                selection,
                TPM2B_DATA(qualifying_data),
                TPMT_SIG_SCHEME(scheme=TPM2_ALG.NULL),
            )
            values: dict[str, str] = {}
            pending = list(quoted)
            while pending:  # pcr_read returns at most 8 digests per call
                sel = TPML_PCR_SELECTION.parse("sha256:" + ",".join(map(str, pending)))
                _, got_sel, digests = self._esapi.pcr_read(sel)
                got = [
                    i * 8 + b
                    for i, byte in enumerate(bytes(got_sel.pcrSelections[0].pcrSelect)[:3])
                    for b in range(8)
                    if byte >> b & 1
                ]
                if not got:
                    break
                for index, digest in zip(got, digests, strict=False):
                    values[str(index)] = bytes(digest).hex()
                pending = [p for p in pending if str(p) not in values]
        except Exception as exc:
            raise TpmAttestationError(f"TPM ({self.tcti}): quote: {exc}") from exc
        return {
            "format": QUOTE_FORMAT,
            "attest": base64.b64encode(bytes(attest)).decode(),
            "r": bytes(sig.signature.ecdsa.signatureR).hex(),
            "s": bytes(sig.signature.ecdsa.signatureS).hex(),
            "pcrs": values,
        }

    def close(self) -> None:
        _close_session(self)

    def __enter__(self) -> TpmAttestationKey:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close_session(owner: Any) -> None:
    """Flush ``owner._handles`` (newest first) and close ``owner._esapi``, once."""
    esapi = getattr(owner, "_esapi", None)
    if esapi is None:
        return
    for handle in reversed(owner._handles):
        try:
            esapi.flush_context(handle)
        except Exception:  # best effort: the TPM flushes transient objects on reset
            pass
    owner._handles.clear()
    esapi.close()
    owner._esapi = None


def _pcr_extend(esapi: Any, tcti: str, pcr: int, digest: bytes) -> None:
    from tpm2_pytss import ESYS_TR, TPM2_ALG, TPML_DIGEST_VALUES, TPMT_HA

    try:
        ha = TPMT_HA(hashAlg=TPM2_ALG.SHA256)
        ha.digest.sha256 = digest
        esapi.pcr_extend(getattr(ESYS_TR, f"PCR{pcr}"), TPML_DIGEST_VALUES([ha]))
    except Exception as exc:  # tpm2-pytss raises TSS2_Exception and friends
        raise TpmAttestationError(f"TPM ({tcti}): extend PCR {pcr}: {exc}") from exc


def extend_pcr(tcti: str, pcr: int, digest: bytes) -> None:
    """TPM2_PCR_Extend of ``pcr`` (sha256 bank) in a session of its own: a PCR extend needs
    no key, so a model's measurement (when a worker starts loading it) does not load the
    attestation key."""
    from tpm2_pytss import ESAPI

    try:
        esapi = ESAPI(tcti)
    except Exception as exc:
        raise TpmAttestationError(f"TPM ({tcti}): {exc}") from exc
    try:
        _pcr_extend(esapi, tcti, pcr, digest)
    finally:
        esapi.close()


class TpmSealingKey:
    """The device's TPM sealing key (``D/identity/sealing-key.json``), loaded for ECDH: what
    opens the Secrets that require a TPM. ``with`` closes the TPM session."""

    def __init__(self, data_dir: Path, tcti: str) -> None:
        from tpm2_pytss import (
            ESAPI,
            ESYS_TR,
            TPM2B_PRIVATE,
            TPM2B_PUBLIC,
            TPM2B_SENSITIVE_CREATE,
        )

        path = Path(data_dir) / SEALING_KEY_FILE
        try:
            doc = orjson.loads(path.read_bytes())
            self.public, _ = TPM2B_PUBLIC.unmarshal(base64.b64decode(doc["public"]))
            private, _ = TPM2B_PRIVATE.unmarshal(base64.b64decode(doc["private"]))
            auth = base64.b64decode(doc["auth"])
        except FileNotFoundError:
            raise TpmAttestationError(
                f"{path} is missing: this device has no TPM sealing key (enroll it again)"
            ) from None
        except (ValueError, KeyError, TypeError) as exc:
            raise TpmAttestationError(f"{path} is not a sealing key: {exc}") from None
        self.tcti = tcti
        self._handles: list[Any] = []
        try:
            self._esapi: Any = ESAPI(tcti)
        except Exception as exc:
            raise TpmAttestationError(f"TPM ({tcti}): {exc}") from exc
        try:
            srk, *_ = self._esapi.create_primary(
                TPM2B_SENSITIVE_CREATE(), _srk_template(), ESYS_TR.OWNER
            )
            self._handles.append(srk)
            self._key = self._esapi.load(srk, private, self.public)
            self._handles.append(self._key)
            self._esapi.tr_set_auth(self._key, auth)
        except Exception as exc:
            self.close()
            raise TpmAttestationError(f"TPM ({tcti}): sealing key: {exc}") from exc

    def public_key_pem(self) -> bytes:
        pem: bytes = self.public.to_pem()
        return pem

    def exchange(self, peer_public_key: Any) -> bytes:
        """ECDH in the TPM (TPM2_ECDH_ZGen) with ``peer_public_key`` (a ``cryptography`` P-256
        public key): the x coordinate of the shared point, as ``cryptography``'s ECDH gives."""
        from tpm2_pytss import TPM2B_ECC_POINT, TPMS_ECC_POINT

        numbers = peer_public_key.public_numbers()
        point = TPM2B_ECC_POINT(
            TPMS_ECC_POINT(x=numbers.x.to_bytes(32, "big"), y=numbers.y.to_bytes(32, "big"))
        )
        try:
            out = self._esapi.ecdh_zgen(self._key, point)
        except Exception as exc:
            raise TpmAttestationError(f"TPM ({self.tcti}): ECDH: {exc}") from exc
        return bytes(out.point.x).rjust(32, b"\x00")

    def close(self) -> None:
        _close_session(self)

    def __enter__(self) -> TpmSealingKey:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def forget(data_dir: Path) -> None:
        (Path(data_dir) / SEALING_KEY_FILE).unlink(missing_ok=True)
