"""Artifacts shared between hub replicas: their bytes in the etcd store, beside the records.

Each replica keeps artifacts in its own blob directory (``D/blobs``), and a push lands in the
leader's. So that a device connected to any replica can download any artifact, even after the
replica that took the push is gone, the leader also writes each new blob into the store:

    /blobs/<sha256>/<index, 6 digits>   the bytes, in chunks of CHUNK_BYTES (1 MiB)
    /blobs/<sha256>                     {"length", "chunks", "chunkBytes"}, written last

A replica asked for a blob it does not have (``FetchArtifact``) copies it out of the store
into its blob directory first (one copy per digest at a time, however many devices ask),
verifying the SHA-256 on the way in (:class:`~edgefleet.artifacts.storing.PinnedDigest`): a
store that hands back other bytes makes the download fail, never serves them.

Why the store and not a replica-to-replica fetch: etcd is already replicated and outlives
any one replica (a blob pushed through a replica that then died is still there), and no
replica has to know or reach the others' addresses. The price is etcd's size: blobs count
against its backend quota (2 GiB by default, 8 GiB at most advised), so a blob larger than
``[etcd] maxSharedArtifactBytes`` (default 256 MiB) is refused at push on a replicated hub,
saying so. A model deleted while no other model uses its bytes has them deleted from the
store too. Chunks of 1 MiB stay under etcd's default request size (1.5 MiB). A follower's
cache watch sees the chunks go by once, at push (and ignores them); ``hub backup`` copies
them with every other key.
"""

from __future__ import annotations

import asyncio
import tempfile
from typing import BinaryIO

from edgefleet.artifacts.storing import ArtifactStore, PinnedDigest
from edgefleet.errors import ArtifactError
from edgefleet.logs import get_logger
from hub.state import storekeys
from hub.state.store import Delete, Put, Store

log = get_logger(__name__)

BLOBS = "/blobs/"
CHUNK_BYTES = 1024 * 1024
CHUNKS_PER_TXN = 8
DEFAULT_MAX_SHARED_BYTES = 256 * 1024 * 1024


def manifest_key(sha256: str) -> str:
    return f"{BLOBS}{sha256}"


def chunk_key(sha256: str, index: int) -> str:
    return f"{BLOBS}{sha256}/{index:06d}"


class SharedBlobs:
    """The blobs of a replicated hub's artifacts, in its store (see the module doc)."""

    def __init__(
        self, store: Store, blobs: ArtifactStore, *, max_bytes: int = DEFAULT_MAX_SHARED_BYTES
    ) -> None:
        self.store = store
        self.blobs = blobs
        self.max_bytes = max_bytes
        self._copying: dict[str, asyncio.Future[None]] = {}

    def check_size(self, what: str, length: int) -> None:
        """Refuse (ArtifactError ``SharedArtifactTooLarge``) a blob too large to share."""
        if length > self.max_bytes:
            raise ArtifactError(
                "SharedArtifactTooLarge",
                f"{what} is {length} bytes; hub replicas share artifacts through etcd, which "
                f"takes at most {self.max_bytes} bytes per artifact ([etcd] "
                "maxSharedArtifactBytes in hub.toml): larger ones are not supported yet on "
                "replicas",
            )

    async def publish(self, sha256: str) -> bool:
        """Write the local blob ``sha256`` into the store unless it is there; whether written."""
        if await self.store.get(manifest_key(sha256)) is not None:
            return False
        path = self.blobs.path_for(sha256)
        length = path.stat().st_size
        self.check_size(f"artifact {sha256[:16]}", length)
        chunks = 0
        with path.open("rb") as f:
            while True:
                ops: list[Put | Delete] = []
                for _ in range(CHUNKS_PER_TXN):
                    data = f.read(CHUNK_BYTES)
                    if not data:
                        break
                    ops.append(Put(chunk_key(sha256, chunks), data))
                    chunks += 1
                if not ops:
                    break
                await self.store.txn((), ops)
        manifest = {"length": length, "chunks": chunks, "chunkBytes": CHUNK_BYTES}
        await self.store.put(manifest_key(sha256), storekeys.dumps(manifest))
        log.info("artifact shared", sha256=sha256, bytes=length, chunks=chunks)
        return True

    async def ensure_local(self, sha256: str) -> bool:
        """Copy blob ``sha256`` out of the store unless this replica has it; whether it has it
        now (False: the store has no such blob). ArtifactError when the copy's digest is not
        ``sha256``."""
        if self.blobs.has(sha256):
            return True
        running = self._copying.get(sha256)
        if running is None:
            running = asyncio.ensure_future(self._copy(sha256))
            self._copying[sha256] = running
            running.add_done_callback(lambda _: self._copying.pop(sha256, None))
        await asyncio.shield(running)
        return self.blobs.has(sha256)

    async def _copy(self, sha256: str) -> None:
        kv = await self.store.get(manifest_key(sha256))
        if kv is None:
            return
        manifest = storekeys.loads(kv.value)
        chunks, length = int(manifest["chunks"]), int(manifest["length"])
        staging = self.blobs.root / ".shared"
        staging.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=staging) as spool:
            for i in range(chunks):
                part = await self.store.get(chunk_key(sha256, i))
                if part is None:
                    raise ArtifactError(
                        "SharedArtifactIncomplete", f"artifact {sha256}: chunk {i} missing"
                    )
                spool.write(part.value)
            spool.seek(0)
            await asyncio.to_thread(self._ingest, spool, sha256, length)
        log.info("artifact copied from the store", sha256=sha256, bytes=length)

    def _ingest(self, spool: BinaryIO, sha256: str, length: int) -> None:
        self.blobs.ingest_stream(
            spool,
            origin=f"artifact {sha256[:16]} from the store",
            name="shared",
            version=sha256[:16],
            verifiers=[PinnedDigest(sha256)],
            max_bytes=length,
        )

    async def forget(self, sha256: str) -> None:
        """Delete blob ``sha256`` from the store (its model records are gone)."""
        kv = await self.store.get(manifest_key(sha256))
        if kv is None:
            return
        chunks = int(storekeys.loads(kv.value)["chunks"])
        await self.store.delete(manifest_key(sha256))  # first: never a manifest without chunks
        for first in range(0, chunks, 64):
            keys = range(first, min(chunks, first + 64))
            await self.store.txn((), [Delete(chunk_key(sha256, i)) for i in keys])
        log.info("shared artifact deleted", sha256=sha256)
