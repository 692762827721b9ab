"""supervise() with in-test components and small real delays.

Each test runs in its own event loop (``async_test``) and fails if it leaves a task behind.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from asynctesting import async_test, eventually

from edgefleet.supervising import Component, CriticalComponentError, supervise


class Flaky:
    """Fails (raises, or returns early) its first ``failures`` runs, then runs until stop."""

    def __init__(self, name: str, failures: int = 0, *, raises: bool = True) -> None:
        self.name = name
        self.failures = failures
        self.raises = raises
        self.starts: list[float] = []
        self.stopped_cleanly = False

    async def run(self, stop: asyncio.Event) -> None:
        self.starts.append(time.monotonic())
        if len(self.starts) <= self.failures:
            await asyncio.sleep(0)
            if self.raises:
                raise RuntimeError(f"{self.name} failure {len(self.starts)}")
            return
        await stop.wait()
        self.stopped_cleanly = True


class Stubborn:
    """Ignores stop; only cancellation ends it."""

    name = "stubborn"

    def __init__(self) -> None:
        self.started = False
        self.cancelled = False

    async def run(self, stop: asyncio.Event) -> None:
        self.started = True
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


@async_test
async def test_failing_component_is_restarted_with_growing_backoff() -> None:
    flaky = Flaky("flaky", failures=3)
    early = Flaky("early", failures=2, raises=False)
    stop = asyncio.Event()
    task = asyncio.create_task(supervise([flaky, early], stop, restart_base=0.01))
    await eventually(lambda: len(flaky.starts) == 4 and len(early.starts) == 3)
    stop.set()
    await task
    assert flaky.stopped_cleanly and early.stopped_cleanly
    gaps = [b - a for a, b in zip(flaky.starts, flaky.starts[1:], strict=False)]
    for n, gap in enumerate(gaps):
        assert gap >= 0.01 * 2**n * 0.9  # 10 ms, 20 ms, 40 ms


@async_test
async def test_backoff_wait_ends_as_soon_as_stop_is_set() -> None:
    flaky = Flaky("flaky", failures=100)
    stop = asyncio.Event()
    task = asyncio.create_task(supervise([flaky], stop, restart_base=30))
    await eventually(lambda: len(flaky.starts) == 1)
    started = time.monotonic()
    stop.set()
    await task
    assert time.monotonic() - started < 1
    assert len(flaky.starts) == 1


@async_test
async def test_critical_component_failing_too_often_stops_everything() -> None:
    bad = Flaky("bad", failures=100)
    good = Flaky("good")
    stop = asyncio.Event()
    with pytest.raises(CriticalComponentError) as caught:
        await supervise([bad, good], stop, restart_base=0.001, critical={"bad"}, max_failures=2)
    assert stop.is_set()
    assert len(bad.starts) == 3  # more than max_failures
    assert caught.value.component == "bad"
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert good.stopped_cleanly


@async_test
async def test_non_critical_component_keeps_being_restarted() -> None:
    bad = Flaky("bad", failures=100)
    stop = asyncio.Event()
    task = asyncio.create_task(
        supervise([bad], stop, restart_base=0.0001, restart_max=0.001, max_failures=2)
    )
    await eventually(lambda: len(bad.starts) >= 8)
    assert not stop.is_set()
    stop.set()
    await task


@async_test
async def test_shutdown_cancels_stragglers_after_grace_and_leaks_no_task() -> None:
    good = Flaky("good")
    stubborn = Stubborn()
    stop = asyncio.Event()
    before = asyncio.all_tasks()
    task = asyncio.create_task(supervise([good, stubborn], stop, grace=0.01))
    await eventually(lambda: stubborn.started and bool(good.starts))
    stop.set()
    await task
    assert good.stopped_cleanly
    assert stubborn.cancelled
    assert asyncio.all_tasks() == before


@async_test
async def test_cancelling_supervise_cancels_components() -> None:
    stubborn = Stubborn()
    stop = asyncio.Event()
    task = asyncio.create_task(supervise([stubborn], stop))
    await eventually(lambda: stubborn.started)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stubborn.cancelled


@async_test
async def test_failure_while_stopping_is_not_restarted() -> None:
    class FailsOnStop:
        name = "fails-on-stop"
        runs = 0

        async def run(self, stop: asyncio.Event) -> None:
            self.runs += 1
            await stop.wait()
            raise RuntimeError("cleanup failed")

    component = FailsOnStop()
    stop = asyncio.Event()
    task = asyncio.create_task(supervise([component], stop))
    await eventually(lambda: component.runs == 1)
    stop.set()
    await task
    assert component.runs == 1


@async_test
async def test_invalid_component_lists() -> None:
    stop = asyncio.Event()
    with pytest.raises(ValueError, match="unique"):
        await supervise([Flaky("a"), Flaky("a")], stop)
    with pytest.raises(ValueError, match="not among"):
        await supervise([Flaky("a")], stop, critical={"b"})


@async_test
async def test_invalid_restart_backoff() -> None:
    stop = asyncio.Event()
    with pytest.raises(ValueError, match="base <= cap"):
        await supervise([Flaky("a")], stop, restart_base=0)
    with pytest.raises(ValueError, match="base <= cap"):
        await supervise([Flaky("a")], stop, restart_base=2, restart_max=1)


def test_components_satisfy_the_protocol() -> None:
    components: list[Component] = [Flaky("a"), Stubborn()]
    assert [c.name for c in components] == ["a", "stubborn"]


@async_test
async def test_an_unreachable_store_is_logged_in_one_line_other_failures_with_their_trace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A hub replica cut from etcd restarts each store-bound component every few seconds
    (the soak run's partitions): each failure is the error's own words, not a 20-line trace;
    any other failure keeps its trace."""
    from edgefleet.errors import StoreUnavailable

    class Unreachable(Flaky):
        async def run(self, stop: asyncio.Event) -> None:
            self.starts.append(time.monotonic())
            if len(self.starts) == 1:
                raise StoreUnavailable("etcd 10.0.0.1:2379: range: UNAVAILABLE: no route")
            await stop.wait()

    unreachable, flaky = Unreachable("cache-follower"), Flaky("other", failures=1)
    stop = asyncio.Event()
    caplog.set_level("INFO", logger="edgefleet.supervising")
    task = asyncio.create_task(supervise([unreachable, flaky], stop, restart_base=0.01))
    await eventually(lambda: len(unreachable.starts) == 2 and len(flaky.starts) == 2)
    stop.set()
    await task
    failed = {
        r.fields["component"]: r  # type: ignore[attr-defined]
        for r in caplog.records
        if r.getMessage() == "component failed"
    }
    assert failed["cache-follower"].exc_info is None
    assert "no route" in failed["cache-follower"].fields["error"]  # type: ignore[attr-defined]
    assert failed["other"].exc_info is not None
