"""TUF metadata for hub replica tests: an artifact's targets entry and a fleet root of real keys."""

from __future__ import annotations

import time

from trusttesting import Key, make_root

from edgefleet.trust.documents import ArtifactMetadata, FileInfo, Root, parse_root
from edgefleet.trust.envelopes import ROOT_TYPE, decode_payload

DAY = 86400.0


def artifact(version: str, data: bytes) -> ArtifactMetadata:
    import hashlib

    now = time.time()
    return ArtifactMetadata(
        name="vision-det", version=version, precision=None, metadata_version=1, created=now,
        expires=now + 30 * DAY,
        files={"model.onnx": FileInfo(hashlib.sha256(data).hexdigest(), len(data), "model")},
    )  # fmt: skip


def fleet_root(keys: dict[str, Key]) -> Root:
    return parse_root(
        decode_payload(
            make_root(keys, expires=time.time() + 365 * DAY), expected_type=ROOT_TYPE, what="r"
        )
    )
