"""Components of the daemon and the supervisor that keeps them running.

Every long-running part of edged (the udev watcher, the hub link, each runner, the API server)
is a :class:`Component`: a ``name`` and ``async run(stop)`` that returns once ``stop`` is set.
The daemon lists its components in one place and hands them to :func:`supervise`, which

* runs each component's ``run(stop)`` in a task of its own;
* restarts a component that returns or raises while ``stop`` is not set, after an exponential
  backoff (:class:`~edgefleet.backoff.Backoff`: ``restart_base * 2**n``, capped at
  ``restart_max``, no jitter) that ends early if ``stop`` is set;
  the backoff starts over once a component has run for ``failure_window`` seconds;
* gives up on a component named in ``critical`` that failed more than ``max_failures`` times in a
  row within ``failure_window``: it sets ``stop`` and raises :class:`CriticalComponentError`, so
  the daemon exits non-zero and systemd restarts it with a clean slate;
* once ``stop`` is set, waits ``grace`` seconds for every component to return, cancels the rest,
  and returns only when every task it started has finished.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Collection, Sequence
from typing import Protocol

from edgefleet.backoff import Backoff
from edgefleet.errors import EdgefleetError, StoreUnavailable
from edgefleet.logs import get_logger

log = get_logger(__name__)


class Component(Protocol):
    """A long-running part of the daemon. ``run`` returns once ``stop`` is set."""

    @property
    def name(self) -> str: ...

    async def run(self, stop: asyncio.Event) -> None: ...


class CriticalComponentError(EdgefleetError):
    """A critical component kept failing; the daemon must exit (and be restarted).

    ``__cause__`` is the component's last exception, if it raised one.
    """

    def __init__(self, component: str, failures: int, window: float) -> None:
        self.component = component
        self.failures = failures
        super().__init__(
            f"component {component!r} failed {failures} times within {window:g}s, giving up"
        )


async def supervise(
    components: Sequence[Component],
    stop: asyncio.Event,
    *,
    restart_base: float = 0.5,
    restart_max: float = 30.0,
    critical: Collection[str] = frozenset(),
    max_failures: int = 5,
    failure_window: float = 60.0,
    grace: float = 10.0,
) -> None:
    """Run ``components`` until ``stop`` is set, restarting those that fail; see the module doc.

    Raises :class:`CriticalComponentError` (after every component has stopped) when a critical
    component failed too often, and ValueError before starting anything when names repeat, a
    critical name is unknown or ``0 < restart_base <= restart_max`` does not hold.
    """
    names = [c.name for c in components]
    if len(set(names)) != len(names):
        raise ValueError(f"component names must be unique, got {names}")
    unknown = set(critical) - set(names)
    if unknown:
        raise ValueError(f"critical components {sorted(unknown)} are not among {names}")
    backoff = Backoff(restart_base, restart_max)

    tasks = [
        asyncio.create_task(
            _keep_running(
                component,
                stop,
                backoff=backoff,
                critical=component.name in critical,
                max_failures=max_failures,
                failure_window=failure_window,
            ),
            name=f"component:{component.name}",
        )
        for component in components
    ]
    try:
        await stop.wait()
        _, pending = await asyncio.wait(tasks, timeout=grace)
        for task in pending:
            log.warning("component did not stop in time, cancelling", component=task.get_name())
    finally:
        for task in tasks:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [e for e in outcomes if isinstance(e, Exception)]
    if errors:
        critical_errors = [e for e in errors if isinstance(e, CriticalComponentError)]
        raise (critical_errors or errors)[0]


async def _keep_running(
    component: Component,
    stop: asyncio.Event,
    *,
    backoff: Backoff,
    critical: bool,
    max_failures: int,
    failure_window: float,
) -> None:
    """Run one component until ``stop`` is set, restarting it with backoff when it fails."""
    name = component.name
    restarts = _Restarts(backoff, failure_window)
    while not stop.is_set():
        started = time.monotonic()
        log.info("component starting", component=name, failures=restarts.failures)
        error: BaseException | None = None
        delay = 0.0
        try:
            await component.run(stop)
        except (asyncio.CancelledError, Exception) as exc:
            if isinstance(exc, asyncio.CancelledError) and _being_cancelled():
                raise  # we are being cancelled; a CancelledError of its own is a failure
            error = exc
            if stop.is_set():
                log.warning("component failed while stopping", component=name, error=repr(exc))
            else:
                delay = restarts.record(started)
                if isinstance(exc, StoreUnavailable):  # unreachable, said in full: no trace
                    log.error("component failed", component=name, restart_in=delay, error=str(exc))
                else:
                    log.exception("component failed", component=name, restart_in=delay)
        if stop.is_set():
            break
        if error is None:
            delay = restarts.record(started)
            log.warning("component exited early", component=name, restart_in=delay)
        if critical and restarts.failures > max_failures:
            log.error(
                "critical component keeps failing, stopping",
                component=name,
                failures=restarts.failures,
            )
            stop.set()
            raise CriticalComponentError(name, restarts.failures, failure_window) from error
        if await wait_for_stop(stop, delay):
            break
    log.info("component stopped", component=name)


class _Restarts:
    """Consecutive failures of one component within a window, and the backoff they call for."""

    def __init__(self, backoff: Backoff, window: float) -> None:
        self._backoff = backoff
        self._window = window
        self._times: deque[float] = deque()

    @property
    def failures(self) -> int:
        return len(self._times)

    def record(self, started: float) -> float:
        """Record a failure of a run that began at ``started``; return the delay to restart."""
        now = time.monotonic()
        if now - started >= self._window:
            self._times.clear()  # it ran fine for a while: start over
        self._times.append(now)
        while self._times[0] < now - self._window:
            self._times.popleft()
        return self._backoff.delay(len(self._times) - 1)


async def wait_for_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``stop`` (not a bare sleep); True if it was set.

    What every periodic loop of a component waits with, so that stopping never waits out a
    period."""
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        return False
    return True


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
