"""The answers a worker reports, as edged counts them: a PONG in, a checked increment out
(tables, hostile reports among them); the worker's own tally round-tripping through a PONG;
and a replica that counts each process's increments, refusing a report that breaks a rule
once in its log. A real worker's report: tests/runtime/test_overlap.py; edged's metrics:
tests/e2e/test_overlap_metrics.py."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from workerprocess import launch_spec

from edged.runtime import processes
from edged.runtime.answerstats import (
    BOUNDS,
    BUCKETS,
    MAX_TOTAL,
    AnswerTally,
    AnswerTotals,
    advance,
    from_pong,
    seconds_range,
)
from edged.runtime.channel import ReplicaChannel
from edged.runtime.launching import SandboxSpec
from edged.runtime.overlapstats import ChannelCounts
from edged.workloads import WorkloadName
from edgefleet.api import Probe, Probes
from edgefleet.metrics import Registry


def _buckets(**at: int) -> list[int]:
    """Bucket counts, ``b3=2``: two answers in the bucket of ``BOUNDS[3]`` (1 ms)."""
    out = [0] * BUCKETS
    for key, n in at.items():
        out[int(key[1:])] = n
    return out


def _doc(count: Any = 2, errors: Any = 0, seconds: Any = 0.0015, buckets: Any = None) -> Any:
    return {
        "answers": {
            "count": count,
            "errors": errors,
            "seconds": seconds,
            "buckets": _buckets(b3=2) if buckets is None else buckets,
        }
    }


PONGS: dict[str, tuple[dict[str, Any], AnswerTotals | None, str]] = {
    "totals": (_doc(), AnswerTotals(2, 0, 0.0015, tuple(_buckets(b3=2))), ""),
    "seconds as a whole number": (
        _doc(1, 0, 2, _buckets(b13=1)),
        AnswerTotals(1, 0, 2.0, tuple(_buckets(b13=1))),
        "",
    ),
    "none (a worker of an older edged): nothing to say": ({"inflight": 0}, None, ""),
    "not an object": ({"answers": [1, 2]}, None, "answers is not an object"),
    "null": ({"answers": None}, None, "answers is not an object"),
    "count missing": (
        {"answers": {"errors": 0, "seconds": 0.0, "buckets": _buckets()}},
        None,
        "answers.count is not a whole number",
    ),
    "count a bool": (_doc(count=True), None, "answers.count is not a whole number"),
    "count a float": (_doc(count=2.0), None, "answers.count is not a whole number"),
    "errors negative": (_doc(errors=-1), None, "answers.errors is -1"),
    "count past what a counter holds exactly": (
        _doc(count=MAX_TOTAL),
        None,
        "answers.count is 9007199254740992",
    ),
    "seconds NaN": (_doc(seconds=math.nan), None, "answers.seconds is not a finite"),
    "seconds infinite": (_doc(seconds=math.inf), None, "answers.seconds is not a finite"),
    "seconds negative": (_doc(seconds=-0.1), None, "answers.seconds is not a finite"),
    "seconds a string": (_doc(seconds="1"), None, "answers.seconds is not a finite"),
    "buckets too few": (
        _doc(buckets=[2]),
        None,
        f"answers.buckets is not a list of {BUCKETS} counts",
    ),
    "buckets too many (a huge list)": (
        _doc(buckets=[0] * 10**5),
        None,
        f"answers.buckets is not a list of {BUCKETS} counts",
    ),
    "a bucket negative": (
        _doc(count=0, buckets=_buckets(b0=-1, b1=1)),
        None,
        "answers.buckets[0] is -1",
    ),
    "a bucket a float": (
        _doc(buckets=[2.0] + [0] * (BUCKETS - 1)),
        None,
        "answers.buckets[0] is not a whole number",
    ),
    "buckets that do not sum to the count": (
        _doc(count=3),
        None,
        "answers.buckets sum to 2, not count 3",
    ),
    "more errors than answers": (
        _doc(errors=3),
        None,
        "answers.errors (3) exceed answers.count (2)",
    ),
}


@pytest.mark.parametrize(("doc", "expected", "why"), PONGS.values(), ids=PONGS.keys())
def test_from_pong(doc: dict[str, Any], expected: AnswerTotals | None, why: str) -> None:
    got, reason = from_pong(doc)
    assert got == expected
    assert reason.startswith(why) and bool(reason) == bool(why)


def test_the_workers_tally_round_trips_through_a_pong_into_the_same_buckets_as_edgeds() -> None:
    tally = AnswerTally()
    values = [0.0, 0.0001, 0.00011, 0.003, 0.003, 2.5, 7.0, -1.0]  # -1: a clock step, as 0
    for i, v in enumerate(values):
        tally.record(500 if i == 2 else 200, v)
    got, why = from_pong({"answers": tally.to_pong()})
    assert got is not None, why
    assert (got.count, got.errors) == (8, 1)
    assert got.seconds == pytest.approx(sum(max(0.0, v) for v in values))
    # the same buckets an edgefleet.metrics histogram puts them in
    registry = Registry()
    hist = registry.histogram("h", "h", ("w",), buckets=BOUNDS).labels(w="x")
    for v in values:
        hist.observe(max(0.0, v))
    assert tuple(hist.counts) == got.buckets
    # and a histogram fed the report shows what one fed each value shows
    fed = registry.histogram("g", "g", ("w",), buckets=BOUNDS).labels(w="x")
    fed.add(got.buckets, got.seconds)
    assert (fed.counts, fed.sum) == (hist.counts, pytest.approx(hist.sum))
    with pytest.raises(ValueError, match="3 bucket counts"):
        fed.add([1, 2, 3], 1.0)


def test_seconds_range() -> None:
    assert seconds_range(tuple(_buckets())) == (0.0, 0.0)
    assert seconds_range(tuple(_buckets(b0=2))) == (0.0, 2 * BOUNDS[0])
    assert seconds_range(tuple(_buckets(b3=1, b4=1))) == (
        BOUNDS[2] + BOUNDS[3],
        BOUNDS[3] + BOUNDS[4],
    )
    assert seconds_range(tuple(_buckets(b14=1))) == (BOUNDS[13], math.inf)


def _totals(count: int, errors: int, seconds: float, **at: int) -> AnswerTotals:
    return AnswerTotals(count, errors, seconds, tuple(_buckets(**at)))


# as of the last report: 90 answers received (2 errors), edged measured 0.2 s for them
SEEN = _totals(90, 2, 0.09, b3=90)  # 1 ms each
THEN = ChannelCounts(sent=100, answered=90, inflight=10, errors=2, answered_s=0.2)
STEPS: dict[str, tuple[AnswerTotals, ChannelCounts, AnswerTotals | None, str]] = {
    "answers since": (
        _totals(100, 3, 0.1, b3=100),
        ChannelCounts(110, 100, 10, 3, 0.25),
        _totals(10, 1, pytest.approx(0.01), b3=10),  # type: ignore[arg-type]
        "",
    ),
    "nothing new": (SEEN, THEN, _totals(0, 0, 0.0), ""),
    "more answers than edged received": (
        _totals(101, 2, 0.101, b3=101),
        ChannelCounts(110, 100, 10, 2, 0.3),
        None,
        "11 answers, 10 received",
    ),
    "more errors than edged received": (
        _totals(100, 4, 0.1, b3=100),
        ChannelCounts(110, 100, 10, 3, 0.3),
        None,
        "2 errors, 1 received",
    ),
    "more seconds than edged measured (past the slack)": (
        _totals(91, 2, 0.09 + 3.0, b3=90, b14=1),
        ChannelCounts(101, 91, 10, 2, 0.2 + 1.0),
        None,
        "3.000 s held, 1.000 s measured by edged",
    ),
    "seconds within edged's measure plus the slack": (
        _totals(91, 2, 0.09 + 1.4, b3=90, b13=1),
        ChannelCounts(101, 91, 10, 2, 0.2 + 1.0),
        _totals(1, 0, pytest.approx(1.4), b13=1),  # type: ignore[arg-type]
        "",
    ),
    "seconds that do not fit the buckets (too many)": (
        _totals(91, 2, 0.09 + 0.5, b3=91),
        ChannelCounts(101, 91, 10, 2, 1.0),
        None,
        "0.500000 s do not fit the buckets",
    ),
    "seconds that do not fit the buckets (too few)": (
        _totals(91, 2, 0.09, b3=90, b12=1),
        ChannelCounts(101, 91, 10, 2, 1.0),
        None,
        "0.000000 s do not fit the buckets",
    ),
    "count went down": (_totals(89, 2, 0.089, b3=89), THEN, None, "an answer total went down"),
    "errors went down": (_totals(90, 1, 0.09, b3=90), THEN, None, "an answer total went down"),
    "a bucket went down (answers moved between buckets)": (
        _totals(90, 2, 0.0899, b2=1, b3=89),
        THEN,
        None,
        "an answer total went down",
    ),
    "seconds went down": (_totals(90, 2, 0.05, b3=90), THEN, None, "answers.seconds went down"),
}


@pytest.mark.parametrize(("report", "now", "delta", "why"), STEPS.values(), ids=STEPS.keys())
def test_advance(
    report: AnswerTotals, now: ChannelCounts, delta: AnswerTotals | None, why: str
) -> None:
    got, reason = advance(SEEN, report, then=THEN, now=now)
    assert got == delta, reason
    assert reason.startswith(why) and bool(reason) == bool(why)


def test_a_new_process_counts_from_zero() -> None:
    report = _totals(3, 1, 0.003, b3=3)
    got, _ = advance(AnswerTotals(), report, then=ChannelCounts(), now=ChannelCounts(4, 3, 1, 1, 1))
    assert got == report


# -- a replica counting its process's reports ----------------------------------------------------

PROBES = Probes(
    readiness=Probe(timeout_s=1.0, period_s=5.0, failure_threshold=2),
    liveness=Probe(timeout_s=2.0, period_s=10.0, failure_threshold=3),
)


class _Pool(SimpleNamespace):
    def __init__(self) -> None:
        super().__init__(answers=[])

    def record_answers(self, rep: Any, delta: AnswerTotals) -> None:
        self.answers.append(delta)

    def record_overlap(self, rep: Any, delta: Any) -> None:
        pass

    def record_batches(self, rep: Any, delta: Any) -> None:
        pass

    def notify(self, workload: Any) -> None:
        pass


def _pong(count: Any, errors: int = 0) -> dict[str, Any]:
    return {
        "inflight": 0,
        "busy_s": 0.0,
        "answers": {
            "count": count,
            "errors": errors,
            "seconds": 0.001 * count if type(count) is int else 0.0,
            "buckets": _buckets(b3=count) if type(count) is int else _buckets(),
        },
    }


def test_a_replica_counts_increments_and_refuses_a_hostile_report_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pool = _Pool()
    spec = launch_spec(tmp_path / "m.onnx", "0" * 64, SandboxSpec(mode="off"))
    rep = processes.Replica(pool, spec, WorkloadName("w"), "r1", 0, PROBES)  # type: ignore[arg-type]
    channel = ReplicaChannel(rep)
    rep.channel = channel

    def saw(answered: int, errors: int = 0) -> None:
        channel.sent = channel.answered = answered
        channel.errors = errors
        channel.answered_s = 0.002 * answered

    with caplog.at_level(logging.WARNING, logger=processes.__name__):
        saw(10, 1)
        rep.on_pong(_pong(10, 1))
        rep.on_pong(_pong(10, 1))  # nothing new: nothing recorded
        saw(20, 1)
        rep.on_pong(_pong(10**6, 1))  # a lie: more answers than edged received
        saw(30, 1)
        rep.on_pong(_pong(10**6 + 5, 1))  # counted again, from the refused report
        rep.on_pong(_pong(1))  # went down: refused, not logged a second time
        rep.on_pong(_pong("lots"))  # malformed: nothing counted, nothing logged again
        rep.on_pong({"inflight": 0, "busy_s": 0.0})  # none: nothing to say
    assert [(d.count, d.errors) for d in pool.answers] == [(10, 1), (5, 0)]
    refused = [r for r in caplog.records if r.msg == "worker answer totals not counted"]
    assert len(refused) == 1
