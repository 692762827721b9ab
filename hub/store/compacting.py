"""Compaction on a schedule: the store keeps a bounded history (as kube-apiserver compacts
etcd every few minutes).

Every put adds a row to the store's history (what ``watch`` replays); without compaction it
grows for ever — with every device's status writes, quickly. The :class:`Compactor` notes the
store's revision every ``period`` and compacts to the newest revision noted at least
``retention`` ago, so that a watcher can always resume from a revision it saw within the last
``retention``; one that asks for an older revision gets ``Compacted`` (AdminService: OUT_OF_RANGE,
"read the current state and watch from its revision") and relists.

The decision (:func:`compaction_target`) is pure and table-tested; the component does the I/O.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence

from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop
from hub.store.protocol import Store

log = get_logger(__name__)

REVISION_PROBE = "/hub/identity"
"""A single key: reading it returns the store's revision cheaply."""


def compaction_target(marks: Sequence[tuple[float, int]], now: float, retention: float) -> int:
    """The newest revision noted at least ``retention`` seconds before ``now`` (0: none yet).

    ``marks`` are (wall-clock time, revision) pairs in the order they were noted (pure)."""
    target = 0
    for at, revision in marks:
        if now - at >= retention:
            target = max(target, revision)
    return target


class Compactor:
    """The ``compactor`` component (``name`` + ``async run(stop)``)."""

    name = "compactor"

    def __init__(
        self,
        store: Store,
        *,
        period: float,
        retention: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.period = period
        self.retention = retention
        self.clock = clock
        self.marks: deque[tuple[float, int]] = deque()
        self.compacted = 0

    async def step(self) -> int:
        """Note the revision and compact if a noted one is old enough; the compaction point."""
        now = self.clock()
        revision = (await self.store.range(REVISION_PROBE)).revision
        self.marks.append((now, revision))
        target = compaction_target(self.marks, now, self.retention)
        while self.marks and self.marks[0][1] < target:
            self.marks.popleft()
        if target > self.compacted:
            started = time.monotonic()
            await self.store.compact(target)
            log.info(
                "store compacted",
                revision=target,
                took_ms=round((time.monotonic() - started) * 1000, 1),
            )
            self.compacted = target
        return self.compacted

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.step()
            if await wait_for_stop(stop, self.period):
                return
