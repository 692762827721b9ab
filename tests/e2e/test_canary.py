"""Canary rollouts with analysis end to end: a real hub, three real edged devices, real ONNX
Runtime workers evaluating the validation set each artifact ships, and real traffic on every
device's inference socket (what the devices report per revision is what the hub analyses).

* a good version (its accuracy on the validation set 1.0) rolls through every step;
* a version whose validation accuracy is below ``minAccuracy`` stops at the first canary step
  (one device) and is rolled back everywhere, with the check and the figures in the status;
* a version that answers half the requests with errors is rolled back by the error rate.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from deploymenttesting import det_canary
from fleet import MEASURED_DEVICE_CONFIG, HubProcess
from fleetcanarytesting import Traffic, labels_of, push
from harness import Edged
from rollouttesting import apply, on_device, run_until

from edgefleet.demo import TINY_MLP, build_mlp

DEPLOYMENT = det_canary(
    '["33%", {{pause: {{duration: 1s}}}}, "66%"]',
    analysis="{{minAccuracy: 0.9, maxErrorRateIncrease: 0.1, window: 3s, minRequests: 5}}",
    progress_deadline_s=240,
)
N = 3


@pytest.fixture
def fleet_size() -> int:
    return N


@pytest.fixture
def device_config() -> str:
    return MEASURED_DEVICE_CONFIG


def build_erring(path: Path) -> Path:
    """input [batch, 64] -> logits [batch, 10]: row ``int(input[:, 0])`` of a table; an index
    past 9 makes ONNX Runtime fail the request (HTTP 500). Warm-up (zeros) passes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = np.random.default_rng(7).standard_normal((10, 10)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["input", "zero"], ["first"], axis=1),
            helper.make_node("Cast", ["first"], ["index"], to=TensorProto.INT64),
            helper.make_node("Reshape", ["index", "flat"], ["rows"]),
            helper.make_node("Gather", ["table", "rows"], ["logits"], axis=0),
        ],
        "erring",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
            numpy_helper.from_array(np.array([-1], np.int64), "flat"),
            numpy_helper.from_array(table, "table"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


def rollout_status(hub: HubProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return hub.edgectl("rollout", "status", "det", *args, check=False)


def canary_of(s: dict[str, Any]) -> dict[str, Any]:
    return s.get("rollout", {}).get("canary") or {}


def test_a_canary_passes_every_step_and_bad_ones_are_rolled_back(
    hub: HubProcess, devices: list[Edged], tmp_path: Path
) -> None:
    stable = build_mlp(tmp_path / "det-1.0.0.onnx", TINY_MLP, seed=1)
    truth = labels_of(stable)
    good = build_mlp(tmp_path / "det-1.1.0.onnx", TINY_MLP, seed=1, scale=1.5)
    assert (labels_of(good) == truth).mean() >= 0.95  # the same answers, other bytes
    wrong = build_mlp(tmp_path / "det-2.0.0.onnx", TINY_MLP, seed=2)
    assert (labels_of(wrong) == truth).mean() < 0.5
    erring = build_erring(tmp_path / "det-3.0.0.onnx")
    push(hub, tmp_path, "1.0.0", stable, truth)
    push(hub, tmp_path, "1.1.0", good, truth)
    push(hub, tmp_path, "2.0.0", wrong, truth)
    push(hub, tmp_path, "3.0.0", erring, labels_of(erring))
    apply(hub, tmp_path, "1.0.0", DEPLOYMENT)  # the first revision goes everywhere at once
    run_until(hub, devices, lambda s: s["readyDevices"] == N, 120, new="1.0.0", budget=N)

    with Traffic(devices) as traffic:
        # 1. a good version: one device, a pause, two devices, then all three; each step held
        # for the window with the analysis passing; never more than one device switching
        apply(hub, tmp_path, "1.1.0", DEPLOYMENT)
        samples = run_until(
            hub,
            devices,
            lambda s: s.get("rollout", {}).get("phase") == "Complete",
            240,
            new="1.1.0",
            budget=1,
        )
        steps = {canary_of(s).get("step") for s in samples} - {None}
        assert steps >= {1, 3}, steps  # the weights' steps (the pause may pass between samples)
        assert max(s["updatedDevices"] for s in samples if canary_of(s).get("step") == 1) <= 1
        passed = [
            c
            for s in samples
            for c in (canary_of(s).get("analysis") or {}).get("checks", [])
            if c["verdict"] == "Pass"
        ]
        assert {"accuracy", "errorRate"} <= {c["name"] for c in passed}, passed
        events = json.loads(
            hub.edgectl("get", "events", "--for", "ModelDeployment/det", "-o", "json").stdout
        )["items"]
        assert sum(1 for e in events if e["reason"] == "CanaryStepPassed") == 3
        done = rollout_status(hub)
        assert done.returncode == 0 and "Complete" in done.stdout, done.stdout + done.stderr

        # 2. accuracy 0.1 on the validation set: it stops at the first step (one device) and
        # every device is back on 1.1.0
        apply(hub, tmp_path, "2.0.0", DEPLOYMENT)
        samples = run_until(
            hub,
            devices,
            lambda s: s.get("rollout", {}).get("phase") == "RolledBack",
            180,
            new="2.0.0",
            budget=1,
        )
        assert max(s["rollout"]["updatedDevices"] for s in samples) <= 1
        rollout = samples[-1]["rollout"]
        assert rollout["reason"] == "AnalysisFailed", rollout
        assert "step 1 of 3 (33%)" in rollout["message"], rollout
        assert "below minAccuracy 0.9" in rollout["message"], rollout
        failed = rollout_status(hub, "--watch", "--timeout", "30s")
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert "AnalysisFailed" in failed.stderr and "minAccuracy" in failed.stderr
        events = json.loads(
            hub.edgectl("get", "events", "--for", "ModelDeployment/det", "-o", "json").stdout
        )["items"]
        sent = [e["message"] for e in events if e["reason"] == "DevicesUpdated"]
        assert [m.rsplit(" ", 1)[-1] for m in sent if "(2.0.0)" in m] == ["dev-0"], sent
        run_until(
            hub,
            devices,
            lambda s: s["availableDevices"] == N and s["versions"].keys() == {"1.1.0"},
            120,
            new="1.1.0",
            budget=1,
        )

        # 3. half the requests fail: rolled back by the error rate, against 1.1.0's 0%
        apply(hub, tmp_path, "3.0.0", DEPLOYMENT)
        samples = run_until(
            hub,
            devices,
            lambda s: s.get("rollout", {}).get("phase") == "RolledBack",
            180,
            new="3.0.0",
            budget=1,
        )
        rollout = samples[-1]["rollout"]
        assert rollout["reason"] == "AnalysisFailed", rollout
        assert "above maxErrorRateIncrease 10.00%" in rollout["message"], rollout
        run_until(
            hub,
            devices,
            lambda s: s["availableDevices"] == N and s["versions"].keys() == {"1.1.0"},
            120,
            new="1.1.0",
            budget=1,
        )
        assert traffic.answers.get(500, 0) > 0  # the errors came from the workers
    assert all(on_device(e)[0] == {"1.1.0"} for e in devices)
