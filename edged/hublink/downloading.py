"""Artifact downloads from the hub into ``D/downloads/<sha256>.part``, resumable.

:meth:`Downloads.fetch` streams an artifact's bytes over the hub link (``fetch(sha256,
offset)``) into its ``.part`` file, resuming after the bytes already there (after a broken
stream or a restart of edged), never past the signed length (``LengthExceeded``), synced every
:data:`SYNC_EVERY_BYTES`. A full disk is ``InsufficientDisk``; a stream that ends early is a
TemporaryError (the next try resumes). What is downloaded is only bytes: the trust gate checks
length and digest again when it moves a ``.part`` into the store.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from edgefleet.artifacts.storing import is_disk_full
from edgefleet.errors import ArtifactError, TemporaryError
from edgefleet.logs import get_logger

log = get_logger(__name__)

SYNC_EVERY_BYTES = 8 << 20  # fsync a download this often: a power cut loses at most this

Fetch = Callable[[str, int], AsyncIterator[tuple[int, bytes]]]
"""``fetch(sha256, offset)`` yields ``(offset, data)`` chunks of an artifact from the hub."""

Progress = Callable[..., None]
"""``progress(bytes_on_disk, force=False)``: how far a download is."""


class Downloads:
    """The downloads folder: one ``<sha256>.part`` per artifact being fetched."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    def part(self, sha: str) -> Path:
        """Where ``sha``'s bytes are downloaded to."""
        return self._dir / f"{sha}.part"

    def resume_offset(self, sha: str, length: int) -> int:
        """How much of a download is already there; a part longer than signed is started
        over."""
        part = self.part(sha)
        try:
            have = part.stat().st_size
        except FileNotFoundError:
            return 0
        if have > length:
            part.unlink()
            return 0
        return have

    def discard(self, sha: str) -> None:
        """Remove ``sha``'s part (stored, or not going to be resumed)."""
        self.part(sha).unlink(missing_ok=True)

    def keep_only(self, keep: set[str]) -> None:
        """Remove the parts of every artifact not in ``keep``."""
        for p in self._dir.iterdir():
            if p.name.removesuffix(".part") not in keep:
                p.unlink(missing_ok=True)

    async def fetch(
        self, sha: str, length: int, fetch: Fetch, progress: Progress | None = None
    ) -> Path:
        """Fetch into ``sha``'s part, resuming after what it holds; never past ``length``
        bytes; ``progress(bytes_on_disk, force=...)`` told as it goes. The part."""
        part = self.part(sha)
        have = self.resume_offset(sha, length)
        if have == length:
            return part
        if have:
            log.info("artifact download resuming", sha256=sha, offset=have, length=length)
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            await _write_chunks(fd, sha, have, length, fetch, progress)
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            raise ArtifactError(
                "InsufficientDisk", f"artifact {sha[:12]}: the disk filled up: {exc}"
            ) from None
        finally:
            os.close(fd)
        return part


async def _write_chunks(
    fd: int, sha: str, have: int, length: int, fetch: Fetch, progress: Progress | None
) -> None:
    try:
        have = await _write_chunks_from(fd, sha, have, length, fetch, progress)
    finally:
        if progress is not None:
            progress(os.fstat(fd).st_size, force=True)  # where a resume would start
    if have < length:
        raise TemporaryError(f"artifact {sha[:12]}: stream ended at {have} of {length} bytes")
    log.info("artifact downloaded", sha256=sha, bytes=length)


async def _write_chunks_from(
    fd: int, sha: str, have: int, length: int, fetch: Fetch, progress: Progress | None
) -> int:
    unsynced = 0
    async for offset, data in fetch(sha, have):
        if offset != have:
            raise TemporaryError(f"artifact {sha[:12]}: chunk at {offset}, expected {have}")
        if have + len(data) > length:
            os.ftruncate(fd, have)
            raise ArtifactError(
                "LengthExceeded",
                f"artifact {sha[:12]}: the hub sent more than the signed length "
                f"({length} bytes); stopped at the limit",
            )
        os.write(fd, data)
        have += len(data)
        unsynced += len(data)
        if unsynced >= SYNC_EVERY_BYTES:
            os.fsync(fd)
            unsynced = 0
        if progress is not None:
            progress(have)
    os.fsync(fd)
    return have
