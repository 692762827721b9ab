"""Fetching an edged release the hub assigned (issue 32, docs/agent-updates.md "Releases").

:func:`fetch_agent_release` is the device's one way to get a release. Before it fetches a
byte it checks the hub's ``DesiredAgent.signed_metadata`` as edgefleet.trust.agentreleases
describes: a release envelope (a model's metadata is ``WrongPayloadType``) for the version
asked, for this device's platform (``WrongPlatform``: its machine and CPython ABI), not
expired, under a usable fleet root; python-tuf's client refreshed from the hub, the release
file a target of an **agent role** (its only path ``agent/edged/*/*``: ``NotAnAgentRole``)
with the signed length and sha256, and the envelope signed by a threshold of that role's
keys (``SignerNotDelegated``). A device that holds no TUF metadata takes no release
(``NoTufRepository``).

Then it streams the file with FetchArtifact into ``D/agent/downloads/<sha256>.part``
(resumable, never past the signed length: ``LengthExceeded``), checks length and sha256
(``DigestMismatch``: the part is removed), fsyncs it and renames it to ``<sha256>.tar.gz``:
a partial or altered download never passes. The tarball's ``release.json`` must say the
signed version, platform and requirements. Other files of the folder are removed (one release
is downloaded at a time; the installer keeps what it installed).

:func:`make_fetch` makes the plain callable the agent controller takes.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from edged.hublink.downloading import Downloads
from edgefleet.errors import TemporaryError, TrustError
from edgefleet.logs import get_logger
from edgefleet.persisting import fsync_dir

if TYPE_CHECKING:
    from edged.trust.admitting import ArtifactGate
    from edged.trust.tufclient import TufClient
    from edgefleet.trust.agentreleases import AgentReleaseMetadata, Platform
    from edgefleet.trust.envelopes import Envelope
    from edgefleet.v1 import device_pb2

log = get_logger(__name__)

DOWNLOADS = Path("agent") / "downloads"


@dataclass(frozen=True, slots=True)
class VerifiedRelease:
    """A release file on this device whose bytes match its verified signed metadata."""

    path: Path  # the release tarball (D/agent/downloads/<sha256>.tar.gz)
    version: str
    arch: str
    python_abi: str
    sha256: str
    length: int
    requires: Mapping[str, str] = field(default_factory=dict)  # distribution -> version


class ReleaseLink(Protocol):
    """What the fetch needs of the hub link's current session (:class:`edged.hublink.linking.
    Fetcher`): an artifact's bytes from an offset, and a file of the hub's TUF repository."""

    def __call__(self, sha256: str, offset: int) -> AsyncIterator[tuple[int, bytes]]: ...

    async def metadata(self, name: str, max_length: int) -> bytes | None: ...


class AgentRequest(Protocol):
    """What the fetch reads of a DesiredAgent (the message, or anything with these)."""

    @property
    def version(self) -> str: ...

    @property
    def signed_metadata(self) -> bytes: ...


FetchRelease = Callable[["device_pb2.DesiredAgent"], Awaitable[VerifiedRelease]]
"""What the agent controller calls with the hub's DesiredAgent: the verified release file."""

Progress = Callable[[int, int], None]
"""``progress(bytes_done, bytes_total)`` while a release downloads."""


def check_metadata(
    desired: AgentRequest, *, platform: Platform, now: float, gate: ArtifactGate
) -> tuple[Envelope, AgentReleaseMetadata]:
    """The checks of the signed metadata that need no TUF (pure over its inputs)."""
    from edgefleet.trust import agentreleases
    from edgefleet.trust.verifying import check_root_usable

    env, meta = agentreleases.decode_release(
        bytes(desired.signed_metadata), what="DesiredAgent.signed_metadata"
    )
    if meta.version != desired.version:
        raise TrustError(
            "MetadataMismatch",
            f"the signed metadata is for edged {meta.version}, the hub asks for {desired.version}",
        )
    agentreleases.check_platform(meta, platform)
    agentreleases.check_not_expired(meta, now)
    check_root_usable(gate.root, now)
    return env, meta


def check_tuf(
    tuf: TufClient,
    fetch: Callable[[str, int], bytes | None],
    gate: ArtifactGate,
    env: Envelope,
    meta: AgentReleaseMetadata,
) -> None:
    """python-tuf refreshed from the hub; the release file a target of an agent role with the
    signed length and sha256; the envelope signed by that role (blocking: run in a thread)."""
    from tuf.api.exceptions import DownloadError, RepositoryError

    from edged.trust.tufclient import _refusal
    from edgefleet.trust import agentreleases

    with tuf.lock():
        updater = tuf.refresh(fetch, gate.root, floor=gate.state.tuf_root_version)
        if updater is None:
            raise TrustError(
                "NoTufRepository",
                f"{meta.what}: edged releases are delegated by TUF and this device holds no TUF "
                "metadata (the hub keeps no TUF repository)",
            )
        try:
            agentreleases.check_listed(updater.get_targetinfo, meta)
        except RepositoryError as exc:
            raise _refusal(exc) from None
        except (DownloadError, TimeoutError, OSError) as exc:
            raise TemporaryError(f"TUF metadata could not be fetched: {exc}") from None
        role, paths = tuf.role_for_path(meta.target, what=meta.what)
    agentreleases.check_agent_role(env, role, paths)


def _digest(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    length = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            length += len(chunk)
        os.fsync(f.fileno())
    return h.hexdigest(), length


def _finish(part: Path, final: Path, meta: AgentReleaseMetadata) -> None:
    """Check the downloaded part against the signed length and sha256, then rename it into
    place (blocking). The part is removed when it does not match."""
    from edgefleet.trust import agentreleases

    sha, length = _digest(part)
    if (sha, length) != (meta.sha256, meta.length):
        part.unlink(missing_ok=True)
        reason = "LengthMismatch" if length != meta.length else "DigestMismatch"
        raise TrustError(
            reason,
            f"{meta.what}: the downloaded file has {length} bytes and sha256 {sha}; the signed "
            f"metadata says {meta.length} and {meta.sha256}",
        )
    manifest = agentreleases.inspect_release(part, what=f"{meta.what}: the downloaded file")
    if (manifest.version, manifest.platform, dict(manifest.requires)) != (
        meta.version,
        meta.platform,
        dict(meta.requires),
    ):
        part.unlink(missing_ok=True)
        raise TrustError(
            "ReleaseMismatch",
            f"{meta.what}: the file's release.json says edged {manifest.version} for "
            f"{manifest.platform}, or other requirements, than its signed metadata",
        )
    os.replace(part, final)
    fsync_dir(final.parent)


async def fetch_agent_release(
    desired: AgentRequest,
    *,
    data_dir: Path,
    link: ReleaseLink,
    tuf: TufClient,
    gate: ArtifactGate,
    platform: Platform | None = None,
    now: float | None = None,
    progress: Progress | None = None,
) -> VerifiedRelease:
    """Verify the release ``desired`` names, download it, and return it (module doc).
    ``ArtifactError`` (a ``TrustError`` for the signed metadata) with the reason when refused;
    ``TemporaryError`` when the hub could not be reached (retry: the download resumes)."""
    from edged.trust.tufclient import sync_fetch
    from edgefleet.trust.agentreleases import this_platform

    now = time.time() if now is None else now
    env, meta = check_metadata(desired, platform=platform or this_platform(), now=now, gate=gate)
    fetch = sync_fetch(link.metadata, asyncio.get_running_loop())
    await asyncio.to_thread(check_tuf, tuf, fetch, gate, env, meta)
    folder = Path(data_dir) / DOWNLOADS
    downloads = Downloads(folder)
    final = folder / f"{meta.sha256}.tar.gz"
    for p in folder.iterdir():  # one release at a time
        if p.name not in (final.name, downloads.part(meta.sha256).name):
            p.unlink(missing_ok=True)
    if final.exists():
        sha, length = await asyncio.to_thread(_digest, final)
        if (sha, length) != (meta.sha256, meta.length):
            final.unlink()
    if not final.exists():

        def told(done: int, force: bool = False) -> None:
            if progress is not None:
                progress(done, meta.length)

        log.info("agent release download", version=meta.version, bytes=meta.length)
        part = await downloads.fetch(meta.sha256, meta.length, link, told)
        await asyncio.to_thread(_finish, part, final, meta)
        log.info("agent release verified", version=meta.version, sha256=meta.sha256)
    return VerifiedRelease(
        path=final,
        version=meta.version,
        arch=meta.platform.arch,
        python_abi=meta.platform.python_abi,
        sha256=meta.sha256,
        length=meta.length,
        requires=dict(meta.requires),
    )


def make_fetch(
    data_dir: Path,
    *,
    link: Callable[[], ReleaseLink | None],
    tuf: TufClient,
    gate: ArtifactGate,
    clock: Callable[[], float] = time.time,
    progress: Progress | None = None,
) -> FetchRelease:
    """The device's release fetch as a plain callable, from what the daemon has: its data
    directory ``D``, ``link`` (the hub link's current session, None while disconnected:
    ``lambda: hub_link.fetcher``), its TUF client and its trust gate (the fleet root and
    the TUF root version its trust state recorded); ``progress(done, total)`` is told as the
    file downloads (AgentStatus.bytes_done/bytes_total).

    ``await fetch(desired_agent)`` verifies ``desired_agent.signed_metadata`` (TUF's agent
    delegation, envelope signatures, platform = this device's, expiry) before any byte is
    fetched, then streams the file into ``D/agent/downloads/<sha256>.tar.gz`` within its
    signed length and digest, and returns it as a :class:`VerifiedRelease`. Raises
    ``ArtifactError`` (``TrustError``) with a CamelCase reason when the release is refused
    (for AgentStatus.reason) and ``TemporaryError`` when the hub could not be reached
    (not connected, or the stream broke): retry.
    """

    async def fetch(desired: Any) -> VerifiedRelease:
        current = link()
        if current is None:
            raise TemporaryError("not connected to the hub: the release is fetched once it is")
        return await fetch_agent_release(
            desired,
            data_dir=data_dir,
            link=current,
            tuf=tuf,
            gate=gate,
            now=clock(),
            progress=progress,
        )

    return fetch
