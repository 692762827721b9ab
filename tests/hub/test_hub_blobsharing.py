"""Artifacts shared between hub replicas through the store (hub/state/sharedblobs.py): a blob
published by one replica's blob directory is copied into another's, digest-checked, on every
store kind (etcd: a real one on loopback)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
from pathlib import Path

import pytest
from asynctesting import async_test
from hubtesting import MakeStore

from edgefleet.artifacts.storing import ArtifactStore, PinnedDigest
from edgefleet.errors import ArtifactError
from hub.state.sharedblobs import CHUNK_BYTES, SharedBlobs, chunk_key, manifest_key
from hub.state.store import Put


def _ingest(blobs: ArtifactStore, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    return blobs.ingest_stream(
        io.BytesIO(data), origin="test", name="m", version="1", verifiers=[PinnedDigest(digest)]
    )


@async_test
async def test_a_blob_published_by_one_replica_is_copied_into_another(
    make_store: MakeStore, tmp_path: Path
) -> None:
    store = await make_store()
    try:
        a = SharedBlobs(store, ArtifactStore(tmp_path / "a"))
        b = SharedBlobs(store, ArtifactStore(tmp_path / "b"))
        data = os.urandom(2 * CHUNK_BYTES + 12345)  # three chunks, the last one short
        digest = _ingest(a.blobs, data)
        assert await a.publish(digest)
        assert not await a.publish(digest)  # already there: nothing written again
        assert not b.blobs.has(digest)
        # many devices asking at once: one copy
        results = await asyncio.gather(*(b.ensure_local(digest) for _ in range(5)))
        assert results == [True] * 5
        assert b.blobs.path_for(digest).read_bytes() == data
        assert not await b.ensure_local("0" * 64)  # not in the store: not copied

        await a.forget(digest)
        assert await store.get(manifest_key(digest)) is None
        assert not (await store.range("/blobs/")).kvs
    finally:
        await store.close()


@async_test
async def test_bytes_that_do_not_match_their_digest_are_refused(make_store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = await make_store()
    try:
        a = SharedBlobs(store, ArtifactStore(tmp_path / "a"))
        b = SharedBlobs(store, ArtifactStore(tmp_path / "b"))
        digest = _ingest(a.blobs, b"model bytes " * 1000)
        await a.publish(digest)
        await store.txn((), [Put(chunk_key(digest, 0), b"forged bytes" + b" " * (12 * 1000 - 12))])
        with pytest.raises(ArtifactError) as refused:
            await b.ensure_local(digest)
        assert refused.value.reason == "DigestMismatch"
        assert not b.blobs.has(digest)
    finally:
        await store.close()


def test_an_artifact_larger_than_the_bound_is_refused_naming_the_setting(tmp_path: Path) -> None:
    from hub.state.store import MemoryStore

    shared = SharedBlobs(MemoryStore(), ArtifactStore(tmp_path), max_bytes=1024 * 1024)
    shared.check_size("m 1.0.0: model.onnx", 1024 * 1024)
    with pytest.raises(ArtifactError) as refused:
        shared.check_size("m 1.0.0: model.onnx", 1024 * 1024 + 1)
    assert refused.value.reason == "SharedArtifactTooLarge"
    assert "maxSharedArtifactBytes" in str(refused.value)
