"""A regional hub fetches from its root the edged releases its root's AgentUpgrades in waves
roll out (docs/agent-updates.md "Waves by region"), so that no operator pushes a release at
each region.

The root names the versions in the region's slice (``RegionSlice.agent_release_versions``,
:func:`hub.decide.agentrelay.wanted_versions`); while the link to the root is up,
:class:`AgentReleaseRelay` fetches one version at a time that the region holds no release of
(:func:`hub.decide.agentrelay.due`) with ``FetchFederatedAgentRelease``, within
:data:`FETCH_TIMEOUT_S`. Each release is checked as a push at a hub checks one
(:mod:`hub.api.agentpush`) before anything is stored:

* its signed metadata decodes as an edged release's (a model's is ``WrongPayloadType``), is not
  expired, and says what the root's record says (version, platform, sha256, length:
  ``RecordMismatch``); its length within the hub's bounds (``ReleaseTooLarge``);
* an agent-release role of the root's TUF targets as this region relays them (checked from the
  fleet's trust root when adopted) lists the file with the signed length and sha256, and a
  threshold of that role's keys signed the metadata
  (:meth:`hub.state.tufrelay.RelayedTuf.check_relayed_release`: ``NotInTargets``,
  ``TargetMismatch``, ``SignerNotDelegated``...);
* a release of that version and platform held with other bytes is ``VersionExists``;
* the bytes are no longer than the signed length and have the signed sha256, and the tarball is
  what the metadata says (:class:`hub.state.agentreleases.ReleaseContent`).

Then the blob, and the record (:func:`hub.state.agentreleases.put_agent_release`) with its event
(``AgentRelease`` ``VERSION-ARCH-ABI``, ``Fetched``) in one transaction, as a push writes them;
the TUF targets are already the root's, relayed. A release refused leaves no blob and no record:
a ``Warning`` ``AgentReleaseRefused`` event, and the region's report names the version and why
(``RegionReport.agent_release_refusals``), which the root's waves show in ``ReleaseMissing``.
A failed try (refused, the root away, a timeout) is tried again after a backoff
(:func:`hub.decide.agentrelay.failed`). A version held is asked again every
:data:`hub.decide.agentrelay.RECHECK_HELD_S` with the sha256 of the releases held (the root
sends only the others: a platform pushed at the root later). With the link down nothing is
fetched: the root's wave holds as before (``ReleaseMissing`` / ``RegionUnreachable``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import grpc

from edgefleet.artifacts.storing import ArtifactStore
from edgefleet.errors import ArtifactError, CompareFailed, EdgefleetError
from edgefleet.logs import get_logger
from edgefleet.trust import agentreleases
from edgefleet.trust.agentreleases import AgentReleaseMetadata
from edgefleet.trust.documents import FileInfo
from edgefleet.trust.envelopes import Envelope
from edgefleet.trust.verifying import SignedFile
from edgefleet.v1 import federation_pb2
from hub.decide import agentrelay
from hub.decide.agentrelay import Attempt
from hub.decide.agentreleases import AgentReleaseRecord
from hub.state.agentreleases import (
    ReleaseContent,
    agent_release,
    agent_releases,
    put_agent_release,
)
from hub.state.heldtuf import HeldTuf
from hub.state.sharedblobs import SharedBlobs
from hub.state.store import Store
from hub.state.tufrelay import RelayedTuf
from hub.state.writer import DeviceWriter

log = get_logger(__name__)

FETCH_TIMEOUT_S = 120.0
"""One version's fetch (every platform of it) at most."""
RECHECK_S = 2.0
"""How often the relay looks again without being woken (a backoff ended, a release gone)."""
KIND_AGENT_RELEASE = "AgentRelease"


class ReleaseRefused(EdgefleetError):
    """A release from the root that a push would have been refused with (``reason``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class _Incoming:
    """One release of the stream being received."""

    meta: AgentReleaseMetadata
    envelope: bytes
    signers: tuple[str, ...]
    file: IO[bytes] | None  # None: the region holds these bytes already (not written again)
    path: Path | None
    got: int = 0


class AgentReleaseRelay:
    """Fetches the releases the root's slice names (module doc); the parent link feeds it the
    slice's versions (:meth:`want`) and runs :meth:`run` while a stream to the root is up."""

    def __init__(
        self,
        *,
        store: Store,
        blobs: ArtifactStore,
        tuf: HeldTuf,
        data_dir: Path,
        writer: DeviceWriter,
        shared_blobs: SharedBlobs | None = None,
        clock: Callable[[], float] = time.time,
        timeout_s: float = FETCH_TIMEOUT_S,
        on_stored: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``on_stored``: called after a release was stored (the AgentUpgrade controller reads
        the releases into the cache, which the region's report lists)."""
        self._store = store
        self._blobs = blobs
        self._tuf = tuf
        self._data_dir = data_dir
        self._writer = writer
        self._shared_blobs = shared_blobs
        self._clock = clock
        self._timeout_s = timeout_s
        self._on_stored = on_stored
        self.wanted: tuple[str, ...] = ()
        self.attempts: dict[str, Attempt] = {}
        self.checked: dict[str, float] = {}  # version -> when last asked while held
        self.held: frozenset[str] = frozenset()
        self.fetched = 0  # releases stored (for tests and logs)
        self._wake = asyncio.Event()

    def want(self, versions: Sequence[str]) -> None:
        """The versions the slice applied names."""
        self.wanted = tuple(versions)
        self.attempts = agentrelay.kept(self.attempts, self.wanted)
        self.checked = agentrelay.kept(self.checked, self.wanted)
        self._wake.set()

    def refusals(self) -> dict[str, str]:
        """What the region's report says of the releases it refused."""
        return agentrelay.refusals(self.attempts, self.held)

    async def run(self, stub: Any) -> None:
        """Fetch what is due, one version at a time, until cancelled (the stream ended)."""
        while True:
            try:
                records = await agent_releases(self._store)
                self.held = frozenset(r.version for r in records)
                version = agentrelay.due(
                    self.wanted, self.held, self.attempts, self._clock(), self.checked
                )
                if version is not None:
                    have = sorted({r.sha256 for r in records if r.version == version})
                    await self.fetch_once(stub, version, have)
                    continue
            except Exception as exc:  # a bug or the store away: logged, tried again
                log.error("agent release relay failed", error=repr(exc))
            self._wake.clear()
            with contextlib.suppress(TimeoutError):  # no wake-up: the periodic recheck
                await asyncio.wait_for(self._wake.wait(), RECHECK_S)

    async def fetch_once(self, stub: Any, version: str, have: Sequence[str] = ()) -> bool:
        """One try at ``version`` (``have``: the sha256 of its releases held here, which the
        root does not send again): True when every release of it the root sent is held."""
        if have:
            self.checked[version] = self._clock()
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._fetch(stub, version, list(have)[:16])
        except ReleaseRefused as exc:
            why = f"{exc.reason}: {exc}"
            self.attempts[version] = agentrelay.failed(
                self.attempts.get(version), why, self._clock(), refused=True, jitter=random.random()
            )
            log.error("agent release from the root refused", version=version, reason=why)
            self._writer.event(
                KIND_AGENT_RELEASE,
                version,
                "Warning",
                "AgentReleaseRefused",
                f"the root hub's release of edged {version} refused: {why}"[:1024],
            )
            return False
        except (grpc.aio.AioRpcError, TimeoutError, OSError, EdgefleetError) as exc:
            if isinstance(exc, grpc.aio.AioRpcError):
                why = f"{exc.code().name}: {exc.details()}"
            elif isinstance(exc, TimeoutError):
                why = f"Timeout: not fetched within {self._timeout_s:g} s"
            elif isinstance(exc, ArtifactError):
                why = f"{exc.reason}: {exc}"
            else:
                why = f"{type(exc).__name__}: {exc}"
            self.attempts[version] = agentrelay.failed(
                self.attempts.get(version),
                why,
                self._clock(),
                refused=False,
                jitter=random.random(),
            )
            log.warning("agent release fetch failed", version=version, error=why)
            return False
        self.attempts.pop(version, None)
        if self._on_stored is not None:
            await self._on_stored()
        return True

    async def _fetch(self, stub: Any, version: str, have: list[str]) -> None:
        current: _Incoming | None = None
        count = 0
        try:
            async for part in stub.FetchFederatedAgentRelease(
                federation_pb2.FetchFederatedAgentReleaseRequest(version=version, held_sha256=have)
            ):
                kind = part.WhichOneof("part")
                if kind == "release":
                    if current is not None:
                        await self._finish(current)
                        current = None
                    count += 1
                    if count > 16:
                        raise ReleaseRefused("TooManyReleases", "more than 16 platforms sent")
                    current = await self._begin(part.release, version)
                elif kind == "data":
                    if current is None:
                        raise ReleaseRefused("NoHeader", "bytes before any release's record")
                    current.got += len(part.data)
                    if current.got > current.meta.length:
                        raise ReleaseRefused(
                            "LengthExceeded",
                            f"{current.meta.what}: more than the signed {current.meta.length} "
                            "bytes",
                        )
                    if current.file is not None:
                        await asyncio.to_thread(current.file.write, part.data)
            if current is not None:
                await self._finish(current)
                current = None
            if count == 0 and not have:
                raise ReleaseRefused("NoRelease", f"the root sent no release of edged {version}")
        finally:
            if current is not None:
                _discard(current)

    async def _begin(self, r: federation_pb2.FederatedAgentRelease, version: str) -> _Incoming:
        now = self._clock()
        envelope = bytes(r.envelope)
        try:
            env, meta = agentreleases.decode_release(envelope, what="the root's release metadata")
            agentreleases.check_not_expired(meta, now)
        except ArtifactError as exc:
            raise ReleaseRefused(exc.reason, str(exc)) from None
        claimed = (r.version, r.arch, r.python_abi, r.sha256, r.length)
        signed = (meta.version, meta.platform.arch, meta.platform.python_abi, meta.sha256)
        if claimed != (*signed, meta.length) or meta.version != version:
            raise ReleaseRefused(
                "RecordMismatch",
                f"{meta.what}: the root's record ({r.version} {r.arch} {r.python_abi}, sha256 "
                f"{r.sha256[:16]}, {r.length} bytes) is not what the signed metadata says "
                f"(sha256 {meta.sha256[:16]}, {meta.length} bytes), or not version {version}",
            )
        tuf = self._tuf()
        if not isinstance(tuf, RelayedTuf):
            # the root's TUF metadata not adopted yet: tried again after a backoff
            raise ArtifactError(
                "NoTufMetadata", "this region holds none of its root's TUF metadata yet"
            )
        try:
            role = tuf.check_relayed_release(meta, now=now, envelope=env)
        except ArtifactError as exc:  # TrustError is one
            raise ReleaseRefused(exc.reason, str(exc)) from None
        if self._shared_blobs is not None:
            try:
                self._shared_blobs.check_size(meta.what, meta.length)
            except ArtifactError as exc:
                raise ReleaseRefused(exc.reason, str(exc)) from None
        held = await agent_release(
            self._store, meta.version, meta.platform.arch, meta.platform.python_abi
        )
        if held is not None and held.sha256 != meta.sha256:
            raise ReleaseRefused(
                "VersionExists",
                f"{meta.what}: this region holds other bytes (sha256 {held.sha256[:16]}); "
                "releases are immutable",
            )
        signers = _signers(tuf, env, role)
        if held is not None or self._blobs.has(meta.sha256):
            return _Incoming(meta, envelope, signers, None, None)
        fd, tmp = tempfile.mkstemp(dir=self._data_dir, prefix=".agent-fetch-")
        return _Incoming(meta, envelope, signers, os.fdopen(fd, "wb"), Path(tmp))

    async def _finish(self, incoming: _Incoming) -> None:
        meta = incoming.meta
        brought = False
        try:
            if incoming.file is not None and incoming.path is not None:
                incoming.file.close()
                info = FileInfo(meta.sha256, meta.length, "release")
                try:
                    await asyncio.to_thread(
                        self._blobs.ingest_file,
                        incoming.path,
                        name=agentreleases.RELEASE_NAME,
                        version=meta.version,
                        verifiers=[SignedFile(info, meta.what), ReleaseContent(meta)],
                        max_bytes=meta.length,
                    )
                except ArtifactError as exc:
                    raise ReleaseRefused(exc.reason, str(exc)) from None
                brought = True
            elif not self._blobs.has(meta.sha256):
                raise ReleaseRefused("Missing", f"{meta.what}: its bytes are not stored")
            if self._shared_blobs is not None:
                await self._shared_blobs.publish(meta.sha256)
            record = AgentReleaseRecord(
                version=meta.version,
                arch=meta.platform.arch,
                python_abi=meta.platform.python_abi,
                sha256=meta.sha256,
                length=meta.length,
                envelope=incoming.envelope,
                pushed_at=self._clock(),
                signers=incoming.signers,
            )
            event = self._writer.prepare_event(
                KIND_AGENT_RELEASE,
                f"{meta.version}-{meta.platform.arch}-{meta.platform.python_abi}",
                "Normal",
                "Fetched",
                f"{meta.what} fetched from the root hub (sha256 {meta.sha256}, "
                f"{meta.length} bytes)",
            )
            try:
                stored = await put_agent_release(self._store, record, with_ops=[event.put])
            except CompareFailed:
                # another replica of this region stored it meanwhile: the same bytes are fine
                again = await agent_release(
                    self._store, meta.version, meta.platform.arch, meta.platform.python_abi
                )
                if again is None or again.sha256 != meta.sha256:
                    raise ReleaseRefused(
                        "VersionExists", f"{meta.what}: other bytes stored meanwhile"
                    ) from None
                stored = False
                brought = False  # the record names these bytes: they stay
            if stored:
                self._writer.committed(event)
                self.fetched += 1
                log.info("agent release fetched from the root", version=meta.version,
                         platform=str(meta.platform), sha256=meta.sha256)  # fmt: skip
        except BaseException:
            if brought:
                self._blobs.path_for(meta.sha256).unlink(missing_ok=True)
            raise
        finally:
            _discard(incoming)


def _discard(incoming: _Incoming) -> None:
    if incoming.file is not None:
        incoming.file.close()
    if incoming.path is not None:
        with contextlib.suppress(FileNotFoundError):  # gone already: nothing to remove
            os.unlink(incoming.path)


def _signers(tuf: RelayedTuf, env: Envelope, role: str) -> tuple[str, ...]:
    """The key ids of the agent role with a valid signature on the envelope (as a push's
    record shows them)."""
    from edgefleet.trust import tufmeta
    from edgefleet.trust.envelopes import valid_signers

    delegations = tuf.targets.delegations
    if delegations is None or not delegations.roles or role not in delegations.roles:
        return ()
    keyids = delegations.roles[role].keyids
    keys = tufmeta.raw_keys(delegations.keys, keyids)
    return tuple(sorted(valid_signers(env, keys, keyids)))
