"""The one loop of the hub's batched work (device writer, projector): wake, gather, work, retry.

Level-based: :meth:`BatchLoop.wake` only says that there is work; one pass does everything
owed so far (the work function reads what is owed; a failed pass must leave it owed). A failed
pass is retried with exponential backoff (:class:`edgefleet.backoff.Backoff`). A failure that
**persists** — every pass failed for ``give_up_after`` seconds (30 s), counted from the start
of the first failed pass — is raised, so that it reaches :func:`edgefleet.supervising.supervise`.
The failing streak outlives the raise: when the supervisor restarts the loop, its first pass
runs at once and, if it fails too, raises at once, so a critical component gives up after the
supervisor's few quick restarts instead of another ``give_up_after``. One success ends a streak.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from edgefleet.backoff import Backoff
from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop

log = get_logger(__name__)

GIVE_UP_AFTER = 30.0
"""Seconds of nothing but failed passes after which a batch loop raises."""


class BatchLoop:
    """Runs ``work`` once per wake-up, after ``gather`` seconds in which more work may be marked.

    ``final``: run ``work`` once more when ``stop`` is set (the device writer flushes).
    ``clock``: monotonic seconds (injected by tests).
    """

    def __init__(
        self,
        name: str,
        work: Callable[[], Awaitable[None]],
        *,
        gather: float,
        backoff: Backoff,
        give_up_after: float = GIVE_UP_AFTER,
        final: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._work = work
        self._gather = gather
        self._backoff = backoff
        self._give_up_after = give_up_after
        self._final = final
        self._clock = clock
        self._wake = asyncio.Event()
        self._failures = 0
        self._failing_since: float | None = None

    @property
    def failures(self) -> int:
        """Consecutive failed passes (0 after a success)."""
        return self._failures

    def wake(self) -> None:
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Pass after pass until ``stop`` is set; raises the error of a failure that persists."""
        while not stop.is_set():
            await wake_or_stop(self._wake, stop)
            if stop.is_set() or await wait_for_stop(stop, self._gather):
                break
            retry_in = await self._pass()
            if retry_in is not None and await wait_for_stop(stop, retry_in):
                break
        if self._final:
            await self._work()

    async def _pass(self) -> float | None:
        """One pass; None when it succeeded, else the delay before the next one."""
        started = self._clock()
        try:
            await self._work()
        except Exception as exc:
            if self._failing_since is None:
                self._failing_since = started
            self._failures += 1
            self._wake.set()  # the work is still owed, after a restart too
            failing_for = self._clock() - self._failing_since
            if failing_for >= self._give_up_after:
                log.error(
                    "batch failing",
                    batch=self.name,
                    failures=self._failures,
                    failing_for=round(failing_for, 3),
                    error=str(exc),
                )
                raise
            retry_in = self._backoff.delay(self._failures - 1)
            log.warning(
                "batch failed",
                batch=self.name,
                failures=self._failures,
                retry_in=retry_in,
                error=str(exc),
            )
            return retry_in
        if self._failures:
            log.info("batch recovered", batch=self.name, failures=self._failures)
        self._failures = 0
        self._failing_since = None
        return None


async def wake_or_stop(wake: asyncio.Event, stop: asyncio.Event) -> None:
    """Wait until ``wake`` or ``stop`` is set; clears ``wake`` (level-based: one wake-up
    handles everything marked so far)."""
    waiter = asyncio.ensure_future(wake.wait())
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        stopper.cancel()
    wake.clear()
