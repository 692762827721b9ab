"""The worker's self-benchmark (``placement.maxLatencyP95``): a real worker process (real ONNX
Runtime, a tiny MLP) times its runs after the warm-up and says the p95 in READY; edged holds
it to bounds (``BenchmarkResult.from_worker``). Nothing is faked."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from workerprocess import Worker, launch_spec

from edged.runtime.launching import SandboxSpec
from edged.runtime.worker import BENCH_RUNS
from edged.serving.measuring import BenchmarkResult
from edgefleet.demo import build_mlp


def test_a_worker_reports_its_self_benchmark_when_ready(tmp_path: Path) -> None:
    model = build_mlp(tmp_path / "model.onnx")
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    w = Worker(launch_spec(model, sha, SandboxSpec(mode="off")))
    try:
        kind, meta = w.first_frame()
    finally:
        w.close()
    assert kind == "ready", meta
    bench = BenchmarkResult.from_worker(meta["benchmark"])
    assert bench is not None
    assert 1 <= bench.runs <= BENCH_RUNS  # bounded in runs (and in time: 2 s)
    assert 0 < bench.p95_s < 2.0


@pytest.mark.parametrize(
    "doc",
    [None, "fast", {"p95Seconds": -1, "runs": 3}, {"p95Seconds": 0.1, "runs": 0},
     {"p95Seconds": "x", "runs": 3}, {"p95Seconds": float("nan"), "runs": 3},
     {"p95Seconds": 0.1, "runs": 10**6}],
)  # fmt: skip
def test_a_malformed_benchmark_is_not_reported(doc: object) -> None:
    assert BenchmarkResult.from_worker(doc) is None
