"""What a worker says it answered on the connections edged handed it (pure: bytes in, checked
answers out; issue 34, item 1, ``direct.py``).

edged no longer sees those answers, so the worker reports each one (``ANSWERED``: its status
and the seconds from reading the request to writing its answer), and edged counts them as
it counts the answers it forwards: per revision (the canary analysis' requests, errors and
latency), in ``edged_inference_requests_total`` and its latency histogram, and in the
autoscaler's queue meter. A worker runs a model edged does not trust, so a report is held to
bounds before anything of it counts: a whole number of entries, at least one and at most
:data:`MAX_ANSWERS` (the worker reports what it answered every 50 ms at most); statuses of
real HTTP answers (100-599); seconds that are finite, not negative, and no
more than the worker process has lived. And at each PONG, the successful answers it
reported so far may not outnumber the requests in the batches it says it ran
(:func:`more_than_batched`; those totals are themselves bounded by the clock,
``batchstats.py``). A report that breaks a rule is dropped, and the process's later reports
are not counted (logged once).
"""

from __future__ import annotations

import math
import struct

ANSWER = struct.Struct("!Hf")
CLOCK_SLACK_S = 1.0
MAX_ANSWERS = 1024  # entries in one report (the worker sends what it answered every 50 ms)


def parse(
    payload: bytes, *, age_s: float, max_answers: int = MAX_ANSWERS
) -> tuple[list[tuple[int, float]] | None, str]:
    """The (status, seconds) of an ANSWERED frame, or None and why not."""
    n, rest = divmod(len(payload), ANSWER.size)
    if rest or n == 0:
        return None, f"an ANSWERED frame of {len(payload)} bytes"
    if n > max_answers:
        return None, f"{n} answers in one report, more than {max_answers}"
    out: list[tuple[int, float]] = []
    for status, seconds in ANSWER.iter_unpack(payload):
        if not 100 <= status <= 599:
            return None, f"status {status}"
        if not (math.isfinite(seconds) and 0.0 <= seconds <= age_s + CLOCK_SLACK_S):
            return None, f"{seconds} s held by a process {age_s:.1f} s old"
        out.append((status, float(seconds)))
    return out, ""


def more_than_batched(direct_ok: int, batched_requests: int) -> str:
    """Why the successful answers reported cannot be right ("" when they can)."""
    if direct_ok > batched_requests:
        return f"{direct_ok} successful answers, {batched_requests} requests batched"
    return ""
