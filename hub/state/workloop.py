"""A hub controller's loop over its work queue of keys (controller-runtime's contract).

Producers — the cache's change feed (:mod:`hub.state.feed`), an operator's action, the slow
periodic resync — only :meth:`KeyLoop.add` a key; the loop takes one key at a time from its
:class:`edgefleet.workqueue.WorkQueue` (a key waits at most once, is never reconciled twice at
once) and calls ``reconcile(key)``:

* it returns None: done, the key's backoff is forgotten;
* it returns seconds: done, and the key comes back after them (``RequeueAfter``: a rollout in
  progress looks again at its timers);
* it raises: the key comes back after its own exponential backoff, owned by the queue
  (``add_rate_limited``). A failure that **persists** — every reconcile failed for
  ``give_up_after`` seconds, whatever the key — is raised from :meth:`run`, so that it reaches
  :func:`edgefleet.supervising.supervise` (a critical controller stops the hub); the keys
  stay owed, and one success ends the streak, as in :mod:`hub.state.batchloop`.

Every ``resync`` seconds ``keys()`` are all added (the safety net; the only whole-fleet look).
:meth:`drain` reconciles what is queued now, in the caller's task (tests, benchmarks).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Generic, TypeVar

from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop
from edgefleet.workqueue import WorkQueue
from hub.state.batchloop import GIVE_UP_AFTER

log = get_logger(__name__)

K = TypeVar("K", bound=Hashable)

RESYNC = 300.0
"""Seconds between two resyncs of every key, by default."""


class KeyLoop(Generic[K]):
    """Reconciles keys one at a time from a work queue (see the module doc)."""

    def __init__(
        self,
        name: str,
        reconcile: Callable[[K], Awaitable[float | None]],
        *,
        keys: Callable[[], Iterable[K]],
        resync: float = RESYNC,
        base_delay: float = 0.05,
        max_delay: float = 10.0,
        give_up_after: float = GIVE_UP_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._reconcile = reconcile
        self._keys = keys
        self._resync = resync
        self._give_up_after = give_up_after
        self._clock = clock
        self.queue: WorkQueue[K] = WorkQueue(
            name, base_delay=base_delay, max_delay=max_delay, clock=clock
        )
        self._failing_since: float | None = None
        self._running = False
        self._progress = asyncio.Event()  # set after each key and when the loop ends
        self.reconciled = 0  # keys reconciled (successfully or not), for tests and metrics

    def add(self, key: K) -> None:
        self.queue.add(key)

    def add_all(self, keys: Iterable[K]) -> None:
        for key in keys:
            self.queue.add(key)

    def resync(self) -> None:
        self.add_all(self._keys())

    async def run(self, stop: asyncio.Event) -> None:
        """Reconcile keys until ``stop``; raises a failure that persists (module doc)."""
        ticker = asyncio.create_task(self._resyncs(stop))
        getter: asyncio.Task[K] | None = None
        stopper = asyncio.ensure_future(stop.wait())
        self._running = True
        try:
            while not stop.is_set():
                getter = asyncio.ensure_future(self.queue.get())
                await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    break
                await self._one(getter.result())
                getter = None
        finally:
            self._running = False
            self._progress.set()
            ticker.cancel()
            stopper.cancel()
            if getter is not None:
                getter.cancel()

    async def settled(self) -> None:
        """Wait until the keys queued now are reconciled (none delayed counts), while the loop
        runs: a writer that answers once its write was acted on (an apply answers once its
        revisions exist). Returns at once when the loop does not run."""
        while self._running and (len(self.queue) or self.queue.processing):
            self._progress.clear()
            await self._progress.wait()

    async def drain(self) -> None:
        """Reconcile every key queued now (and those queued meanwhile), here; raises the
        first failure after queueing its key again."""
        while len(self.queue):
            await self._one(await self.queue.get(), persist=False)

    async def _resyncs(self, stop: asyncio.Event) -> None:
        self.resync()  # a start (or a restart after a failure) looks at everything once
        while not await wait_for_stop(stop, self._resync):
            self.resync()

    async def _one(self, key: K, *, persist: bool = True) -> None:
        started = self._clock()
        try:
            again = await self._reconcile(key)
        except Exception as exc:
            self.queue.done(key)
            retry_in = self.queue.add_rate_limited(key)
            if self._failing_since is None:
                self._failing_since = started
            failing_for = self._clock() - self._failing_since
            if not persist or failing_for >= self._give_up_after:
                log.error(
                    "reconcile failing",
                    controller=self.name,
                    key=str(key),
                    failing_for=round(failing_for, 3),
                    error=str(exc),
                )
                raise
            log.warning(
                "reconcile failed",
                controller=self.name,
                key=str(key),
                retry_in=round(retry_in, 3),
                error=str(exc),
            )
            return
        finally:
            self.reconciled += 1
            self._progress.set()
        self.queue.done(key)
        self.queue.forget(key)
        self._failing_since = None
        if again is not None:
            self.queue.add_after(key, again)
