"""ArtifactStore: stage, verify, commit by sha256; nothing unverified or partial is ever kept."""

from __future__ import annotations

import hashlib
import io
import stat
from pathlib import Path
from typing import BinaryIO, cast

import pytest

from edgefleet.artifacts.storing import (
    ArtifactStore,
    LooksLikeOnnx,
    PinnedDigest,
    StagedArtifact,
    Verifier,
)
from edgefleet.errors import ArtifactError

ONNX_CHECKS: list[Verifier] = [LooksLikeOnnx()]


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def contents(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def ingest(store: ArtifactStore, source: Path, **kw: object) -> str:
    kw.setdefault("verifiers", ONNX_CHECKS)
    return store.ingest_file(source, name="tiny", version="1.0", **kw)  # type: ignore[arg-type]


def test_stored_by_sha256_and_read_only(tmp_path: Path, onnx_model: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    digest = ingest(store, onnx_model)
    assert digest == sha256_of(onnx_model)
    blob = store.path_for(digest)
    assert blob == tmp_path / "artifacts" / "sha256" / digest
    assert blob.read_bytes() == onnx_model.read_bytes()
    assert stat.S_IMODE(blob.stat().st_mode) == 0o444
    assert store.has(digest) and store.digests() == {digest}
    assert contents(tmp_path / "artifacts" / "staging") == []
    assert stat.S_IMODE((tmp_path / "artifacts").stat().st_mode) == 0o700


def test_same_bytes_twice_are_stored_once(tmp_path: Path, onnx_model: Path) -> None:
    store = ArtifactStore(tmp_path)
    copy = tmp_path / "copy.onnx"
    copy.write_bytes(onnx_model.read_bytes())
    assert ingest(store, onnx_model) == ingest(store, copy)
    assert len(store.digests()) == 1
    assert contents(tmp_path / "staging") == []


def test_verifiers_see_the_staged_bytes(tmp_path: Path, onnx_model: Path) -> None:
    seen: list[tuple[StagedArtifact, bytes]] = []

    class Recorder:
        def verify(self, staged: StagedArtifact) -> None:
            seen.append((staged, staged.path.read_bytes()))

    store = ArtifactStore(tmp_path)
    digest = ingest(store, onnx_model, verifiers=[Recorder()])
    ((staged, data),) = seen
    assert (staged.sha256, staged.length) == (digest, onnx_model.stat().st_size)
    assert (staged.origin, staged.name, staged.version) == (str(onnx_model), "tiny", "1.0")
    assert staged.path.parent == tmp_path / "staging"
    assert data == onnx_model.read_bytes()


def test_pinned_digest_accepts_the_pinned_bytes(tmp_path: Path, onnx_model: Path) -> None:
    store = ArtifactStore(tmp_path)
    digest = sha256_of(onnx_model)
    assert ingest(store, onnx_model, verifiers=[PinnedDigest(digest), LooksLikeOnnx()]) == digest
    assert ingest(store, onnx_model, verifiers=[PinnedDigest(None)]) == digest


def test_pinned_digest_mismatch_leaves_nothing(tmp_path: Path, onnx_model: Path) -> None:
    store = ArtifactStore(tmp_path)
    with pytest.raises(ArtifactError) as info:
        ingest(store, onnx_model, verifiers=[PinnedDigest("0" * 64), LooksLikeOnnx()])
    assert info.value.reason == "DigestMismatch"
    assert f"has sha256 {sha256_of(onnx_model)}, the manifest pins {'0' * 64}" in str(info.value)
    assert store.digests() == set()
    assert contents(tmp_path / "staging") == []


@pytest.mark.parametrize(
    "data", [b"hello, I am a text file\n", b"", b"\x08"], ids=["text", "empty", "one byte"]
)
def test_looks_like_onnx_refuses_other_files(tmp_path: Path, data: bytes) -> None:
    source = tmp_path / "model.onnx"
    source.write_bytes(data)
    store = ArtifactStore(tmp_path / "store")
    with pytest.raises(ArtifactError, match="is not an ONNX model file") as info:
        ingest(store, source)
    assert info.value.reason == "NotAnOnnxModel"
    assert store.digests() == set()
    assert contents(tmp_path / "store" / "staging") == []


def test_too_large_is_refused_at_the_limit(tmp_path: Path, onnx_model: Path) -> None:
    store = ArtifactStore(tmp_path)
    size = onnx_model.stat().st_size
    with pytest.raises(ArtifactError, match=f"larger than {size - 1} bytes") as info:
        ingest(store, onnx_model, max_bytes=size - 1)
    assert info.value.reason == "ArtifactTooLarge"
    assert store.digests() == set()
    assert contents(tmp_path / "staging") == []
    assert ingest(store, onnx_model, max_bytes=size) == sha256_of(onnx_model)


class Endless(io.RawIOBase):
    """A stream that never ends (a misbehaving download); counts the bytes read from it."""

    def __init__(self) -> None:
        self.given = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        n = 1 << 16 if size < 0 else size
        self.given += n
        return b"\x08" * n


def test_reading_stops_at_the_limit(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    stream = Endless()
    with pytest.raises(ArtifactError) as info:
        store.ingest_stream(
            cast(BinaryIO, stream),
            origin="endless",
            name="m",
            version="1",
            verifiers=[],
            max_bytes=3 << 20,
        )
    assert info.value.reason == "ArtifactTooLarge"
    assert stream.given <= (3 << 20) + (1 << 20)  # at most one chunk past the limit
    assert contents(tmp_path / "staging") == []


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda d: d / "absent.onnx", "ArtifactNotFound"),
        (lambda d: d, "ArtifactUnreadable"),  # a directory
    ],
    ids=["missing", "directory"],
)
def test_unreadable_source(tmp_path: Path, make: object, reason: str) -> None:
    store = ArtifactStore(tmp_path / "store")
    with pytest.raises(ArtifactError) as info:
        ingest(store, make(tmp_path))  # type: ignore[operator]
    assert info.value.reason == reason


def test_collect_garbage_keeps_referenced_blobs(tmp_path: Path, onnx_model: Path) -> None:
    store = ArtifactStore(tmp_path)
    other = tmp_path / "other.onnx"
    other.write_bytes(onnx_model.read_bytes() + b"\x00")
    keep, drop = ingest(store, onnx_model), ingest(store, other)
    assert store.collect_garbage({keep}) == [drop]
    assert store.digests() == {keep}
    assert store.path_for(keep).read_bytes() == onnx_model.read_bytes()
    assert store.collect_garbage({keep}) == []


def test_stale_staging_files_are_removed_at_start(tmp_path: Path, onnx_model: Path) -> None:
    digest = ingest(ArtifactStore(tmp_path), onnx_model)
    (tmp_path / "staging" / "1234-abcdef").write_bytes(b"half a model, from before a crash")
    store = ArtifactStore(tmp_path)
    assert contents(tmp_path / "staging") == []
    assert store.digests() == {digest}


def flip_a_bit(blob: Path, offset: int = 40) -> None:
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[offset] ^= 0x01
    blob.write_bytes(bytes(data))
    blob.chmod(0o444)


def test_a_rotten_blob_is_quarantined_and_an_intact_one_is_not(
    tmp_path: Path, onnx_model: Path
) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    digest = ingest(store, onnx_model)
    assert store.quarantine_if_rotten(digest, now=1000.0) is None  # intact: stays
    assert store.has(digest)
    flip_a_bit(store.path_for(digest))
    moved = store.quarantine_if_rotten(digest, now=1000.0)
    assert moved == tmp_path / "artifacts" / "quarantine" / f"{digest}.1000"
    assert moved.is_file() and not store.has(digest)
    assert store.quarantined() == {digest} and store.digests() == set()
    assert store.quarantine_if_rotten(digest, now=1001.0) is None  # gone: nothing to do
    # fetched again: the store takes the good bytes back
    assert ingest(store, onnx_model) == digest and store.has(digest)


def test_quarantine_keeps_only_the_newest_copies(tmp_path: Path, onnx_model: Path) -> None:
    from edgefleet.artifacts.storing import MAX_QUARANTINED

    store = ArtifactStore(tmp_path / "artifacts")
    digest = ingest(store, onnx_model)
    for i in range(MAX_QUARANTINED + 2):
        flip_a_bit(store.path_for(digest), offset=40 + i)
        assert store.quarantine_if_rotten(digest, now=1000.0 + i) is not None
        assert ingest(store, onnx_model) == digest
    assert len(contents(tmp_path / "artifacts" / "quarantine")) == MAX_QUARANTINED


SHORTFALLS = {
    "fits with room": (dict(free=100, download=30, copy=30, reserve=10), 0),
    "fits exactly": (dict(free=70, download=30, copy=30, reserve=10), 0),
    "the copy does not fit": (dict(free=60, download=30, copy=30, reserve=10), 10),
    "resumed: only the rest is downloaded": (dict(free=45, download=5, copy=30, reserve=10), 0),
    "nothing free": (dict(free=0, download=0, copy=30, reserve=10), 40),
}


@pytest.mark.parametrize(("sizes", "short"), SHORTFALLS.values(), ids=SHORTFALLS.keys())
def test_disk_shortfall(sizes: dict[str, int], short: int) -> None:
    from edgefleet.artifacts.storing import disk_shortfall

    assert disk_shortfall(**sizes) == short
