"""An artifact's bytes served to a caller that may have them (FetchArtifact to a device,
FetchFederatedArtifact to a region): copied from the store first on a hub replica that did not
receive the push, then streamed from an offset in chunks; what cannot be served ends the call
with its status."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from edgefleet.artifacts.storing import ArtifactStore
from edgefleet.artifacts.streaming import OffsetPastEnd, read_chunks
from edgefleet.errors import ArtifactError
from edgefleet.logs import get_logger
from hub.state.sharedblobs import SharedBlobs

log = get_logger(__name__)


async def blob_chunks(
    blobs: ArtifactStore,
    shared: SharedBlobs | None,
    sha256: str,
    offset: int,
    context: Any,
    *,
    end: str = "the end",
) -> AsyncIterator[tuple[int, bytes]]:
    """``(offset, bytes)`` of ``sha256`` from ``offset`` on. The caller checked that it may have
    them. Aborts the call: UNAVAILABLE (the replicas' copy failed, or at replicas a blob this
    one lacks: another may hold it), NOT_FOUND, OUT_OF_RANGE
    (``end`` names the end in the message)."""
    if shared is not None and not blobs.has(sha256):
        try:  # replicas: pushed through another one; its bytes are in the store
            await shared.ensure_local(sha256)
        except ArtifactError as exc:
            log.error("shared artifact refused", sha256=sha256, error=str(exc))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"artifact copy failed: {exc}")
    try:
        async for chunk in read_chunks(blobs.path_for(sha256), offset):
            yield chunk
    except FileNotFoundError:
        if shared is not None:  # replicas: another one may hold it (a region's root artifact
            # too large to share): the device tries again, maybe there
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"artifact {sha256} is not stored on this replica"
            )
        await context.abort(grpc.StatusCode.NOT_FOUND, f"artifact {sha256} is not stored")
    except OffsetPastEnd as exc:
        await context.abort(
            grpc.StatusCode.OUT_OF_RANGE, f"offset {offset} is past {end} ({exc.size} bytes)"
        )
