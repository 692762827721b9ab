"""The attestation controller: challenge connected devices, judge their evidence.

Every connected device (a session in the hub's sessions) is challenged with a fresh 32-byte
nonce when it has no outstanding challenge and its last verdict is older than
``attestation.period`` (so a device that just connected is challenged at the next scan, not
a period later). The device answers with evidence (:meth:`edged.trust.attesting.Attester.answer`,
JSON bytes), which :class:`DeviceServicer` hands to :meth:`Attestation.on_evidence`.

The decisions are pure functions, tested as tables:

* :func:`reference_policy` — the reference :class:`~edgefleet.trust.evidence.Policy` from the
  fleet's ``SecurityBaseline`` objects (``spec.allowedCodeDigests``,
  ``spec.allowedConfigDigests``, ``spec.allowedModelDigests``: lists of ``sha256:<hex>``; a
  list that no baseline fills is not checked; several baselines allow the union), the payload
  digest of the hub's trust root (checked when the hub has one; never the file's bytes), and
  the models the device is owed (always allowed, so a device is not Untrusted for running
  what the hub sent it); ``requireTpm`` in any baseline makes a device without an EK-bound
  attestation key Untrusted (``NoTpmQuote``), and ``requireMeasurementPcr`` (which implies
  it) also one whose quote carries no measurement PCR and event log
  (``MeasurementPcrRequired``);
* :func:`assess` — given the device, its outstanding challenge, the evidence that arrived (if
  any) and ``now``: the device's new :class:`~hub.decide.devices.Attestation`. Evidence is verified
  by
  the pure :func:`~edgefleet.trust.evidence.verify_evidence` against the outstanding nonce (an
  answer to an older or unknown nonce fails with ``NonceMismatch``); no evidence within
  ``attestation.timeout`` is ``NoAnswer``.

This loop only applies them: the device record (the device writer's ``update``), an event and a new
projection (the projector's ``mark``) when the state or its reasons change: under a baseline with
``requireAttestation: true`` an Untrusted device gets a NoExecute taint
(:func:`hub.decide.placement.taints_for`). Devices that are not connected are not challenged and
keep
their last verdict (they are NotReady anyway).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from edgefleet.errors import TrustError
from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop
from edgefleet.trust.envelopes import parse_envelope_bytes
from edgefleet.trust.evidence import Policy, verify_evidence
from edgefleet.trust.verifying import root_digest
from hub.config import AttestationConfig
from hub.decide.devices import Attestation, Device, TrustState
from hub.state.cache import Cache
from hub.state.projector import Projector
from hub.state.sessions import Sessions
from hub.state.writer import DeviceWriter

log = get_logger(__name__)

NONCE_BYTES = 32
MAX_EVIDENCE_BYTES = 64 * 1024
KIND_BASELINE = "SecurityBaseline"


@dataclass(frozen=True, slots=True)
class Challenge:
    """A challenge sent to a device and not answered yet."""

    nonce: bytes
    sent_at: float


# -- pure decisions ----------------------------------------------------------------------------


def _digests(values: object) -> set[str]:
    """``sha256:<hex>`` (or bare hex) entries of a baseline list, as the hex devices report."""
    if not isinstance(values, list):
        return set()
    out = set()
    for v in values:
        if isinstance(v, str) and v:
            out.add(v.lower().removeprefix("sha256:"))
    return out


def _root_measurement(trust_root: bytes) -> str:
    """What a device measures for this root: its payload digest (the device stores the root
    with its own formatting; file bytes would differ by a newline and mark it Untrusted)."""
    try:
        return root_digest(parse_envelope_bytes(trust_root, what="the hub's trust root"))
    except TrustError:
        return hashlib.sha256(trust_root).hexdigest()


def reference_policy(
    baselines: Iterable[Mapping[str, Any]],
    *,
    trust_root: bytes,
    owed_models: Iterable[str],
) -> Policy:
    """The reference values a device's measurements are checked against (pure; module doc)."""
    code: set[str] = set()
    config: set[str] = set()
    models: set[str] = set()
    pcrs: dict[int, set[str]] = {}
    require_tpm = False
    require_measurement_pcr = False
    for manifest in baselines:
        spec = manifest.get("spec")
        if not isinstance(spec, Mapping):
            continue
        measured = bool(spec.get("requireMeasurementPcr"))
        require_measurement_pcr = require_measurement_pcr or measured
        require_tpm = require_tpm or measured or bool(spec.get("requireTpm"))
        raw_pcrs = spec.get("allowedPcrValues")
        if isinstance(raw_pcrs, Mapping):
            for index, values in raw_pcrs.items():
                if str(index).isdigit() and isinstance(values, list):
                    pcrs.setdefault(int(index), set()).update(str(v).lower() for v in values)
        code |= _digests(spec.get("allowedCodeDigests"))
        config |= _digests(spec.get("allowedConfigDigests"))
        models |= _digests(spec.get("allowedModelDigests"))
    return Policy(
        allowed_code=frozenset(code) or None,
        allowed_config=frozenset(config) or None,
        trust_root=_root_measurement(trust_root) if trust_root else None,
        allowed_models=frozenset(models | set(owed_models)) if models else None,
        require_tpm=require_tpm,
        require_measurement_pcr=require_measurement_pcr,
        check_trust_root=bool(trust_root),
        allowed_pcrs={i: frozenset(v) for i, v in sorted(pcrs.items())} or None,
    )


def challenge_due(
    current: Attestation, *, connected: bool, outstanding: bool, now: float, period_s: float
) -> bool:
    """Whether to challenge a device now (pure)."""
    if not connected or outstanding:
        return False
    return current.verified_at is None or now - current.verified_at >= period_s


def assess(
    device: Device,
    challenge: Challenge | None,
    *,
    evidence: bytes | None,
    policy: Policy,
    now: float,
    timeout_s: float,
) -> Attestation:
    """The device's attestation after ``evidence`` arrived (or, with ``None``, after time
    passed) given its outstanding ``challenge``. Pure: no I/O, ``now`` passed in."""
    current = device.attestation
    if evidence is None:
        if challenge is None:
            return current
        if now - challenge.sent_at > timeout_s:
            return Attestation(
                TrustState.UNTRUSTED,
                (f"NoAnswer: no evidence within {timeout_s:g}s of the challenge",),
                verified_at=now,
                challenged_at=None,
            )
        return Attestation(current.state, current.reasons, current.verified_at, challenge.sent_at)
    expected = challenge.nonce if challenge is not None else b""
    try:
        doc = orjson.loads(evidence)
    except orjson.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        reasons: tuple[str, ...] = ("EvidenceMalformed: not a JSON object",)
    elif not device.public_key_pem:
        reasons = ("NoIdentityKey: the hub has no identity key for this device",)
    elif challenge is not None and now - challenge.sent_at > timeout_s:
        # Freshness by the hub's clock: the nonce is fresh, the answer must come in time.
        reasons = (
            f"EvidenceLate: answered {now - challenge.sent_at:.0f}s after the challenge, "
            f"limit {timeout_s:g}s",
        )
    else:
        verdict = verify_evidence(
            doc,
            expected_nonce=expected,
            identity_public_key=device.public_key_pem,
            policy=policy,
            now=now,
            attestation_key=device.attestation_key_pem or None,
        )
        reasons = verdict.reasons
        if verdict.trusted and challenge is not None:
            return Attestation(TrustState.TRUSTED, (), verified_at=now, challenged_at=None)
    if challenge is None:
        reasons = ("NoChallenge: evidence arrived with no challenge outstanding", *reasons)
    return Attestation(TrustState.UNTRUSTED, reasons, verified_at=now, challenged_at=None)


# -- the controller ------------------------------------------------------------------------------


class AttestationController:
    """The component (``name``, ``async run(stop)``); see the module doc."""

    name = "attestation"

    def __init__(
        self,
        cache: Cache,
        writer: DeviceWriter,
        projector: Projector,
        sessions: Sessions,
        *,
        config: AttestationConfig,
        clock: Callable[[], float] = time.time,
        nonce: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self._cache = cache
        self._writer = writer
        self._projector = projector
        self._sessions = sessions
        self._config = config
        self._clock = clock
        self._nonce = nonce
        self.outstanding: dict[str, Challenge] = {}

    # what the scan and the evidence handler share
    def policy_for(self, name: str) -> Policy:
        content = self._projector.content_for(name)
        return reference_policy(
            (o.manifest for o in self._cache.objects_of(KIND_BASELINE)),
            trust_root=self._cache.trust_root,
            owed_models=content.artifacts if content is not None else (),
        )

    def _apply(self, name: str, new: Attestation) -> None:
        device = self._cache.devices.get(name)
        if device is None or device.attestation == new:
            return
        old = device.attestation
        self._writer.update(device.with_(attestation=new))
        if (old.state, old.reasons) == (new.state, new.reasons):
            return
        trusted = new.state is TrustState.TRUSTED
        self._writer.event(
            "Device",
            name,
            "Normal" if trusted else "Warning",
            new.state.value,
            (
                "the evidence verified (TPM-attested: a quote by the EK-bound attestation key)"
                if device.attestation_key_pem
                else "the evidence verified (software-attested, no TPM)"
            )
            if trusted
            else "; ".join(new.reasons),
        )
        log.info("attestation", device=name, state=new.state.value, reasons=list(new.reasons))
        self._projector.mark([name])

    def on_evidence(self, name: str, nonce: bytes, evidence: bytes) -> None:
        """DeviceServicer's ``on_evidence``: judge a device's answer now."""
        device = self._cache.devices.get(name)
        if device is None:
            return
        if len(evidence) > MAX_EVIDENCE_BYTES:
            evidence = b"too large"
        challenge = self.outstanding.pop(name, None)
        new = assess(
            device,
            challenge,
            evidence=evidence,
            policy=self.policy_for(name),
            now=self._clock(),
            timeout_s=self._config.timeout_s,
        )
        self._apply(name, new)

    def scan(self) -> None:
        """Time out unanswered challenges and send the ones that are due."""
        now = self._clock()
        config = self._config
        for name, challenge in list(self.outstanding.items()):
            device = self._cache.devices.get(name)
            if device is None:
                del self.outstanding[name]
                continue
            new = assess(
                device,
                challenge,
                evidence=None,
                policy=self.policy_for(name),
                now=now,
                timeout_s=config.timeout_s,
            )
            if new.challenged_at is None:  # timed out: judged NoAnswer
                del self.outstanding[name]
            self._apply(name, new)
        for name in self._sessions.names():
            device = self._cache.devices.get(name)
            session = self._sessions.get(name)
            if device is None or session is None:
                continue
            if not challenge_due(
                device.attestation,
                connected=not session.closed,
                outstanding=name in self.outstanding,
                now=now,
                period_s=config.period_s,
            ):
                continue
            challenge = Challenge(self._nonce(NONCE_BYTES), now)
            self.outstanding[name] = challenge
            session.challenge(challenge.nonce)
            self._apply(name, replace(device.attestation, challenged_at=now))

    def tick_s(self) -> float:
        config = self._config
        return max(min(1.0, config.timeout_s / 4, config.period_s / 4), 0.01)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.scan()
            await wait_for_stop(stop, self.tick_s())
