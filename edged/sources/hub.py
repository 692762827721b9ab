"""Desired state from the hub: accept a ``DesiredState`` message into verified workloads.

The hub sends the device's complete desired state with a generation. :meth:`HubSource.apply`

1. ignores a generation not newer than the one accepted (stale or repeated: harmless);
2. parses every manifest (ModelDeployment, DeviceHealthPolicy) with the same validation as
   everywhere; an invalid one is a problem and keeps what that name had;
3. for each deployment, finds the publisher-signed metadata that came with the state and has
   the trust gate verify it **before** any byte is fetched (root, threshold, expiry, no
   rollback; with TUF, the publisher role whose targets list it signed it, and only a
   rollback allowance in that role's targets counts); then fetches the artifact from the hub
   into ``D/downloads/<sha256>.part``, resuming from the bytes already there (after a broken
   stream or a restart of edged), never past the signed length; then the gate moves it into
   the content-addressed store, checking length and digest again on the way. The artifact's
   signed extra files (a validation set) are fetched and verified the same way, before the
   model. What is in the store already is not fetched. Disk space is checked first (the rest
   of the download plus the store's copy, with the store's reserve left free): a model that
   does not fit is refused as ``InsufficientDisk`` naming the sizes, and a ``.part`` that
   will not be resumed (refused, or the disk filled up during the download) is removed, so
   the device's own writes and the hub link go on;
4. before all this, follows the fleet's trust roots the state carries from the root this
   device trusts (a root that does not chain is refused and reported; the hub cannot make
   one), so a rotation reaches the device with its next desired state;
5. persists what it accepted (``D/state/hub.json``, atomically): generation, manifests and the
   signed metadata, so a restart serves the same state without the hub.

A refusal (bad signature, tampered bytes...) keeps the previous workload of that name serving
and is reported as a problem, logged, and kept in :attr:`HubSource.incoming` as a ``Refused``
revision with its reason (the hub shows it per device). While a new artifact is checked and
fetched, ``incoming`` says so too (``Verifying``, ``Downloading``). A transient failure (the
hub went away mid-download) asks to be retried. Either way the rest of the state is applied.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from edged.reconcile.model import RevisionPhase, RevisionStatus
from edged.sources.static import SourceProblem
from edged.state.merging import HUB_SOURCE
from edged.trust.admitting import ArtifactGate
from edged.trust.secrets import SecretVolumes
from edged.trust.tpmattesting import AK_FILE
from edged.trust.tufclient import FetchAsync, TufClient, sync_fetch
from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.api import DeviceHealthPolicy, ModelDeployment, SecurityBaseline, parse_manifest
from edgefleet.api.baselines import parse_security_baseline
from edgefleet.artifacts.storing import ArtifactStore, is_disk_full
from edgefleet.errors import ArtifactError, StateError, TemporaryError, ValidationError
from edgefleet.logs import get_logger
from edgefleet.persisting import read_json, write_json_atomic
from edgefleet.sealing import SealedForDevice
from edgefleet.trust.documents import ArtifactMetadata
from edgefleet.trust.envelopes import parse_envelope_bytes
from edgefleet.trust.publishers import check_signed_by_role
from edgefleet.trust.verifying import TrustState, verify_artifact_metadata

log = get_logger(__name__)

SYNC_EVERY_BYTES = 8 << 20  # fsync a download this often: a power cut loses at most this
MAX_ROOTS = 1000  # trust roots in one desired state (a chain of rotations)
PROGRESS_EVERY_S = 2.0
"""How often a download's progress in ``incoming`` (and so in the device's status) moves:
status goes to the hub when it changed, and the hub rate-limits status per device."""

Fetch = Callable[[str, int], AsyncIterator[tuple[int, bytes]]]
"""``fetch(sha256, offset)`` yields ``(offset, data)`` chunks of an artifact from the hub."""


@dataclass(frozen=True, slots=True)
class HubApplyResult:
    workloads: dict[WorkloadName, DesiredWorkload]
    policies: tuple[DeviceHealthPolicy, ...]
    problems: tuple[SourceProblem, ...]
    generation: int
    retry: bool = False  # something transient failed: apply the same state again later
    stale: bool = False


@dataclass(slots=True)
class _Accepted:
    generation: int = 0
    manifests: list[bytes] = field(default_factory=list)
    metadata: list[bytes] = field(default_factory=list)
    workloads: dict[WorkloadName, DesiredWorkload] = field(default_factory=dict)
    policies: tuple[DeviceHealthPolicy, ...] = ()
    # per workload, what it ran before its current artifact: the envelope as accepted then,
    # and the workload (its artifact stays in the store: going back needs no download)
    previous: dict[WorkloadName, tuple[bytes, DesiredWorkload]] = field(default_factory=dict)


def _previous(
    acc: _Accepted, workloads: dict[WorkloadName, DesiredWorkload]
) -> dict[WorkloadName, tuple[bytes, DesiredWorkload]]:
    """What each workload ran before: kept while it runs the same artifact, replaced by the
    accepted one when that changes, dropped with the workload."""
    envelopes = {s: e for e in acc.metadata if (s := _envelope_subject(e)) is not None}
    out = {}
    for name, new in workloads.items():
        old = acc.workloads.get(name)
        model = old.deployment.spec.model if old is not None else None
        env = envelopes.get((model.name, model.version)) if model is not None else None
        if old is not None and old.sha256 != new.sha256 and env is not None:
            out[name] = (env, old)
        elif name in acc.previous and acc.previous[name][1].sha256 != new.sha256:
            out[name] = acc.previous[name]
    return out


def _baselines_of(manifests: list[bytes]) -> tuple[SecurityBaseline, ...]:
    """The SecurityBaselines among a desired state's manifests (bad ones are reported with
    the state's other problems)."""
    found = []
    for raw in manifests:
        try:
            doc = orjson.loads(raw)
            if isinstance(doc, dict) and doc.get("kind") == SecurityBaseline.KIND:
                found.append(parse_security_baseline(doc))
        except (ValueError, ValidationError):
            continue
    return tuple(found)


def _lists(baselines: tuple[SecurityBaseline, ...]) -> bool:
    """Whether any baseline lists publishers (``spec.publishers``)."""
    return any(b.spec.publishers is not None for b in baselines)


def _envelope_subject(envelope: bytes) -> tuple[str, str] | None:
    """The (name, version) an artifact metadata envelope claims, read without trusting it."""
    import base64

    try:
        doc = orjson.loads(envelope)
        payload = orjson.loads(base64.b64decode(doc["payload"]))
        return str(payload["name"]), str(payload["version"])
    except (ValueError, KeyError, TypeError):
        return None


def _resume_offset(part: Path, length: int) -> int:
    """How much of a download is already there; a part longer than signed is started over."""
    try:
        have = part.stat().st_size
    except FileNotFoundError:
        return 0
    if have > length:
        part.unlink()
        return 0
    return have


class _Progress:
    """Calls ``report(done)`` at most every ``every`` seconds, and when forced."""

    def __init__(
        self, report: Callable[[int], None], clock: Callable[[], float], every: float
    ) -> None:
        self._report, self._clock, self._every = report, clock, every
        self._last = clock()

    def __call__(self, done: int, *, force: bool = False) -> None:
        now = self._clock()
        if force or now - self._last >= self._every:
            self._last = now
            self._report(done)


class HubSource:
    def __init__(
        self,
        data_dir: Path,
        store: ArtifactStore,
        gate: ArtifactGate,
        *,
        tuf: TufClient | None = None,
        clock: Callable[[], float] = time.monotonic,
        secrets: SecretVolumes | None = None,
    ) -> None:
        """``secrets``: where the Secrets the workloads mount are written (None: a workload
        that mounts one does not run, and says so)."""
        self._secrets = secrets
        self._clock = clock  # paces the download progress reported
        self._state_path = data_dir / "state" / "hub.json"
        self._ak_path = data_dir / AK_FILE  # a TPM attestation key the hub bound to the EK
        self._downloads = data_dir / "downloads"
        self._downloads.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._store = store
        self._gate = gate
        self._tuf = tuf
        # python-tuf's updater of this apply (refreshed once per desired state), or the
        # refusal every artifact gets when TUF is required and its metadata was refused
        self._tuf_updater: Any = None
        self._tuf_refusal: ArtifactError | None = None
        self._accepted = _Accepted()
        self._baselines: tuple[int, tuple[SecurityBaseline, ...]] = (-1, ())
        self.problems: tuple[SourceProblem, ...] = ()
        self.root_problem: SourceProblem | None = None  # the hub's roots were refused
        self.refetch_requested = False  # an artifact went missing: apply the same state again
        # Revisions the hub asks for that are not accepted (yet): checked, fetched, refused.
        self.incoming: dict[WorkloadName, RevisionStatus] = {}
        self._load()
        if secrets is not None:  # after a reboot the tmpfs is empty: write them again
            refused = secrets.write(_mounts(self._accepted.workloads))
            for name, why in refused.items():
                log.error("secret unavailable", workload=name, message=why)

    @property
    def generation(self) -> int:
        return self._accepted.generation

    @property
    def workloads(self) -> dict[WorkloadName, DesiredWorkload]:
        return dict(self._accepted.workloads)

    @property
    def policies(self) -> tuple[DeviceHealthPolicy, ...]:
        return self._accepted.policies

    @property
    def baselines(self) -> tuple[SecurityBaseline, ...]:
        """The fleet's SecurityBaselines in the accepted state (read from its manifests)."""
        acc = self._accepted
        if self._baselines[0] != acc.generation:
            self._baselines = (acc.generation, _baselines_of(acc.manifests))
        return self._baselines[1]

    # -- persisted state -----------------------------------------------------------------
    def _load(self) -> None:
        doc = read_json(self._state_path)
        if doc is None:
            return
        try:
            workloads = {}
            for item in doc["workloads"]:
                dep = parse_manifest(item["deployment"])
                assert isinstance(dep, ModelDeployment)
                workloads[WorkloadName(dep.metadata.name)] = DesiredWorkload(
                    dep,
                    str(item["sha256"]),
                    HUB_SOURCE,
                    {str(k): str(v) for k, v in item.get("extras", {}).items()},
                )
            policies = []
            for item in doc.get("policies", []):
                pol = parse_manifest(item)
                assert isinstance(pol, DeviceHealthPolicy)
                policies.append(pol)
            previous = {}
            for item in doc.get("previous", []):
                dep = parse_manifest(item["deployment"])
                assert isinstance(dep, ModelDeployment)
                held = DesiredWorkload(
                    dep,
                    str(item["sha256"]),
                    HUB_SOURCE,
                    {str(k): str(v) for k, v in item.get("extras", {}).items()},
                )
                previous[held.name] = (str(item["envelope"]).encode(), held)
            self._accepted = _Accepted(
                int(doc["generation"]),
                [m.encode() for m in doc.get("manifests", [])],
                [m.encode() for m in doc.get("metadata", [])],
                workloads,
                tuple(policies),
                previous,
            )
        except (KeyError, TypeError, ValueError, AssertionError, ValidationError) as exc:
            raise StateError(f"{self._state_path} is not a hub state: {exc}") from None

    def _save(self, acc: _Accepted) -> None:
        write_json_atomic(
            self._state_path,
            {
                "generation": acc.generation,
                "manifests": [m.decode() for m in acc.manifests],
                "metadata": [m.decode() for m in acc.metadata],
                "workloads": [
                    {
                        "deployment": w.deployment.to_dict(),
                        "sha256": w.sha256,
                        "extras": dict(sorted(w.extras.items())),
                    }
                    for _, w in sorted(acc.workloads.items())
                ],
                "policies": [p.to_dict() for p in acc.policies],
                "previous": [
                    {
                        "envelope": env.decode(),
                        "deployment": w.deployment.to_dict(),
                        "sha256": w.sha256,
                        "extras": dict(sorted(w.extras.items())),
                    }
                    for _, (env, w) in sorted(acc.previous.items())
                ],
            },
        )

    @property
    def held(self) -> set[str]:
        """Artifacts kept for going back to the previous version (not garbage)."""
        out = set()
        for _, w in self._accepted.previous.values():
            out.add(w.sha256)
            out.update(w.extras.values())
        return out

    def _already_verified(
        self, name: WorkloadName, manifest: ModelDeployment, envelope: bytes | None, now: float
    ) -> DesiredWorkload | None:
        """The workload as it runs now, or as it ran before, when the hub sends exactly the
        signed metadata this device accepted for it then and its artifact is still here: a
        rollback to the last verified version (or staying on the current one while newer
        metadata was accepted for another version), admitted without the metadata and model
        version rollback checks; the signatures, the root and the expiry are checked again.
        None otherwise: the normal path decides."""
        if envelope is None:
            return None
        acc = self._accepted
        held: list[tuple[bytes, DesiredWorkload]] = []
        current = acc.workloads.get(name)
        if current is not None:
            model = current.deployment.spec.model
            for raw in acc.metadata:
                if _envelope_subject(raw) == (model.name, model.version):
                    held.append((raw, current))
        if name in acc.previous:
            held.append(acc.previous[name])
        for env_bytes, old in held:
            if env_bytes != envelope or old.deployment.spec.model != manifest.spec.model:
                continue
            if not all(self._store.has(sha) for sha in (old.sha256, *old.extras.values())):
                continue
            try:
                parsed = parse_envelope_bytes(envelope, what="signed metadata")
                verify_artifact_metadata(self._gate.root, parsed, now=now, state=TrustState())
            except ArtifactError:
                return None
            return DesiredWorkload(manifest, old.sha256, HUB_SOURCE, dict(old.extras))
        return None

    # -- one desired state ---------------------------------------------------------------
    async def apply(
        self,
        generation: int,
        manifests: list[bytes],
        metadata: list[bytes],
        allowances: list[bytes],
        fetch: Fetch,
        trust_roots: list[bytes] | None = None,
        tuf_fetch: FetchAsync | None = None,
        secrets: list[SealedForDevice] | None = None,
    ) -> HubApplyResult:
        acc = self._accepted
        now = self._gate.begin()
        if trust_roots:
            self._accept_roots(trust_roots, now)
        refetch, self.refetch_requested = self.refetch_requested, False
        if generation < acc.generation or (generation == acc.generation and not refetch):
            return HubApplyResult(
                acc.workloads, acc.policies, self.problems, acc.generation, stale=True
            )
        try:
            await self._refresh_tuf(tuf_fetch)
        except TemporaryError as exc:
            problem = SourceProblem(HUB_SOURCE, "", "TufFetchFailed", str(exc))
            self.problems = (problem,)
            log.warning("tuf metadata fetch failed", message=str(exc))
            return HubApplyResult(
                acc.workloads, acc.policies, self.problems, acc.generation, retry=True
            )
        problems: list[SourceProblem] = []
        envelopes: dict[tuple[str, str], bytes] = {}
        for env in metadata:
            subject = _envelope_subject(env)
            if subject is not None:
                envelopes[subject] = env
        allow: dict[tuple[str, str], bytes] = {}
        for env in allowances:
            subject = _envelope_subject(env)
            if subject is not None:
                allow[subject] = env
        baselines = _baselines_of(manifests)
        workloads: dict[WorkloadName, DesiredWorkload] = {}
        policies: list[DeviceHealthPolicy] = []
        named: set[WorkloadName] = set()
        retry = False
        if self.root_problem is not None:
            problems.append(self.root_problem)
        if self._tuf_refusal is not None:
            problems.append(
                SourceProblem(HUB_SOURCE, "", self._tuf_refusal.reason, str(self._tuf_refusal))
            )
        for i, raw in enumerate(manifests):
            try:
                manifest = parse_manifest(orjson.loads(raw), source=f"manifests[{i}]")
            except (ValueError, ValidationError) as exc:
                problems.append(SourceProblem(HUB_SOURCE, "", "InvalidManifest", str(exc)))
                continue
            if isinstance(manifest, DeviceHealthPolicy):
                policies.append(manifest)
                continue
            if isinstance(manifest, SecurityBaseline):
                continue  # read from the accepted manifests (``baselines``)
            if not isinstance(manifest, ModelDeployment):
                problems.append(
                    SourceProblem(
                        HUB_SOURCE,
                        "",
                        "UnsupportedKind",
                        f"manifests[{i}]: a {manifest.kind} is not part of a device's desired "
                        "state",
                    )
                )
                continue
            name = WorkloadName(manifest.metadata.name)
            named.add(name)
            model = manifest.spec.model
            if manifest.spec.placement.require_tpm and not self._ak_path.exists():
                # the hub places it only on TPM-attested devices; a device without an
                # attestation key bound to its TPM's EK never runs it, whatever the hub says
                message = (
                    f"{name}: placement.requireTpm: this device is software-attested (no TPM "
                    f"attestation key in {self._ak_path}), so it does not run this deployment"
                )
                problems.append(SourceProblem(HUB_SOURCE, name, "TpmRequired", message))
                self._mark(name, model.version, "", RevisionPhase.REFUSED, "TpmRequired", message)
                log.warning("deployment refused", workload=name, reason="TpmRequired")
                continue
            back = self._already_verified(
                name, manifest, envelopes.get((model.name, model.version)), now
            )
            if back is not None and not await self._in_targets(
                envelopes[(model.name, model.version)], manifest, baselines
            ):
                back = None  # the normal path refuses it, with the reason
            if back is not None:
                current = acc.workloads.get(name)
                if current is None or current.sha256 != back.sha256:
                    log.info(
                        "returned to the previous version",
                        workload=name,
                        model=model.name,
                        version=model.version,
                        sha256=back.sha256,
                    )
                self.incoming.pop(name, None)
                workloads[name] = back
                continue
            self._mark(name, model.version, "", RevisionPhase.VERIFYING)
            try:
                sha, extras = await self._admit(
                    manifest,
                    baselines,
                    model.name,
                    model.version,
                    envelopes.get((model.name, model.version)),
                    allow.get((model.name, model.version)),
                    fetch,
                    now,
                )
            except ArtifactError as exc:
                problems.append(SourceProblem(HUB_SOURCE, name, exc.reason, str(exc)))
                sha = self.incoming[name].sha256
                self._mark(name, model.version, sha, RevisionPhase.REFUSED, exc.reason, str(exc))
                log.warning(
                    "artifact refused",
                    workload=name,
                    model=model.name,
                    version=model.version,
                    reason=exc.reason,
                    message=str(exc),
                )
                if name in acc.workloads and await self._still_allowed(
                    acc, acc.workloads[name], manifest, baselines
                ):
                    workloads[name] = acc.workloads[name]  # the previous good version serves
                continue
            except TemporaryError as exc:
                retry = True
                problems.append(SourceProblem(HUB_SOURCE, name, "ArtifactFetchFailed", str(exc)))
                sha = self.incoming[name].sha256
                self._mark(
                    name,
                    model.version,
                    sha,
                    RevisionPhase.DOWNLOADING,
                    "ArtifactFetchFailed",
                    str(exc),
                )
                if name in acc.workloads:
                    workloads[name] = acc.workloads[name]
                continue
            self.incoming.pop(name, None)
            workloads[name] = DesiredWorkload(manifest, sha, HUB_SOURCE, extras)
        for gone in set(self.incoming) - named:
            del self.incoming[gone]
        self.problems = tuple(problems)
        if retry:
            # Not accepted yet: the same generation is applied again when the fetch can go on.
            return HubApplyResult(
                workloads, tuple(policies), self.problems, acc.generation, retry=True
            )
        problems.extend(self._write_secrets(workloads, secrets or []))
        self.problems = tuple(problems)
        new = _Accepted(
            generation,
            list(manifests),
            list(metadata),
            workloads,
            tuple(policies),
            _previous(acc, workloads),
        )
        await asyncio.to_thread(self._save, new)
        self._accepted = new
        self._clean_downloads(
            {w.sha256 for w in workloads.values()}
            | {sha for w in workloads.values() for sha in w.extras.values()}
        )
        return HubApplyResult(workloads, new.policies, self.problems, generation)

    def _write_secrets(
        self, workloads: dict[WorkloadName, DesiredWorkload], sealed: list[SealedForDevice]
    ) -> list[SourceProblem]:
        """Write the secrets the workloads mount; a workload whose secrets cannot be had is
        a problem (``SecretUnavailable``). One that the hub withdrew (not sent: deleted, or
        this device no longer trusted) stops and its files are removed; for a local failure
        (the directory, a seal that does not open) the previous version keeps serving with
        the files it has, if it mounts the same. ``workloads`` is changed in place."""
        problems: list[SourceProblem] = []
        mounts = _mounts(workloads)
        withheld: set[str] = set()
        if self._secrets is None:
            refused = {
                w: "this device has no secrets directory" for w, names in mounts.items() if names
            }
        else:
            refused = self._secrets.update(sealed, mounts)
            withheld = self._secrets.withheld
        for name, why in sorted(refused.items()):
            problems.append(SourceProblem(HUB_SOURCE, name, "SecretUnavailable", why))
            log.warning("secret unavailable", workload=name, message=why)
            wname = WorkloadName(name)
            previous = self._accepted.workloads.get(wname)
            if (
                name not in withheld  # a secret withdrawn: its files go, the workload stops
                and previous is not None
                and previous.deployment.spec.secrets == workloads[wname].deployment.spec.secrets
            ):
                workloads[wname] = previous
            else:
                del workloads[wname]
        if self._secrets is not None:
            self._secrets.remove_except(_mounts(workloads))
        return problems

    async def _refresh_tuf(self, tuf_fetch: FetchAsync | None) -> None:
        """Update the TUF metadata from the hub once for this desired state (python-tuf's
        client in a thread, fetching over the hub link). TemporaryError: retry later."""
        self._tuf_updater = None
        self._tuf_refusal = None
        if self._tuf is None:
            return
        if tuf_fetch is None:
            if self._tuf.active or self._gate.state.tuf_root_version:
                self._tuf_refusal = ArtifactError(
                    "NoTufRepository", "TUF is required and no TUF metadata can be fetched"
                )
            return
        fetch = sync_fetch(tuf_fetch, asyncio.get_running_loop())
        floor = self._gate.state.tuf_root_version
        try:
            self._tuf_updater = await asyncio.to_thread(
                self._tuf.refresh, fetch, self._gate.root, floor=floor
            )
        except ArtifactError as exc:
            log.error("tuf metadata refused", reason=exc.reason, message=str(exc))
            self._tuf_refusal = exc
            return
        if self._tuf_updater is not None:
            self._gate.accept_tuf_root(await asyncio.to_thread(self._tuf.root_version))

    @property
    def _tuf_in_use(self) -> bool:
        """Whether this device uses TUF: it holds a TUF root, its image requires TUF, or its
        trust state recorded one (then only TUF's rollback allowances count)."""
        if self._tuf is None:
            return False
        return self._tuf.active or bool(self._gate.state.tuf_root_version)

    def _check_tuf(self, meta: Any, envelope: bytes) -> None:
        """Every file of the artifact is in a publisher's delegated targets, when TUF is in
        use, and the role whose targets list it signed ``envelope`` (ArtifactError otherwise;
        TemporaryError when a delegated role could not be fetched)."""
        if self._tuf_refusal is not None:
            raise self._tuf_refusal
        if self._tuf_updater is not None and self._tuf is not None:
            TufClient.check(self._tuf_updater, meta)
            check_signed_by_role(
                parse_envelope_bytes(envelope, what="signed metadata"),
                self._tuf.publisher_role(meta),
                what=f"{meta.name} {meta.version}",
            )

    async def _in_targets(
        self,
        envelope: bytes,
        deployment: ModelDeployment,
        baselines: tuple[SecurityBaseline, ...],
    ) -> bool:
        """Whether an envelope already verified is in a publisher's targets (when TUF is in
        use) and from a publisher the baselines allow for ``deployment``: going back to an
        earlier artifact needs the current signed set and the current baselines to allow it."""
        if self._tuf_refusal is None and self._tuf_updater is None and not _lists(baselines):
            return True
        from edgefleet.trust.documents import parse_artifact
        from edgefleet.trust.envelopes import ARTIFACT_TYPE, decode_payload

        env = parse_envelope_bytes(envelope, what="signed metadata")
        meta = parse_artifact(decode_payload(env, expected_type=ARTIFACT_TYPE, what="metadata"))
        try:
            await asyncio.to_thread(self._check_tuf, meta, envelope)
            await asyncio.to_thread(self._check_publisher, deployment, baselines, envelope, meta)
        except (ArtifactError, TemporaryError):
            return False
        return True

    async def _still_allowed(
        self,
        acc: _Accepted,
        current: DesiredWorkload,
        deployment: ModelDeployment,
        baselines: tuple[SecurityBaseline, ...],
    ) -> bool:
        """Whether the artifact ``current`` runs may keep serving ``deployment`` under the
        baselines' publishers (always, when none lists publishers): a baseline that no longer
        allows its publisher stops it rather than leave it running (``PublisherNotAllowed``
        of the new state says why)."""
        if not _lists(baselines):
            return True
        model = current.deployment.spec.model
        for env in acc.metadata:
            if _envelope_subject(env) == (model.name, model.version):
                return await self._in_targets(env, deployment, baselines)
        return False

    def _check_publisher(
        self,
        deployment: ModelDeployment,
        baselines: tuple[SecurityBaseline, ...],
        envelope: bytes,
        meta: ArtifactMetadata,
    ) -> None:
        """The baselines' ``spec.publishers`` allow the keys that signed the artifact (and,
        with TUF, the publisher role that lists it) for ``deployment``
        (``PublisherNotAllowed``). Called after the envelope and the TUF targets passed."""
        if not _lists(baselines):
            return
        from edgefleet.trust.documents import ROLE_ARTIFACTS
        from edgefleet.trust.envelopes import valid_signers
        from edgefleet.trust.publishers import check_publisher

        root = self._gate.root
        if root is None:  # verify_remote refused it already; never admit without a root
            raise ArtifactError("NoTrustRoot", "no trust root to check the publisher with")
        role = root.role(ROLE_ARTIFACTS)
        env = parse_envelope_bytes(envelope, what="signed metadata")
        tuf_role = None
        if self._tuf is not None and self._tuf_updater is not None:
            tuf_role = self._tuf.publisher_role(meta)
        check_publisher(
            baselines,
            what=f"{meta.name} {meta.version}",
            deployment=deployment.metadata.name,
            labels=deployment.metadata.labels,
            signers=valid_signers(env, root.keys, role.keyids),
            threshold=role.threshold,
            role=tuf_role,
        )

    def _accept_roots(self, roots: list[bytes], now: float) -> None:
        """The hub's roots, followed from the root this device trusts (before the state's
        artifacts are verified, so a rotation applies to them). A refusal keeps the root in
        force and is a problem of the hub source; the hub cannot make a root."""
        from edgefleet.errors import TrustError
        from edgefleet.trust.envelopes import parse_envelope_bytes

        try:
            if len(roots) > MAX_ROOTS:
                raise TrustError("MalformedEnvelope", f"more than {MAX_ROOTS} roots")
            envs = [parse_envelope_bytes(r, what=f"trust_roots[{i}]") for i, r in enumerate(roots)]
            self._gate.accept_root_envelopes(envs, now, origin="the hub's trust roots")
        except TrustError as exc:
            if self.root_problem is None or self.root_problem.message != str(exc):
                log.error("hub trust roots refused", reason=exc.reason, message=str(exc))
            self.root_problem = SourceProblem(HUB_SOURCE, "", exc.reason, str(exc))
            return
        self.root_problem = None

    def _mark(
        self,
        workload: WorkloadName,
        version: str,
        sha256: str,
        phase: RevisionPhase,
        reason: str = "",
        message: str = "",
        *,
        bytes_total: int = 0,
    ) -> None:
        """What ``workload``'s wanted revision is at. A download keeps the progress it had
        (also when it broke: it resumes from there)."""
        done = 0
        old = self.incoming.get(workload)
        if phase is RevisionPhase.DOWNLOADING and old is not None and old.sha256 == sha256:
            done, bytes_total = old.bytes_done, bytes_total or old.bytes_total
        self.incoming[workload] = RevisionStatus(
            "", version, sha256, phase, 0, reason, message, wanted=True,
            bytes_done=done if bytes_total else 0, bytes_total=bytes_total,
        )  # fmt: skip

    def _progress(self, workload: WorkloadName, sha256: str) -> _Progress:
        """A download's progress, into ``incoming`` while it is that download's entry."""

        def report(done: int) -> None:
            held = self.incoming.get(workload)
            if held is not None and held.sha256 == sha256:
                self.incoming[workload] = replace(held, bytes_done=done)

        return _Progress(report, self._clock, PROGRESS_EVERY_S)

    async def _admit(
        self,
        deployment: ModelDeployment,
        baselines: tuple[SecurityBaseline, ...],
        name: str,
        version: str,
        envelope: bytes | None,
        allowance: bytes | None,
        fetch: Fetch,
        now: float,
    ) -> tuple[str, dict[str, str]]:
        """Verify the signed metadata, then fetch what the store lacks of its files (extras
        first, the model last: storing the model accepts the metadata). The model's sha256 and
        the extras' (by file name)."""
        workload = WorkloadName(deployment.metadata.name)
        if envelope is None:
            raise ArtifactError(
                "UnsignedArtifact",
                f"{name} {version}: the hub sent no signed metadata for this model",
            )
        grant = None
        if self._tuf_updater is not None:
            grant = await asyncio.to_thread(TufClient.rollback_grant, self._tuf_updater, envelope)
        meta, info = self._gate.verify_remote(
            envelope,
            name=name,
            version=version,
            allowance=allowance,
            now=now,
            grant=grant,
            tuf=self._tuf_in_use,
        )
        await asyncio.to_thread(self._check_tuf, meta, envelope)
        await asyncio.to_thread(self._check_publisher, deployment, baselines, envelope, meta)
        extras: dict[str, str] = {}
        for fname, extra in sorted(meta.files.items()):
            if extra.role == "model":
                continue
            if not self._store.has(extra.sha256):
                self._mark(workload, version, info.sha256, RevisionPhase.DOWNLOADING)
                part = self._downloads / f"{extra.sha256}.part"
                await self._download(extra.sha256, extra.length, part, fetch)
                self._mark(workload, version, info.sha256, RevisionPhase.VERIFYING)
                await asyncio.to_thread(
                    self._gate.store_downloaded_extra, meta, fname, part, self._store
                )
                part.unlink(missing_ok=True)
            extras[fname] = extra.sha256
        if self._store.has(info.sha256):
            self._gate.accept(meta)
            return info.sha256, extras
        self._mark(
            workload, version, info.sha256, RevisionPhase.DOWNLOADING, bytes_total=info.length
        )
        part = self._downloads / f"{info.sha256}.part"
        try:
            # the rest of the download and the store's copy of it must fit, with the reserve
            # left free; else refuse now rather than fill the disk (and stop the hub link)
            have = _resume_offset(part, info.length)
            self._store.check_space(
                what=f"{name} {version}", download=info.length - have, copy=info.length
            )
            progress = self._progress(workload, info.sha256)
            progress(have, force=True)
            await self._download(info.sha256, info.length, part, fetch, progress)
            self._mark(workload, version, info.sha256, RevisionPhase.VERIFYING)
            sha = await asyncio.to_thread(
                self._gate.store_downloaded, meta, info, part, self._store
            )
        except ArtifactError as exc:
            if exc.reason == "InsufficientDisk":
                part.unlink(missing_ok=True)  # not going to be resumed: give the space back
            raise
        part.unlink(missing_ok=True)
        return sha, extras

    async def _download(
        self,
        sha: str,
        length: int,
        part: Path,
        fetch: Fetch,
        progress: Callable[..., None] | None = None,
    ) -> None:
        """Fetch into ``part``, resuming after what it holds; never past ``length`` bytes;
        ``progress(bytes_on_disk, force=...)`` told as it goes."""
        have = _resume_offset(part, length)
        if have == length:
            return
        if have:
            log.info("artifact download resuming", sha256=sha, offset=have, length=length)
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            await self._write_chunks(fd, sha, have, length, fetch, progress)
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            raise ArtifactError(
                "InsufficientDisk", f"artifact {sha[:12]}: the disk filled up: {exc}"
            ) from None
        finally:
            os.close(fd)

    async def _write_chunks(
        self,
        fd: int,
        sha: str,
        have: int,
        length: int,
        fetch: Fetch,
        progress: Callable[..., None] | None = None,
    ) -> None:
        try:
            have = await self._write_chunks_from(fd, sha, have, length, fetch, progress)
        finally:
            if progress is not None:
                progress(os.fstat(fd).st_size, force=True)  # where a resume would start
        if have < length:
            raise TemporaryError(f"artifact {sha[:12]}: stream ended at {have} of {length} bytes")
        log.info("artifact downloaded", sha256=sha, bytes=length)

    async def _write_chunks_from(
        self,
        fd: int,
        sha: str,
        have: int,
        length: int,
        fetch: Fetch,
        progress: Callable[..., None] | None,
    ) -> int:
        unsynced = 0
        async for offset, data in fetch(sha, have):
            if offset != have:
                raise TemporaryError(f"artifact {sha[:12]}: chunk at {offset}, expected {have}")
            if have + len(data) > length:
                os.ftruncate(fd, have)
                raise ArtifactError(
                    "LengthExceeded",
                    f"artifact {sha[:12]}: the hub sent more than the signed length "
                    f"({length} bytes); stopped at the limit",
                )
            os.write(fd, data)
            have += len(data)
            unsynced += len(data)
            if unsynced >= SYNC_EVERY_BYTES:
                os.fsync(fd)
                unsynced = 0
            if progress is not None:
                progress(have)
        os.fsync(fd)
        return have

    def _clean_downloads(self, keep: set[str]) -> None:
        for p in self._downloads.iterdir():
            if p.name.removesuffix(".part") not in keep:
                p.unlink(missing_ok=True)

    def status(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "problems": [p.to_json() for p in self.problems],
            **({"secrets": self._secrets.status()} if self._secrets is not None else {}),
            **(self._tuf.status() if self._tuf is not None else {}),
        }


def _mounts(workloads: Mapping[WorkloadName, DesiredWorkload]) -> dict[str, tuple[str, ...]]:
    """Workload -> the names of the Secrets it mounts."""
    return {
        str(name): tuple(m.name for m in w.deployment.spec.secrets) for name, w in workloads.items()
    }
