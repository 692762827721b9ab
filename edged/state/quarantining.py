"""Blobs of the store whose bytes no longer match their digest (a worker refused one).

:meth:`BlobQuarantine.check` hashes the blob off the event loop and moves it to the store's
``quarantine/`` when it is rotten; the workload then looks again: its next plan finds the
artifact missing, says so in a condition and asks its source for it again. Replicas already
running keep serving: their model is in memory. :meth:`BlobQuarantine.holds` is what the
workloads' reconciler asks (an artifact that was quarantined).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from edged.workloads import WorkloadName
from edgefleet.artifacts.storing import ArtifactStore
from edgefleet.logs import get_logger

log = get_logger(__name__)


class BlobQuarantine:
    def __init__(
        self,
        store: ArtifactStore,
        *,
        enqueue: Callable[[WorkloadName], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``enqueue(workload)``: the workload looks again (after each check)."""
        self._store = store
        self._enqueue = enqueue
        self._clock = clock

    async def check(self, workload: WorkloadName, sha256: str) -> None:
        """Quarantine ``sha256`` if its bytes changed (hashing in a thread), then have
        ``workload`` look again."""
        moved = await asyncio.to_thread(self._store.quarantine_if_rotten, sha256, now=self._clock())
        if moved is not None:
            log.error("rotten artifact quarantined", workload=workload, sha256=sha256)
        self._enqueue(workload)

    def holds(self, sha256: str) -> bool:
        """Whether a copy of ``sha256`` was quarantined."""
        return sha256 in self._store.quarantined()
