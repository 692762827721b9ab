"""Attestation on the device: measure what edged runs and answer a hub's nonce with signed
evidence (the format and the hub's verifier: :mod:`edgefleet.trust.evidence`)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

from edgefleet.logs import get_logger
from edgefleet.trust.envelopes import EVIDENCE_TYPE, canonical_json, pae
from edgefleet.trust.evidence import FORMAT, measurement_digest, statement_digest

log = get_logger(__name__)

# -- measurements (device side) -------------------------------------------------------------------


def digest_file(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except FileNotFoundError:
        return None


def digest_root(path: Path | None) -> str | None:
    """The trust root's measurement: the digest of its signed payload (what identifies a root,
    :func:`edgefleet.trust.verifying.root_digest`), so that a root stored with other
    formatting than the hub's copy measures the same. A file that is not an envelope measures
    as its file digest (which matches no root)."""
    from edgefleet.errors import TrustError
    from edgefleet.trust.envelopes import parse_envelope_bytes
    from edgefleet.trust.verifying import root_digest

    if path is None:
        return None
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return root_digest(parse_envelope_bytes(data, what=str(path)))
    except TrustError:
        return hashlib.sha256(data).hexdigest()


def digest_code(package_dirs: Iterable[Path] | None = None) -> str:
    """One digest of the code edged runs: every ``.py`` file under the ``edged`` and
    ``edgefleet`` packages, by package, relative path and content, in sorted order. Computed
    once at start (a few ms)."""
    if package_dirs is None:
        here = Path(__file__).resolve()
        package_dirs = (here.parents[1], here.parents[2] / "edgefleet")
    h = hashlib.sha256()
    for root in package_dirs:
        for p in sorted(root.rglob("*.py")):
            rel = f"{root.name}/{p.relative_to(root).as_posix()}".encode()
            h.update(b"%d:%b:" % (len(rel), rel))
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def measurements(
    *, code: str, config: str | None, trust_root: str | None, models: Iterable[str]
) -> dict[str, Any]:
    return {"code": code, "config": config, "trustRoot": trust_root, "models": sorted(set(models))}


Quoter = Callable[[bytes, dict[str, Any]], dict[str, Any]]
"""``quote(qualifying_data, measurements)``: a quote by the device's EK-bound attestation key
(:meth:`edged.trust.tpmattesting.TpmAttestationKey.quote`); with a measurement PCR, the
measurements are extended into it first (:class:`MeasurementLog`)."""


class MeasurementLog:
    """edged's own measurements in a static PCR (docs/trust.md): each code, config and model
    digest not extended since boot is appended to the event log (``path``, under ``/run``:
    cleared at reboot, like the PCR) and then extended into ``pcr``. The log is written before
    the extend: a crash between them leaves an event the PCR lacks, which the hub sees as a
    mismatch until the next reboot rather than a measurement it cannot see.

    Two threads extend: a model's measurement when a worker starts loading it
    (:class:`LoadMeasurer`) and the attestation answer before its quote. ``lock`` (held for
    each read-append-extend, and by the answer for its whole TPM session) keeps the log's
    order the PCR's order."""

    def __init__(self, path: Path, pcr: int) -> None:
        from edgefleet.trust.evidence import MEASUREMENT_PCRS

        if pcr not in MEASUREMENT_PCRS:
            raise ValueError(f"a measurement PCR is 8-15 (reset only by a reboot), got {pcr}")
        self.path = path
        self.pcr = pcr
        self.lock = threading.RLock()

    def read(self) -> list[dict[str, str]]:
        try:
            doc = orjson.loads(self.path.read_bytes())
        except FileNotFoundError:
            return []
        return list(doc["events"]) if isinstance(doc, dict) else []

    def extend(
        self, m: dict[str, Any], extend: Callable[[int, bytes], None]
    ) -> list[dict[str, str]]:
        """Extend what ``m`` measures and the log lacks; the whole log since boot."""
        wanted = [("code", m["code"]), ("config", m["config"])]
        wanted += [("model", d) for d in m["models"]]
        return self.extend_events(wanted, extend)

    def extend_events(
        self, wanted: Iterable[tuple[str, str | None]], extend: Callable[[int, bytes], None]
    ) -> list[dict[str, str]]:
        """Append and extend each ``(kind, sha256)`` the log lacks, in order; the whole log
        since boot. ``extend(pcr, digest)`` is called only for new events."""
        from edgefleet.persisting import write_atomic
        from edgefleet.trust.evidence import event_digest

        with self.lock:
            events = self.read()
            seen = {(e["kind"], e["sha256"]) for e in events}
            for kind, digest in wanted:
                if digest is None or (kind, digest) in seen:
                    continue
                event = {"kind": kind, "sha256": digest}
                events.append(event)
                seen.add((kind, digest))
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                doc = orjson.dumps({"pcr": self.pcr, "events": events})
                write_atomic(self.path, doc, mode=0o600)
                extend(self.pcr, event_digest(event))
            return events


class LoadMeasurer:
    """Extends a model's measurement into the measurement PCR when a worker starts loading
    it (``await measurer(sha256)``, from :class:`edged.runtime.workerpool.WorkerPool`), so the
    PCR holds every model edged ran since boot before any attestation challenge; the
    attestation answer extends what is still missing before its quote. Only with an EK-bound
    attestation key (``D/identity/ak.json``) and a TPM ``trust.tpm`` selects, as the answer.
    Runs in a thread; a TPM error is logged (the next answer tries again) and never raised:
    serving does not wait on the TPM beyond the pool's bound."""

    def __init__(self, data_dir: Path, *, tpm: str, measurement: MeasurementLog) -> None:
        self._data_dir = data_dir
        self._tpm = tpm
        self.log = measurement

    async def __call__(self, sha256: str) -> None:
        await asyncio.to_thread(self.measure, sha256)

    def measure(self, sha256: str) -> bool:
        """Append and extend ``sha256`` as a model event unless the log has it; whether the
        PCR holds it now."""
        from edged.trust.identity import resolve_tcti
        from edged.trust.tpmattesting import AK_FILE, TpmAttestationError, extend_pcr

        tcti = resolve_tcti(self._tpm)
        if tcti is None or not (self._data_dir / AK_FILE).exists():
            return False
        try:
            self.log.extend_events(
                [("model", sha256)], lambda pcr, digest: extend_pcr(tcti, pcr, digest)
            )
        except (TpmAttestationError, OSError, ValueError) as exc:
            log.error("model measurement failed", sha256=sha256, error=str(exc))
            return False
        return True


class Attester:
    """Answers challenges for one device. ``identity`` is a FileIdentity or TpmIdentity;
    ``quoter``, when the device has an EK-bound TPM attestation key, quotes for each answer."""

    def __init__(
        self, identity: Any, *, code_digest: str | None = None, quoter: Quoter | None = None
    ) -> None:
        self._identity = identity
        self._quoter = quoter
        self.code_digest = code_digest or digest_code()

    def answer(
        self,
        nonce: bytes,
        *,
        now: float,
        config_path: Path | None,
        trust_root_path: Path | None,
        model_digests: Iterable[str],
    ) -> dict[str, Any]:
        m = measurements(
            code=self.code_digest,
            config=digest_file(config_path),
            trust_root=digest_root(trust_root_path),
            models=model_digests,
        )
        statement = {
            "nonce": base64.b64encode(nonce).decode(),
            "time": now,
            "identityKind": self._identity.kind,
            "measurements": m,
        }
        sig = self._identity.sign(pae(EVIDENCE_TYPE, canonical_json(statement)))
        evidence: dict[str, Any] = {
            "format": FORMAT,
            "statement": statement,
            "signature": base64.b64encode(sig).decode(),
        }
        if self._quoter is not None:
            evidence["tpm"] = self._quoter(statement_digest(statement), m)
        elif self._identity.kind == "tpm":
            q = self._identity.measure_and_quote(measurement_digest(m), nonce)
            ((pcr, value),) = q.pcrs.items()
            evidence["tpm"] = {
                "pcr": pcr,
                "pcrValue": value.hex(),
                "attest": base64.b64encode(q.attest).decode(),
                "r": q.r.hex(),
                "s": q.s.hex(),
            }
        return evidence


class ChallengeAnswerer:
    """Answers a hub's attestation challenge (``await answerer(nonce)``: evidence as JSON).

    The identity is loaded and the code measured at the first challenge, in a thread, as is
    every answer (signing may go through the TPM). ``model_digests`` gives the artifacts of the
    desired state at the time of the challenge.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        config_path: Path | None,
        trust_root_path: Path,
        model_digests: Callable[[], Iterable[str]],
        tpm: str = "off",
        measurement: MeasurementLog | None = None,
    ) -> None:
        self._data_dir = data_dir
        self._tpm = tpm
        self._measurement = measurement
        self._config_path = config_path
        self._trust_root_path = trust_root_path
        self._model_digests = model_digests
        self._attester: Attester | None = None

    def _quote_or_none(self) -> Quoter | None:
        from edged.trust.identity import resolve_tcti
        from edged.trust.tpmattesting import AK_FILE

        tcti = resolve_tcti(self._tpm)
        if tcti is None or not (self._data_dir / AK_FILE).exists():
            return None

        def quote(qualifying: bytes, m: dict[str, Any]) -> dict[str, Any]:
            from edged.trust.tpmattesting import TpmAttestationError, TpmAttestationKey

            log_ = self._measurement
            try:
                # one TPM session at a time with the model measurer (a TPM behind a single
                # connection, like swtpm's socket, would otherwise wait on itself)
                with log_.lock if log_ is not None else contextlib.nullcontext():
                    key = TpmAttestationKey.load(self._data_dir, tcti)
                    if key is None:
                        raise TpmAttestationError("the attestation key file is gone")
                    with key:
                        if log_ is None:
                            return key.quote(qualifying)
                        events = log_.extend(m, key.extend)
                        out = key.quote(qualifying, extra_pcr=log_.pcr)
                        return {**out, "measurementPcr": log_.pcr, "eventLog": events}
            except (TpmAttestationError, OSError, ValueError) as exc:
                # Answer anyway: the hub judges a missing quote (Untrusted, with the reason).
                log.error("tpm quote failed", error=str(exc))
                return {"format": "unavailable", "error": str(exc)[:500]}

        return quote

    async def __call__(self, nonce: bytes) -> bytes:
        return await asyncio.to_thread(self._answer, nonce)

    def _answer(self, nonce: bytes) -> bytes:
        from edged.trust.identity import load_or_create_identity

        if self._attester is None:
            # The identity (TLS) key is a file key: grpc cannot use a TPM key. The TPM, when
            # trust.tpm selects one and enrollment bound an attestation key in it, quotes.
            self._attester = Attester(
                load_or_create_identity(self._data_dir, tpm="off"), quoter=self._quote_or_none()
            )
        root = self._trust_root_path
        evidence = self._attester.answer(
            nonce,
            now=time.time(),
            config_path=self._config_path,
            trust_root_path=root if root.exists() else None,
            model_digests=sorted(set(self._model_digests())),
        )
        return orjson.dumps(evidence)
