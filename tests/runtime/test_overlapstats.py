"""A worker's overlap totals as edged counts them: a PONG in, a checked increment out (tables,
hostile reports among them); and a replica that counts each process's increments, refusing a
report that breaks a rule once in its log. A real worker's report: tests/runtime/test_overlap.py."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from workerprocess import launch_spec

from edged.runtime import processes
from edged.runtime.channel import ReplicaChannel
from edged.runtime.launching import SandboxSpec
from edged.runtime.overlapping import OverlapCounts
from edged.runtime.overlapstats import (
    MAX_TOTAL,
    ChannelCounts,
    OverlapTotals,
    advance,
    from_pong,
)
from edged.workloads import WorkloadName
from edgefleet.api import Probe, Probes

PONGS: dict[str, tuple[dict[str, Any], OverlapTotals | None, str]] = {
    "totals": (
        {"overlap": {"decoded": 16, "encoded": 8, "staged": 2}},
        OverlapTotals(16, 8, 2),
        "",
    ),
    "zeros (a fast model: no runner thread)": (
        {"overlap": {"decoded": 0, "encoded": 0, "staged": 0}},
        OverlapTotals(),
        "",
    ),
    "more fields than edged knows": (
        {"overlap": {"decoded": 1, "encoded": 1, "staged": 1, "other": "x"}},
        OverlapTotals(1, 1, 1),
        "",
    ),
    "none (a worker of an older edged): nothing to say": ({"inflight": 0}, None, ""),
    "not an object": ({"overlap": [1, 2, 3]}, None, "overlap is not an object"),
    "null": ({"overlap": None}, None, "overlap is not an object"),
    "a field missing": (
        {"overlap": {"decoded": 1, "encoded": 1}},
        None,
        "overlap.staged is not a whole number",
    ),
    "a float": (
        {"overlap": {"decoded": 1.0, "encoded": 1, "staged": 1}},
        None,
        "overlap.decoded is not a whole number",
    ),
    "NaN": (
        {"overlap": {"decoded": 1, "encoded": float("nan"), "staged": 1}},
        None,
        "overlap.encoded is not a whole number",
    ),
    "a bool": (
        {"overlap": {"decoded": 1, "encoded": 1, "staged": True}},
        None,
        "overlap.staged is not a whole number",
    ),
    "a string": (
        {"overlap": {"decoded": "1", "encoded": 1, "staged": 1}},
        None,
        "overlap.decoded is not a whole number",
    ),
    "negative": (
        {"overlap": {"decoded": -1, "encoded": 1, "staged": 1}},
        None,
        "overlap.decoded is -1",
    ),
    "past what a counter holds exactly": (
        {"overlap": {"decoded": MAX_TOTAL, "encoded": 1, "staged": 1}},
        None,
        "overlap.decoded is 9007199254740992",
    ),
    "huge": (
        {"overlap": {"decoded": 1, "encoded": 10**400, "staged": 1}},
        None,
        "overlap.encoded is 1000",
    ),
}


@pytest.mark.parametrize(("doc", "expected", "why"), PONGS.values(), ids=PONGS.keys())
def test_from_pong(doc: dict[str, Any], expected: OverlapTotals | None, why: str) -> None:
    got, reason = from_pong(doc)
    assert got == expected
    assert reason.startswith(why) and bool(reason) == bool(why)


def test_the_workers_counts_round_trip_through_a_pong() -> None:
    counts = OverlapCounts()
    counts.decoded, counts.encoded, counts.staged = 5, 4, 1
    assert from_pong({"overlap": counts.to_pong()}) == (OverlapTotals(5, 4, 1), "")


# as of the last report: 100 requests sent, 90 answered, 10 in flight
SEEN = OverlapTotals(40, 30, 5)
THEN = ChannelCounts(sent=100, answered=90, inflight=10)
STEPS: dict[str, tuple[OverlapTotals, ChannelCounts, OverlapTotals | None, str]] = {
    "work overlapped": (
        OverlapTotals(50, 38, 7),
        ChannelCounts(120, 110, 10),
        OverlapTotals(10, 8, 2),
        "",
    ),
    "nothing new": (SEEN, THEN, OverlapTotals(), ""),
    "every request sent since, and every one in flight then, decoded": (
        OverlapTotals(40 + 20 + 10, 30, 5),
        ChannelCounts(120, 90, 30),
        OverlapTotals(30, 0, 0),
        "",
    ),
    "more decoded than it could read": (
        OverlapTotals(40 + 31, 30, 5),
        ChannelCounts(120, 90, 30),
        None,
        "31 requests decoded of 30 it could read",
    ),
    "more decoded than were in flight then, with nothing sent since": (
        OverlapTotals(40 + 11, 30, 5),
        ChannelCounts(100, 90, 0),
        None,
        "11 requests decoded of 10 it could read",
    ),
    "more batches handed over than requests to fill them": (
        OverlapTotals(40, 30, 5 + 11),
        ChannelCounts(100, 100, 0),
        None,
        "11 batches handed over with 10 requests to read",
    ),
    "every answer received since encoded during a run": (
        OverlapTotals(40, 30 + 20, 5),
        ChannelCounts(120, 110, 10),
        OverlapTotals(0, 20, 0),
        "",
    ),
    "more encoded than answers received": (
        OverlapTotals(40, 30 + 21, 5),
        ChannelCounts(120, 110, 10),
        None,
        "21 answers encoded, 20 received",
    ),
    "decoded went down": (
        OverlapTotals(39, 30, 5),
        THEN,
        None,
        "overlap.decoded went down",
    ),
    "encoded went down (a replayed older report)": (
        OverlapTotals(40, 29, 5),
        THEN,
        None,
        "overlap.encoded went down",
    ),
    "staged went down (wrapped)": (
        OverlapTotals(40, 30, 0),
        THEN,
        None,
        "overlap.staged went down",
    ),
}


@pytest.mark.parametrize(("report", "now", "delta", "why"), STEPS.values(), ids=STEPS.keys())
def test_advance(
    report: OverlapTotals, now: ChannelCounts, delta: OverlapTotals | None, why: str
) -> None:
    got, reason = advance(SEEN, report, then=THEN, now=now)
    assert got == delta
    assert reason.startswith(why) and bool(reason) == bool(why)


def test_a_new_process_counts_from_zero() -> None:
    """A restarted worker's first report is counted from zero, against its new socket."""
    report = OverlapTotals(3, 2, 1)
    got, _ = advance(OverlapTotals(), report, then=ChannelCounts(), now=ChannelCounts(4, 3, 1))
    assert got == report


# -- a replica counting its process's reports ----------------------------------------------------

PROBES = Probes(
    readiness=Probe(timeout_s=1.0, period_s=5.0, failure_threshold=2),
    liveness=Probe(timeout_s=2.0, period_s=10.0, failure_threshold=3),
)


class _Pool(SimpleNamespace):
    def __init__(self) -> None:
        super().__init__(overlap=[], batches=[])

    def record_overlap(self, rep: Any, delta: OverlapTotals) -> None:
        self.overlap.append(delta)

    def record_batches(self, rep: Any, delta: Any) -> None:
        self.batches.append(delta)

    def notify(self, workload: Any) -> None:
        pass


def _pong(decoded: Any, encoded: Any = 0, staged: Any = 0) -> dict[str, Any]:
    return {
        "inflight": 0,
        "busy_s": 0.0,
        "overlap": {"decoded": decoded, "encoded": encoded, "staged": staged},
    }


def test_a_replica_counts_increments_and_refuses_a_hostile_report_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pool = _Pool()
    spec = launch_spec(tmp_path / "m.onnx", "0" * 64, SandboxSpec(mode="off"))
    rep = processes.Replica(pool, spec, WorkloadName("w"), "r1", 0, PROBES)  # type: ignore[arg-type]
    channel = ReplicaChannel(rep)
    rep.channel = channel

    def saw(sent: int, answered: int) -> None:
        channel.sent, channel.answered = sent, answered

    with caplog.at_level(logging.WARNING, logger=processes.__name__):
        saw(10, 10)
        rep.on_pong(_pong(6, 4, 1))
        rep.on_pong(_pong(6, 4, 1))  # nothing new: nothing recorded
        saw(20, 20)
        rep.on_pong(_pong(10**6, 5, 1))  # a lie: more decoded than sent
        saw(30, 30)
        rep.on_pong(_pong(10**6 + 2, 6, 2))  # counted again, from the refused report
        rep.on_pong(_pong(1, 6, 2))  # went down: refused, not logged a second time
        rep.on_pong(_pong("lots"))  # malformed: nothing counted, nothing logged again
        rep.on_pong({"inflight": 0, "busy_s": 0.0})  # none: nothing to say
    assert pool.overlap == [OverlapTotals(6, 4, 1), OverlapTotals(2, 1, 1)]
    refused = [r for r in caplog.records if r.msg == "worker overlap totals not counted"]
    assert len(refused) == 1
