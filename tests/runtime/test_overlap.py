"""Decode and encode overlap ONNX Runtime in a real worker process (issue 34, item 2).

A model slowed deterministically (``tests/slowmodel.py``: its answers are exact) runs
batches of 8 in the worker's runner thread. While the first batch runs, the worker is shown
it is busy (a PONG), then two more full batches arrive: its own counters (in each PONG) must
show them decoded during a run, handed to the runner before the running batch ended, and the
earlier batches' answers encoded while a later one ran; and edged accepts them as they are,
against what it sent and received (``overlapstats.py``), as it accepts the answers the worker
says it wrote (``answerstats.py``). Counters, not clocks: nothing here
asserts a duration.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from slowmodel import WIDTH, expected, slow_model
from workerprocess import Worker, launch_spec

from edged.runtime import answerstats
from edged.runtime.framing import HEADER, NO_HEADER_LENGTH, RESULT_PREFIX, U32, FrameType
from edged.runtime.launching import SandboxSpec
from edged.runtime.overlapstats import ChannelCounts, OverlapTotals, advance, from_pong


def _infer(req_id: int, x: np.ndarray, *, binary: bool) -> bytes:
    if binary:
        head = orjson.dumps(
            {
                "inputs": [
                    {
                        "name": "input",
                        "shape": list(x.shape),
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": x.nbytes},
                    }
                ],
                "outputs": [{"name": "out", "parameters": {"binary_data": True}}],
            }
        )
        body = head + x.tobytes()
        hlen = len(head)
    else:
        doc = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32"}]}
        doc["inputs"][0]["data"] = x.ravel().tolist()
        body = orjson.dumps(doc)
        hlen = NO_HEADER_LENGTH
    payload = U32.pack(hlen) + body
    return HEADER.pack(len(payload), FrameType.INFER, req_id) + payload


def _answer(payload: bytes) -> tuple[int, np.ndarray]:
    status, hlen = RESULT_PREFIX.unpack_from(payload, 0)
    body = payload[RESULT_PREFIX.size :]
    if status != 200:
        return status, np.zeros(0)
    if hlen == NO_HEADER_LENGTH:
        (out,) = orjson.loads(body)["outputs"]
        return status, np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    (out,) = orjson.loads(body[:hlen])["outputs"]
    assert out["parameters"]["binary_data_size"] == len(body) - hlen
    return status, np.frombuffer(body[hlen:], dtype=np.float32).reshape(out["shape"])


def _pong(worker: Worker, req_id: int, answers: dict[int, Any]) -> dict[str, Any]:
    worker.sock.sendall(HEADER.pack(0, FrameType.PING, req_id))
    while True:
        ftype, rid, payload = worker.read_frame()
        if ftype == FrameType.PONG and rid == req_id:
            return dict(orjson.loads(payload))
        assert ftype == FrameType.RESULT
        answers[rid] = _answer(payload)


@pytest.fixture
def worker(tmp_path: Path) -> Any:
    path, moved = slow_model(tmp_path / "slow.onnx")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    spec = launch_spec(path, digest, SandboxSpec())
    w = Worker(spec)
    kind, meta = w.first_frame()
    assert kind == "ready", meta
    yield w, moved
    w.close()


def test_next_batches_are_decoded_and_handed_over_while_one_runs(worker: Any) -> None:
    w, moved = worker
    started = time.monotonic()
    rng = np.random.default_rng(5)
    xs = {i: rng.standard_normal((1, WIDTH)).astype(np.float32) for i in range(1, 25)}
    answers: dict[int, Any] = {}
    # batch A: 8 binary requests at once; the worker runs them as one batch
    w.sock.sendall(b"".join(_infer(i, xs[i], binary=True) for i in range(1, 9)))
    for ping in range(1000, 1100):  # a PING read with them is answered before A starts
        busy = _pong(w, ping, answers)
        if busy["busy_s"] > 0 or busy["batches"]:
            break
    assert busy["inflight"] == 8 and busy["busy_s"] > 0, busy  # batch A runs now
    # batches B (binary requests and answers) and C (JSON) arrive while A runs
    w.sock.sendall(b"".join(_infer(i, xs[i], binary=i <= 16) for i in range(9, 25)))
    while len(answers) < 24:
        ftype, rid, payload = w.read_frame()
        assert ftype == FrameType.RESULT
        answers[rid] = _answer(payload)
    pong = _pong(w, 1001, answers)

    for i, x in xs.items():  # every answer is its own request's, exactly
        status, y = answers[i]
        assert status == 200
        np.testing.assert_array_equal(y, expected(x, moved))
    assert pong["requests"] == 24 and pong["batches"] == 3, pong
    overlap = pong["overlap"]
    # B and C were read and decoded while A ran; B was handed over before A ended, and C
    # before B ended (each started with no hop through the loop)
    assert overlap["decoded"] >= 16, overlap
    assert overlap["staged"] >= 2, overlap
    # A's answers were encoded while B ran, B's while C ran
    assert overlap["encoded"] >= 16, overlap
    # edged counts them as they are: 24 requests sent, 24 answers received, none in flight
    report, why = from_pong(pong)
    assert report is not None, why
    delta, why = advance(OverlapTotals(), report, then=ChannelCounts(), now=ChannelCounts(24, 24))
    assert delta == report, why
    # and the answers it wrote: 24, none an error, each held for no longer than edged could
    # have measured (this test's own time bounds it: the worker answered within it)
    answered, why = answerstats.from_pong(pong)
    assert answered is not None, why
    assert (answered.count, answered.errors, sum(answered.buckets)) == (24, 0, 24), answered
    measured = ChannelCounts(24, 24, 0, 0, 24 * (time.monotonic() - started))
    counted, why = answerstats.advance(
        answerstats.AnswerTotals(), answered, then=ChannelCounts(), now=measured
    )
    assert counted == answered, why


def test_a_lone_request_is_not_held_for_a_batch_that_runs(worker: Any) -> None:
    """One request at a time (a lone client): nothing is decoded during a run, nothing is
    handed over early, and each answer comes back."""
    w, moved = worker
    x = np.ones((1, WIDTH), dtype=np.float32)
    answers: dict[int, Any] = {}
    for i in range(1, 4):
        w.sock.sendall(_infer(i, x * i, binary=i % 2 == 0))
        ftype, rid, payload = w.read_frame()
        assert (ftype, rid) == (FrameType.RESULT, i)
        answers[rid] = _answer(payload)
        np.testing.assert_array_equal(answers[rid][1], expected(x * i, moved))
    pong = _pong(w, 99, answers)
    assert pong["overlap"] == {"decoded": 0, "encoded": 0, "staged": 0}
    assert (pong["batches"], pong["requests"]) == (3, 3)


def _busy(w: Worker, xs: dict[int, np.ndarray], answers: dict[int, Any]) -> None:
    """Send requests 1-8 as one batch and return once it runs."""
    w.sock.sendall(b"".join(_infer(i, xs[i], binary=True) for i in range(1, 9)))
    for ping in range(1000, 1100):
        busy = _pong(w, ping, answers)
        if busy["busy_s"] > 0 or busy["batches"]:
            break
    assert busy["busy_s"] > 0, busy


def test_drain_answers_the_batch_handed_over_early_then_exits_0(worker: Any) -> None:
    """DRAIN while one batch runs and the next is already handed to the runner: every request
    is answered, then the worker exits 0."""
    w, moved = worker
    xs = {i: np.full((1, WIDTH), float(i), dtype=np.float32) for i in range(1, 17)}
    answers: dict[int, Any] = {}
    _busy(w, xs, answers)
    w.sock.sendall(
        b"".join(_infer(i, xs[i], binary=False) for i in range(9, 17))
        + HEADER.pack(0, FrameType.DRAIN, 0)
    )
    while len(answers) < 16:
        ftype, rid, payload = w.read_frame()
        assert ftype == FrameType.RESULT
        answers[rid] = _answer(payload)
    for i, x in xs.items():
        assert answers[i][0] == 200
        np.testing.assert_array_equal(answers[i][1], expected(x, moved))
    assert w.proc.wait(60) == 0


def test_sigterm_while_a_batch_runs_exits_0(worker: Any) -> None:
    w, _ = worker
    xs = {i: np.ones((1, WIDTH), dtype=np.float32) for i in range(1, 9)}
    _busy(w, xs, {})
    w.proc.terminate()
    assert w.proc.wait(60) == 0  # the runner thread ends: nothing keeps the process up
