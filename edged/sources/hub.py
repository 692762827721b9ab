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
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from edged.reconcile.model import RevisionPhase, RevisionStatus
from edged.sources.static import SourceProblem
from edged.state.hubstate import (
    AcceptedHubState,
    baselines_of,
    load_hub_state,
    previous_of,
    save_hub_state,
)
from edged.state.merging import HUB_SOURCE
from edged.state.modelconfigs import ConfigRefused, ConfigVolumes
from edged.trust.admitting import ArtifactGate
from edged.trust.secrets import SecretVolumes
from edged.trust.tpmattesting import AK_FILE
from edged.trust.tufchecking import HubMetadataChecks, envelope_subject, lists_publishers
from edged.trust.tufclient import FetchAsync, TufClient
from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.api import DeviceHealthPolicy, ModelDeployment, SecurityBaseline, parse_manifest
from edgefleet.api.modelconfigs import MAX_MERGED_BYTES
from edgefleet.artifacts.storing import ArtifactStore
from edgefleet.configschemas import FILE_NAME as SCHEMA_FILE
from edgefleet.configschemas import ConfigSchema, SchemaError, parse_schema
from edgefleet.errors import ArtifactError, TemporaryError, ValidationError
from edgefleet.logs import get_logger
from edgefleet.sealing import SealedForDevice

if TYPE_CHECKING:
    # the hub link's: it owns the downloads and the stream they are fetched over
    from edged.hublink.downloading import Downloads, Fetch

log = get_logger(__name__)

CLOCK_JUDGED = frozenset(
    {"TufMetadataExpired", "MetadataExpired", "RollbackAllowanceExpired", "RootExpired"}
)
"""Refusals judged against this device's own clock, which may be wrong (stepped ahead, not
synchronised yet): they may pass once it is corrected, or once the hub signs again (the TUF
timestamp, hourly). The artifact is refused for now (the previous good version serves; its
revision stays ``Verifying`` with the reason, not ``Refused``, which the hub's rollouts count
as broken) and the same state is applied again after a backoff, rather than accepted as
refused for good (a device whose clock was hours ahead refused a new version and never took
it once NTP stepped the clock back: docs/soak.md, clock jumps)."""

PROGRESS_EVERY_S = 2.0
"""How often a download's progress in ``incoming`` (and so in the device's status) moves:
status goes to the hub when it changed, and the hub rate-limits status per device."""


@dataclass(frozen=True, slots=True)
class HubApplyResult:
    workloads: dict[WorkloadName, DesiredWorkload]
    policies: tuple[DeviceHealthPolicy, ...]
    problems: tuple[SourceProblem, ...]
    generation: int
    retry: bool = False  # something transient failed: apply the same state again later
    stale: bool = False


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
        downloads: Downloads,
        *,
        tuf: TufClient | None = None,
        clock: Callable[[], float] = time.monotonic,
        secrets: SecretVolumes | None = None,
        configs: ConfigVolumes | None = None,
    ) -> None:
        """``downloads``: where artifacts are fetched to before the gate stores them (the hub
        link's); ``secrets``: where the Secrets the workloads mount are written (None: a
        workload that mounts one does not run, and says so); ``configs``: where the workloads'
        model configurations are written (None: one the hub sends is refused, and says so)."""
        self._secrets = secrets
        self._configs = configs
        self.config_errors: dict[str, str] = {}  # by workload: why its config is not applied
        self._clock = clock  # paces the download progress reported
        self._state_path = data_dir / "state" / "hub.json"
        self._ak_path = data_dir / AK_FILE  # a TPM attestation key the hub bound to the EK
        self._downloads = downloads
        self._store = store
        self._gate = gate
        self.tuf = tuf  # also the agent release fetch's (edged.hublink.agentreleases)
        self._checks = HubMetadataChecks(gate, tuf)
        self._baselines: tuple[int, tuple[SecurityBaseline, ...]] = (-1, ())
        self.problems: tuple[SourceProblem, ...] = ()
        self.root_problem: SourceProblem | None = None  # the hub's roots were refused
        self.refetch_requested = False  # an artifact went missing: apply the same state again
        # Revisions the hub asks for that are not accepted (yet): checked, fetched, refused.
        self.incoming: dict[WorkloadName, RevisionStatus] = {}
        self._accepted = load_hub_state(self._state_path)
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
            self._baselines = (acc.generation, baselines_of(acc.manifests))
        return self._baselines[1]

    @property
    def held(self) -> set[str]:
        """Artifacts kept for going back to the previous version (not garbage)."""
        return self._accepted.held

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
                if envelope_subject(raw) == (model.name, model.version):
                    held.append((raw, current))
        if name in acc.previous:
            held.append(acc.previous[name])
        for env_bytes, old in held:
            if env_bytes != envelope or old.deployment.spec.model != manifest.spec.model:
                continue
            if not all(self._store.has(sha) for sha in (old.sha256, *old.extras.values())):
                continue
            if not self._checks.verify_held(envelope, now):
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
        model_configs: list[tuple[str, bytes, str]] | None = None,
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
            await self._checks.refresh_tuf(tuf_fetch)
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
            subject = envelope_subject(env)
            if subject is not None:
                envelopes[subject] = env
        allow: dict[tuple[str, str], bytes] = {}
        for env in allowances:
            subject = envelope_subject(env)
            if subject is not None:
                allow[subject] = env
        baselines = baselines_of(manifests)
        workloads: dict[WorkloadName, DesiredWorkload] = {}
        policies: list[DeviceHealthPolicy] = []
        named: set[WorkloadName] = set()
        retry = False
        if self.root_problem is not None:
            problems.append(self.root_problem)
        refusal = self._checks.tuf_refusal
        if refusal is not None:
            problems.append(SourceProblem(HUB_SOURCE, "", refusal.reason, str(refusal)))
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
            if back is not None and not await self._checks.in_targets(
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
                # judged by this device's clock: not a broken revision (the hub rolls those
                # back fleet-wide), still verifying until the clock or the hub corrects it
                on_clock = exc.reason in CLOCK_JUDGED
                retry = retry or on_clock
                problems.append(SourceProblem(HUB_SOURCE, name, exc.reason, str(exc)))
                sha = self.incoming[name].sha256
                phase = RevisionPhase.VERIFYING if on_clock else RevisionPhase.REFUSED
                self._mark(name, model.version, sha, phase, exc.reason, str(exc))
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
        await asyncio.to_thread(self._write_configs, workloads, model_configs or [])
        self.problems = tuple(problems)
        new = AcceptedHubState(
            generation,
            list(manifests),
            list(metadata),
            workloads,
            tuple(policies),
            previous_of(acc, workloads),
        )
        await asyncio.to_thread(save_hub_state, self._state_path, new)
        self._accepted = new
        self._downloads.keep_only(
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

    def _write_configs(
        self, workloads: dict[WorkloadName, DesiredWorkload], sent: list[tuple[str, bytes, str]]
    ) -> None:
        """Check and write each workload's model configuration (edged.state.modelconfigs);
        one that does not check keeps the previous one in place, and its error is reported
        (``config_status``); a workload the hub sends none for has none."""
        configs = self._configs
        wanted = {name: raw for name, raw, _ in sent if WorkloadName(name) in workloads}
        errors: dict[str, str] = {}
        for name in sorted(wanted):
            try:
                if configs is None:
                    raise ConfigRefused("this device has no configs directory")
                if len(wanted[name]) > 2 * MAX_MERGED_BYTES:
                    raise ConfigRefused(f"the config is {len(wanted[name])} bytes")
                document = orjson.loads(wanted[name])
                if not isinstance(document, dict):
                    raise ConfigRefused("a config is a JSON object")
                schema = self._config_schema(workloads[WorkloadName(name)])
                digest = configs.write(name, document, schema)
                log.info("model config applied", workload=name, digest=digest)
            except (ValueError, ConfigRefused, SchemaError, OSError) as exc:
                errors[name] = str(exc)[:1024]
                log.warning("model config refused", workload=name, message=errors[name])
        if configs is not None:
            for name in workloads:
                if name not in wanted:
                    configs.clear(name)
            for gone in set(self._accepted.workloads) - set(workloads):  # the hub's only
                configs.remove(gone)
        self.config_errors = errors

    def _config_schema(self, workload: DesiredWorkload) -> ConfigSchema | None:
        """The publisher's config schema of the workload's artifact, from the store (a signed
        extra, admitted with the artifact); None when it carries none."""
        digest = workload.extras.get(SCHEMA_FILE)
        if digest is None:
            return None
        return parse_schema(self._store.path_for(digest).read_bytes())

    def config_status(self, name: WorkloadName) -> tuple[str, str]:
        """The digest of the config the workload's replicas read ("" when none) and why the
        one the hub sent is not applied ("" when it is)."""
        digest = self._configs.digest(name) if self._configs is not None else None
        return digest or "", self.config_errors.get(name, "")

    async def _still_allowed(
        self,
        acc: AcceptedHubState,
        current: DesiredWorkload,
        deployment: ModelDeployment,
        baselines: tuple[SecurityBaseline, ...],
    ) -> bool:
        """Whether the artifact ``current`` runs may keep serving ``deployment`` under the
        baselines' publishers (always, when none lists publishers): a baseline that no longer
        allows its publisher stops it rather than leave it running (``PublisherNotAllowed``
        of the new state says why)."""
        if not lists_publishers(baselines):
            return True
        model = current.deployment.spec.model
        for env in acc.metadata:
            if envelope_subject(env) == (model.name, model.version):
                return await self._checks.in_targets(env, deployment, baselines)
        return False

    def _accept_roots(self, roots: list[bytes], now: float) -> None:
        """The hub's roots, followed from the root this device trusts
        (:meth:`HubMetadataChecks.accept_roots`). A refusal keeps the root in force and is a
        problem of the hub source; the hub cannot make a root."""
        exc = self._checks.accept_roots(roots, now)
        if exc is None:
            self.root_problem = None
            return
        if self.root_problem is None or self.root_problem.message != str(exc):
            log.error("hub trust roots refused", reason=exc.reason, message=str(exc))
        self.root_problem = SourceProblem(HUB_SOURCE, "", exc.reason, str(exc))

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
        meta, info = await self._checks.verify(
            envelope,
            deployment,
            baselines,
            name=name,
            version=version,
            allowance=allowance,
            now=now,
        )
        extras: dict[str, str] = {}
        for fname, extra in sorted(meta.files.items()):
            if extra.role == "model":
                continue
            if not self._store.has(extra.sha256):
                self._mark(workload, version, info.sha256, RevisionPhase.DOWNLOADING)
                part = await self._downloads.fetch(extra.sha256, extra.length, fetch)
                self._mark(workload, version, info.sha256, RevisionPhase.VERIFYING)
                await asyncio.to_thread(
                    self._gate.store_downloaded_extra, meta, fname, part, self._store
                )
                self._downloads.discard(extra.sha256)
            extras[fname] = extra.sha256
        if self._store.has(info.sha256):
            self._gate.accept(meta)
            return info.sha256, extras
        self._mark(
            workload, version, info.sha256, RevisionPhase.DOWNLOADING, bytes_total=info.length
        )
        try:
            # the rest of the download and the store's copy of it must fit, with the reserve
            # left free; else refuse now rather than fill the disk (and stop the hub link)
            have = self._downloads.resume_offset(info.sha256, info.length)
            self._store.check_space(
                what=f"{name} {version}", download=info.length - have, copy=info.length
            )
            progress = self._progress(workload, info.sha256)
            progress(have, force=True)
            part = await self._downloads.fetch(info.sha256, info.length, fetch, progress)
            self._mark(workload, version, info.sha256, RevisionPhase.VERIFYING)
            sha = await asyncio.to_thread(
                self._gate.store_downloaded, meta, info, part, self._store
            )
        except ArtifactError as exc:
            if exc.reason == "InsufficientDisk":
                self._downloads.discard(info.sha256)  # not resumed: give the space back
            raise
        self._downloads.discard(info.sha256)
        return sha, extras

    def status(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "problems": [p.to_json() for p in self.problems],
            **({"secrets": self._secrets.status()} if self._secrets is not None else {}),
            **self._checks.status(),
        }


def _mounts(workloads: Mapping[WorkloadName, DesiredWorkload]) -> dict[str, tuple[str, ...]]:
    """Workload -> the names of the Secrets it mounts."""
    return {
        str(name): tuple(m.name for m in w.deployment.spec.secrets) for name, w in workloads.items()
    }
