"""Compaction on a schedule: the store keeps a bounded history (as kube-apiserver compacts
etcd every few minutes).

Every put adds a row to the store's history (what ``watch`` replays); without compaction it
grows for ever — with every device's status writes, quickly. The :class:`Compactor` notes the
store's revision every ``period`` and compacts to the newest revision noted at least
``retention`` ago, so that a watcher can always resume from a revision it saw within the last
``retention``; one that asks for an older revision gets ``Compacted`` (AdminService: OUT_OF_RANGE,
"read the current state and watch from its revision") and relists.

**In chunks**: a store that has not been compacted for a long time (a big history, or a hub
restarted after a long stop) is compacted from the last point up to the target a chunk of
revisions at a time, each chunk its own store operation, so the store's one writer is held for
a short while at a time and device writes and reads queued meanwhile go in between chunks. The
chunk size adapts (:func:`next_chunk`, pure) so that a chunk takes about ``CHUNK_GOAL_S``.

**Across restarts**: the noted marks are kept in the store (:data:`MARKS_KEY`, the newest
:data:`MAX_MARKS`) and read back when the component starts, so a hub restarted more often
than ``retention`` (a crash loop, or the soak harness's kill -9 every few minutes) still
compacts: with the marks in memory only, each start began a new ``retention`` wait, and the
root of the soak's 1-hour run (seed 62, killed about every 10 minutes) compacted nothing in
31 minutes, its history 22 MB of a 64 MiB disk and growing. A record that cannot be read is
logged and left out (the marks start again).

The decisions (:func:`compaction_target`, :func:`next_chunk`, :func:`marks_of`) are pure and
table-tested; the component does the I/O.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from edgefleet.errors import StoreError
from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop
from hub.state.store.protocol import Store

log = get_logger(__name__)

REVISION_PROBE = "/hub/identity"
"""A single key: reading it returns the store's revision cheaply."""
MARKS_KEY = "/hub/compaction"
"""The noted marks, ``{"marks": [[time, revision], ...]}``, kept across restarts."""
MAX_MARKS = 64
CHUNK_GOAL_S = 0.05
"""How long one compaction chunk should hold the store: a device write waits at most this."""
FIRST_CHUNK = 1024
MIN_CHUNK = 16
MAX_CHUNK = 1 << 20


def compaction_target(marks: Sequence[tuple[float, int]], now: float, retention: float) -> int:
    """The newest revision noted at least ``retention`` seconds before ``now`` (0: none yet).

    ``marks`` are (wall-clock time, revision) pairs in the order they were noted (pure)."""
    target = 0
    for at, revision in marks:
        if now - at >= retention:
            target = max(target, revision)
    return target


def marks_of(value: bytes) -> list[tuple[float, int]]:
    """The marks a :data:`MARKS_KEY` record holds, oldest first, at most :data:`MAX_MARKS`
    (pure). Raises ValueError naming what is wrong."""
    try:
        doc: Any = json.loads(value)
        raw = doc["marks"]
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"{MARKS_KEY}: not a marks record: {exc!r}") from None
    if not isinstance(raw, list):
        raise ValueError(f"{MARKS_KEY}: marks: must be a list")
    marks: list[tuple[float, int]] = []
    for i, item in enumerate(raw[-MAX_MARKS:]):
        ok = isinstance(item, list) and len(item) == 2
        at, revision = (item[0], item[1]) if ok else (None, None)
        if (
            not ok
            or isinstance(at, bool)
            or not isinstance(at, int | float)
            or not math.isfinite(at)
            or isinstance(revision, bool)
            or not isinstance(revision, int)
            or revision < 0
        ):
            raise ValueError(f"{MARKS_KEY}: marks[{i}]: must be [time, revision], got {item!r}")
        marks.append((float(at), revision))
    return marks


def next_chunk(size: int, took: float, goal: float = CHUNK_GOAL_S) -> int:
    """The number of revisions to compact next, after ``size`` took ``took`` seconds (pure).

    Under half the goal: twice as many; over the goal: scaled down to fit it (at least
    halved); otherwise the same. Within ``MIN_CHUNK``..``MAX_CHUNK``."""
    if took < goal / 2:
        size *= 2
    elif took > goal:
        size = min(size // 2, int(size * goal / took))
    return max(MIN_CHUNK, min(MAX_CHUNK, size))


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
        first_chunk: int = FIRST_CHUNK,
    ) -> None:
        self.store = store
        self.period = period
        self.retention = retention
        self.clock = clock
        self.marks: deque[tuple[float, int]] = deque(maxlen=MAX_MARKS)
        self._loaded = False
        self.compacted = 0
        self.chunk = first_chunk
        self.chunks = 0
        """Store operations the last compaction took."""

    async def step(self) -> int:
        """Note the revision and compact if a noted one is old enough; the compaction point."""
        if not self._loaded:
            await self._load()
        now = self.clock()
        revision = (await self.store.range(REVISION_PROBE)).revision
        self.marks.append((now, revision))
        target = compaction_target(self.marks, now, self.retention)
        while self.marks and self.marks[0][1] < target:
            self.marks.popleft()
        if target > self.compacted:
            started = time.monotonic()
            longest = await self._compact_to(target)
            log.info(
                "store compacted",
                revision=target,
                chunks=self.chunks,
                took_ms=round((time.monotonic() - started) * 1000, 1),
                longest_chunk_ms=round(longest * 1000, 1),
            )
        # after compacting (which frees room: a full disk must not keep it from happening)
        doc = {"marks": [[at, rev] for at, rev in self.marks]}
        try:
            await self.store.put(MARKS_KEY, json.dumps(doc).encode())
        except StoreError as exc:  # noted again next time; this start's marks stay in memory
            log.warning("compaction marks not kept", error=str(exc))
        return self.compacted

    async def _load(self) -> None:
        """The marks an earlier start of this hub (or another replica) noted."""
        kv = await self.store.get(MARKS_KEY)
        self._loaded = True
        if kv is None:
            return
        try:
            self.marks.extend(marks_of(kv.value))
        except ValueError as exc:
            log.warning("compaction marks left out", error=str(exc))

    async def _compact_to(self, target: int) -> float:
        """Compact up to ``target`` a chunk at a time; the longest time one chunk took.

        Each chunk is one store operation; ``self.compacted`` follows, so a failure midway
        keeps what was done and the next step goes on from there."""
        self.chunks = 0
        longest = 0.0
        while self.compacted < target:
            upto = min(target, self.compacted + self.chunk)
            started = time.monotonic()
            await self.store.compact(upto)
            took = time.monotonic() - started
            longest = max(longest, took)
            self.compacted = upto
            self.chunks += 1
            self.chunk = next_chunk(self.chunk, took)
            await asyncio.sleep(0)  # let what waits for the loop (and the store) go first
        return longest

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.step()
            if await wait_for_stop(stop, self.period):
                return
