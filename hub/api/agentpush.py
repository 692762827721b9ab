"""Receiving a pushed edged release (AdminService ``PushAgentRelease``; docs/agent-updates.md,
"Releases"), and listing them (``ListAgentReleases``).

The hub checks a release as a device would before it stores anything, so that a release no
device would take is refused at the door:

1. the first message is a header with the release's signed metadata (a DSSE envelope of
   payload type ``application/vnd.edgefleet.agent-release+json``: a model's metadata is
   ``WrongPayloadType``) and the agent role's delegated TUF targets listing the file;
2. the hub keeps a TUF repository (agent releases are delegated by TUF only:
   ``NoTufRepository``); the metadata is well-formed, not expired, within the size bound
   (``ReleaseTooLarge``); the role is an agent-release role of the top-level targets (its only
   path ``agent/edged/*/*``: a model publisher's role is ``NotAnAgentRole``), a threshold of its
   keys signed both the envelope and the targets, and the targets list the file with the signed
   length and sha256 (:meth:`hub.state.tufrepo.TufRepository.check_delegated_release`);
3. releases are immutable: a version and platform held with other bytes is ALREADY_EXISTS
   (``VersionExists``), decided before any byte is read; the same bytes again are
   ``stored=false``;
4. the bytes stream into the blob store (where models go; devices fetch them with
   FetchArtifact) with the signed length as a hard limit and the signed sha256 as a verifier,
   and the tarball must be what the metadata says: only files and folders under ``lib/`` and
   ``release.json`` (``UnsafeReleasePath``), its ``release.json`` of the same version
   (``VersionMismatch``), platform (``PlatformMismatch``) and requirements;
5. then the record (:mod:`hub.state.agentreleases`) with its event (``AgentRelease``
   ``VERSION-ARCH-ABI``, ``Pushed``) in one transaction, and the agent role's targets (a new
   snapshot and timestamp: devices see the release in TUF).

A refused push leaves no blob and no record. Operators only (AdminService's authorization).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import BinaryIO, cast

import grpc

from edgefleet.artifacts.storing import ArtifactStore
from edgefleet.errors import ArtifactError, CompareFailed, TrustError
from edgefleet.logs import get_logger
from edgefleet.trust import agentreleases
from edgefleet.trust.agentreleases import AgentReleaseMetadata
from edgefleet.trust.documents import FileInfo
from edgefleet.trust.envelopes import Envelope
from edgefleet.trust.verifying import SignedFile
from edgefleet.v1 import admin_pb2
from hub.api.push import ChunkReader, PushRefused
from hub.decide.agentreleases import AgentReleaseRecord
from hub.state.agentreleases import (
    ReleaseContent,
    agent_release,
    agent_releases,
    put_agent_release,
)
from hub.state.sharedblobs import SharedBlobs
from hub.state.sharedtuf import MAX_SHARED_TARGETS_BYTES, SharedTuf, TufConflict
from hub.state.store import Store
from hub.state.tufrelay import RelayedTuf
from hub.state.tufrepo import TufRepository
from hub.state.writer import DeviceWriter

log = get_logger(__name__)

KIND_AGENT_RELEASE = "AgentRelease"  # the kind its events name

_CODES = {
    "UnknownRole": grpc.StatusCode.PERMISSION_DENIED,
    "NotAnAgentRole": grpc.StatusCode.PERMISSION_DENIED,
    "PathNotDelegated": grpc.StatusCode.PERMISSION_DENIED,
    "UnknownKey": grpc.StatusCode.PERMISSION_DENIED,
    "SignatureThresholdNotMet": grpc.StatusCode.PERMISSION_DENIED,
    "SignerNotDelegated": grpc.StatusCode.PERMISSION_DENIED,
    "MetadataRollback": grpc.StatusCode.FAILED_PRECONDITION,
    "MetadataExpired": grpc.StatusCode.FAILED_PRECONDITION,
    "TufRelayed": grpc.StatusCode.FAILED_PRECONDITION,
    "ReleaseTooLarge": grpc.StatusCode.INVALID_ARGUMENT,
}


def _refused(exc: ArtifactError, prefix: str = "") -> PushRefused:
    code = _CODES.get(exc.reason, grpc.StatusCode.INVALID_ARGUMENT)
    return PushRefused(code, exc.reason, f"{prefix}{exc}")


class AgentReleaseReceiver:
    """Receives pushed edged releases (module doc); hub.wiring builds it."""

    def __init__(
        self,
        store: Store,
        blobs: ArtifactStore,
        *,
        tuf: Callable[[], TufRepository | RelayedTuf | None],
        tuf_shared: SharedTuf | None,
        shared_blobs: SharedBlobs | None,
        writer: DeviceWriter | None = None,
    ) -> None:
        self.store = store
        self.blobs = blobs
        self.writer = writer  # the event of each release pushed
        self.tuf = tuf
        self.tuf_shared = tuf_shared
        self.shared_blobs = shared_blobs

    async def receive(
        self, requests: AsyncIterator[admin_pb2.PushArtifactRequest], *, now: float
    ) -> admin_pb2.PushAgentReleaseResponse:
        it = requests.__aiter__()
        try:
            first = await it.__anext__()
        except StopAsyncIteration:
            first = None
        if first is None or first.WhichOneof("message") != "header":
            raise PushRefused(
                grpc.StatusCode.INVALID_ARGUMENT,
                "NoHeader",
                "the first message must be a header with the release's signed metadata",
            )
        header = first.header
        envelope_bytes = bytes(header.signed_metadata)
        env, meta, delegated = self._verify_header(header, envelope_bytes, now)
        held = await agent_release(self.store, meta.version, *_platform(meta))
        if held is not None and held.sha256 != meta.sha256:
            raise _exists(meta, f"sha256 {held.sha256}")
        if self.shared_blobs is not None:
            try:
                self.shared_blobs.check_size(meta.what, meta.length)
            except ArtifactError as exc:
                raise PushRefused(
                    grpc.StatusCode.FAILED_PRECONDITION, exc.reason, str(exc)
                ) from None
        had = self.blobs.has(meta.sha256)
        reader = ChunkReader(it, asyncio.get_running_loop())
        try:
            sha256 = await self._ingest(reader, meta)
            if reader.begin_next_file() is not None:
                raise PushRefused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "FileNotSigned",
                    f"{meta.what}: a release is one file; no other file may follow it",
                )
            if self.shared_blobs is not None:
                await self.shared_blobs.publish(sha256)
            record = AgentReleaseRecord(
                version=meta.version,
                arch=meta.platform.arch,
                python_abi=meta.platform.python_abi,
                sha256=sha256,
                length=meta.length,
                envelope=envelope_bytes,
                pushed_at=now,
                signers=self._signers(env, delegated[0]),
            )
            event = None
            if self.writer is not None:
                event = self.writer.prepare_event(
                    KIND_AGENT_RELEASE,
                    f"{meta.version}-{meta.platform.arch}-{meta.platform.python_abi}",
                    "Normal",
                    "Pushed",
                    f"{meta.what} pushed (sha256 {sha256}, {meta.length} bytes)",
                )
            try:
                stored = await put_agent_release(
                    self.store, record, with_ops=[event.put] if event is not None else []
                )
            except CompareFailed:
                raise _exists(meta, "other bytes pushed meanwhile") from None
            if stored and event is not None and self.writer is not None:
                self.writer.committed(event)
            await self._store_targets(delegated)
        except BaseException:
            if not had:  # bytes this push brought
                self.blobs.path_for(meta.sha256).unlink(missing_ok=True)
            raise
        log.info(
            "agent release pushed" if stored else "agent release unchanged",
            version=meta.version,
            platform=str(meta.platform),
            sha256=sha256,
        )
        return admin_pb2.PushAgentReleaseResponse(
            version=meta.version,
            arch=meta.platform.arch,
            python_abi=meta.platform.python_abi,
            sha256=sha256,
            length=meta.length,
            stored=stored,
        )

    def _verify_header(
        self, header: admin_pb2.ArtifactHeader, envelope_bytes: bytes, now: float
    ) -> tuple[Envelope, AgentReleaseMetadata, tuple[str, bytes, int]]:
        tuf = self.tuf()
        if tuf is None:
            raise PushRefused(
                grpc.StatusCode.FAILED_PRECONDITION,
                "NoTufRepository",
                "this hub keeps no TUF repository: edged releases are signed by a TUF "
                "delegation of their own, so a hub without TUF cannot take them (not supported)",
            )
        try:
            env, meta = agentreleases.decode_release(envelope_bytes, what="header.signed_metadata")
            agentreleases.check_not_expired(meta, now)
        except ArtifactError as exc:
            raise _refused(exc) from None
        data, role = bytes(header.delegated_targets), str(header.delegated_role)
        if not data or not role:
            raise PushRefused(
                grpc.StatusCode.FAILED_PRECONDITION,
                "TargetsMissing",
                "header.delegated_targets: an edged release comes with the agent role's TUF "
                "targets listing it (edgectl agent push signs them); devices refuse releases no "
                "agent role lists",
            )
        if self.tuf_shared is not None and len(data) > MAX_SHARED_TARGETS_BYTES:
            raise PushRefused(
                grpc.StatusCode.INVALID_ARGUMENT,
                "MetadataTooLarge",
                f"header.delegated_targets: {len(data)} bytes; hub replicas share them in the "
                f"store, at most {MAX_SHARED_TARGETS_BYTES} bytes",
            )
        try:
            version = tuf.check_delegated_release(role, data, meta, now=now, envelope=env)
        except TrustError as exc:
            raise _refused(exc, "header.delegated_targets: ") from None
        return env, meta, (role, data, version)

    def _signers(self, env: Envelope, role: str) -> tuple[str, ...]:
        """The key ids of the agent role with a valid signature on the envelope (what the
        record shows; a signature by any other key was never counted)."""
        from edgefleet.trust import tufmeta
        from edgefleet.trust.envelopes import valid_signers

        tuf = self.tuf()
        delegations = tuf.targets.delegations if tuf is not None else None
        if delegations is None or not delegations.roles or role not in delegations.roles:
            return ()
        keyids = delegations.roles[role].keyids
        keys = tufmeta.raw_keys(delegations.keys, keyids)
        return tuple(sorted(valid_signers(env, keys, keyids)))

    async def _ingest(self, reader: ChunkReader, meta: AgentReleaseMetadata) -> str:
        info = FileInfo(meta.sha256, meta.length, "release")
        try:
            return await asyncio.to_thread(
                self.blobs.ingest_stream,
                cast("BinaryIO", reader),
                origin=f"pushed {meta.file_name}",
                name=agentreleases.RELEASE_NAME,
                version=meta.version,
                verifiers=[SignedFile(info, meta.what), ReleaseContent(meta)],
                max_bytes=meta.length,
            )
        except PushRefused:
            raise
        except ArtifactError as exc:
            if exc.reason == "ArtifactTooLarge":
                raise PushRefused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "LengthExceeded",
                    f"{meta.what}: the pushed bytes are longer than the signed length "
                    f"{meta.length}",
                ) from None
            raise _refused(exc) from None

    async def _store_targets(self, delegated: tuple[str, bytes, int]) -> None:
        role, data, version = delegated
        tuf = self.tuf()
        if not version or tuf is None:
            return  # the same targets again: nothing new to sign
        try:
            if self.tuf_shared is not None:
                await self.tuf_shared.publish_delegated(role, data, version)
            else:
                await asyncio.to_thread(tuf.store_delegated, role, data, version)
        except TufConflict as exc:
            raise PushRefused(grpc.StatusCode.ABORTED, "TufConflict", str(exc)) from None
        except TrustError as exc:
            raise PushRefused(grpc.StatusCode.ABORTED, exc.reason, str(exc)) from None


def _platform(meta: AgentReleaseMetadata) -> tuple[str, str]:
    return meta.platform.arch, meta.platform.python_abi


def _exists(meta: AgentReleaseMetadata, have: str) -> PushRefused:
    return PushRefused(
        grpc.StatusCode.ALREADY_EXISTS,
        "VersionExists",
        f"{meta.what} was already pushed ({have}); these bytes have sha256 {meta.sha256}. "
        "Releases are immutable: push a new version",
    )


async def list_releases(store: Store) -> admin_pb2.ListAgentReleasesResponse:
    """``ListAgentReleases``: every release the hub holds, newest push first."""
    from google.protobuf.timestamp_pb2 import Timestamp

    out = admin_pb2.ListAgentReleasesResponse()
    for r in await agent_releases(store):
        pushed = Timestamp()
        pushed.FromNanoseconds(int(r.pushed_at * 1e9))
        out.releases.append(
            admin_pb2.AgentRelease(
                version=r.version,
                arch=r.arch,
                python_abi=r.python_abi,
                sha256=r.sha256,
                length=r.length,
                pushed_at=pushed,
                signers=list(r.signers),
            )
        )
    return out
