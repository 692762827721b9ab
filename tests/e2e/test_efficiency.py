"""Autoscaling and eviction with a real edged and real ONNX Runtime workers.

* A load generator keeps the queue deep: replicas go up after the scale-up window, and the
  new replica serves; the load stops: down after the scale-down window, not before.
* Memory pressure: ``MemAvailable`` is read from a file the test writes (the sampler's
  test-only seam ``EDGED_TEST_MEMINFO``): as it shrinks the batch size drops, then the
  low-priority workload is evicted while the critical one keeps serving; both come back when
  memory does. ``oom_score_adj`` of each worker follows its priority.

(That the autoscaler does not flap under an oscillating load is a table test:
tests/reconcile/test_autoscaling.py.)
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from harness import UNSIGNED_CONFIG, Edged, wait_for
from loading import Load, infer_bytes

from edgefleet.demo import MEDIUM_MLP, TINY_MLP, build_mlp

SCALED = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: {name}}}
spec:
  model: {{name: {name}, version: "1", path: {path}}}
  runtime: {{maxBatchSize: 1, executionProviders: [CPUExecutionProvider]}}
  replicas: {{perDevice: 1}}
  resources: {{cpu: 1000m}}
  scaling:
    minReplicas: 1
    maxReplicas: 2
    queueDepthUp: 4
    cpuDownBelow: 40%
    scaleUpWindow: {up}
    scaleDownWindow: {down}
"""

PRIORITIZED = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: {name}}}
spec:
  model: {{name: {name}, version: "1", path: mlp.onnx}}
  runtime: {{maxBatchSize: {batch}, executionProviders: [CPUExecutionProvider]}}
  replicas: {{perDevice: {replicas}}}
  priority: {priority}
  probes: {{readiness: {{periodSeconds: 1}}}}
"""


def _config(tmp_path: Path, extra: str) -> str:
    return UNSIGNED_CONFIG.format(absent=tmp_path / "no-trust-root.json") + extra


def test_queue_depth_scales_up_and_idle_scales_down(tmp_path: Path, edged_factory) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    build_mlp(manifests / "medium.onnx", MEDIUM_MLP, seed=1)
    (manifests / "m.yaml").write_text(
        SCALED.format(name="m", path="medium.onnx", up="2s", down="4s")
    )
    e: Edged = edged_factory(
        manifests, config=_config(tmp_path, '[scaling]\nsamplePeriod = "250ms"\n')
    ).start()
    e.wait_ready(120)
    w = e.workload("m")
    assert w["scaling"]["desiredReplicas"] == 1 and w["scaling"]["lastDecision"] is None
    assert len(w["replicas"]) == 1

    request = infer_bytes("m", MEDIUM_MLP[0])
    with Load(e.infer_sock, request, connections=3, window=6) as load:
        up = wait_for(
            lambda: (s := e.workload("m")["scaling"])["lastDecision"] and s,
            120,
            "a scale-up decision",
        )
        decision = up["lastDecision"]
        assert (decision["from"], decision["to"], decision["reason"]) == (1, 2, "QueueDepthHigh")
        assert "above queueDepthUp 4" in decision["message"], decision
        assert "every sample for 2s" in decision["message"]
        # the new replica serves, while the load goes on
        wait_for(
            lambda: sum(r["ready"] for r in e.workload("m")["replicas"]) == 2,
            120,
            "the second replica ready",
        )
        before = load.answered
        wait_for(lambda: load.answered > before + 50, 60, "requests answered with 2 replicas")
        assert e.workload("m")["scaling"]["currentReplicas"] == 2
    stopped = time.time()
    assert load.errors == [] and load.failed == 0, (load.errors, load.failed)
    assert "replicas scaled" in e.logs()

    down = wait_for(
        lambda: (d := e.workload("m")["scaling"]["lastDecision"])["to"] == 1 and d,
        120,
        "a scale-down decision",
    )
    assert down["reason"] == "CpuLow" and "below cpuDownBelow 40%" in down["message"]
    assert down["at"] >= stopped + 4 - 0.5  # not before the scale-down window (clock slack)
    wait_for(lambda: len(e.workload("m")["replicas"]) == 1, 60, "the extra replica stopped")
    x = np.zeros((1, MEDIUM_MLP[0]), dtype=np.float32)
    assert e.infer("m", x)[0] == 200
    assert e.terminate() == 0


def test_memory_pressure_evicts_the_low_priority_workload(
    tmp_path: Path, edged_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    build_mlp(manifests / "mlp.onnx", TINY_MLP, seed=1)
    meminfo = tmp_path / "meminfo"

    def available(mib: int) -> None:
        tmp = meminfo.with_suffix(".tmp")
        tmp.write_text(f"MemTotal: 8000000 kB\nMemAvailable: {mib * 1024} kB\n")
        tmp.replace(meminfo)

    available(4000)
    monkeypatch.setenv("EDGED_TEST_MEMINFO", str(meminfo))
    for name, replicas, priority, batch in (("critical", 1, 1000, 8), ("batch", 2, -10, 1)):
        (manifests / f"{name}.yaml").write_text(
            PRIORITIZED.format(name=name, replicas=replicas, priority=priority, batch=batch)
        )
    e: Edged = edged_factory(
        manifests,
        config=_config(
            tmp_path,
            '[scaling]\nsamplePeriod = "200ms"\n'
            '[eviction]\nmemoryAvailableFloor = "500Mi"\nhysteresis = "10%"\ninterval = "1s"\n',
        ),
    ).start()
    e.wait_ready(120)
    wait_for(lambda: len(e.worker_pids("batch")) == 2, 60, "both batch replicas")
    # the kernel's OOM killer is steered by priority
    for name, sign in (("critical", -1), ("batch", 1)):
        for pid in e.worker_pids(name):
            adj = int(Path(f"/proc/{pid}/oom_score_adj").read_text())
            own = int(Path("/proc/self/oom_score_adj").read_text())
            assert adj * sign > 0 or (sign < 0 and adj == own), (name, adj)

    x = np.zeros((1, TINY_MLP[0]), dtype=np.float32)
    # memory-aware batching: plenty of memory, the declared 8 rows
    batching = wait_for(lambda: e.workload("critical").get("batching"), 30, "batching status")
    assert batching["maxBatchSize"] == batching["effectiveMaxBatchSize"] == 8
    assert "batching" not in e.workload("batch")  # maxBatchSize 1: nothing to limit
    # room for about 3 rows above the floor: the batch size drops (a power of two), and the
    # worker says it applies it
    row = batching["rowBytes"]
    tmp = meminfo.with_suffix(".tmp")
    tmp.write_text(f"MemAvailable: {(500 * (1 << 20) + 3 * row + 512) // 1024} kB\n")
    tmp.replace(meminfo)
    small = wait_for(
        lambda: (n := e.workload("critical")["batching"]["effectiveMaxBatchSize"]) < 8 and n,
        30,
        "a smaller batch size",
    )
    assert small in (1, 2)
    wait_for(
        lambda: e.workload("critical")["replicas"][0]["batchRows"] == small, 30, "the worker's"
    )
    assert "batch size changed" in e.logs()
    assert e.infer("critical", np.zeros((3, TINY_MLP[0]), dtype=np.float32))[0] == 200
    assert not any(w.get("eviction", {}).get("evictedReplicas") for w in e.status()["workloads"])

    available(300)  # below the 500Mi floor
    wait_for(lambda: e.workload("batch")["eviction"]["evictedReplicas"] == 2, 60, "batch evicted")
    wait_for(lambda: not e.worker_pids("batch"), 60, "batch replicas stopped")
    status = e.status()
    assert status["device"]["memory"]["underPressure"] is True
    crit = e.workload("critical")
    assert crit["eviction"]["evictedReplicas"] == 0 and crit["readyReplicas"] == 1
    batch = e.workload("batch")
    assert any(
        c["type"] == "Evicted" and c["reason"] == "MemoryPressure" for c in batch["conditions"]
    )
    for _ in range(20):
        assert e.infer("critical", x)[0] == 200  # the critical one keeps serving
    assert e.infer("batch", x)[0] == 503
    wait_for(lambda: "nothing to evict" in e.logs(), 30, "the critical workload left alone")
    assert e.worker_pids("critical")
    logs = e.logs()
    assert "replica evicted" in logs and "MemAvailable 300Mi is below the floor 500Mi" in logs

    available(520)  # above the floor, below floor + hysteresis + a replica: nothing moves
    time.sleep(1.5)
    assert e.workload("batch")["eviction"]["evictedReplicas"] == 2
    available(4000)
    wait_for(lambda: len(e.worker_pids("batch")) == 2, 60, "batch back")
    wait_for(lambda: e.infer("batch", x)[0] == 200, 60, "batch serving again")
    assert e.workload("batch")["eviction"]["evictedReplicas"] == 0
    wait_for(
        lambda: e.workload("critical")["replicas"][0]["batchRows"] == 8, 30, "batches grown back"
    )
    assert "replica restored" in e.logs()
    assert e.terminate() == 0
