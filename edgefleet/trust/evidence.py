"""Attestation evidence: its format and the pure verifier the hub uses (the device's side,
which makes evidence, is ``edged.trust.attesting``).

Evidence (a JSON-able dict; the hub carries it as bytes):

```
{"format": "edgefleet-evidence/v1",
 "statement": {"nonce": B64, "time": EPOCH, "identityKind": "tpm"|"file",
               "measurements": {"code": HEX, "config": HEX|null, "trustRoot": HEX|null,
                                "models": [HEX, ...]}},
 "signature": B64,            # ECDSA P-256/SHA-256 by the identity key over
                              # PAE(EVIDENCE_TYPE, canonical_json(statement))
 "tpm": {"pcr": 23, "pcrValue": HEX, "attest": B64, "r": HEX, "s": HEX}}   # TPM only
```

With a TPM, PCR 23 is reset and extended with ``sha256(canonical_json(measurements))`` and
quoted with the nonce as qualifying data, so the quote binds the same measurements.
:func:`verify_evidence` is pure (no I/O, no clock) and returns a :class:`Verdict` with a
reason for every failed check.

Freshness is the nonce's job: the hub's challenge is fresh and answered within the hub's
timeout (measured on the hub's clock, :func:`hub.controllers.attestation.assess`), so the device's
clock is
not consulted (``statement.time`` must only be a finite number).

A quote proves something only when it is signed by an attestation key (AK) the hub bound to
the TPM's endorsement key at enrollment (:mod:`edgefleet.trust.tpmbinding`): then the evidence
carries ``"tpm": {"format": "ak-quote/v1", "attest", "r", "s", "pcrs": {"0": HEX...}}``, a
quote of PCRs 0-7 (measured boot, not resettable by software) whose qualifying data is
:func:`statement_digest` (binding the nonce and the measurements), and the verdict is
TPM-attested. A device with a bound AK must send such a quote ("from then on only quotes").
Any other quote (the older PCR-23 quote by the identity key, which no EK vouches for and which a
device without a TPM can make up) is refused (``QuoteKeyNotEkBound``); a device without a
bound AK is at best *software-attested* (``Verdict.tpm_attested`` is False).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgefleet.trust.envelopes import EVIDENCE_TYPE, canonical_json, pae

FORMAT = "edgefleet-evidence/v1"
AK_QUOTE_FORMAT = "ak-quote/v1"
AK_QUOTE_PCRS = tuple(range(8))  # measured boot: PCRs software cannot reset
TPM_GENERATED_VALUE = 0xFF544347
TPM_ST_ATTEST_QUOTE = 0x8018
TPM_ALG_SHA256 = 0x000B


# edged's own measurements (docs/trust.md, "edged's measurements in a PCR"): extended into a
# static PCR (8-15: reset only by a reboot; 16 and 23 are reset by any software) named in the
# device's config, with an event log since boot that the hub replays against the quote.
MEASUREMENT_PCRS = range(8, 16)
MAX_EVENTS = 4096
EVENT_KINDS = ("code", "config", "model")


def event_digest(event: Mapping[str, Any]) -> bytes:
    """What one event extends into the measurement PCR: sha256 of its canonical JSON."""
    return hashlib.sha256(
        canonical_json({"kind": event["kind"], "sha256": event["sha256"]})
    ).digest()


def replay(events: list[Mapping[str, Any]]) -> bytes:
    """The PCR value after a reboot (zeros) and one SHA-256 extend per event, in order."""
    value = b"\x00" * 32
    for event in events:
        value = hashlib.sha256(value + event_digest(event)).digest()
    return value


def measurement_digest(m: Mapping[str, Any]) -> bytes:
    return hashlib.sha256(canonical_json(m)).digest()


def expected_pcr(measurement: bytes) -> bytes:
    """PCR value after a reset (zeros) and one SHA-256 extend with ``measurement``."""
    return hashlib.sha256(b"\x00" * 32 + measurement).digest()


# -- the verifier (hub side, pure) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Policy:
    """Reference values. An empty ``allowed_*`` set allows nothing; ``None`` does not check
    that measurement (the hub's baseline left it open). ``trust_root`` is checked only when
    ``check_trust_root`` (``None`` then means the device must report no root)."""

    allowed_code: frozenset[str] | None
    allowed_config: frozenset[str] | None
    trust_root: str | None
    allowed_models: frozenset[str] | None
    require_tpm: bool = False
    check_trust_root: bool = True
    # PCR index -> allowed values (hex): measured-boot reference values; a PCR listed here
    # must be quoted by an EK-bound attestation key with one of them
    allowed_pcrs: Mapping[int, frozenset[str]] | None = None
    # a baseline's requireMeasurementPcr: the quote must cover edged's measurement PCR with
    # an event log that replays (docs/trust.md); implies require_tpm
    require_measurement_pcr: bool = False


@dataclass(frozen=True, slots=True)
class Verdict:
    trusted: bool
    reasons: tuple[str, ...]
    # Whether a TPM vouched for the measurements (a quote by an EK-bound attestation key).
    # Always False today: trusted evidence is software-attested (module doc).
    tpm_attested: bool = False


@dataclass(frozen=True, slots=True)
class ParsedQuote:
    magic: int
    type: int
    extra_data: bytes
    pcr_selection: tuple[tuple[int, tuple[int, ...]], ...]  # (hash alg, pcr indices)
    pcr_digest: bytes


def parse_quote(attest: bytes) -> ParsedQuote:
    """TPMS_ATTEST (TPM 2.0 Part 2, 10.12.12) for a quote; ValueError when malformed."""
    try:
        magic, typ = struct.unpack_from(">IH", attest, 0)
        off = 6
        (n,) = struct.unpack_from(">H", attest, off)  # qualifiedSigner
        off += 2 + n
        (n,) = struct.unpack_from(">H", attest, off)  # extraData
        extra = attest[off + 2 : off + 2 + n]
        off += 2 + n
        off += 8 + 4 + 4 + 1 + 8  # clockInfo, firmwareVersion
        (count,) = struct.unpack_from(">I", attest, off)
        off += 4
        selection = []
        for _ in range(count):
            alg, size = struct.unpack_from(">HB", attest, off)
            off += 3
            bits = attest[off : off + size]
            off += size
            pcrs = tuple(
                i * 8 + b for i, byte in enumerate(bits) for b in range(8) if byte >> b & 1
            )
            selection.append((alg, pcrs))
        (n,) = struct.unpack_from(">H", attest, off)
        digest = attest[off + 2 : off + 2 + n]
        if len(digest) != n:
            raise ValueError("truncated")
    except struct.error as exc:
        raise ValueError(f"malformed TPMS_ATTEST: {exc}") from None
    return ParsedQuote(magic, typ, extra, tuple(selection), digest)


def _load_public(identity_public_key: Any) -> Any:
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    if isinstance(identity_public_key, bytes | str):
        data = (
            identity_public_key.encode()
            if isinstance(identity_public_key, str)
            else identity_public_key
        )
        return load_pem_public_key(data)
    return identity_public_key


def _ecdsa_ok(public: Any, signature_der: bytes, message: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        public.verify(signature_der, message, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError, TypeError, AttributeError):
        return False
    return True


def _check_tpm(tpm: Any, nonce: bytes, m: Mapping[str, Any], public: Any) -> list[str]:
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    try:
        attest = base64.b64decode(tpm["attest"], validate=True)
        pcr = int(tpm["pcr"])
        value = bytes.fromhex(tpm["pcrValue"])
        sig = encode_dss_signature(int(tpm["r"], 16), int(tpm["s"], 16))
        q = parse_quote(attest)
    except (KeyError, TypeError, ValueError) as exc:
        return [f"QuoteMalformed: {exc}"]
    reasons = []
    if q.magic != TPM_GENERATED_VALUE:
        reasons.append("QuoteMagicInvalid: not generated by a TPM")
    if q.type != TPM_ST_ATTEST_QUOTE:
        reasons.append(f"QuoteTypeInvalid: type {q.type:#x} is not TPM_ST_ATTEST_QUOTE")
    if not hmac.compare_digest(q.extra_data, nonce):
        reasons.append("QuoteNonceMismatch: the quote's qualifying data is not the nonce")
    if q.pcr_selection != ((TPM_ALG_SHA256, (pcr,)),):
        reasons.append(f"QuotePcrSelectionMismatch: quote selects {q.pcr_selection}")
    if q.pcr_digest != hashlib.sha256(value).digest():
        reasons.append("QuotePcrDigestMismatch: the quoted PCR digest is not the claimed value")
    if value != expected_pcr(measurement_digest(m)):
        reasons.append(f"PcrMeasurementMismatch: PCR {pcr} does not bind the measurements")
    if not _ecdsa_ok(public, sig, attest):
        reasons.append("QuoteSignatureInvalid: the quote is not signed by the identity key")
    reasons.append(
        "QuoteKeyNotEkBound: the quote is signed by the device's identity key, which no "
        "endorsement key vouches for; a device without a TPM, or root on one, can make such "
        "a quote up"
    )
    return reasons


def statement_digest(statement: Mapping[str, Any]) -> bytes:
    """What an AK quote's qualifying data is: it binds the nonce and the measurements."""
    return hashlib.sha256(pae(EVIDENCE_TYPE, canonical_json(statement))).digest()


def _check_ak_quote(tpm: Any, statement: Mapping[str, Any], ak_public: Any) -> list[str]:
    """A quote by the device's EK-bound attestation key over :data:`AK_QUOTE_PCRS`."""
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    try:
        if not isinstance(tpm, Mapping) or tpm.get("format") != AK_QUOTE_FORMAT:
            raise ValueError(f"format must be {AK_QUOTE_FORMAT!r}")
        attest = base64.b64decode(tpm["attest"], validate=True)
        sig = encode_dss_signature(int(tpm["r"], 16), int(tpm["s"], 16))
        selected = AK_QUOTE_PCRS
        if "measurementPcr" in tpm:
            pcr = tpm["measurementPcr"]
            if isinstance(pcr, bool) or not isinstance(pcr, int) or pcr not in MEASUREMENT_PCRS:
                raise ValueError(f"measurementPcr must be a PCR index 8-15, got {pcr!r}")
            selected = (*AK_QUOTE_PCRS, pcr)
        values = [bytes.fromhex(tpm["pcrs"][str(i)]) for i in selected]
        q = parse_quote(attest)
        key = _load_public(ak_public)
    except (KeyError, TypeError, ValueError) as exc:
        return [f"QuoteMalformed: {exc}"]
    reasons = []
    if q.magic != TPM_GENERATED_VALUE:
        reasons.append("QuoteMagicInvalid: not generated by a TPM")
    if q.type != TPM_ST_ATTEST_QUOTE:
        reasons.append(f"QuoteTypeInvalid: type {q.type:#x} is not TPM_ST_ATTEST_QUOTE")
    if not hmac.compare_digest(q.extra_data, statement_digest(statement)):
        reasons.append("QuoteNonceMismatch: the quote does not bind this statement and nonce")
    if q.pcr_selection != ((TPM_ALG_SHA256, selected),):
        reasons.append(f"QuotePcrSelectionMismatch: quote selects {q.pcr_selection}")
    if q.pcr_digest != hashlib.sha256(b"".join(values)).digest():
        reasons.append("QuotePcrDigestMismatch: the quoted PCR digest is not the claimed values")
    if not _ecdsa_ok(key, sig, attest):
        reasons.append(
            "QuoteSignatureInvalid: the quote is not signed by this device's EK-bound "
            "attestation key"
        )
    return reasons


def _check_event_log(tpm: Mapping[str, Any], m: Mapping[str, Any], policy: Policy) -> list[str]:
    """edged's measurements in a PCR: the event log replays to the quoted value of the
    measurement PCR, the statement's code, config and models are among its events, and every
    code and config event since boot is an allowed value (a device that ran code the baselines
    do not allow since its last reboot is not trusted until it reboots)."""
    pcr = tpm["measurementPcr"]
    try:
        events = tpm["eventLog"]
        if not isinstance(events, list) or len(events) > MAX_EVENTS:
            raise ValueError(f"eventLog must be a list of at most {MAX_EVENTS} events")
        for e in events:
            if not isinstance(e, Mapping) or set(e) != {"kind", "sha256"}:
                raise ValueError("an event is {kind, sha256}")
            if e["kind"] not in EVENT_KINDS or not isinstance(e["sha256"], str):
                raise ValueError(f"an event's kind is one of {', '.join(EVENT_KINDS)}")
            if len(e["sha256"]) != 64 or bytes.fromhex(e["sha256"]).hex() != e["sha256"]:
                raise ValueError("an event's sha256 is 64 lowercase hexadecimal digits")
        quoted = bytes.fromhex(tpm["pcrs"][str(pcr)])
    except (KeyError, TypeError, ValueError) as exc:
        return [f"EventLogMalformed: {exc}"]
    if not hmac.compare_digest(replay(events), quoted):
        return [f"EventLogMismatch: the event log does not replay to the quoted PCR {pcr}"]
    reasons = []
    seen = {(e["kind"], e["sha256"]) for e in events}
    claimed = [("code", m.get("code")), ("config", m.get("config"))]
    claimed += [("model", d) for d in m.get("models", ())]
    for kind, digest in claimed:
        if digest is not None and (kind, digest) not in seen:
            reasons.append(f"MeasurementNotExtended: {kind} {digest} is not in PCR {pcr}")
    # code and config since boot; models as the statement claims them (checked below in
    # verify_evidence): a model replaced since boot need not stay owed
    allowed = {"code": policy.allowed_code, "config": policy.allowed_config}
    for kind, digest in sorted(seen):
        names = allowed.get(kind)
        if names is not None and digest not in names:
            reasons.append(
                f"EventNotAllowed: {kind} {digest} was extended into PCR {pcr} since boot "
                "and is not a reference value"
            )
    return reasons


def verify_evidence(
    evidence: Mapping[str, Any],
    *,
    expected_nonce: bytes,
    identity_public_key: Any,
    policy: Policy,
    now: float,
    attestation_key: Any | None = None,
) -> Verdict:
    """Is this device's answer to ``expected_nonce`` trustworthy under ``policy``? Pure.

    ``identity_public_key``: the device's P-256 public key (PEM bytes/str or a key object),
    taken from its certificate. ``attestation_key``: the public key (PEM) of the device's
    EK-bound TPM attestation key, when the hub bound one: then only evidence with a valid quote
    by it is trusted, and the verdict is TPM-attested. Every failed check adds a reason
    (``Reason: detail``). ``now`` is kept for callers; no check compares it with the device's
    clock (module doc)."""
    reasons: list[str] = []
    try:
        if evidence.get("format") != FORMAT:
            return Verdict(False, (f"UnknownFormat: {evidence.get('format')!r}",))
        st = evidence["statement"]
        nonce = base64.b64decode(st["nonce"], validate=True)
        when = st["time"]
        if isinstance(when, bool) or not isinstance(when, int | float) or not math.isfinite(when):
            raise ValueError(f"statement.time must be a finite number, got {when!r}")
        m = st["measurements"]
        sig = base64.b64decode(evidence["signature"], validate=True)
        models = list(m["models"])
    except (KeyError, TypeError, ValueError) as exc:
        return Verdict(False, (f"EvidenceMalformed: {exc}",))
    try:
        public = _load_public(identity_public_key)
    except ValueError as exc:
        return Verdict(False, (f"BadIdentityKey: {exc}",))
    if not _ecdsa_ok(public, sig, pae(EVIDENCE_TYPE, canonical_json(st))):
        reasons.append("BadSignature: the evidence is not signed by the device identity key")
    if not hmac.compare_digest(nonce, expected_nonce):
        reasons.append("NonceMismatch: the evidence answers another (stale or replayed) nonce")
    tpm = evidence.get("tpm")
    tpm_attested = False
    if attestation_key is not None:
        if tpm is None:
            reasons.append(
                "NoTpmQuote: this device's TPM attestation key is bound: only quotes are accepted"
            )
        else:
            quote_reasons = _check_ak_quote(tpm, st, attestation_key)
            if not quote_reasons and "measurementPcr" in tpm:
                quote_reasons = _check_event_log(tpm, m, policy)
            reasons += quote_reasons
            tpm_attested = not quote_reasons
            if tpm_attested and policy.require_measurement_pcr and "measurementPcr" not in tpm:
                reasons.append(
                    "MeasurementPcrRequired: a SecurityBaseline requires edged's measurements "
                    "in a PCR and this device's quote carries no measurement PCR and event log "
                    "(set trust.measurementPcr in its edged.toml)"
                )
    elif tpm is not None:
        reasons += _check_tpm(tpm, expected_nonce, m, public)
    elif policy.require_tpm or policy.require_measurement_pcr:
        reasons.append(
            "NoTpmQuote: a SecurityBaseline requires TPM attestation and this device has no "
            "attestation key bound to a TPM endorsement key"
        )
    if policy.allowed_pcrs:
        if not tpm_attested:
            if attestation_key is None:
                reasons.append(
                    "PcrNotAttested: a SecurityBaseline pins PCR values and this device has no "
                    "attestation key bound to a TPM endorsement key to quote them"
                )
        elif isinstance(tpm, Mapping):
            pcrs = tpm["pcrs"]
            for index, allowed in sorted(policy.allowed_pcrs.items()):
                value = str(pcrs.get(str(index), "")).lower()
                if value not in allowed:
                    reasons.append(f"PcrNotAllowed: PCR {index} is {value}, not a reference value")
    if policy.allowed_code is not None and m.get("code") not in policy.allowed_code:
        reasons.append(f"CodeNotAllowed: edged code digest {m.get('code')}")
    if policy.allowed_config is not None and m.get("config") not in policy.allowed_config:
        reasons.append(f"ConfigNotAllowed: config digest {m.get('config')}")
    if policy.check_trust_root and m.get("trustRoot") != policy.trust_root:
        reasons.append(f"TrustRootMismatch: trust root digest {m.get('trustRoot')}")
    for digest in models:
        if policy.allowed_models is not None and digest not in policy.allowed_models:
            reasons.append(f"ModelNotAllowed: model digest {digest}")
    return Verdict(not reasons, tuple(reasons), tpm_attested and not reasons)
