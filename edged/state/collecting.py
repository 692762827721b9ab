"""Garbage collection of the artifact store: blobs nothing refers to any more are removed.

Kept: the artifacts of the accepted desired state and of every replica still running (an old
revision drains after the desired state moved on). While a source is in the middle of a sync
(``with collector.syncing():``) nothing is collected: it may have stored an artifact that it
has not handed over yet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from edgefleet.artifacts.storing import ArtifactStore


class ArtifactCollector:
    def __init__(self, store: ArtifactStore, *, in_use: Callable[[], set[str]]) -> None:
        self._store = store
        self._in_use = in_use
        self._syncing = 0

    @contextmanager
    def syncing(self) -> Iterator[None]:
        """A source syncs inside this block: no collection meanwhile."""
        self._syncing += 1
        try:
            yield
        finally:
            self._syncing -= 1

    def collect(self) -> None:
        if self._syncing:
            return
        self._store.collect_garbage(self._in_use())
