"""Serving: answers match ONNX Runtime called directly; bad requests get 4xx and harm nothing."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import orjson
from harness import Edged, wait_for, write_manifest
from metricstesting import series_value


def direct(model: Path, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    out: np.ndarray = sess.run(None, {"input": x})[0]
    return out


def test_serves_same_answers_as_onnxruntime(model_dir: Path, edged_factory) -> None:
    write_manifest(model_dir)
    e: Edged = edged_factory(model_dir).start()
    e.wait_ready()
    rng = np.random.default_rng(3)
    for batch in (1, 3, 8):
        x = rng.standard_normal((batch, 64)).astype(np.float32)
        status, doc = e.infer("mlp", x)
        assert status == 200, doc
        out = doc["outputs"][0]
        assert out["name"] == "logits" and out["datatype"] == "FP32"
        assert out["shape"] == [batch, 10]
        got = np.asarray(out["data"], dtype=np.float32).reshape(batch, 10)
        np.testing.assert_allclose(got, direct(model_dir / "mlp.onnx", x), rtol=1e-5, atol=1e-5)

    status, body, _ = e.request("GET", "/v2/models/mlp")
    meta = orjson.loads(body)
    assert status == 200
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert meta["versions"] == ["1.0.0"]
    assert e.request("GET", "/v2/models/mlp/ready")[0] == 200
    assert e.request("GET", "/v2/models/mlp/versions/1.0.0/ready")[0] == 200
    assert e.request("GET", "/v2/health/live")[0] == 200
    assert e.terminate() == 0


def test_binary_tensor_extension(model_dir: Path, edged_factory) -> None:
    write_manifest(model_dir)
    e: Edged = edged_factory(model_dir).start()
    e.wait_ready()
    x = np.random.default_rng(5).standard_normal((2, 64)).astype(np.float32)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [2, 64],
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    status, body, headers = e.request(
        "POST",
        "/v2/models/mlp/infer",
        header + x.tobytes(),
        headers={
            "Inference-Header-Content-Length": str(len(header)),
            "Content-Type": "application/octet-stream",
        },
    )
    assert status == 200, body
    hlen = int(headers["inference-header-content-length"])
    doc = orjson.loads(body[:hlen])
    size = doc["outputs"][0]["parameters"]["binary_data_size"]
    got = np.frombuffer(body[hlen : hlen + size], dtype=np.float32).reshape(2, 10)
    np.testing.assert_allclose(got, direct(model_dir / "mlp.onnx", x), rtol=1e-5, atol=1e-5)
    assert e.terminate() == 0


def test_bad_requests_get_4xx_and_never_kill_the_worker(model_dir: Path, edged_factory) -> None:
    write_manifest(model_dir)
    e: Edged = edged_factory(model_dir).start()
    e.wait_ready()
    pids = e.worker_pids("mlp")
    bad = [
        (b"{not json", 400, "not valid JSON"),
        (b"[]", 400, "JSON object"),
        (orjson.dumps({"inputs": []}), 400, "non-empty list"),
        (
            orjson.dumps(
                {
                    "inputs": [
                        {"name": "input", "datatype": "FP32", "shape": [1, 63], "data": [0.0] * 63}
                    ]
                }
            ),
            400,
            "shape [1, 63]",
        ),
        (
            orjson.dumps(
                {
                    "inputs": [
                        {"name": "input", "datatype": "INT64", "shape": [1, 64], "data": [0] * 64}
                    ]
                }
            ),
            400,
            "datatype INT64",
        ),
        (
            orjson.dumps(
                {
                    "inputs": [
                        {"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 10}
                    ]
                }
            ),
            400,
            "has 10 elements",
        ),
        (
            orjson.dumps(
                {
                    "inputs": [
                        {"name": "nope", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}
                    ]
                }
            ),
            400,
            "'nope' is not an input",
        ),
        (
            orjson.dumps(
                {
                    "inputs": [
                        {"name": "input", "datatype": "FP32", "shape": [9, 64], "data": [0.0] * 576}
                    ]
                }
            ),
            400,
            "exceeds maxBatchSize 8",
        ),
        (
            orjson.dumps(
                {
                    "inputs": [
                        {"name": "input", "datatype": "FP32", "shape": [1, 64], "data": ["x"] * 64}
                    ]
                }
            ),
            400,
            "not a tensor of FP32",
        ),
    ]
    for body, want_status, want_text in bad:
        status, out, _ = e.request("POST", "/v2/models/mlp/infer", body)
        assert status == want_status, (body[:60], out)
        assert want_text in orjson.loads(out)["error"], out
    status, out, _ = e.request("POST", "/v2/models/unknown/infer", b"{}")
    assert status == 404 and "unknown" in orjson.loads(out)["error"]
    # OIP edge cases: out of range for the datatype, malformed binary-extension headers,
    # unknown paths whatever the method
    too_big = {"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [1e39] * 64}
    status, out, _ = e.request("POST", "/v2/models/mlp/infer", orjson.dumps({"inputs": [too_big]}))
    assert status == 400
    assert "input 'input'" in orjson.loads(out)["error"]
    assert "out of range for FP32" in orjson.loads(out)["error"]
    for value, text in (
        ("99999999999", "is larger than the request body"),
        ("-1", "must be a non-negative integer"),
        ("12abc", "must be a non-negative integer"),
        ("\u00b2", "must be a non-negative integer"),
        ("9" * 40, "must be a non-negative integer"),
    ):
        status, out, _ = e.request(
            "POST",
            "/v2/models/mlp/infer",
            b"{}",
            headers={"Inference-Header-Content-Length": value.encode().decode("latin-1")},
        )
        assert status == 400, (value, out)
        assert text in orjson.loads(out)["error"], out
    for method in ("GET", "POST", "PUT", "DELETE"):
        status, out, _ = e.request(method, "/v2/nothing/here", b"" if method != "GET" else None)
        assert status == 404, (method, out)
    assert e.request("POST", "/v2/health/live", b"")[0] == 405
    assert e.request("GET", "/v2/models/mlp/infer")[0] == 405
    assert e.request("GET", "/v2/models/mlp/versions/9.9.9")[0] == 404
    # A raw malformed HTTP request gets 400 and the connection is closed.
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.connect(e.infer_sock)
    s.sendall(b"GARBAGE\r\n\r\n")
    assert s.recv(100).startswith(b"HTTP/1.1 400")
    s.close()
    # Same workers, still serving.
    assert e.worker_pids("mlp") == pids
    x = np.zeros((1, 64), dtype=np.float32)
    assert e.infer("mlp", x)[0] == 200
    assert e.terminate() == 0


def test_status_socket_reports_and_metrics(model_dir: Path, edged_factory) -> None:
    write_manifest(model_dir)
    e: Edged = edged_factory(model_dir).start()
    e.wait_ready()
    e.infer("mlp", np.zeros((1, 64), dtype=np.float32))
    w = e.workload("mlp")
    assert w["phase"] == "Running" and w["readyReplicas"] == 1
    assert w["model"] == {"name": "mlp", "version": "1.0.0", "sha256": w["model"]["sha256"]}
    rep = w["replicas"][0]
    assert rep["ready"] and rep["restarts"] == 0 and rep["pid"] > 0
    assert rep["limits"]["mode"] in ("rlimit", "cgroup")
    assert rep["providers"] == ["CPUExecutionProvider"]
    assert e.request("GET", "/healthz", sock=e.status_sock)[0] == 200
    assert e.request("GET", "/readyz", sock=e.status_sock)[0] == 200
    status, metrics, headers = e.request("GET", "/metrics", sock=e.status_sock)
    text = metrics.decode()
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert 'edged_inference_requests_total{workload="mlp",code="200"} 1' in text
    assert "edged_inference_request_duration_seconds_bucket" in text
    assert 'edged_reconcile_total{controller="workloads",result="success"}' in text
    assert "edged_workqueue_depth" in text
    assert "# TYPE edged_replica_restarts_total counter" in text
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/install-system-deps installs prometheus"
    checked = subprocess.run(
        [promtool, "check", "metrics"], check=False, input=text, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # The worker's batches, counted as of its next liveness probe (every 5 s): one request at a
    # time never merges, so 6 requests are 6 batches; ONNX Runtime's time in them is real and
    # less than the time they took.
    t0 = time.monotonic()
    for _ in range(5):
        assert e.infer("mlp", np.zeros((1, 64), dtype=np.float32))[0] == 200
    took = time.monotonic() - t0

    def batch_totals() -> tuple[float, float, float]:
        text = e.request("GET", "/metrics", sock=e.status_sock)[1].decode()
        return tuple(  # type: ignore[return-value]
            series_value(text, f'edged_inference_{name}{{workload="mlp"}}')
            for name in ("batches_total", "batched_requests_total", "compute_seconds_total")
        )

    wait_for(lambda: batch_totals()[0] == 6, 30, "6 batches counted")
    batches, batched, compute_s = batch_totals()
    assert batches == batched == 6 and 0 < compute_s < took + 1
    # A worker killed from outside is started again: counted, as status counts it.
    os.kill(rep["pid"], signal.SIGKILL)
    wait_for(lambda: e.workload("mlp")["replicas"][0]["restarts"] == 1, 60, "a restart")
    wait_for(
        lambda: (
            'edged_replica_restarts_total{workload="mlp"} 1.0'
            in e.request("GET", "/metrics", sock=e.status_sock)[1].decode()
        ),
        10,
        "the restart in the metrics",
    )
    e.wait_ready()
    # The content-addressed store holds the artifact, read-only, by digest.
    blob = e.data / "artifacts" / "sha256" / w["model"]["sha256"]
    assert blob.read_bytes() == (model_dir / "mlp.onnx").read_bytes()
    assert not blob.stat().st_mode & 0o222
    # The human rendering.
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "edged", "status", "--data-dir", str(e.data)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "mlp" in out and "Running" in out and "1/1" in out
    assert e.terminate() == 0


def test_dynamic_batching_merges_concurrent_requests(tmp_path: Path, edged_factory) -> None:
    """Concurrent clients on a slow-ish model are answered correctly out of merged batches."""
    from concurrent.futures import ThreadPoolExecutor

    from edgefleet.demo import build_mlp

    d = tmp_path / "m"
    d.mkdir()
    build_mlp(d / "mlp.onnx", (256, 1024, 1024, 16), seed=2)
    write_manifest(d, batch=8)
    e: Edged = edged_factory(d).start()
    e.wait_ready()
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1, 256)).astype(np.float32) for _ in range(64)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda x: e.infer("mlp", x), xs))
    sess = ort.InferenceSession(str(d / "mlp.onnx"), providers=["CPUExecutionProvider"])
    for x, (status, doc) in zip(xs, results, strict=True):
        assert status == 200
        got = np.asarray(doc["outputs"][0]["data"], dtype=np.float32)
        np.testing.assert_allclose(
            got, sess.run(None, {"input": x})[0].ravel(), rtol=1e-4, atol=1e-4
        )
    assert e.terminate() == 0
