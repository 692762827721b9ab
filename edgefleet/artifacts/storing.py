"""The content-addressed artifact store: ``<data-dir>/artifacts/sha256/<hex>``.

Models are loaded only from here, never from where they came from. Getting an artifact in is
one pipeline, :meth:`ArtifactStore.ingest`:

1. *stage*: copy the bytes into ``staging/`` while hashing, stopping at the size limit
   (a signed length once signatures exist);
2. *verify*: every :class:`Verifier` in the chain sees the staged file, its digest and length,
   and may refuse it (``ArtifactError`` with a reason). Signature checks (the trust issue) are
   one more verifier here, so nothing unverified can ever reach the store;
3. *commit*: fsync, make read-only, rename into place, fsync the directory.

A crash at any point leaves either no blob or a complete one; stale staging files are
removed at start. Workers check the digest again when they read a blob; a blob that no longer
matches its digest (rot on disk) is moved to ``quarantine/``
(:meth:`ArtifactStore.quarantine_if_rotten`, the newest ``MAX_QUARANTINED`` kept as
evidence), so that the artifact is missing and its source fetches it again.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from edgefleet.errors import ArtifactError
from edgefleet.logs import get_logger
from edgefleet.persisting import fsync_dir

log = get_logger(__name__)

CHUNK = 1 << 20
DEFAULT_MAX_BYTES = 4 << 30
MAX_QUARANTINED = 3
# Left free by every ingest and download: the device's state files, logs and the hub link's
# writes must keep working when a model does not fit.
DISK_RESERVE_BYTES = 16 << 20


def disk_shortfall(*, free: int, download: int, copy: int, reserve: int) -> int:
    """How many bytes are missing to write ``download`` new bytes and then stage a ``copy``
    of ``copy`` bytes, leaving ``reserve`` free (0: it fits). Pure."""
    return max(0, download + copy + reserve - free)


def is_disk_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True, slots=True)
class StagedArtifact:
    """Bytes staged for verification; ``path`` is private to the store until committed."""

    path: Path
    sha256: str
    length: int
    origin: str  # where the bytes came from, for messages
    name: str  # the model name the artifact is for
    version: str


class Verifier(Protocol):
    def verify(self, staged: StagedArtifact) -> None:
        """Raise ArtifactError to refuse the artifact."""


class PinnedDigest:
    """Refuses an artifact whose digest is not the one the manifest pinned (if it pinned one)."""

    def __init__(self, sha256: str | None) -> None:
        self._sha256 = sha256

    def verify(self, staged: StagedArtifact) -> None:
        if self._sha256 is not None and staged.sha256 != self._sha256:
            raise ArtifactError(
                "DigestMismatch",
                f"{staged.origin} has sha256 {staged.sha256}, the manifest pins {self._sha256}",
            )


class LooksLikeOnnx:
    """A cheap sniff: an ONNX ModelProto starts with field 1 (ir_version, a varint)."""

    def verify(self, staged: StagedArtifact) -> None:
        with open(staged.path, "rb") as f:
            head = f.read(2)
        if len(head) < 2 or head[0] != 0x08:
            raise ArtifactError("NotAnOnnxModel", f"{staged.origin} is not an ONNX model file")


QUEUED = 4


class _Writer:
    """Writes chunks to a file in a thread; ``finish`` waits for all and re-raises its error."""

    def __init__(self, out: BinaryIO) -> None:
        import queue
        import threading

        self._out = out
        self._queue: queue.Queue[bytes | None] = queue.Queue(QUEUED)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="artifact-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (chunk := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._out.write(chunk)
                except BaseException as exc:  # handed to the reading thread
                    self._error = exc

    def put(self, chunk: bytes) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put(chunk)

    def finish(self) -> None:
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        self._out.flush()

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():  # an error while reading: stop the writer, then go on
            self._queue.put(None)
            self._thread.join()


def _quarantined_at(path: Path) -> int:
    stamp = path.name.rpartition(".")[2]
    return int(stamp) if stamp.isdigit() else 0


class ArtifactStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._blobs = root / "sha256"
        self._staging = root / "staging"
        self._quarantine = root / "quarantine"
        for d in (root, self._blobs, self._staging, self._quarantine):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        for stale in self._staging.iterdir():
            stale.unlink(missing_ok=True)

    def path_for(self, sha256: str) -> Path:
        return self._blobs / sha256

    def has(self, sha256: str) -> bool:
        return self.path_for(sha256).is_file()

    def digests(self) -> set[str]:
        return {p.name for p in self._blobs.iterdir() if not p.name.startswith(".")}

    def ingest_file(
        self,
        source: Path,
        *,
        name: str,
        version: str,
        verifiers: list[Verifier],
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> str:
        """Stage, verify and commit a local file; return its sha256."""
        try:
            f = open(source, "rb")  # noqa: SIM115 - closed in finally below
        except FileNotFoundError:
            raise ArtifactError("ArtifactNotFound", f"model file {source} does not exist") from None
        except OSError as exc:
            raise ArtifactError(
                "ArtifactUnreadable", f"cannot read {source}: {exc.strerror}"
            ) from None
        try:
            size = os.fstat(f.fileno()).st_size
            # the staged copy must fit, with the reserve left free (a file larger than
            # max_bytes is refused while read: no need for the space)
            self.check_space(what=str(source), download=0, copy=min(size, max_bytes + 1))
            return self.ingest_stream(
                f,
                origin=str(source),
                name=name,
                version=version,
                verifiers=verifiers,
                max_bytes=max_bytes,
            )
        finally:
            f.close()

    def ingest_stream(
        self,
        stream: BinaryIO,
        *,
        origin: str,
        name: str,
        version: str,
        verifiers: list[Verifier],
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> str:
        tmp = self._staging / f"{os.getpid()}-{os.urandom(6).hex()}"
        try:
            return self._stage_verify_commit(
                stream, tmp, origin, name, version, verifiers, max_bytes
            )
        except OSError as exc:
            if is_disk_full(exc):
                raise ArtifactError(
                    "InsufficientDisk", f"{origin}: the disk filled up while storing it: {exc}"
                ) from None
            raise
        finally:
            tmp.unlink(missing_ok=True)

    def _stage_verify_commit(
        self,
        stream: BinaryIO,
        tmp: Path,
        origin: str,
        name: str,
        version: str,
        verifiers: list[Verifier],
        max_bytes: int,
    ) -> str:
        digest = hashlib.sha256()
        length = 0
        with open(tmp, "wb") as out, _Writer(out) as writer:
            # Hash here while a thread writes the previous chunks: hashlib and file
            # writes both release the GIL, so a large artifact costs about the slower
            # of the two instead of their sum. At most QUEUED chunks are in memory.
            while True:
                chunk = stream.read(CHUNK)
                if not chunk:
                    break
                length += len(chunk)
                if length > max_bytes:
                    raise ArtifactError(
                        "ArtifactTooLarge", f"{origin} is larger than {max_bytes} bytes"
                    )
                digest.update(chunk)
                writer.put(chunk)
            writer.finish()
            os.fsync(out.fileno())
        staged = StagedArtifact(tmp, digest.hexdigest(), length, origin, name, version)
        for verifier in verifiers:
            verifier.verify(staged)
        final = self.path_for(staged.sha256)
        if final.is_file():
            tmp.unlink()
        else:
            os.chmod(tmp, 0o444)
            os.replace(tmp, final)
            fsync_dir(self._blobs)
            log.info("artifact stored", sha256=staged.sha256, bytes=length, origin=origin)
        return staged.sha256

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.root).free

    def check_space(self, *, what: str, download: int, copy: int) -> None:
        """Raise ``ArtifactError("InsufficientDisk")`` naming the sizes when ``download`` new
        bytes plus the store's staged ``copy`` do not fit next to the reserve."""
        free = self.free_bytes()
        short = disk_shortfall(free=free, download=download, copy=copy, reserve=DISK_RESERVE_BYTES)
        if short:
            raise ArtifactError(
                "InsufficientDisk",
                f"{what}: needs {download + copy} bytes on the device's disk "
                f"({download} to download, {copy} for the store's copy) and "
                f"{DISK_RESERVE_BYTES} kept free; {free} bytes are free "
                f"({short} short)",
            )

    def digest_of(self, sha256: str) -> str | None:
        """The sha256 of the blob stored as ``sha256`` as it is on disk now (None: absent)."""
        digest = hashlib.sha256()
        try:
            with open(self.path_for(sha256), "rb") as f:
                while chunk := f.read(CHUNK):
                    digest.update(chunk)
        except FileNotFoundError:
            return None
        return digest.hexdigest()

    def quarantine_if_rotten(self, sha256: str, *, now: float) -> Path | None:
        """Move the blob ``sha256`` to ``quarantine/`` if its bytes no longer hash to that
        name; where it went, or None (absent or intact). Blocking: hashes the whole file."""
        found = self.digest_of(sha256)
        if found is None or found == sha256:
            return None
        target = self._quarantine / f"{sha256}.{int(now)}"
        os.replace(self.path_for(sha256), target)
        fsync_dir(self._blobs)
        log.error("artifact quarantined", sha256=sha256, found=found, path=str(target))
        kept = sorted(self._quarantine.iterdir(), key=_quarantined_at)
        for old in kept[:-MAX_QUARANTINED]:
            old.unlink(missing_ok=True)
        return target

    def quarantined(self) -> set[str]:
        """The digests with a quarantined copy (the names they were stored under)."""
        return {p.name.split(".", 1)[0] for p in self._quarantine.iterdir()}

    def collect_garbage(self, keep: set[str]) -> list[str]:
        removed = []
        for digest in self.digests() - keep:
            self.path_for(digest).unlink(missing_ok=True)
            removed.append(digest)
        if removed:
            log.info("artifacts removed", count=len(removed))
        return removed
