"""What a worker's batching did, as edged counts it (pure: reports in, deltas out).

A worker keeps three running totals of the batches it ran to completion: how many, the
requests merged into them (requests / batches is how well batching merges) and the seconds
ONNX Runtime spent in them (``session.run`` only: no decoding, no encoding). It sends them in
every PONG (``framing.py``). edged turns the totals into increments of its counters
(``edged_inference_batches_total`` and friends, ``serving/inference.py``): per process, since
a restarted worker counts from zero again.

A worker runs a model edged does not trust, so a report is checked before it counts: whole,
non-negative numbers that never go down; at least one request and at most ``maxBatchSize``
requests per batch (each takes a row at least); no more ONNX Runtime seconds than could have
passed: the wall-clock time since the last report, plus how long the batch running then had
already run (its ``busy_s``; batches run one at a time). A report that breaks a rule adds
nothing; counting starts again from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

CLOCK_SLACK_S = 0.5
"""Compute seconds a report may exceed the time that could have passed by (two clocks, and
when each end read them)."""


@dataclass(frozen=True, slots=True)
class BatchCounts:
    """Running totals of a worker's batches, or an increment of them."""

    batches: int = 0
    requests: int = 0
    compute_s: float = 0.0

    def to_pong(self) -> dict[str, Any]:
        return {"batches": self.batches, "requests": self.requests, "compute_s": self.compute_s}


def from_pong(doc: dict[str, Any]) -> BatchCounts | None:
    """The totals in a PONG; None when they are missing or not numbers of the right kind."""
    batches, requests = doc.get("batches"), doc.get("requests")
    seconds = doc.get("compute_s")
    if type(batches) is not int or type(requests) is not int:
        return None
    if type(seconds) is int:
        seconds = float(seconds)
    if type(seconds) is not float or not math.isfinite(seconds):
        return None
    if batches < 0 or requests < 0 or seconds < 0:
        return None
    return BatchCounts(batches, requests, seconds)


def advance(
    seen: BatchCounts, report: BatchCounts, *, max_batch: int, wall_s: float
) -> tuple[BatchCounts | None, str]:
    """The increment from ``seen`` (the last report counted) to ``report``; or None and why it
    cannot be right. ``wall_s``: the most ONNX Runtime time that can lie between them (seconds
    since ``seen`` came, plus the ``busy_s`` it came with)."""
    delta = BatchCounts(
        report.batches - seen.batches,
        report.requests - seen.requests,
        report.compute_s - seen.compute_s,
    )
    if delta.batches < 0 or delta.requests < 0 or delta.compute_s < 0:
        return None, "a total went down"
    if delta.requests < delta.batches:
        return None, f"{delta.requests} requests in {delta.batches} batches"
    if delta.requests > delta.batches * max(1, max_batch):
        return None, f"{delta.requests} requests in {delta.batches} batches of at most {max_batch}"
    if delta.compute_s > max(0.0, wall_s) + CLOCK_SLACK_S:
        return None, f"{delta.compute_s:.3f} s of compute in {wall_s:.3f} s"
    return delta, ""
