"""A worker's batch totals as edged counts them: a PONG in, a checked increment out (tables);
and what a real worker process reports."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from workerprocess import Worker, launch_spec

from edged.runtime.batchstats import CLOCK_SLACK_S, BatchCounts, advance, from_pong
from edged.runtime.framing import HEADER, NO_HEADER_LENGTH, RESULT_PREFIX, U32, FrameType
from edged.runtime.launching import SandboxSpec
from edgefleet.demo import build_mlp
from edgefleet.inference import infer_request_body

PONGS: dict[str, tuple[dict[str, Any], BatchCounts | None]] = {
    "totals": ({"batches": 3, "requests": 20, "compute_s": 0.5}, BatchCounts(3, 20, 0.5)),
    "whole seconds": ({"batches": 1, "requests": 1, "compute_s": 2}, BatchCounts(1, 1, 2.0)),
    "a worker that sends none (older edged)": ({"inflight": 0, "busy_s": 0.0}, None),
    "a count as a float": ({"batches": 1.0, "requests": 1, "compute_s": 0.1}, None),
    "a count as a string": ({"batches": "1", "requests": 1, "compute_s": 0.1}, None),
    "a count as a bool": ({"batches": True, "requests": 1, "compute_s": 0.1}, None),
    "negative": ({"batches": -1, "requests": 1, "compute_s": 0.1}, None),
    "negative seconds": ({"batches": 1, "requests": 1, "compute_s": -0.1}, None),
    "seconds not a number": ({"batches": 1, "requests": 1, "compute_s": "0.1"}, None),
    "infinite seconds": ({"batches": 1, "requests": 1, "compute_s": float("inf")}, None),
    "NaN seconds": ({"batches": 1, "requests": 1, "compute_s": float("nan")}, None),
    "a huge count stays exact": (
        {"batches": 10**18, "requests": 10**18, "compute_s": 1.0},
        BatchCounts(10**18, 10**18, 1.0),
    ),
}


@pytest.mark.parametrize(("doc", "expected"), PONGS.values(), ids=PONGS.keys())
def test_from_pong(doc: dict[str, Any], expected: BatchCounts | None) -> None:
    assert from_pong(doc) == expected


def test_totals_round_trip_through_a_pong() -> None:
    counts = BatchCounts(7, 50, 1.25)
    assert from_pong(counts.to_pong()) == counts


SEEN = BatchCounts(10, 60, 2.0)
STEPS: dict[str, tuple[BatchCounts, float, BatchCounts | None, str]] = {
    "batches of 1 to 8": (BatchCounts(14, 80, 3.5), 5.0, BatchCounts(4, 20, 1.5), ""),
    "nothing new": (SEEN, 5.0, BatchCounts(0, 0, 0.0), ""),
    "full batches": (BatchCounts(12, 76, 2.5), 5.0, BatchCounts(2, 16, 0.5), ""),
    "more requests than 8 per batch": (
        BatchCounts(12, 77, 2.5),
        5.0,
        None,
        "17 requests in 2 batches of at most 8",
    ),
    "a batch with no request": (BatchCounts(12, 61, 2.5), 5.0, None, "1 requests in 2 batches"),
    "a total went down": (BatchCounts(9, 60, 2.0), 5.0, None, "a total went down"),
    "seconds went down": (BatchCounts(11, 61, 1.0), 5.0, None, "a total went down"),
    "more compute than wall time": (BatchCounts(11, 61, 9.0), 5.0, None, "7.000 s of compute"),
    "a long batch that began before the last report (wall time includes its busy_s)": (
        BatchCounts(11, 61, 12.0),
        5.0 + 6.0,
        BatchCounts(1, 1, 10.0),
        "",
    ),
    "within the clock slack": (
        BatchCounts(11, 61, 2.0 + 5.0 + CLOCK_SLACK_S - 0.01),
        5.0,
        BatchCounts(1, 1, 5.0 + CLOCK_SLACK_S - 0.01),
        "",
    ),
}


@pytest.mark.parametrize(("report", "wall_s", "delta", "why"), STEPS.values(), ids=STEPS.keys())
def test_advance(report: BatchCounts, wall_s: float, delta: BatchCounts | None, why: str) -> None:
    got, reason = advance(SEEN, report, max_batch=8, wall_s=wall_s)
    if delta is None:
        assert got is None and reason.startswith(why)
    else:
        assert got is not None and reason == ""
        assert (got.batches, got.requests) == (delta.batches, delta.requests)
        assert got.compute_s == pytest.approx(delta.compute_s)


def test_a_model_that_does_not_batch_runs_one_request_per_batch() -> None:
    assert advance(BatchCounts(), BatchCounts(3, 3, 0.1), max_batch=1, wall_s=1.0)[0] is not None
    assert advance(BatchCounts(), BatchCounts(3, 4, 0.1), max_batch=1, wall_s=1.0)[0] is None


def test_a_real_worker_reports_its_batches_in_pong(tmp_path: Path) -> None:
    """A real worker (real ONNX Runtime) answers 8 requests sent at once, merged into batches
    of at most 8, and its next PONG carries totals that edged accepts as they are."""
    model = build_mlp(tmp_path / "model.onnx")
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    w = Worker(launch_spec(model, sha, SandboxSpec(mode="off")))
    started = time.monotonic()
    try:
        kind, meta = w.first_frame()
        assert kind == "ready", meta
        body = infer_request_body({"input": np.zeros((1, 64), dtype=np.float32)})
        frames = b"".join(
            HEADER.pack(len(body) + 4, FrameType.INFER, i) + U32.pack(NO_HEADER_LENGTH) + body
            for i in range(1, 9)
        )
        w.sock.sendall(frames)
        answered = set()
        while len(answered) < 8:
            ftype, req_id, payload = w.read_frame(30)
            assert ftype == FrameType.RESULT and RESULT_PREFIX.unpack_from(payload)[0] == 200
            answered.add(req_id)
        w.sock.sendall(HEADER.pack(0, FrameType.PING, 99))
        ftype, _, payload = w.read_frame(30)
        assert ftype == FrameType.PONG
        report = from_pong(orjson.loads(payload))
    finally:
        w.close()
    assert report is not None and report.requests == 8 and 1 <= report.batches <= 8
    delta, why = advance(BatchCounts(), report, max_batch=8, wall_s=time.monotonic() - started)
    assert delta == report, why
    assert report.compute_s > 0
