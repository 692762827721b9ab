"""The device's TUF checks under test: artifacts' targets entries, a hub that signs metadata with
real keys, and a refusal with its reason."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from trusttesting import Key

from edgefleet.errors import TrustError
from edgefleet.trust import tufmeta
from edgefleet.trust.documents import ArtifactMetadata, FileInfo, Root
from hub.state.tufrepo import TufRepository

DAY = 86400.0


def artifact(name: str, version: str, data: bytes = b"model bytes") -> ArtifactMetadata:
    now = time.time()
    return ArtifactMetadata(
        name=name,
        version=version,
        precision=None,
        metadata_version=1,
        created=now,
        expires=now + 30 * DAY,
        files={
            "model.onnx": FileInfo(hashlib.sha256(data).hexdigest(), len(data), "model"),
            "labels.txt": FileInfo(hashlib.sha256(b"a,b").hexdigest(), 3, "extra"),
        },
    )


@dataclass
class Hub:
    """The hub's real repository, and what a compromised hub serves instead."""

    data: Path
    keys: dict[str, Key]
    fleet_root: Root
    repo: TufRepository
    served: dict[str, bytes | None] = field(default_factory=dict)
    fetched: list[str] = field(default_factory=list)

    def fetch(self, name: str, max_length: int) -> bytes | None:
        self.fetched.append(name)
        if name in self.served:
            return self.served[name]
        return self.repo.read(name)

    def reload(self, **kwargs: Any) -> None:
        self.repo = TufRepository(self.data / "tuf", **kwargs)

    def publish(
        self, key: str, role: str, meta: ArtifactMetadata, *, rollback: float | None = None
    ) -> bytes:
        """What ``edgectl models push`` does: the role's targets plus ``meta``, signed."""
        data = tufmeta.add_artifact(
            self.repo.read(tufmeta.role_file(role)),
            meta,
            [tufmeta.tuf_signer(self.keys[key].key_file)],
            expires=time.time() + 30 * DAY,
            rollback_expires=rollback,
        )
        version = self.repo.check_delegated(role, data, meta, now=time.time())
        self.repo.store_delegated(role, data, version)
        return data

    def online_signer(self) -> Any:
        return tufmeta.tuf_signer(self.data / "tuf" / "online.key")

    def forge_snapshot(self, meta: dict[str, int]) -> None:
        """A compromised hub signs a snapshot (and a timestamp for it) with its online key."""
        from tuf.api.metadata import MetaFile, Snapshot, Timestamp

        old_snap, _ = tufmeta.parse(self.repo.read("snapshot.json") or b"", Snapshot, what="s")
        old_ts, _ = tufmeta.parse(self.repo.read("timestamp.json") or b"", Timestamp, what="t")
        exp = tufmeta._expiry(time.time() + DAY)
        snap = Snapshot(
            version=old_snap.version + 10,
            expires=exp,
            meta={k: MetaFile(v) for k, v in meta.items()},
        )
        snap_bytes = tufmeta.sign(snap, [self.online_signer()])
        ts = Timestamp(
            version=old_ts.version + 10, expires=exp, snapshot_meta=MetaFile(snap.version)
        )
        self.served["snapshot.json"] = snap_bytes
        self.served["timestamp.json"] = tufmeta.sign(ts, [self.online_signer()])


def refused(reason: str, call: Any, *args: Any, **kwargs: Any) -> TrustError:
    with pytest.raises(TrustError) as info:
        call(*args, **kwargs)
    assert info.value.reason == reason, str(info.value)
    return info.value
