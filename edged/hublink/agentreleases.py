"""Fetching an edged release the hub assigned (issue 32, docs/agent-updates.md "Releases").

:func:`fetch_agent_release` is the device's one way to get a release: it verifies the signed
metadata (TUF delegation for agent releases, envelope signatures, platform, expiry) before it
downloads a byte, streams the file with FetchArtifact within its signed length and digest,
and returns it as a :class:`VerifiedRelease`. edged.agent installs only what it returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


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
