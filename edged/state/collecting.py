"""Garbage collection of the artifact store: blobs nothing refers to any more are removed.

Kept: the artifacts of the accepted desired state and of every replica still running (an old
revision drains after the desired state moved on). While a source is in the middle of a sync
(``with collector.syncing():``) nothing is collected: it may have stored an artifact that it
has not handed over yet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.artifacts.storing import ArtifactStore


def artifacts_in_use(
    workloads: Mapping[WorkloadName, DesiredWorkload],
    *,
    held: Iterable[str],
    running: Iterable[str],
) -> set[str]:
    """What the collector keeps (pure): the artifacts of the desired ``workloads`` (their
    models and extras), those a source ``held`` (the hub's previous version: going back needs
    no download) and those of the replicas ``running``."""
    keep = {w.sha256 for w in workloads.values()}
    keep |= {sha for w in workloads.values() for sha in w.extras.values()}
    return keep | set(held) | set(running)


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
