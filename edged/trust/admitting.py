"""The artifact gate: the effects around the pure checks of :mod:`edgefleet.trust.verifying`.

``ArtifactGate`` owns ``D/trust/``: the accepted trust root (``root.json``, the envelope as
received) and the trust state (``state.json``: accepted root version, highest metadata and
model version per artifact name), both written atomically. One update (a sync of the desired
state) calls :meth:`begin` once — which fixes ``now`` and picks up a newer root from
``trust.rootFile`` — and then :meth:`admit` for each artifact: read the signed metadata,
verify it, stream the model into the store with the signed length as the limit and the signed
digest as a verifier, verify the extras the same way, and only then raise the persisted
highest versions. Every outcome is counted (``on_result(result, reason)``) and every refusal
is a ``TrustError`` naming the artifact and the reason.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edged.config import TrustConfig
from edged.trust.tpmcounter import TpmCounter, TpmCounterError, counter_lost
from edgefleet.artifacts.storing import ArtifactStore, LooksLikeOnnx, PinnedDigest, Verifier
from edgefleet.errors import ArtifactError, StateError, TrustError
from edgefleet.logs import get_logger
from edgefleet.metrics import Registry
from edgefleet.persisting import read_json, write_atomic, write_json_atomic
from edgefleet.trust.documents import (
    ArtifactMetadata,
    FileInfo,
    RollbackAllowance,
    Root,
    format_time,
    parse_root,
)
from edgefleet.trust.envelopes import (
    ROOT_TYPE,
    Envelope,
    decode_payload,
    parse_envelope,
    parse_envelope_bytes,
)
from edgefleet.trust.verifying import (
    SignedFile,
    TrustState,
    check_matches,
    check_model_version,
    check_root_usable,
    follow_roots,
    lost_trust_state,
    root_digest,
    verify_artifact_metadata,
)

log = get_logger(__name__)

CHUNK = 1 << 20
MAX_ROOTS_OFFERED = 1000  # roots in one file or message (a chain of rotations)
METADATA_SUFFIX = ".metadata.json"


@dataclass(frozen=True, slots=True)
class ArtifactRequest:
    """One artifact a desired workload needs, as the source found it on disk."""

    name: str
    version: str
    model_path: Path
    metadata_path: Path  # default: <model path>.metadata.json
    allowance_path: Path | None = None  # a signed rollback allowance, if the state carries one
    pinned_sha256: str | None = None


OnResult = Callable[[str, str], None]


class ArtifactGate:
    def __init__(
        self,
        data_dir: Path,
        *,
        root_file: Path | None,
        allow_unsigned: bool,
        on_result: OnResult | None = None,
        clock: Callable[[], float] = time.time,
        counter: TpmCounter | None = None,
        adopt_counter: bool = False,
    ) -> None:
        self._dir = Path(data_dir) / "trust"
        # the TPM's trust-state counter (edged/trust/tpmcounter.py), where a TPM exists
        self._counter = counter
        self._adopt_counter = adopt_counter  # enrollment: a new trust state adopts the TPM's
        self._tpm_value = 0
        self._root_file = root_file
        self.allow_unsigned = allow_unsigned
        self._on_result = on_result or (lambda result, reason: None)
        self._clock = clock
        self.root: Root | None = None
        self.root_problem: tuple[str, str] | None = None
        self.state = TrustState()
        self.unsigned: set[str] = set()
        self.root_digest: str | None = None
        # Set when artifacts must be refused until an operator acts (TrustStateLost,
        # RootConflict of the image root): (reason, message).
        self.blocked: tuple[str, str] | None = None
        self._root_file_seen: tuple[int, int] | None = None
        self._stat_cache: dict[tuple[str, int, int, int], str] = {}
        self._load()

    @classmethod
    def from_config(cls, data_dir: Path, trust: TrustConfig, registry: Registry) -> ArtifactGate:
        """edged's gate, as edged.toml's ``[trust]`` says: each verification counted in
        ``edged_artifact_verifications_total``, the trust state's version kept in the TPM's
        counter where edged has a TPM."""
        from edged.trust.identity import resolve_tcti

        verifications = registry.counter(
            "edged_artifact_verifications_total",
            "Artifact verifications by result (accepted, unsigned, refused) and reason",
            ("result", "reason"),
        )
        tcti = resolve_tcti(trust.tpm)
        return cls(
            data_dir,
            root_file=trust.root_file,
            allow_unsigned=trust.allow_unsigned,
            on_result=lambda result, reason: verifications.labels(
                result=result, reason=reason
            ).inc(),
            counter=TpmCounter(tcti) if tcti is not None else None,
        )

    # -- persisted state ----------------------------------------------------------------
    @property
    def root_path(self) -> Path:
        return self._dir / "root.json"

    @property
    def state_path(self) -> Path:
        return self._dir / "state.json"

    def _load(self) -> None:
        doc = read_json(self.state_path)
        if doc is not None:
            try:
                self.state = TrustState.from_json(doc)
            except (ValueError, KeyError, TypeError) as exc:
                raise StateError(f"{self.state_path} is not a trust state: {exc}") from None
        if self.root_path.exists():
            env = parse_envelope_bytes(self.root_path.read_bytes(), what=str(self.root_path))
            # Verified when it was accepted; parsed again, not re-verified against time.
            self.root = parse_root(decode_payload(env, expected_type=ROOT_TYPE, what="root"))
            self.root_digest = root_digest(env)
        self.blocked = lost_trust_state(
            state_exists=doc is not None,
            state=self.state,
            root_version=self.root.version if self.root is not None else None,
            root_digest=self.root_digest,
        )
        if self.blocked is None and self._counter is not None:
            self.blocked = self._check_counter(state_exists=doc is not None)
        if self.blocked is not None:
            log.error("trust state lost", reason=self.blocked[0], message=self.blocked[1])
            return
        if self.root is not None and self.root_digest is not None:
            # root.json is written before state.json: a crash between the two leaves the
            # state one step behind; bring it up (the root was verified before it was written).
            known = self.state.root_digests.get(self.root.version)
            if self.root.version > self.state.root_version or known is None:
                self._save_state(
                    self.state.with_roots(self.root.version, {self.root.version: self.root_digest})
                )

    def _check_counter(self, *, state_exists: bool) -> tuple[str, str] | None:
        """The TPM counter against the state (``TrustStateLost`` when the state is older)."""
        assert self._counter is not None
        try:
            value = self._counter.read()
        except TpmCounterError as exc:
            log.error("tpm counter unreadable", error=str(exc))
            return None
        self._tpm_value = value or 0
        if not state_exists and self._adopt_counter:
            return None  # enrolling with a token is deliberate: the state starts at the count
        lost = counter_lost(
            tpm_value=value, state_exists=state_exists, state_counter=self.state.tpm_counter
        )
        if lost is None:
            return None
        return ("TrustStateLost", f"{lost} (recover deliberately: edged trust reset)")

    def _save_state(self, state: TrustState) -> None:
        if state == self.state:
            return
        if self._counter is None:
            write_json_atomic(self.state_path, state.to_json())
            self.state = state
            return
        # written with the count it will have, then counted: a crash between leaves the
        # state one ahead of the TPM, never behind it
        state = replace(state, tpm_counter=max(self._tpm_value, state.tpm_counter) + 1)
        write_json_atomic(self.state_path, state.to_json())
        self.state = state
        try:
            self._tpm_value = self._counter.increment()
        except TpmCounterError as exc:
            log.error("tpm counter not raised", error=str(exc))

    # -- one update ---------------------------------------------------------------------
    def begin(self) -> float:
        """Fix ``now`` for one update and pick up a newer root from ``trust.rootFile``."""
        now = self._clock()
        self.refresh_root(now)
        return now

    def refresh_root(self, now: float) -> None:
        """Read ``trust.rootFile`` (the device image's root) when it changed. Without an
        accepted root it is the first root; with one, a newer image root must chain from the
        accepted one, and an image root of a version already accepted must be the same root
        (``RootConflict`` otherwise: reported, and artifacts are refused until it is resolved,
        because one of the two roots was not made by the fleet's root keys)."""
        path = self._root_file
        if path is None or (self.blocked is not None and self.blocked[0] == "TrustStateLost"):
            return
        try:
            st = path.stat()
            if (st.st_mtime_ns, st.st_size) == self._root_file_seen:
                return
            data = path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            self.root_problem = ("RootUnreadable", f"{path}: {exc.strerror}")
            return
        self._root_file_seen = (st.st_mtime_ns, st.st_size)
        try:
            self.accept_roots(data, now, origin=str(path))
            self.root_problem = None
            self.blocked = None
        except TrustError as exc:
            self.root_problem = (exc.reason, str(exc))
            if exc.reason == "RootConflict":
                self.blocked = (exc.reason, f"the image's trust root conflicts: {exc}")
            log.error("trust root refused", file=str(path), reason=exc.reason, message=str(exc))

    def accept_roots(
        self, data: bytes, now: float, *, origin: str, anchor: str | None = None
    ) -> Root | None:
        """Accept the root(s) in ``data`` — one envelope, or a JSON list of envelopes (a chain
        of rotations, oldest first) — as :func:`~edgefleet.trust.verifying.follow_roots`
        decides. Without an accepted root, the first root is the one whose digest is
        ``anchor`` (a pin), or the first in ``data`` when ``anchor`` is None: only a file
        of the device image may be trusted that way. Returns the new root, or None when
        nothing newer was offered; raises TrustError (nothing changes) when refused."""
        import orjson

        try:
            doc: Any = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise TrustError("MalformedEnvelope", f"{origin}: is not valid JSON") from None
        items = doc if isinstance(doc, list) else [doc]
        if not items or len(items) > MAX_ROOTS_OFFERED:
            raise TrustError(
                "MalformedEnvelope", f"{origin}: 1 to {MAX_ROOTS_OFFERED} roots, got {len(items)}"
            )
        envs = [parse_envelope(d, what=origin) for d in items]
        return self.accept_root_envelopes(envs, now, origin=origin, anchor=anchor)

    def accept_root_envelopes(
        self, envs: list[Envelope], now: float, *, origin: str, anchor: str | None = None
    ) -> Root | None:
        """:meth:`accept_roots` for envelopes already parsed."""
        known = dict(self.state.root_digests)
        if self.root is not None and self.root_digest is not None:
            known.setdefault(self.root.version, self.root_digest)
        update = follow_roots(self.root, known, envs, now, anchor=anchor, what=origin)
        if not update.changed or update.envelope is None:
            return None
        last = update.envelope
        write_atomic(self.root_path, last.to_bytes(), mode=0o644)
        self.root = update.root
        self.root_digest = root_digest(last)
        self._save_state(self.state.with_roots(update.root.version, update.digests))
        log.info(
            "trust root accepted",
            version=update.root.version,
            expires=format_time(update.root.expires),
            origin=origin,
        )
        return update.root

    def admit(
        self, req: ArtifactRequest, store: ArtifactStore, *, now: float, max_bytes: int
    ) -> str:
        """Verify and store the model of ``req``; return its sha256 (raise ArtifactError)."""
        return self.admit_with_extras(req, store, now=now, max_bytes=max_bytes)[0]

    def admit_with_extras(
        self, req: ArtifactRequest, store: ArtifactStore, *, now: float, max_bytes: int
    ) -> tuple[str, dict[str, str]]:
        """Verify and store the model of ``req`` and its signed extra files (a validation
        set, precision variants); the model's sha256 and the extras' by file name."""
        try:
            return self._admit(req, store, now=now, max_bytes=max_bytes)
        except ArtifactError as exc:
            self._on_result("refused", exc.reason)
            raise

    def _admit(
        self, req: ArtifactRequest, store: ArtifactStore, *, now: float, max_bytes: int
    ) -> tuple[str, dict[str, str]]:
        what = f"{req.name} {req.version}"
        try:
            env_bytes = req.metadata_path.read_bytes()
        except FileNotFoundError:
            return self._admit_unsigned(req, store, max_bytes=max_bytes), {}
        except OSError as exc:
            raise ArtifactError(
                "ArtifactUnreadable", f"{what}: cannot read {req.metadata_path}: {exc.strerror}"
            ) from None
        env = parse_envelope_bytes(env_bytes, what=f"{what}: {req.metadata_path.name}")
        self._check_not_blocked(what)
        if self.root is None and self.root_problem is not None:
            reason, message = self.root_problem
            raise TrustError(reason, f"{what}: {message}")
        meta = verify_artifact_metadata(
            self.root, env, now=now, state=self.state, what=f"{what}: signed metadata"
        )
        info = check_matches(
            meta, name=req.name, version=req.version, model_file=req.model_path.name
        )
        allowance = None
        if req.allowance_path is not None:
            try:
                allowance = parse_envelope_bytes(
                    req.allowance_path.read_bytes(), what=str(req.allowance_path)
                )
            except OSError as exc:
                raise ArtifactError(
                    "ArtifactUnreadable", f"{what}: rollback allowance: {exc}"
                ) from None
        root = check_root_usable(self.root, now)
        check_model_version(meta, state=self.state, root=root, allowance=allowance, now=now)
        extras = self._store_extras(meta, req.model_path.parent, store, what)
        sha = self._ingest(
            req,
            store,
            info,
            [SignedFile(info, what), PinnedDigest(req.pinned_sha256), LooksLikeOnnx()],
            what,
        )
        self._save_state(self.state.accept(meta))
        self.unsigned.discard(req.name)
        self._on_result("accepted", "Verified")
        return sha, extras

    def _store_extras(
        self, meta: ArtifactMetadata, folder: Path, store: ArtifactStore, what: str
    ) -> dict[str, str]:
        """Every signed extra next to the model, into the store (checked against its signed
        length and digest on the way; a file unchanged since the last sync is not hashed
        again). Stored before the model: storing the model accepts the metadata."""
        out: dict[str, str] = {}
        for fname, info in sorted(meta.files.items()):
            if info.role != "extra":
                continue
            path = folder / fname
            try:
                st = path.stat()
            except FileNotFoundError:
                raise TrustError(
                    "FileMissing", f"{what}: signed file {fname} is missing ({path})"
                ) from None
            except OSError as exc:
                raise ArtifactError("ArtifactUnreadable", f"{what}: {path}: {exc}") from None
            key = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
            if self._stat_cache.get(key) == info.sha256 and store.has(info.sha256):
                out[fname] = info.sha256
                continue
            if st.st_size > info.length:
                raise TrustError(
                    "LengthExceeded",
                    f"{what}: {fname} is longer than its signed length ({info.length})",
                )
            try:
                sha = store.ingest_file(
                    path,
                    name=meta.name,
                    version=meta.version,
                    verifiers=[SignedFile(info, f"{what}: {fname}")],
                    max_bytes=info.length,
                )
            except ArtifactError as exc:
                if exc.reason == "ArtifactTooLarge":
                    raise TrustError(
                        "LengthExceeded",
                        f"{what}: {fname} is longer than its signed length ({info.length})",
                    ) from None
                raise
            self._stat_cache[key] = sha
            out[fname] = sha
        return out

    def _check_not_blocked(self, what: str) -> None:
        if self.blocked is not None:
            reason, message = self.blocked
            raise TrustError(reason, f"{what}: {message}")

    def _admit_unsigned(self, req: ArtifactRequest, store: ArtifactStore, *, max_bytes: int) -> str:
        what = f"{req.name} {req.version}"
        if not self.allow_unsigned:
            raise TrustError(
                "UnsignedArtifact",
                f"{what}: no signed metadata at {req.metadata_path} "
                "(sign it with `edgectl models sign`; trust.allowUnsigned is off)",
            )
        verifiers: list[Verifier] = [PinnedDigest(req.pinned_sha256), LooksLikeOnnx()]
        sha = self._ingest(req, store, None, verifiers, what, max_bytes=max_bytes)
        if req.name not in self.unsigned:
            log.warning(
                "unsigned artifact accepted (trust.allowUnsigned)",
                model=req.name,
                version=req.version,
                sha256=sha,
            )
            self.unsigned.add(req.name)
        self._on_result("unsigned", "UnsignedArtifact")
        return sha

    def _ingest(
        self,
        req: ArtifactRequest,
        store: ArtifactStore,
        info: FileInfo | None,
        verifiers: list[Verifier],
        what: str,
        *,
        max_bytes: int = 0,
    ) -> str:
        path = req.model_path
        try:
            st = path.stat()
        except FileNotFoundError:
            raise ArtifactError(
                "ArtifactNotFound", f"spec.model.path: model file {path} does not exist"
            ) from None
        except OSError as exc:
            raise ArtifactError("ArtifactUnreadable", f"spec.model.path: {path}: {exc}") from None
        key = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
        cached = self._stat_cache.get(key)
        want = info.sha256 if info is not None else req.pinned_sha256
        if cached is not None and store.has(cached) and want in (None, cached):
            return cached
        try:
            sha = store.ingest_file(
                path,
                name=req.name,
                version=req.version,
                verifiers=verifiers,
                max_bytes=info.length if info is not None else max_bytes,
            )
        except ArtifactError as exc:
            if exc.reason == "ArtifactTooLarge" and info is not None:
                raise TrustError(
                    "LengthExceeded",
                    f"{what}: {path} is longer than its signed length ({info.length} bytes); "
                    "stopped reading at the limit",
                ) from None
            raise
        self._stat_cache[key] = sha
        return sha

    @staticmethod
    def _check_extras(meta: ArtifactMetadata, folder: Path, what: str) -> None:
        """Every signed extra is present next to the model, with its signed length and digest
        (hashed in a stream, stopping at the signed length). Extras are not stored: edged does
        not use them yet."""
        for fname, info in sorted(meta.files.items()):
            if info.role != "extra":
                continue
            path = folder / fname
            try:
                f = open(path, "rb")  # noqa: SIM115 - closed below
            except FileNotFoundError:
                raise TrustError(
                    "FileMissing", f"{what}: signed file {fname} is missing ({path})"
                ) from None
            with f:
                h, n = hashlib.sha256(), 0
                while chunk := f.read(CHUNK):
                    n += len(chunk)
                    if n > info.length:
                        raise TrustError(
                            "LengthExceeded",
                            f"{what}: {fname} is longer than its signed length ({info.length})",
                        )
                    h.update(chunk)
            if n != info.length:
                raise TrustError(
                    "LengthMismatch", f"{what}: {fname} is {n} bytes, signed {info.length}"
                )
            if h.hexdigest() != info.sha256:
                raise TrustError(
                    "DigestMismatch", f"{what}: {fname} differs from its signed digest"
                )

    # -- status ---------------------------------------------------------------------------
    # -- artifacts from the hub: verify first, download within the signed length, then store --
    def verify_remote(
        self,
        envelope: bytes,
        *,
        name: str,
        version: str,
        allowance: bytes | None,
        now: float,
        grant: RollbackAllowance | None = None,
        tuf: bool = False,
    ) -> tuple[ArtifactMetadata, FileInfo]:
        """Check signed metadata that came with the hub's desired state, before any download:
        root valid, threshold met, not expired, no metadata or model-version rollback (unless
        a rollback allowance: ``grant`` from the publisher's TUF targets, or ``allowance``;
        with ``tuf``, the device uses TUF and only ``grant`` counts), and it names this model
        and version. Returns the metadata and the signed model file."""
        what = f"{name} {version}"
        try:
            env = parse_envelope_bytes(envelope, what=f"{what}: signed metadata")
            self._check_not_blocked(what)
            if self.root is None and self.root_problem is not None:
                reason, message = self.root_problem
                raise TrustError(reason, f"{what}: {message}")
            meta = verify_artifact_metadata(
                self.root, env, now=now, state=self.state, what=f"{what}: signed metadata"
            )
            if meta.name != name or meta.version != version:
                raise TrustError(
                    "MetadataMismatch",
                    f"the signed metadata is for {meta.name} {meta.version}, "
                    f"the deployment asks for {name} {version}",
                )
            allowance_env = (
                parse_envelope_bytes(allowance, what=f"{what}: rollback allowance")
                if allowance
                else None
            )
            root = check_root_usable(self.root, now)
            check_model_version(
                meta,
                state=self.state,
                root=root,
                allowance=allowance_env,
                now=now,
                grant=grant,
                tuf=tuf,
            )
        except ArtifactError as exc:
            self._on_result("refused", exc.reason)
            raise
        _, info = meta.model_file()
        return meta, info

    def store_downloaded(
        self, meta: ArtifactMetadata, info: FileInfo, part: Path, store: ArtifactStore
    ) -> str:
        """Move a completed download into the store, checked against the signed length and
        digest on the way (the bytes are hashed again while copied); then record the accepted
        versions. The worker hashes the stored blob once more before loading it."""
        what = f"{meta.name} {meta.version}"
        try:
            sha = store.ingest_file(
                part,
                name=meta.name,
                version=meta.version,
                verifiers=[SignedFile(info, what), LooksLikeOnnx()],
                max_bytes=info.length,
            )
        except ArtifactError as exc:
            if exc.reason == "ArtifactTooLarge":
                exc = TrustError(
                    "LengthExceeded", f"{what}: longer than its signed length ({info.length})"
                )
            self._on_result("refused", exc.reason)
            raise exc from None
        self.accept(meta)
        return sha

    def store_downloaded_extra(
        self, meta: ArtifactMetadata, fname: str, part: Path, store: ArtifactStore
    ) -> str:
        """Move a completed download of the extra file ``fname`` into the store, checked
        against its signed length and digest on the way. The metadata is accepted with the
        model (:meth:`store_downloaded`), so call this first."""
        info = meta.files[fname]
        what = f"{meta.name} {meta.version}: {fname}"
        try:
            return store.ingest_file(
                part,
                name=meta.name,
                version=meta.version,
                verifiers=[SignedFile(info, what)],
                max_bytes=info.length,
            )
        except ArtifactError as exc:
            if exc.reason == "ArtifactTooLarge":
                exc = TrustError(
                    "LengthExceeded", f"{what}: longer than its signed length ({info.length})"
                )
            self._on_result("refused", exc.reason)
            raise exc from None

    def accept_tuf_root(self, version: int) -> None:
        """Record the TUF root version the device's TUF client holds (it only goes up)."""
        if version > self.state.tuf_root_version:
            self._save_state(replace(self.state, tuf_root_version=version))

    def accept(self, meta: ArtifactMetadata) -> None:
        """Record ``meta`` as accepted (its artifact is in the store, digest checked)."""
        self._save_state(self.state.accept(meta))
        self._on_result("accepted", "Verified")

    def status(self) -> dict[str, Any]:
        return {
            "allowUnsigned": self.allow_unsigned,
            "rootFile": str(self._root_file) if self._root_file else None,
            "rootVersion": self.root.version if self.root else None,
            "rootDigest": f"sha256:{self.root_digest}" if self.root_digest else None,
            "rootExpires": format_time(self.root.expires) if self.root else None,
            "rootProblem": (
                {"reason": self.root_problem[0], "message": self.root_problem[1]}
                if self.root_problem
                else None
            ),
            "blocked": (
                {"reason": self.blocked[0], "message": self.blocked[1]} if self.blocked else None
            ),
            "unsignedArtifacts": sorted(self.unsigned),
        }
