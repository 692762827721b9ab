"""Artifacts shared between hub replicas through the store (hub/state/sharedblobs.py): a blob
published by one replica's blob directory is copied into another's, digest-checked, on every
store kind (etcd: a real one on loopback)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from asynctesting import async_test
from hubtesting import MakeStore

from edgefleet.artifacts.storing import ArtifactStore, PinnedDigest
from edgefleet.errors import ArtifactError
from edgefleet.v1 import federation_pb2
from hub.api.blobserving import blob_chunks
from hub.controllers.parentlink.link import ParentLink
from hub.controllers.parentlink.regionenrollment import ParentFiles
from hub.state.cache import Cache
from hub.state.heldtuf import HeldTuf
from hub.state.sharedblobs import CHUNK_BYTES, SharedBlobs, chunk_key, manifest_key
from hub.state.store import MemoryStore, Put
from hub.state.writer import DeviceWriter


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


class _Root:
    """A root that streams ``data`` for FetchFederatedArtifact."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def FetchFederatedArtifact(self, request: Any) -> AsyncIterator[Any]:
        async def gen() -> AsyncIterator[Any]:
            for i in range(0, len(self.data), 65536):
                yield federation_pb2.FederatedChunk(data=self.data[i : i + 65536])

        return gen()


def _link(tmp_path: Path, store: MemoryStore, shared: SharedBlobs) -> tuple[ParentLink, Cache]:
    files = ParentFiles("127.0.0.1:1", "eu", "root", b"", b"", b"")
    cache = Cache()
    link = ParentLink(
        files,
        data_dir=tmp_path,
        store=store,
        cache=cache,
        writer=DeviceWriter(store, cache),
        blobs=shared.blobs,
        tuf=HeldTuf(cache),
        region="eu",
        shared_blobs=shared,
    )
    return link, cache


@async_test
async def test_a_regions_root_artifact_is_shared_with_its_other_replicas(tmp_path: Path) -> None:
    """The root's model that a region's leader fetched reaches the store the replicas share,
    so a device connected to a follower downloads it there (it was answered "not stored",
    which edged takes as final, and never ran the deployment). One too large to share stays
    on the leader alone, said in a Warning event; a replica without it answers UNAVAILABLE
    (try again, maybe elsewhere), never NOT_FOUND."""
    store = MemoryStore()
    leader = SharedBlobs(store, ArtifactStore(tmp_path / "leader"))
    follower = SharedBlobs(store, ArtifactStore(tmp_path / "follower"))
    link, cache = _link(tmp_path, store, leader)
    data = os.urandom(CHUNK_BYTES + 777)
    digest = hashlib.sha256(data).hexdigest()
    await link._fetch(_Root(data), digest, len(data), "det", "1.0.0")
    assert leader.blobs.has(digest) and await store.get(manifest_key(digest)) is not None
    assert await follower.ensure_local(digest)
    assert follower.blobs.path_for(digest).read_bytes() == data
    # fetched before the region had replicas (or before this fix): shared at the next slice
    await leader.forget(digest)
    await link._fetch(_Root(b""), digest, len(data), "det", "1.0.0")
    assert await store.get(manifest_key(digest)) is not None

    big = os.urandom(5000)
    big_digest = hashlib.sha256(big).hexdigest()
    leader.max_bytes = 4096
    await link._fetch(_Root(big), big_digest, len(big), "det", "2.0.0")
    assert leader.blobs.has(big_digest) and await store.get(manifest_key(big_digest)) is None
    (warning,) = [e for e in cache.events if e.get("reason") == "SharedArtifactTooLarge"]
    assert "det 2.0.0 is served by this replica only" in str(warning["message"])

    class Aborted(Exception):
        pass

    class Context:
        code: Any = None

        async def abort(self, code: Any, details: str) -> None:
            self.code = code
            raise Aborted(details)

    context = Context()
    with pytest.raises(Aborted, match="not stored on this replica"):
        async for _ in blob_chunks(follower.blobs, follower, big_digest, 0, context):
            pass
    assert context.code is grpc.StatusCode.UNAVAILABLE
    alone = Context()
    with pytest.raises(Aborted, match="is not stored"):
        async for _ in blob_chunks(follower.blobs, None, big_digest, 0, alone):
            pass
    assert alone.code is grpc.StatusCode.NOT_FOUND
