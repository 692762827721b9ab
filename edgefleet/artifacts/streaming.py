"""Sending a stored artifact in chunks, from an offset: the one streamer behind the hub's
``FetchArtifact`` (to devices) and ``FetchFederatedArtifact`` (to regional hubs). A fetch that
broke off resumes at the offset the receiver already has.

:func:`read_chunks` is an async generator of ``(offset, bytes)``; the caller wraps each pair in
its own message. It raises before the first chunk when the file is absent
(FileNotFoundError) or the offset is past its end (:class:`OffsetPastEnd`), so the servicer can
answer with a status instead of a short stream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from edgefleet.errors import ArtifactError

CHUNK = 256 * 1024
"""The bytes in one chunk: a few per gRPC message limit, and many per artifact."""


class OffsetPastEnd(ArtifactError):
    """The receiver asked for bytes from beyond the artifact's end; ``size`` is its length."""

    def __init__(self, offset: int, size: int) -> None:
        super().__init__("OffsetPastEnd", f"offset {offset} is past the end ({size} bytes)")
        self.offset = offset
        self.size = size


async def read_chunks(
    path: Path, offset: int = 0, *, chunk: int = CHUNK
) -> AsyncIterator[tuple[int, bytes]]:
    """The bytes of ``path`` from ``offset`` to its end, as ``(offset, data)`` of at most
    ``chunk`` bytes each; none when ``offset`` is the end. The file is closed when the stream
    ends or its consumer stops early."""
    if offset < 0:
        raise ValueError(f"offset must be 0 or more, got {offset}")
    if chunk < 1:
        raise ValueError(f"chunk must be 1 byte or more, got {chunk}")
    # A local file in the page cache: reads of 256 KiB do not stall the loop noticeably.
    with open(path, "rb") as f:  # noqa: ASYNC230 - see above
        size = f.seek(0, 2)
        if offset > size:
            raise OffsetPastEnd(offset, size)
        at = f.seek(offset)
        while data := f.read(chunk):
            yield at, data
            at += len(data)
