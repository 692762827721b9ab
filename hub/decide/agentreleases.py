"""Agent releases the hub holds (issue 32): plain records, shared by the push path
(hub.api.agentpush), the store (hub.state.agentreleases) and the AgentUpgrade deciders.

Key: ``/agentreleases/VERSION/ARCH/ABI`` (``/agentreleases/0.2.1/x86_64/cp311``); value: the
JSON of :meth:`AgentReleaseRecord.to_json`. A release is immutable: the same version and
platform with other bytes is refused at push (``VersionExists``).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

AGENT_RELEASES = "/agentreleases/"


def agent_release_key(version: str, arch: str, python_abi: str) -> str:
    return f"{AGENT_RELEASES}{version}/{arch}/{python_abi}"


@dataclass(frozen=True, slots=True)
class AgentReleaseRecord:
    """One pushed edged release for one platform; the hub never re-signs it."""

    version: str
    arch: str
    python_abi: str
    sha256: str
    length: int
    envelope: bytes  # the publisher-signed release metadata, exactly as signed
    pushed_at: float
    signers: tuple[str, ...] = field(default=())

    @property
    def key(self) -> str:
        return agent_release_key(self.version, self.arch, self.python_abi)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "arch": self.arch,
            "pythonAbi": self.python_abi,
            "sha256": self.sha256,
            "length": self.length,
            "pushedAt": self.pushed_at,
            "signers": list(self.signers),
            "signedMetadata": base64.b64encode(self.envelope).decode(),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> AgentReleaseRecord:
        return cls(
            version=str(doc["version"]),
            arch=str(doc["arch"]),
            python_abi=str(doc["pythonAbi"]),
            sha256=str(doc["sha256"]),
            length=int(doc["length"]),
            envelope=base64.b64decode(doc["signedMetadata"]),
            pushed_at=float(doc["pushedAt"]),
            signers=tuple(str(s) for s in doc.get("signers", ())),
        )
