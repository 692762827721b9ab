"""The worker's adaptive batching policy as tables: queue shape and timings in, decision out."""

from __future__ import annotations

import itertools
from collections.abc import Hashable

import pytest

from edged.runtime.batching import QueueShape, choose_batch, hold_queue

T = 10.0  # "now", monotonic seconds
MS = 0.001


def shape(**kw: float) -> QueueShape:
    """Two requests of one row each queued; four were in flight at the peak; the last batch
    ran 4 ms; the oldest request came 0.5 ms ago, after the worker went idle."""
    defaults: dict[str, float] = {
        "queued": 2,
        "queued_rows": 2,
        "oldest_enqueued": T - 0.5 * MS,
        "idle_since": T - 1 * MS,
        "recent_peak": 4,
        "last_run_s": 4 * MS,
    }
    defaults.update(kw)
    return QueueShape(
        queued=int(defaults["queued"]),
        queued_rows=int(defaults["queued_rows"]),
        oldest_enqueued=defaults["oldest_enqueued"],
        idle_since=defaults["idle_since"],
        recent_peak=int(defaults["recent_peak"]),
        last_run_s=defaults["last_run_s"],
    )


MAX_DELAY = 2 * MS  # maxQueueDelay of most cases

HOLDS = {
    # -- waiting for the clients of the last batch ---------------------------------------------
    "fewer queued than the recent peak: hold for the rest of maxQueueDelay": (
        shape(),
        MAX_DELAY,
        1.5 * MS,
    ),
    "queued behind a running batch: counted from when the worker went idle": (
        shape(oldest_enqueued=T - 3 * MS, idle_since=T - 0.5 * MS),
        MAX_DELAY,
        1.5 * MS,
    ),
    "held long enough: run now": (
        shape(oldest_enqueued=T - 3 * MS, idle_since=T - 3 * MS),
        MAX_DELAY,
        -1 * MS,
    ),
    "a fast model holds at most half its last run": (
        shape(last_run_s=1 * MS, oldest_enqueued=T - 0.2 * MS),
        MAX_DELAY,
        0.3 * MS,
    ),
    # -- no waiting ---------------------------------------------------------------------------
    "a lone client never waits": (shape(queued=1, queued_rows=1, recent_peak=1), MAX_DELAY, 0.0),
    "as many queued as the peak: run now": (shape(queued=4, queued_rows=4), MAX_DELAY, 0.0),
    "the queued rows fill a batch: run now": (shape(queued_rows=8), MAX_DELAY, 0.0),
    "a peak above maxBatchSize expects only a full batch": (
        shape(queued=8, queued_rows=8, recent_peak=20),
        MAX_DELAY,
        0.0,
    ),
    "maxQueueDelay 0: never wait": (shape(), 0.0, 0.0),
    "no run time measured: never wait": (shape(last_run_s=0.0), MAX_DELAY, 0.0),
}


@pytest.mark.parametrize(("queue", "max_delay", "wait"), HOLDS.values(), ids=HOLDS.keys())
def test_hold_queue(queue: QueueShape, max_delay: float, wait: float) -> None:
    held = hold_queue(queue, max_rows=8, max_queue_delay=max_delay, now=T)
    assert held == pytest.approx(wait, abs=1e-9)


BATCHES: dict[str, tuple[list[tuple[Hashable, int]], bool, list[int]]] = {
    "not batchable: one request at a time": ([("f32", 1), ("f32", 1)], False, [0]),
    "same key: everything that fits": ([("f32", 1), ("f32", 2), ("f32", 1)], True, [0, 1, 2]),
    "another key is left for a later batch": ([("f32", 1), ("i64", 1), ("f32", 2)], True, [0, 2]),
    "full: the rest waits": ([("f32", 4), ("f32", 4), ("f32", 1)], True, [0, 1]),
    "too many rows for what is left: a smaller one after it joins": (
        [("f32", 6), ("f32", 4), ("f32", 2)],
        True,
        [0, 2],
    ),
    "the first request alone": ([("f32", 8)], True, [0]),
}


@pytest.mark.parametrize(("queue", "batchable", "chosen"), BATCHES.values(), ids=BATCHES.keys())
def test_choose_batch(
    queue: list[tuple[Hashable, int]], batchable: bool, chosen: list[int]
) -> None:
    assert choose_batch(queue, max_rows=8, batchable=batchable) == chosen


def test_choose_batch_reads_the_queue_only_until_the_batch_is_full() -> None:
    endless = itertools.repeat(("f32", 1))
    assert choose_batch(endless, max_rows=8, batchable=True) == list(range(8))
