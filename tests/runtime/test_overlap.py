"""Decode and encode overlap ONNX Runtime in a real worker process (issue 34, item 2).

A model slowed deterministically (a long chain of MatMuls by one shared permutation matrix,
a Relu between each two: the answer is the input with its negatives zeroed and its columns
permuted, exactly) runs batches of 8 in the worker's
runner thread. While the first batch runs, the worker is shown it is busy (a PONG), then two
more full batches arrive: its own counters (in each PONG) must show them decoded during a
run, handed to the runner before the running batch ended, and the earlier batches' answers
encoded while a later one ran. Counters, not clocks: nothing here asserts a duration.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from workerprocess import Worker, launch_spec

from edged.runtime.framing import HEADER, NO_HEADER_LENGTH, RESULT_PREFIX, U32, FrameType
from edged.runtime.launching import SandboxSpec

WIDTH = 1024
LAYERS = 256  # about 270 M multiply-adds per row: tens of milliseconds per batch of 8


def _slow_model(path: Path) -> tuple[Path, np.ndarray]:
    """The model, and where each input column lands in its output."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    perm = np.random.default_rng(3).permutation(WIDTH)
    w = np.zeros((WIDTH, WIDTH), dtype=np.float32)
    w[np.arange(WIDTH), perm] = 1.0  # x @ w moves column i to column perm[i]
    nodes = []
    prev = "input"
    for i in range(LAYERS):  # MatMul, Relu, MatMul, ...: nothing for the optimizer to fold
        out = "out" if i == LAYERS - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, "w"], [out if i == 0 else f"m{i}"]))
        if i:
            nodes[-1:] = [
                helper.make_node("Relu", [prev], [f"r{i}"]),
                helper.make_node("MatMul", [f"r{i}", "w"], [out]),
            ]
        prev = out
    graph = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", WIDTH])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    moved = np.arange(WIDTH)  # where each column ends up after all the layers
    for _ in range(LAYERS):
        moved = perm[moved]
    return path, moved


def _expected(x: np.ndarray, moved: np.ndarray) -> np.ndarray:
    y = np.empty_like(x)
    y[:, moved] = np.maximum(x, 0)
    return y


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
    path, moved = _slow_model(tmp_path / "slow.onnx")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    spec = launch_spec(path, digest, SandboxSpec())
    w = Worker(spec)
    kind, meta = w.first_frame()
    assert kind == "ready", meta
    yield w, moved
    w.close()


def test_next_batches_are_decoded_and_handed_over_while_one_runs(worker: Any) -> None:
    w, moved = worker
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
        np.testing.assert_array_equal(y, _expected(x, moved))
    assert pong["requests"] == 24 and pong["batches"] == 3, pong
    overlap = pong["overlap"]
    # B and C were read and decoded while A ran; B was handed over before A ended, and C
    # before B ended (each started with no hop through the loop)
    assert overlap["decoded"] >= 16, overlap
    assert overlap["staged"] >= 2, overlap
    # A's answers were encoded while B ran, B's while C ran
    assert overlap["encoded"] >= 16, overlap


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
        np.testing.assert_array_equal(answers[rid][1], _expected(x * i, moved))
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
        np.testing.assert_array_equal(answers[i][1], _expected(x, moved))
    assert w.proc.wait(60) == 0


def test_sigterm_while_a_batch_runs_exits_0(worker: Any) -> None:
    w, _ = worker
    xs = {i: np.ones((1, WIDTH), dtype=np.float32) for i in range(1, 9)}
    _busy(w, xs, {})
    w.proc.terminate()
    assert w.proc.wait(60) == 0  # the runner thread ends: nothing keeps the process up
