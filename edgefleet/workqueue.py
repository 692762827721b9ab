"""A work queue of keys with de-duplication, delays and per-key backoff (client-go semantics):
edged's reconcilers and the hub's controllers (:mod:`hub.state.workloop`) each run on one.

Producers (udev events, hub pushes, worker exits, the periodic resync) only ``add`` a key; the
runner's workers ``get`` keys, reconcile them and call ``done``. The queue guarantees:

* a key waits at most once: adding a key that is already waiting does nothing;
* a key is never handed to two workers at once: a key added while it is being processed is
  marked dirty and queued again when ``done(key)`` is called;
* ``add_after`` delays a key; a key already scheduled keeps the earliest deadline. All delays
  share ONE timer (``loop.call_later`` for the earliest deadline of a heap), so an idle queue
  causes no wake-ups at all;
* ``add_rate_limited`` delays a key by its own exponential backoff with jitter; ``forget`` resets
  it once the key reconciled successfully.

Backoff (:class:`edgefleet.backoff.Backoff` with equal jitter): ``delay = min(base *
2**failures, max) * uniform(1 - jitter, 1]``. The defaults (base 50 ms, max 300 s, jitter
0.5) are chosen for devices, not for an API server: Kubernetes starts at 5 ms, which on a
device only burns CPU retrying a fault that needs at least tens of milliseconds to clear (a USB
camera re-enumerating, a worker restarting), and caps at 1000 s, which is too long for a device
to sit without its model after, say, a network outage. "Equal jitter" (multiply by a factor in
(1 - jitter, 1]) spreads out a fleet of devices retrying the same hub at once, never exceeds
the cap, and with jitter 0.5 never drops below half the delay.

After ``shutdown()`` every ``get()`` raises :class:`QueueShutDown`, waiting keys are dropped
and new adds are ignored: state is level-based, so a restarted daemon's resync re-adds them.

The queue must be used from inside the event loop it belongs to; it has no locks.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from edgefleet.backoff import Backoff, Jitter

K = TypeVar("K", bound=Hashable)

DEFAULT_BASE_DELAY = 0.05
DEFAULT_MAX_DELAY = 300.0
DEFAULT_JITTER = 0.5


class QueueShutDown(Exception):
    """Raised by :meth:`WorkQueue.get` once the queue is shut down.

    Control flow, not an error (named like Python 3.13's ``asyncio.QueueShutDown``), hence not
    an :class:`~edgefleet.errors.EdgefleetError`.
    """


class WorkQueue(Generic[K]):
    """De-duplicating asyncio work queue with delayed and rate-limited adds.

    ``rng`` (a :class:`random.Random`) and ``clock`` (monotonic seconds) can be injected for
    tests. Deadlines are kept in ``clock`` time and the timer is armed with the remaining delay,
    so a fake clock works too: after advancing it, ``get()`` and ``len()`` see the keys that
    became due without waiting for the timer.
    """

    def __init__(
        self,
        name: str = "",
        *,
        base_delay: float = DEFAULT_BASE_DELAY,
        max_delay: float = DEFAULT_MAX_DELAY,
        jitter: float = DEFAULT_JITTER,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not base_delay > 0:
            raise ValueError(f"base_delay must be > 0, got {base_delay}")
        if not max_delay >= base_delay:
            raise ValueError(f"max_delay must be >= base_delay, got {max_delay}")
        if not 0 <= jitter <= 1:
            raise ValueError(f"jitter must be between 0 and 1, got {jitter}")
        self.name = name
        self._backoff = Backoff(base_delay, max_delay, Jitter.EQUAL, fraction=jitter)
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock

        self._queue: deque[K] = deque()  # keys waiting now, in order
        self._dirty: set[K] = set()  # keys that need processing (waiting, or re-queued at done)
        self._processing: set[K] = set()  # keys handed out and not done yet
        self._getters: deque[asyncio.Future[None]] = deque()
        self._shut_down = False

        self._deadlines: dict[K, float] = {}  # delayed keys -> earliest deadline (clock time)
        self._heap: list[tuple[float, int, K]] = []  # may hold stale entries, never at the top
        self._seq = itertools.count()  # ties in the heap never compare keys
        self._timer: asyncio.TimerHandle | None = None
        self._timer_deadline = 0.0

        self._failures: dict[K, int] = {}

    # -- state ------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Keys waiting to be processed now (the queue depth)."""
        self._promote_due()
        return len(self._queue)

    @property
    def delayed(self) -> int:
        """Keys waiting for a deadline (``add_after``, ``add_rate_limited``)."""
        self._promote_due()
        return len(self._deadlines)

    @property
    def processing(self) -> int:
        """Keys handed out by ``get()`` and not yet ``done()``."""
        return len(self._processing)

    @property
    def next_wakeup(self) -> float | None:
        """Clock time at which the queue's one timer fires; None when no timer is armed."""
        return self._timer_deadline if self._timer is not None else None

    @property
    def is_shut_down(self) -> bool:
        return self._shut_down

    # -- adding -----------------------------------------------------------------------------

    def add(self, key: K) -> None:
        """Queue ``key`` now, unless it is already waiting; if it is being processed, queue it
        again when ``done(key)`` is called."""
        if self._shut_down or key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return
        self._queue.append(key)
        self._wake_one()

    def add_after(self, key: K, delay: float) -> None:
        """Queue ``key`` after ``delay`` seconds; a key already scheduled keeps the earliest."""
        if self._shut_down:
            return
        if delay <= 0:
            self.add(key)
            return
        deadline = self._clock() + delay
        current = self._deadlines.get(key)
        if current is not None and current <= deadline:
            return
        self._deadlines[key] = deadline
        heapq.heappush(self._heap, (deadline, next(self._seq), key))
        if len(self._heap) > 64 and len(self._heap) > 4 * len(self._deadlines):
            self._compact_heap()
        self._arm_timer()

    def add_rate_limited(self, key: K) -> float:
        """Queue ``key`` after its own exponential backoff; return the delay used."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = self._backoff.delay(failures, self._rng)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """Reset the backoff of ``key`` (after it was reconciled successfully)."""
        self._failures.pop(key, None)

    def num_requeues(self, key: K) -> int:
        """How many times ``key`` was rate-limited since it was last forgotten."""
        return self._failures.get(key, 0)

    # -- consuming --------------------------------------------------------------------------

    async def get(self) -> K:
        """Wait for a key and mark it as processing; the caller must call ``done(key)``.

        Raises :class:`QueueShutDown` once the queue is shut down.
        """
        while True:
            if self._shut_down:
                raise QueueShutDown(self.name)
            self._promote_due()
            if self._queue:
                key = self._queue.popleft()
                self._dirty.discard(key)
                self._processing.add(key)
                return key
            getter = asyncio.get_running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except BaseException:
                getter.cancel()
                try:
                    self._getters.remove(getter)
                except ValueError:
                    pass
                if getter.done() and not getter.cancelled():
                    # We were woken for a key but got cancelled: pass the wake-up on.
                    self._wake_one()
                raise

    def done(self, key: K) -> None:
        """Mark ``key`` as processed; if it was added meanwhile, queue it again."""
        if key not in self._processing:
            return
        self._processing.discard(key)
        if key in self._dirty and not self._shut_down:
            self._queue.append(key)
            self._wake_one()

    def shutdown(self) -> None:
        """Stop handing out keys: waiting and future ``get()`` calls raise QueueShutDown."""
        if self._shut_down:
            return
        self._shut_down = True
        self._queue.clear()
        self._dirty.clear()
        self._deadlines.clear()
        self._heap.clear()
        self._cancel_timer()
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)

    # -- internals --------------------------------------------------------------------------

    def _wake_one(self) -> None:
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return

    def _promote_due(self, now: float | None = None) -> None:
        """Move every delayed key whose deadline has passed to the queue."""
        if not self._heap:
            return
        if now is None:
            now = self._clock()
        if self._heap[0][0] > now:
            return
        while self._heap and self._heap[0][0] <= now:
            deadline, _, key = heapq.heappop(self._heap)
            if self._deadlines.get(key) == deadline:
                del self._deadlines[key]
                self.add(key)
        self._arm_timer()

    def _drop_stale_top(self) -> None:
        heap = self._heap
        while heap and self._deadlines.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)

    def _compact_heap(self) -> None:
        self._heap = [e for e in self._heap if self._deadlines.get(e[2]) == e[0]]
        heapq.heapify(self._heap)

    def _arm_timer(self) -> None:
        """Keep exactly one timer, for the earliest live deadline; none when nothing is delayed."""
        self._drop_stale_top()
        if not self._heap:
            self._cancel_timer()
            return
        deadline = self._heap[0][0]
        if self._timer is not None:
            if self._timer_deadline == deadline:
                return
            self._timer.cancel()
        delay = max(0.0, deadline - self._clock())
        self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)
        self._timer_deadline = deadline

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        self._timer = None
        # The timer was armed for this deadline: treat it as reached even if the loop's clock
        # fired a hair early, so the timer never spins.
        self._promote_due(max(self._clock(), self._timer_deadline))
        self._arm_timer()
