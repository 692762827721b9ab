"""What a worker answered, as it reports it and as edged counts it (pure: reports in, deltas
out; the worker's own tally, :class:`AnswerTally`, is here too, standard library only).

A worker keeps running totals of the answers it wrote: how many, how many were errors (a
status of 500 or more), the seconds it held them (from reading a request to writing its
answer: decoding, queueing, ONNX Runtime, encoding) and those seconds as histogram counts
over :data:`BOUNDS` (one count per bucket, the last for above the last bound; a value falls
in the first bucket whose bound is at or above it, as ``edgefleet.metrics`` histograms do).
It sends them in every PONG under ``answers`` (``framing.py``). edged turns them into
increments of ``edged_inference_worker_duration_seconds`` and
``edged_inference_worker_errors_total`` (``serving/inference.py``): per process, as the batch
and overlap totals are (``batchstats.py``, ``overlapstats.py``).

These are the figures a worker that serves its clients' connections itself would report for
canary analysis (docs/edged.md, "The control process and the data path"). Today edged sees
every answer too, so the worker's report is held to edged's own count of the same answers.
A worker runs a model edged does not trust, so a report is checked before it counts: whole,
non-negative numbers below :data:`MAX_TOTAL` that never go down; a finite, non-negative
number of seconds; as many histogram counts as buckets, summing to the answers; no more
errors than answers; seconds that fit the buckets the answers fall in; no more answers, and
no more errors, than edged received from the worker since the last report (a worker counts
an answer when it writes it, and its PONG after it on the same stream); no more seconds than
edged measured for those answers (it starts its clock before the worker reads the request
and stops it after the answer is read), plus :data:`CLOCK_SLACK_S`. A report that breaks a
rule adds nothing; counting starts again from it.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

from edged.runtime.overlapstats import MAX_TOTAL, ChannelCounts

BOUNDS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
"""The histogram's bucket bounds in seconds (edged's request-duration histograms' too)."""

BUCKETS = len(BOUNDS) + 1  # the last one: above the last bound
CLOCK_SLACK_S = 0.5
"""Seconds a report may exceed edged's own measure of the same answers by (two clocks)."""
_EPSILON = 1e-9  # per answer: float sums of bucketed values


class AnswerTally:
    """The worker's running totals (mutable; sent in each PONG)."""

    __slots__ = ("buckets", "count", "errors", "seconds")

    def __init__(self) -> None:
        self.count = 0
        self.errors = 0
        self.seconds = 0.0
        self.buckets = [0] * BUCKETS

    def record(self, status: int, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.count += 1
        if status >= 500:
            self.errors += 1
        self.seconds += seconds
        self.buckets[bisect.bisect_left(BOUNDS, seconds)] += 1

    def to_pong(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "errors": self.errors,
            "seconds": self.seconds,
            "buckets": list(self.buckets),
        }


@dataclass(frozen=True, slots=True)
class AnswerTotals:
    """Running totals of a worker's answers, or an increment of them."""

    count: int = 0
    errors: int = 0
    seconds: float = 0.0
    buckets: tuple[int, ...] = (0,) * BUCKETS


def _whole(value: object, what: str) -> tuple[int | None, str]:
    if type(value) is not int:
        return None, f"answers.{what} is not a whole number"
    if not 0 <= value < MAX_TOTAL:
        return None, f"answers.{what} is {value}, not in [0, 2^53)"
    return value, ""


def from_pong(doc: dict[str, Any]) -> tuple[AnswerTotals | None, str]:
    """The totals in a PONG, or None and why not ("" when the PONG has none: a worker of an
    older edged)."""
    if "answers" not in doc:
        return None, ""
    answers = doc["answers"]
    if type(answers) is not dict:
        return None, "answers is not an object"
    count, why = _whole(answers.get("count"), "count")
    if count is None:
        return None, why
    errors, why = _whole(answers.get("errors"), "errors")
    if errors is None:
        return None, why
    seconds = answers.get("seconds")
    if type(seconds) is int:
        seconds = float(seconds)
    if type(seconds) is not float or not math.isfinite(seconds) or seconds < 0:
        return None, "answers.seconds is not a finite number of seconds"
    buckets = answers.get("buckets")
    if type(buckets) is not list or len(buckets) != BUCKETS:
        return None, f"answers.buckets is not a list of {BUCKETS} counts"
    got: list[int] = []
    for i, value in enumerate(buckets):
        n, why = _whole(value, f"buckets[{i}]")
        if n is None:
            return None, why
        got.append(n)
    if sum(got) != count:
        return None, f"answers.buckets sum to {sum(got)}, not count {count}"
    if errors > count:
        return None, f"answers.errors ({errors}) exceed answers.count ({count})"
    return AnswerTotals(count, errors, seconds, tuple(got)), ""


def seconds_range(buckets: tuple[int, ...]) -> tuple[float, float]:
    """The least and most seconds answers counted in ``buckets`` can add up to (the most is
    infinite when one is above the last bound)."""
    low = sum(n * BOUNDS[i - 1] for i, n in enumerate(buckets) if i > 0 and n)
    if buckets[-1]:
        return low, math.inf
    return low, sum(n * BOUNDS[i] for i, n in enumerate(buckets[:-1]) if n)


def advance(
    seen: AnswerTotals, report: AnswerTotals, *, then: ChannelCounts, now: ChannelCounts
) -> tuple[AnswerTotals | None, str]:
    """The increment from ``seen`` (the last report counted) to ``report``; or None and why it
    cannot be right. ``then``: the worker's socket as of ``seen``; ``now``: as of ``report``
    (both of the same connection)."""
    buckets = tuple(r - s for r, s in zip(report.buckets, seen.buckets, strict=True))
    delta = AnswerTotals(
        report.count - seen.count,
        report.errors - seen.errors,
        report.seconds - seen.seconds,
        buckets,
    )
    if delta.count < 0 or delta.errors < 0 or any(n < 0 for n in buckets):
        return None, "an answer total went down"
    if delta.seconds < -_EPSILON * max(1, report.count):
        return None, "answers.seconds went down"
    low, high = seconds_range(buckets)
    slack = _EPSILON * max(1, report.count)
    if not low - slack <= delta.seconds <= high + slack:
        return None, f"{delta.seconds:.6f} s do not fit the buckets ({low:.6f} to {high:.6f} s)"
    received = max(0, now.answered - then.answered)
    if delta.count > received:
        return None, f"{delta.count} answers, {received} received"
    errors = max(0, now.errors - then.errors)
    if delta.errors > errors:
        return None, f"{delta.errors} errors, {errors} received"
    measured = max(0.0, now.answered_s - then.answered_s)
    if delta.seconds > measured + CLOCK_SLACK_S:
        return None, f"{delta.seconds:.3f} s held, {measured:.3f} s measured by edged"
    return AnswerTotals(delta.count, delta.errors, max(0.0, delta.seconds), buckets), ""
