"""WorkQueue semantics (client-go workqueue): real asyncio loop; a fake clock where time matters.

Each test runs in its own event loop (``async_test``) and fails if it leaves a task behind.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from asynctesting import async_test, eventually

from edgefleet.workqueue import QueueShutDown, WorkQueue


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@async_test
async def test_waiting_keys_are_deduplicated() -> None:
    q: WorkQueue[str] = WorkQueue()
    for key in ("a", "b", "a", "a", "b", "c"):
        q.add(key)
    assert len(q) == 3
    assert [await q.get(), await q.get(), await q.get()] == ["a", "b", "c"]
    assert len(q) == 0
    assert q.processing == 3


@async_test
async def test_key_added_while_processing_is_requeued_once_after_done() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    assert await q.get() == "a"
    q.add("a")
    q.add("a")
    assert len(q) == 0  # not handed out again while it is processing
    q.done("a")
    assert len(q) == 1
    assert await q.get() == "a"
    q.done("a")
    assert len(q) == 0
    assert q.processing == 0


@async_test
async def test_one_key_never_goes_to_two_getters_at_once() -> None:
    q: WorkQueue[int] = WorkQueue()
    active: set[int] = set()
    overlaps = 0
    processed = 0
    busiest = 0
    rng = random.Random(7)

    async def worker() -> None:
        nonlocal overlaps, processed, busiest
        while True:
            try:
                key = await q.get()
            except QueueShutDown:
                return
            if key in active:
                overlaps += 1
            active.add(key)
            busiest = max(busiest, len(active))
            for _ in range(rng.randint(0, 3)):
                await asyncio.sleep(0)
            active.discard(key)
            processed += 1
            q.done(key)

    workers = [asyncio.create_task(worker()) for _ in range(5)]
    for _ in range(300):
        q.add(rng.randint(0, 3))
        if rng.random() < 0.5:
            await asyncio.sleep(0)
    await eventually(lambda: len(q) == 0 and q.processing == 0)
    q.shutdown()
    await asyncio.gather(*workers)
    assert overlaps == 0
    assert busiest > 1  # different keys did run concurrently
    assert processed < 300  # adds were coalesced


@async_test
async def test_add_after_orders_by_deadline_and_keeps_the_earliest() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(clock=clock)
    q.add_after("a", 3)
    q.add_after("b", 1)
    q.add_after("c", 2)
    q.add_after("c", 5)  # later: the earlier deadline wins
    assert (len(q), q.delayed) == (0, 3)
    assert q.next_wakeup == clock.now + 1

    clock.now += 1.5
    assert (len(q), q.delayed) == (1, 2)
    assert await q.get() == "b"

    q.add_after("a", 0.1)  # earlier than its 3 s: moves up
    clock.now += 0.1
    assert await q.get() == "a"
    clock.now += 10
    assert await q.get() == "c"
    assert (len(q), q.delayed) == (0, 0)
    assert q.next_wakeup is None


@async_test
async def test_add_after_with_real_timer_and_no_timer_left_when_idle() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add_after("late", 0.5)
    q.add_after("late", 0.01)  # the 0.5 s entry is now stale
    q.add_after("zero", 0)  # no delay: queued at once
    assert await q.get() == "zero"
    started = time.monotonic()
    assert await q.get() == "late"
    assert time.monotonic() - started < 0.4
    assert q.delayed == 0
    assert q.next_wakeup is None  # the stale entry does not keep a timer armed


@async_test
async def test_backoff_grows_with_jitter_within_half_and_full_and_caps() -> None:
    q: WorkQueue[str] = WorkQueue(rng=random.Random(42), clock=FakeClock())
    delays = [q.add_rate_limited("k") for _ in range(20)]
    for failures, delay in enumerate(delays):
        nominal = min(0.05 * 2**failures, 300.0)
        assert nominal / 2 <= delay <= nominal
    assert max(delays) <= 300.0
    assert delays[-1] >= 150.0
    assert q.num_requeues("k") == 20
    assert q.num_requeues("other") == 0
    for _ in range(2000):  # no overflow long after the cap
        assert q.add_rate_limited("k") <= 300.0
    q.shutdown()


@async_test
async def test_backoff_without_jitter_is_exact_and_forget_resets() -> None:
    q: WorkQueue[str] = WorkQueue(base_delay=0.1, max_delay=1.0, jitter=0, clock=FakeClock())
    assert [q.add_rate_limited("k") for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    q.forget("k")
    assert q.num_requeues("k") == 0
    assert q.add_rate_limited("k") == 0.1
    assert q.add_rate_limited("j") == 0.1  # per key
    q.shutdown()


@async_test
async def test_rate_limited_key_is_queued_once_due() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(jitter=0, clock=clock)
    assert q.add_rate_limited("k") == 0.05
    assert (len(q), q.delayed) == (0, 1)
    clock.now += 0.05
    assert await q.get() == "k"


@async_test
async def test_shutdown_wakes_getters_and_ignores_later_adds() -> None:
    q: WorkQueue[str] = WorkQueue()
    getters = [asyncio.create_task(q.get()) for _ in range(3)]
    await asyncio.sleep(0)  # let them start waiting
    q.add_after("x", 100)
    q.shutdown()
    results = await asyncio.gather(*getters, return_exceptions=True)
    assert all(isinstance(r, QueueShutDown) for r in results)
    assert q.is_shut_down
    assert q.next_wakeup is None
    q.add("y")
    q.add_after("y", 1)
    assert (len(q), q.delayed) == (0, 0)
    with pytest.raises(QueueShutDown):
        await q.get()


@async_test
async def test_shutdown_lets_processing_keys_finish() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    key = await q.get()
    q.add("a")  # dirty
    q.shutdown()
    q.done(key)
    assert q.processing == 0
    assert len(q) == 0


@async_test
async def test_cancelled_getter_passes_its_wakeup_on() -> None:
    q: WorkQueue[str] = WorkQueue()
    first = asyncio.create_task(q.get())
    second = asyncio.create_task(q.get())
    await asyncio.sleep(0)  # both are waiting
    q.add("k")  # wakes `first`...
    first.cancel()  # ...which is cancelled before it runs
    assert await second == "k"
    with pytest.raises(asyncio.CancelledError):
        await first


def test_invalid_parameters() -> None:
    with pytest.raises(ValueError, match="base_delay"):
        WorkQueue(base_delay=0)
    with pytest.raises(ValueError, match="max_delay"):
        WorkQueue(base_delay=1, max_delay=0.5)
    with pytest.raises(ValueError, match="jitter"):
        WorkQueue(jitter=1.5)
