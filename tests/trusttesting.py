"""Trust tests: real Ed25519 keys (``cryptography``), real envelopes on disk, a real
ArtifactStore and ArtifactGate in ``tmp_path``, real tiny ONNX models, and a real software TPM
(``swtpm``, started on free ports by the ``swtpm`` fixture; missing swtpm fails the test, it
does not skip). The clock is never read: every check gets ``now`` passed in.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from edged.trust.admitting import ArtifactGate, ArtifactRequest
from edgefleet.artifacts.storing import ArtifactStore
from edgefleet.demo import build_mlp
from edgefleet.trust.envelopes import ARTIFACT_TYPE, ROOT_TYPE, Envelope, sign_envelope
from edgefleet.trust.signing import (
    build_artifact_metadata,
    build_root,
    generate_key_pair,
    load_private_key,
    load_public_key_raw,
)

NOW = 1_900_000_000.0  # 2030-03-17, fixed
DAY = 86400.0


@dataclass
class Key:
    prefix: Path

    @property
    def private(self) -> Any:
        return load_private_key(self.prefix.with_name(self.prefix.name + ".key"))

    @property
    def key_file(self) -> Path:
        return self.prefix.with_name(self.prefix.name + ".key")

    @property
    def pub_file(self) -> Path:
        return self.prefix.with_name(self.prefix.name + ".pub")

    @property
    def raw(self) -> bytes:
        return load_public_key_raw(self.pub_file)


@pytest.fixture(scope="session")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Key]:
    d = tmp_path_factory.mktemp("keys")
    out = {}
    for name in ("root1", "root2", "newroot1", "newroot2", "pub1", "pub2", "pub3", "stranger"):
        generate_key_pair(d / name)
        out[name] = Key(d / name)
    return out


def make_root(
    keys: dict[str, Key],
    *,
    root: tuple[str, ...] = ("root1",),
    artifacts: tuple[str, ...] = ("pub1", "pub2", "pub3"),
    threshold: int = 1,
    root_threshold: int = 1,
    version: int = 1,
    expires: float = NOW + 365 * DAY,
    signers: tuple[str, ...] | None = None,
) -> Envelope:
    doc = build_root(
        root_keys=[keys[k].raw for k in root],
        artifact_keys=[keys[k].raw for k in artifacts],
        threshold=threshold,
        root_threshold=root_threshold,
        version=version,
        expires_in_s=expires - NOW,
        now=NOW,
    )
    return sign_envelope(ROOT_TYPE, doc, [keys[k].private for k in (signers or root)])


def make_metadata(
    keys: dict[str, Key],
    model: Path,
    *,
    name: str = "mlp",
    version: str = "1.0.0",
    signers: tuple[str, ...] = ("pub1",),
    metadata_version: int = 10,
    expires: float = NOW + 30 * DAY,
    extras: tuple[Path, ...] = (),
    doc_edit: dict[str, Any] | None = None,
) -> Envelope:
    doc = build_artifact_metadata(
        model,
        name=name,
        version=version,
        extras=extras,
        metadata_version=metadata_version,
        expires_in_s=expires - (NOW - DAY),
        now=NOW - DAY,
    )
    doc.update(doc_edit or {})
    return sign_envelope(ARTIFACT_TYPE, doc, [keys[k].private for k in signers])


@pytest.fixture(scope="session")
def model_bytes(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    d = tmp_path_factory.mktemp("models")
    return (
        build_mlp(d / "a.onnx", (4, 8, 2), seed=1).read_bytes(),
        build_mlp(d / "b.onnx", (4, 8, 2), seed=2).read_bytes(),
    )


class Device:
    """A data dir with a gate and a store; a folder where artifacts arrive."""

    def __init__(self, tmp: Path, keys: dict[str, Key], root: Envelope | None) -> None:
        self.tmp = tmp
        self.keys = keys
        self.incoming = tmp / "incoming"
        self.incoming.mkdir(exist_ok=True)
        self.root_file = tmp / "trust-root.json"
        if root is not None:
            self.root_file.write_bytes(root.to_bytes())
        self.results: list[tuple[str, str]] = []
        self.reopen()

    def reopen(self, *, allow_unsigned: bool = False) -> None:
        """A fresh gate and store on the same data dir, as after a restart."""
        self.store = ArtifactStore(self.tmp / "data" / "artifacts")
        self.gate = ArtifactGate(
            self.tmp / "data",
            root_file=self.root_file,
            allow_unsigned=allow_unsigned,
            on_result=lambda r, why: self.results.append((r, why)),
            clock=lambda: NOW,
        )

    def publish(self, data: bytes, *, file: str = "model.onnx", **meta: Any) -> ArtifactRequest:
        model = self.incoming / file
        model.write_bytes(data)
        env = make_metadata(self.keys, model, **meta)
        md = model.with_name(model.name + ".metadata.json")
        md.write_bytes(env.to_bytes())
        return ArtifactRequest(
            name=meta.get("name", "mlp"),
            version=meta.get("version", "1.0.0"),
            model_path=model,
            metadata_path=md,
        )

    def admit(self, req: ArtifactRequest, *, max_bytes: int = 1 << 30) -> str:
        now = self.gate.begin()
        return self.gate.admit(req, self.store, now=now, max_bytes=max_bytes)


@pytest.fixture
def device(tmp_path: Path, keys: dict[str, Key]) -> Iterator[Device]:
    yield Device(tmp_path, keys, make_root(keys))
