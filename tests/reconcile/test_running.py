"""The Runner with a real WorkQueue and small real delays; reconcilers are in-test recorders.

Each test runs in its own event loop (``async_test``) and fails if it leaves a task behind.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from asynctesting import async_test, eventually

from edged.reconcile.running import Result, Runner
from edgefleet.errors import PermanentError, TemporaryError
from edgefleet.metrics import Registry
from edgefleet.workqueue import WorkQueue


def fast_queue(base_delay: float = 0.001) -> WorkQueue[str]:
    return WorkQueue(base_delay=base_delay, max_delay=max(base_delay, 0.01), jitter=0)


class Scripted:
    """A reconciler that plays a script of outcomes per key, then returns Result()."""

    def __init__(self, script: dict[str, list[Result | BaseException]] | None = None) -> None:
        self.script = {k: iter(v) for k, v in (script or {}).items()}
        self.calls: list[str] = []

    async def reconcile(self, key: str) -> Result:
        self.calls.append(key)
        outcome = next(self.script.get(key, iter(())), Result())
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


@asynccontextmanager
async def running(runner: Runner[str]) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        yield stop
    finally:
        stop.set()
        await task


def sample(registry: Registry, line_start: str) -> str:
    lines = [line for line in registry.render().splitlines() if line.startswith(line_start)]
    assert len(lines) == 1, lines
    return lines[0].rsplit(" ", 1)[1]


def errors_recorder() -> tuple[list[tuple[str, BaseException]], Callable[..., None]]:
    errors: list[tuple[str, BaseException]] = []
    return errors, lambda key, exc: errors.append((key, exc))


@async_test
async def test_success_forgets_backoff_and_counts() -> None:
    registry = Registry()
    queue = fast_queue()
    reconciler = Scripted()
    async with running(Runner("test", reconciler, queue, metrics=registry)):
        queue.add_rate_limited("a")  # pretend it had failed before
        await eventually(lambda: reconciler.calls == ["a"] and queue.processing == 0)
    assert queue.num_requeues("a") == 0
    assert sample(registry, 'edged_reconcile_total{controller="test",result="success"}') == "1.0"
    assert sample(registry, 'edged_reconcile_duration_seconds_count{controller="test"}') == "1"
    assert sample(registry, 'edged_workqueue_depth{controller="test"}') == "0.0"


@async_test
async def test_requeue_after_reconciles_again_later() -> None:
    registry = Registry()
    queue = fast_queue()
    reconciler = Scripted({"a": [Result(requeue_after=0.01)]})
    async with running(Runner("test", reconciler, queue, metrics=registry)):
        queue.add("a")
        await eventually(lambda: reconciler.calls == ["a", "a"] and queue.processing == 0)
    assert queue.delayed == 0
    assert sample(registry, 'edged_reconcile_total{controller="test",result="requeue"}') == "1.0"
    assert sample(registry, 'edged_reconcile_total{controller="test",result="success"}') == "1.0"


@async_test
async def test_temporary_error_backs_off_and_retries_until_success() -> None:
    registry = Registry()
    queue = fast_queue()
    reconciler = Scripted({"a": [TemporaryError("busy"), TemporaryError("still busy")]})
    errors, on_error = errors_recorder()
    async with running(Runner("test", reconciler, queue, metrics=registry, on_error=on_error)):
        queue.add("a")
        await eventually(lambda: len(reconciler.calls) == 3 and queue.processing == 0)
    assert [str(e) for _, e in errors] == ["busy", "still busy"]
    assert queue.num_requeues("a") == 0  # forgotten after the success
    assert queue.delayed == 0
    total = 'edged_reconcile_total{controller="test",result='
    assert sample(registry, total + '"temporary_error"}') == "2.0"
    assert sample(registry, total + '"success"}') == "1.0"
    assert sample(registry, 'edged_workqueue_retries_total{controller="test"}') == "2.0"


@async_test
async def test_permanent_error_is_not_retried() -> None:
    queue = fast_queue()
    reconciler = Scripted({"a": [PermanentError("bad manifest")]})
    errors, on_error = errors_recorder()
    async with running(Runner("test", reconciler, queue, on_error=on_error)):
        queue.add("a")
        await eventually(lambda: bool(errors) and queue.processing == 0)
        # Nothing is waiting or scheduled, so nothing can retry it.
        assert (len(queue), queue.delayed, queue.num_requeues("a")) == (0, 0, 0)
        queue.add("a")  # its inputs changed: reconciled again
        await eventually(lambda: reconciler.calls == ["a", "a"])
    assert isinstance(errors[0][1], PermanentError)


@async_test
async def test_unexpected_exception_is_logged_and_does_not_kill_the_worker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    registry = Registry()
    queue = fast_queue(base_delay=60)  # the failed key stays scheduled during the test
    reconciler = Scripted({"bad": [RuntimeError("bug")]})
    errors, on_error = errors_recorder()
    runner = Runner("test", reconciler, queue, workers=1, metrics=registry, on_error=on_error)
    async with running(runner):
        queue.add("bad")
        await eventually(lambda: bool(errors))
        queue.add("good")  # the only worker is still alive
        await eventually(lambda: reconciler.calls == ["bad", "good"] and queue.processing == 0)
        assert queue.delayed == 1  # "bad" waits for its backoff
    assert sample(registry, 'edged_reconcile_total{controller="test",result="error"}') == "1.0"
    crashed = [r for r in caplog.records if r.getMessage() == "reconcile crashed, will retry"]
    assert crashed and crashed[0].exc_info is not None  # with the traceback


@async_test
async def test_on_error_that_raises_is_contained() -> None:
    queue = fast_queue()
    reconciler = Scripted({"a": [TemporaryError("once")]})

    def on_error(key: str, exc: BaseException) -> None:
        raise RuntimeError("callback bug")

    async with running(Runner("test", reconciler, queue, workers=1, on_error=on_error)):
        queue.add("a")
        await eventually(lambda: reconciler.calls == ["a", "a"] and queue.processing == 0)


@async_test
async def test_wrong_return_type_counts_as_error() -> None:
    queue = fast_queue(base_delay=60)
    reconciler = Scripted({"a": ["not a Result"]})  # type: ignore[list-item]
    errors, on_error = errors_recorder()
    async with running(Runner("test", reconciler, queue, on_error=on_error)):
        queue.add("a")
        await eventually(lambda: bool(errors))
    assert isinstance(errors[0][1], TypeError)


@async_test
async def test_timeout_cancels_the_reconcile_and_retries() -> None:
    queue = fast_queue()
    cancelled = asyncio.Event()
    calls = 0

    class Slow:
        async def reconcile(self, key: str) -> Result:
            nonlocal calls
            calls += 1
            if calls == 1:
                try:
                    await asyncio.Event().wait()  # hangs
                except asyncio.CancelledError:
                    cancelled.set()
                    raise
            return Result()

    errors, on_error = errors_recorder()
    async with running(Runner("test", Slow(), queue, timeout=0.01, on_error=on_error)):
        queue.add("a")
        await eventually(lambda: calls == 2 and queue.processing == 0)
    assert cancelled.is_set()
    assert isinstance(errors[0][1], TimeoutError)
    assert queue.num_requeues("a") == 0


@async_test
async def test_same_key_is_never_reconciled_concurrently() -> None:
    active: set[str] = set()
    overlaps = 0
    busiest = 0
    calls = 0
    rng = random.Random(3)

    class Recording:
        async def reconcile(self, key: str) -> Result:
            nonlocal overlaps, busiest, calls
            if key in active:
                overlaps += 1
            active.add(key)
            busiest = max(busiest, len(active))
            await asyncio.sleep(0.001)
            active.discard(key)
            calls += 1
            if rng.random() < 0.2:
                raise TemporaryError("flaky")
            return Result(requeue_after=0.002) if rng.random() < 0.2 else Result()

    queue = fast_queue()
    async with running(Runner("test", Recording(), queue, workers=4)):
        for _ in range(200):
            queue.add(rng.choice("abcde"))
            await asyncio.sleep(0)
        await eventually(lambda: len(queue) == 0 and queue.delayed == 0 and queue.processing == 0)
    assert calls > 5
    assert overlaps == 0
    assert busiest > 1


@async_test
async def test_stop_waits_for_in_flight_reconciles() -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    finished = False

    class Blocking:
        async def reconcile(self, key: str) -> Result:
            nonlocal finished
            started.set()
            await release.wait()
            finished = True
            return Result()

    queue = fast_queue()
    stop = asyncio.Event()
    task = asyncio.create_task(Runner("test", Blocking(), queue, grace=5).run(stop))
    queue.add("a")
    await started.wait()
    stop.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done()  # still draining
    release.set()
    await task
    assert finished
    assert queue.is_shut_down and queue.processing == 0


@async_test
async def test_stop_cancels_reconciles_after_the_grace_period() -> None:
    started = asyncio.Event()
    cancelled = False

    class Stuck:
        async def reconcile(self, key: str) -> Result:
            nonlocal cancelled
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled = True
                raise
            return Result()

    queue = fast_queue()
    stop = asyncio.Event()
    task = asyncio.create_task(Runner("test", Stuck(), queue, grace=0.01, timeout=None).run(stop))
    queue.add("a")
    await started.wait()
    stop.set()
    await task
    assert cancelled
    assert queue.processing == 0


@async_test
async def test_runners_share_one_registry() -> None:
    registry = Registry()
    Runner("one", Scripted(), fast_queue(), metrics=registry)
    Runner("two", Scripted(), fast_queue(), metrics=registry)
    text = registry.render()
    assert 'edged_workqueue_depth{controller="one"} 0.0' in text
    assert 'edged_workqueue_depth{controller="two"} 0.0' in text


def test_result_rejects_negative_requeue_after() -> None:
    assert Result().requeue_after is None
    with pytest.raises(ValueError, match="requeue_after"):
        Result(requeue_after=-1)
    with pytest.raises(ValueError, match="requeue_after"):
        Result(requeue_after=float("nan"))


def test_runner_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="workers"):
        Runner("x", Scripted(), fast_queue(), workers=0)
    with pytest.raises(ValueError, match="timeout"):
        Runner("x", Scripted(), fast_queue(), timeout=0)
