"""Scheduled compaction: the pure decision as a table, and the component on a real SQLite file
(the clock is the only fake: a ``FakeClock`` the test moves), with a watch that asks for a
compacted revision getting ``Compacted`` — and over AdminService, OUT_OF_RANGE saying to relist."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import grpc
import pytest
from asynctesting import async_test
from hubserving import AdminHub, make_hub_dir
from hubtesting import FakeClock

from edgefleet.errors import Compacted
from edgefleet.v1 import admin_pb2
from hub.store import SqliteStore
from hub.store.compacting import Compactor, compaction_target


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
