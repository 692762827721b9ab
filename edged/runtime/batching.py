"""Adaptive dynamic batching in the worker (pure: the queue's shape and recent timings in).

* :func:`hold_queue`: how much longer to hold queued requests before running them. When fewer
  requests are queued than were recently in flight at once (the clients of the last batch are
  about to come back), wait for them: at most ``max_queue_delay`` and at most half the last
  batch's run time, counted from when the worker could first have run the oldest request (it
  went idle, or the request came). A lone client (peak 1) never waits; nor does a full batch.
* :func:`choose_batch`: which queued requests run together: the oldest, then each later one
  with the same batch key (input dtypes, trailing shapes, requested outputs) while the rows
  still fit in ``max_rows``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QueueShape:
    """The worker's queue and recent history, as :func:`hold_queue` needs them."""

    queued: int  # requests waiting
    queued_rows: int  # their rows
    oldest_enqueued: float  # monotonic time the oldest one arrived
    idle_since: float  # monotonic time the last batch finished
    recent_peak: int  # most requests in flight at once over the last few batches
    last_run_s: float  # how long the last batch ran


def hold_queue(shape: QueueShape, *, max_rows: int, max_queue_delay: float, now: float) -> float:
    """Seconds to keep holding the queue; zero or less: run a batch now."""
    delay = min(max_queue_delay, shape.last_run_s / 2)
    if delay <= 0:
        return 0.0
    expected = min(shape.recent_peak, max_rows)
    if shape.queued >= expected or shape.queued_rows >= max_rows:
        return 0.0
    start = max(shape.oldest_enqueued, shape.idle_since)
    return start + delay - now


def choose_batch(
    queue: Iterable[tuple[Hashable, int]], *, max_rows: int, batchable: bool
) -> list[int]:
    """Positions in ``queue`` (``(batch key, rows)`` of each request, oldest first) of the
    requests to run as one batch; reads ``queue`` only as far as it needs to."""
    items = iter(queue)
    first_key, rows = next(items)
    chosen = [0]
    if not batchable:
        return chosen
    for i, (key, n) in enumerate(items, 1):
        if rows >= max_rows:
            break
        if key == first_key and rows + n <= max_rows:
            chosen.append(i)
            rows += n
    return chosen
