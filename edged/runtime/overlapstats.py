"""What a worker's overlapped work was, as edged counts it (pure: reports in, deltas out).

A worker that runs its model in the runner thread (``overlapping.py``) keeps three running
totals of the work its event loop did while ONNX Runtime ran a batch: requests decoded,
answers encoded, and batches handed over before the running one ended (``staged``). It sends
them in every PONG under ``overlap`` (``framing.py``). edged turns the totals into increments
of its counters (``edged_inference_overlapped_decodes_total`` and friends,
``serving/inference.py``): per process, since a restarted worker counts from zero again; as
the batch totals are (``batchstats.py``).

A worker runs a model edged does not trust, so a report is checked against what edged itself
saw on the worker's socket before it counts: whole, non-negative numbers below
:data:`MAX_TOTAL` that never go down; no more requests decoded, and no more batches handed
over (each holds a request of its own), than edged sent the worker since the last report plus
those it had not answered then (sent before that report, they may be read after it); no more
answers encoded than answers edged received since the last report (a worker writes each
answer as it encodes it, and its PONG after them on the same stream). These bounds need no
clock. On the connections edged hands the worker (``direct.py``) it sees no request, so
there the bounds are the answers the worker reported (``ANSWERED``) and the requests it
says it holds, at most what those connections can hold (``MAX_PIPELINED`` each). A report
that breaks a rule adds nothing; counting starts again from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_TOTAL = 2**53
"""A total at or above this is refused: a counter is a float, exact up to here."""

FIELDS = ("decoded", "encoded", "staged")


@dataclass(frozen=True, slots=True)
class OverlapTotals:
    """Running totals of a worker's overlapped work, or an increment of them."""

    decoded: int = 0
    encoded: int = 0
    staged: int = 0


@dataclass(frozen=True, slots=True)
class ChannelCounts:
    """What edged saw on one worker's socket, as of a report: INFER frames it sent, answers
    it received for them, and requests it had sent and not been answered (in flight); of
    those answers, the errors (a status of 500 or more) and the seconds edged measured from
    writing each request to reading its answer (``answerstats.py``)."""

    sent: int = 0
    answered: int = 0
    inflight: int = 0
    errors: int = 0
    answered_s: float = 0.0
    # on the connections handed to the worker (direct.py): the answers it reported (all
    # codes), and the requests it says it holds, at most what those connections can hold
    direct_answered: int = 0
    direct_inflight: int = 0


def from_pong(doc: dict[str, Any]) -> tuple[OverlapTotals | None, str]:
    """The totals in a PONG, or None and why not ("" when the PONG has none: a worker of an
    older edged)."""
    if "overlap" not in doc:
        return None, ""
    overlap = doc["overlap"]
    if type(overlap) is not dict:
        return None, "overlap is not an object"
    got: list[int] = []
    for name in FIELDS:
        value = overlap.get(name)
        if type(value) is not int:
            return None, f"overlap.{name} is not a whole number"
        if not 0 <= value < MAX_TOTAL:
            return None, f"overlap.{name} is {value}, not in [0, 2^53)"
        got.append(value)
    return OverlapTotals(*got), ""


def advance(
    seen: OverlapTotals, report: OverlapTotals, *, then: ChannelCounts, now: ChannelCounts
) -> tuple[OverlapTotals | None, str]:
    """The increment from ``seen`` (the last report counted) to ``report``; or None and why it
    cannot be right. ``then``: the worker's socket as of ``seen``; ``now``: as of ``report``
    (both of the same connection)."""
    delta = OverlapTotals(
        report.decoded - seen.decoded,
        report.encoded - seen.encoded,
        report.staged - seen.staged,
    )
    for name in FIELDS:
        if getattr(delta, name) < 0:
            return None, f"overlap.{name} went down"
    direct = max(0, now.direct_answered - then.direct_answered)
    readable = (
        max(0, now.sent - then.sent)
        + max(0, then.inflight)
        + direct
        + max(0, now.direct_inflight)
        + max(0, then.direct_inflight)
    )
    if delta.decoded > readable:
        return None, f"{delta.decoded} requests decoded of {readable} it could read"
    if delta.staged > readable:
        return None, f"{delta.staged} batches handed over with {readable} requests to read"
    answered = max(0, now.answered - then.answered) + direct
    if delta.encoded > answered:
        return None, f"{delta.encoded} answers encoded, {answered} received"
    return delta, ""
