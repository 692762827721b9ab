"""The hub's batch loop (hub.state.batchloop), then the device writer and the projector over it.

The loop's table runs on a clock the work moves (a pass "takes" its seconds), with real but
tiny backoff waits. The writer and projector run over a real SQLite store; the failures are a
wrapper that makes its writes raise while ``failing`` is set (the store itself, read back
after, is real).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from asynctesting import async_test, eventually

from edgefleet.api import parse_manifest
from edgefleet.backoff import Backoff
from edgefleet.errors import StoreError
from edgefleet.supervising import CriticalComponentError, supervise
from hub.decide.devices import Device
from hub.state import storekeys
from hub.state.batchloop import BatchLoop
from hub.state.cache import Cache
from hub.state.projector import Projector
from hub.state.sessions import Sessions
from hub.state.store import SqliteStore
from hub.state.store.protocol import Compare, Op
from hub.state.writer import DeviceWriter

TINY = Backoff(0.001, 0.004)


class Script:
    """The work of a loop: pass ``i`` takes ``seconds[i]`` on the clock, then fails or not; a
    pass that succeeds marks more work, until the last, which sets ``stop``."""

    def __init__(self, outcomes: str, seconds: Sequence[float], stop: asyncio.Event) -> None:
        self.outcomes = outcomes  # "F": the pass raises, "o": it succeeds
        self.seconds = seconds
        self.stop = stop
        self.now = 0.0
        self.passes = 0
        self.loop: BatchLoop | None = None

    def clock(self) -> float:
        return self.now

    async def work(self) -> None:
        i = self.passes
        self.passes += 1
        self.now += self.seconds[i % len(self.seconds)]
        if i + 1 >= len(self.outcomes):
            self.stop.set()  # the script is over (the loop ends after this pass)
        if self.outcomes[i % len(self.outcomes)] == "F":
            raise StoreError(f"pass {i} failed")
        if self.loop is not None:
            self.loop.wake()


@dataclass(frozen=True)
class Case:
    name: str
    outcomes: str
    seconds: tuple[float, ...]
    raises_at: int | None  # the pass (1-based) whose error the loop raises, or None


CASES = [
    Case("one success", "o", (0.1,), None),
    Case("transient failures are retried", "FFo", (1.0,), None),
    Case("many quick failures are still transient", "F" * 40 + "o", (0.1,), None),
    Case("failures just under the bound", "FFFo", (10.0, 10.0, 9.9, 0.1), None),
    Case("a success starts the count over", "FFoFFo", (10.0,), None),
    Case("failures spanning the bound raise", "FFFFFF", (10.0,), 3),
    Case("the first pass counts from its start", "FFFFFF", (30.0,), 1),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@async_test
async def test_batch_loop(case: Case) -> None:
    stop = asyncio.Event()
    script = Script(case.outcomes, case.seconds, stop)
    loop = BatchLoop(
        "test", script.work, gather=0, backoff=TINY, give_up_after=30.0, clock=script.clock
    )
    script.loop = loop
    loop.wake()
    if case.raises_at is None:
        await loop.run(stop)
        assert script.passes == len(case.outcomes)
        assert loop.failures == 0
    else:
        with pytest.raises(StoreError, match=f"pass {case.raises_at - 1} failed"):
            await loop.run(stop)
        assert script.passes == case.raises_at
        assert loop.failures == case.raises_at


@async_test
async def test_retries_wait_the_backoff() -> None:
    stop = asyncio.Event()
    starts: list[float] = []

    async def work() -> None:
        starts.append(time.monotonic())
        if len(starts) < 4:
            raise StoreError("not yet")
        stop.set()

    loop = BatchLoop("test", work, gather=0, backoff=Backoff(0.02, 0.05))
    loop.wake()
    await loop.run(stop)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    for gap, expected in zip(gaps, (0.02, 0.04, 0.05), strict=True):
        assert gap >= expected * 0.9


@async_test
async def test_after_a_persistent_failure_a_restart_fails_at_once_or_recovers() -> None:
    stop = asyncio.Event()
    script = Script("FFFFFo", (20.0, 20.0, 0.0, 0.0, 0.0, 0.0), stop)
    loop = BatchLoop("test", script.work, gather=0, backoff=TINY, clock=script.clock)
    loop.wake()
    with pytest.raises(StoreError, match="pass 1 failed"):
        await loop.run(stop)  # 40 s of failures
    for n in (2, 3, 4):  # what the supervisor does: run it again, no new wake needed
        with pytest.raises(StoreError, match=f"pass {n} failed"):
            await loop.run(stop)
        assert script.passes == n + 1  # one pass each: the streak is still persistent
    await loop.run(stop)  # the store is back
    assert script.passes == 6 and loop.failures == 0


@async_test
async def test_a_persistent_failure_reaches_the_supervisor_of_a_critical_loop() -> None:
    stop = asyncio.Event()
    script = Script("F" * 1000, (10.0,), stop)
    loop = BatchLoop("batches", script.work, gather=0, backoff=TINY, clock=script.clock)
    loop.wake()
    with pytest.raises(CriticalComponentError) as caught:
        await supervise([loop], stop, restart_base=0.001, critical={"batches"}, max_failures=3)
    assert isinstance(caught.value.__cause__, StoreError)
    assert script.passes == 3 + 3  # 30 s of failures, then one quick failure per restart


@async_test
async def test_a_loop_that_only_fails_transiently_is_never_given_up() -> None:
    stop = asyncio.Event()
    script = Script("FFFFFFFFFo", (1.0,), stop)
    loop = BatchLoop("batches", script.work, gather=0, backoff=TINY, clock=script.clock)
    loop.wake()
    await supervise([loop], stop, restart_base=0.001, critical={"batches"}, max_failures=0)
    assert script.passes == 10


@pytest.mark.parametrize("final", [True, False])
@async_test
async def test_stop_runs_the_work_once_more_when_final(final: bool) -> None:
    stop = asyncio.Event()
    passes: list[int] = []

    async def work() -> None:
        passes.append(1)

    loop = BatchLoop("test", work, gather=60, backoff=TINY, final=final)
    task = asyncio.create_task(loop.run(stop))
    loop.wake()  # work marked, then stop during the gathering
    await asyncio.sleep(0.01)
    stop.set()
    await task
    assert len(passes) == (1 if final else 0)


@async_test
async def test_stop_during_a_backoff_still_runs_the_final_work_and_raises_its_error() -> None:
    stop = asyncio.Event()
    passes: list[int] = []

    async def work() -> None:
        passes.append(1)
        raise StoreError("down")

    loop = BatchLoop("test", work, gather=0, backoff=Backoff(60, 60), final=True)
    loop.wake()
    task = asyncio.create_task(loop.run(stop))
    await eventually(lambda: len(passes) == 1)
    stop.set()
    with pytest.raises(StoreError, match="down"):
        await task
    assert len(passes) == 2


# -- the device writer and the projector over a real store -------------------------------------


class FailingStore:
    """A real SqliteStore whose writes raise while ``failing`` is set."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        self.failing = False
        self.failed = 0
        self.written = 0

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
        if self.failing:
            self.failed += 1
            raise StoreError("disk I/O error")
        revision = await self.store.txn(compares, ops)
        self.written += 1
        return revision

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


async def _device_in(store: SqliteStore, name: str) -> Device | None:
    kv = await store.get(storekeys.device_key(name))
    return Device.from_json(storekeys.loads(kv.value)) if kv else None


@async_test
async def test_writer_retries_a_transient_failure_and_writes_everything(tmp_path: Path) -> None:
    real = await SqliteStore.open(tmp_path / "hub.db")
    store = FailingStore(real)
    cache = Cache()
    writer = DeviceWriter(store, cache, period=0.001)  # type: ignore[arg-type]
    stop = asyncio.Event()
    task = asyncio.create_task(writer.run(stop))
    store.failing = True
    writer.update(Device("cam-1", labels={"site": "a"}))
    writer.event("Device", "cam-1", "Normal", "Labelled", "site=a")
    await eventually(lambda: store.failed >= 3)
    store.failing = False
    try:
        await eventually(lambda: store.written == 1)  # the loop retried on its own
        stored = await _device_in(real, "cam-1")
        assert stored is not None and stored.labels == {"site": "a"}
        events = (await real.range(storekeys.EVENTS)).kvs
        assert [storekeys.loads(kv.value)["reason"] for kv in events] == ["Labelled"]
    finally:
        stop.set()
        await task
        await real.close()


@async_test
async def test_writer_raises_a_persistent_failure_and_keeps_what_it_owes(tmp_path: Path) -> None:
    real = await SqliteStore.open(tmp_path / "hub.db")
    store = FailingStore(real)
    cache = Cache()
    writer = DeviceWriter(store, cache, period=0.001, give_up_after=0.05)  # type: ignore[arg-type]
    store.failing = True
    writer.update(Device("cam-1"))
    try:
        with pytest.raises(StoreError, match="disk I/O error"):
            await writer.run(asyncio.Event())
        assert store.failed > 1
        store.failing = False
        await writer.flush()  # what the hub does at its exit: nothing was dropped
        assert await _device_in(real, "cam-1") == Device("cam-1")
    finally:
        await real.close()


DEPLOYMENT = {
    "apiVersion": "edgefleet.io/v1",
    "kind": "ModelDeployment",
    "metadata": {"name": "fraud"},
    "spec": {"model": {"name": "fraud", "version": "1.0.0"}, "replicas": {"perDevice": 1}},
}


@async_test
async def test_projector_raises_a_persistent_failure_and_projects_after_it(tmp_path: Path) -> None:
    real = await SqliteStore.open(tmp_path / "hub.db")
    store = FailingStore(real)
    cache = Cache(devices={"cam-1": Device("cam-1"), "cam-2": Device("cam-2")})
    cache.put_object(parse_manifest(DEPLOYMENT).to_dict(), 1)
    projector = Projector(
        store,  # type: ignore[arg-type]
        cache,
        Sessions(),
        region="eu-frankfurt",
        give_up_after=0.05,
    )
    store.failing = True
    projector.mark_all()
    try:
        with pytest.raises(StoreError, match="disk I/O error"):
            await projector.run(asyncio.Event())
        assert not (await real.range(storekeys.DESIRED)).kvs
        store.failing = False
        stop = asyncio.Event()
        task = asyncio.create_task(projector.run(stop))  # restarted: the marks are still owed
        await eventually(lambda: set(cache.desired) == {"cam-1", "cam-2"})
        stop.set()
        await task
        stored = {kv.key for kv in (await real.range(storekeys.DESIRED)).kvs}
        assert stored == {storekeys.desired_key("cam-1"), storekeys.desired_key("cam-2")}
    finally:
        await real.close()
