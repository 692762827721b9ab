"""Fetching an edged release the hub assigned (issue 32, docs/agent-updates.md "Releases").

:func:`fetch_agent_release` is the device's one way to get a release: it verifies the signed
metadata (TUF delegation for agent releases, envelope signatures, platform, expiry) before it
downloads a byte, streams the file with FetchArtifact within its signed length and digest,
and returns it as a :class:`VerifiedRelease`. edged.agent installs only what it returns.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from edgefleet.errors import ArtifactError

if TYPE_CHECKING:
    from edged.trust.admitting import ArtifactGate
    from edged.trust.tufclient import TufClient
    from edgefleet.v1 import device_pb2


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


FetchRelease = Callable[["device_pb2.DesiredAgent"], Awaitable[VerifiedRelease]]
"""What the agent controller calls with the hub's DesiredAgent: the verified release file."""


def make_fetch(
    data_dir: Path,
    *,
    link: Callable[[], ReleaseLink | None],
    tuf: TufClient,
    gate: ArtifactGate,
    clock: Callable[[], float] = time.time,
) -> FetchRelease:
    """The device's release fetch as a plain callable, from what the daemon has: its data
    directory ``D``, ``link`` (the hub link's current session, None while disconnected:
    ``lambda: hub_link.fetcher``), its TUF client and its trust gate (the fleet root and
    the TUF root version its trust state recorded).

    ``await fetch(desired_agent)`` verifies ``desired_agent.signed_metadata`` (TUF's agent
    delegation, envelope signatures, platform = this device's, expiry) before any byte is
    fetched, then streams the file into ``D/agent/downloads/<sha256>.tar.gz`` within its
    signed length and digest, and returns it as a :class:`VerifiedRelease`. Raises
    ``ArtifactError`` (``TrustError``) with a CamelCase reason when the release is refused
    (for AgentStatus.reason) and ``TemporaryError`` when the hub could not be reached: retry.
    """

    async def fetch(desired: device_pb2.DesiredAgent) -> VerifiedRelease:
        raise ArtifactError(
            "NotSupportedYet", "fetching an agent release is not supported yet (issue 32)"
        )

    return fetch
