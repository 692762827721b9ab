"""Scheduled compaction: the pure decision as a table, and the component on a real SQLite file
(the clock is the only fake: a ``FakeClock`` the test moves), with a watch that asks for a
compacted revision getting ``Compacted`` — and over AdminService, OUT_OF_RANGE saying to relist."""

from __future__ import annotations

import asyncio
import re
import sqlite3
from pathlib import Path
from typing import Any

import grpc
import pytest
from asynctesting import async_test
from hubserving import AdminHub, make_hub_dir
from hubtesting import FakeClock

from edgefleet.errors import Compacted
from edgefleet.v1 import admin_pb2
from hub.state.store import SqliteStore
from hub.state.store.compacting import (
    MARKS_KEY,
    MAX_CHUNK,
    MIN_CHUNK,
    Compactor,
    compaction_target,
    marks_of,
    next_chunk,
)


@pytest.mark.parametrize(
    ("marks", "now", "retention", "target"),
    [
        ([], 100.0, 60.0, 0),
        ([(90.0, 5)], 100.0, 60.0, 0),  # not old enough yet
        ([(40.0, 5)], 100.0, 60.0, 5),  # exactly the retention ago
        ([(0.0, 3), (30.0, 7), (50.0, 9)], 100.0, 60.0, 7),
        ([(0.0, 3), (30.0, 7), (50.0, 9)], 1000.0, 60.0, 9),
    ],
)
def test_compaction_target_table(
    marks: list[tuple[float, int]], now: float, retention: float, target: int
) -> None:
    assert compaction_target(marks, now, retention) == target


@async_test
async def test_the_compactor_keeps_a_bounded_history(tmp_path: Path) -> None:
    clock = FakeClock()
    store = await SqliteStore.open(tmp_path / "hub.db", clock=clock)
    try:
        compactor = Compactor(store, period=60, retention=300, clock=clock)
        for minute in range(12):
            for i in range(10):
                await store.put(f"/devices/d{i}", f"{minute}".encode())
            await compactor.step()
            clock.advance(60)
        # history kept: about retention / period marks; everything older compacted
        assert 4 <= len(compactor.marks) <= 7
        revision = (await store.range("/")).revision
        assert revision - 70 <= compactor.compacted <= revision - 40
        with pytest.raises(Compacted):
            async for _ in store.watch("/devices/", 1):
                break
    finally:
        await store.close()
    db = sqlite3.connect(tmp_path / "hub.db")
    try:
        events = db.execute("SELECT count(*) FROM events").fetchone()[0]
    finally:
        db.close()
    assert events <= revision - compactor.compacted + 1  # the history rows are gone


@async_test
async def test_a_watch_on_a_compacted_revision_is_told_to_relist(tmp_path: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub, hub.channel() as channel:
        for i in range(3):
            await hub.ctx.store.put(f"/devices/x{i}", b"{}")
        revision = (await hub.ctx.store.range("/")).revision
        await hub.ctx.store.compact(revision)
        call = hub.stub(channel).Watch(
            admin_pb2.WatchRequest(kind="Device", resource_version=1), timeout=10
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in call:
                pass
        assert err.value.code() is grpc.StatusCode.OUT_OF_RANGE
        assert "read the current state and watch from its revision" in (err.value.details() or "")


@pytest.mark.parametrize(
    ("size", "took", "expected"),
    [
        (1024, 0.001, 2048),  # fast: twice as many
        (1024, 0.04, 1024),  # about the goal: the same
        (1024, 0.1, 512),  # twice the goal: half
        (1024, 1.0, 51),  # 20 times the goal: fitted to it
        (MIN_CHUNK, 10.0, MIN_CHUNK),
        (MAX_CHUNK, 0.0, MAX_CHUNK),
    ],
)
def test_next_chunk_table(size: int, took: float, expected: int) -> None:
    assert next_chunk(size, took, goal=0.05) == expected


class _Recording:
    """The real store, with the order in which compactions and writes finished written down."""

    def __init__(self, store: SqliteStore, order: list[str]) -> None:
        self._store, self._order = store, order
        self.compacting = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def compact(self, revision: int) -> None:
        await self._store.compact(revision)
        self._order.append(f"compact {revision}")
        self.compacting.set()

    async def put(self, key: str, value: bytes) -> int:
        revision = await self._store.put(key, value)
        self._order.append("put" if key != MARKS_KEY else "marks")
        return revision


@async_test
async def test_a_big_history_is_compacted_in_chunks_with_writes_in_between(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    store = await SqliteStore.open(tmp_path / "hub.db", clock=clock)
    order: list[str] = []
    recording = _Recording(store, order)
    try:
        compactor = Compactor(
            recording,  # type: ignore[arg-type]
            period=60,
            retention=60,
            clock=clock,
            first_chunk=16,
        )
        for i in range(600):
            await store.put(f"/devices/d{i % 7}", b"%d" % i)
        await compactor.step()  # noted, not old enough yet
        clock.advance(60)
        target = compactor.marks[-1][1]  # the revision noted (before the marks' own write)

        async def device_write() -> None:
            await recording.compacting.wait()  # once the first chunk is done
            await recording.put("/devices/late", b"x")

        compacted, _ = await asyncio.gather(compactor.step(), device_write())
        assert compacted == target and compactor.compacted == target
        assert compactor.chunks >= 2  # 16, then at most doubling: never all 600 at once
        compactions = [o for o in order if o.startswith("compact")]
        assert compactions[-1] == f"compact {target}"
        assert order.index("put") < order.index(compactions[-1])  # not held off to the end
        with pytest.raises(Compacted):
            async for _ in store.watch("/devices/", target - 1):
                break
    finally:
        await store.close()
    db = sqlite3.connect(tmp_path / "hub.db")
    try:
        oldest = db.execute("SELECT min(revision) FROM events").fetchone()[0]
    finally:
        db.close()
    assert oldest >= target


@async_test
async def test_the_marks_outlive_a_restart_so_a_hub_restarted_often_still_compacts(
    tmp_path: Path,
) -> None:
    """A hub killed every 4 minutes with a 5-minute retention: each start reads the marks the
    last one noted (kept in the store), so the history is compacted all the same (with the
    marks in memory only it never was: seed 62's root, killed about every 10 minutes)."""
    clock = FakeClock()
    store = await SqliteStore.open(tmp_path / "hub.db", clock=clock)
    try:
        compacted = 0
        for start in range(6):  # each a new Compactor: a restarted hub
            compactor = Compactor(store, period=60, retention=300, clock=clock)
            for _ in range(4):
                for i in range(10):
                    await store.put(f"/devices/d{i}", b"%d" % start)
                compacted = max(compacted, await compactor.step())
                clock.advance(60)
        revision = (await store.range("/")).revision
        assert compacted > 0 and revision - compacted <= 7 * 11, (compacted, revision)
        # a record that cannot be read is left out, and the marks start again
        await store.put(MARKS_KEY, b'{"marks": [[1.0, "x"]]}')
        again = Compactor(store, period=60, retention=300, clock=clock)
        await again.step()
        assert len(again.marks) == 1
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("value", "marks", "problem"),
    [
        (b'{"marks": [[1.5, 3], [2, 7]]}', [(1.5, 3), (2.0, 7)], None),
        (b'{"marks": []}', [], None),
        (b"nope", None, "not a marks record"),
        (b'{"other": 1}', None, "not a marks record"),
        (b'{"marks": {"a": 1}}', None, "marks: must be a list"),
        (b'{"marks": [[1.0]]}', None, "marks[0]"),
        (b'{"marks": [[1.0, -1]]}', None, "marks[0]"),
        (b'{"marks": [[true, 1]]}', None, "marks[0]"),
        (b'{"marks": [[1.0, 2], ["x", 3]]}', None, "marks[1]"),
        (b'{"marks": [[1e999, 3]]}', None, "marks[0]"),
    ],
)
def test_a_marks_record_is_read_or_refused_naming_what(
    value: bytes, marks: list[tuple[float, int]] | None, problem: str | None
) -> None:
    if problem is None:
        assert marks_of(value) == marks
    else:
        with pytest.raises(ValueError, match=re.escape(problem)):
            marks_of(value)
