"""The ModelConfig drives the worker's processing stage (issue 36: "the model's pre/post-
processing reads it"), end to end: a real hub, two real edged, real ONNX Runtime workers
evaluating the artifact's validation set, real traffic.

* the answers served are the model's with its config (``edgefleet.io/processing``), and a
  config change changes them on the same worker process, without a restart;
* the canary analysis measures the model *with* the config: a config that ruins the answers
  (its classes reversed) fails ``minAccuracy`` at the first canary step and is rolled back,
  every device back on the stable config;
* a config that does not fit the model (an input it does not have) is refused on the device,
  by the worker, with its reason: the revision is broken there and rolled back, and the hub
  names the device and the reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fleet import SIGNED_DEVICE_CONFIG, HubProcess
from fleetcanarytesting import INPUTS, Traffic, labels_of, push
from harness import Edged
from modelconfigtesting import apply, deployment, rollout
from polltesting import wait_for
from rollouttesting import status

from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.modelprocessing import PROCESSING_KEY

pytestmark = pytest.mark.scenario

DEPLOYMENT = deployment(
    pause="{duration: 1s}",
    rollout="    progressDeadlineSeconds: 240\n",
    canary="      analysis: {minAccuracy: 0.9, maxErrorRateIncrease: 0.5, window: 3s,"
    " minRequests: 3}\n",
)
N = 2


@pytest.fixture
def fleet_size() -> int:
    return N


@pytest.fixture
def device_config() -> str:
    return SIGNED_DEVICE_CONFIG + '\n[inference]\nmetricsPeriod = "1s"\n'


def config(outputs: dict[str, Any] | None = None, inputs: dict[str, Any] | None = None) -> str:
    processing = {"outputs": outputs or {}, "inputs": inputs or {}}
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelConfig",
        "metadata": {"name": "det"},
        "spec": {"model": "det", "data": {PROCESSING_KEY: processing}},
    }
    return json.dumps(doc)


def answers(e: Edged) -> np.ndarray | None:
    code, doc = e.infer("det", INPUTS[:4].tolist())
    if code != 200:
        return None
    (out,) = doc["outputs"]
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def serve(devices: list[Edged], want: np.ndarray) -> bool:
    return all((got := answers(e)) is not None and np.allclose(got, want) for e in devices)


def test_the_config_drives_the_answers_and_the_canary_measures_model_and_config(
    hub: HubProcess, devices: list[Edged], tmp_path: Path
) -> None:
    import onnxruntime as ort

    model = build_mlp(tmp_path / "det.onnx", TINY_MLP, seed=1)
    truth = labels_of(model)
    push(hub, tmp_path, "1.0.0", model, truth)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    raw = np.asarray(session.run(None, {"input": INPUTS[:4]})[0])
    mean = float(np.median(raw))  # a threshold that changes the answers, not their arg-max

    # 1. the first revision, with a threshold: every device answers thresholded
    first = {"logits": {"threshold": mean, "below": -100.0}}
    apply(hub, tmp_path, DEPLOYMENT + "---\n" + config(first))
    wait_for(lambda: rollout(hub).get("phase") == "Complete", 180, "revision 1 complete",
             detail=lambda: json.dumps(rollout(hub)))  # fmt: skip
    thresholded = np.where(raw < mean, np.float32(-100.0), raw)
    wait_for(lambda: serve(devices, thresholded), 60, "thresholded answers on both devices")
    pids = [e.worker_pids("det") for e in devices]

    with Traffic(devices) as traffic:
        # 2. a change that keeps the accuracy: through every canary step, on the same workers
        second = {"logits": {"threshold": mean, "below": -50.0}}
        apply(hub, tmp_path, config(second))
        wait_for(lambda: rollout(hub).get("revision") == 2, 60, "revision 2")
        wait_for(lambda: rollout(hub).get("phase") == "Complete", 180, "revision 2 complete",
                 detail=lambda: json.dumps(rollout(hub)))  # fmt: skip
        analysis = json.dumps(rollout(hub))
        assert wait_for(lambda: serve(devices, np.where(raw < mean, -50.0, raw)), 30, "2nd")
        assert [e.worker_pids("det") for e in devices] == pids  # no restart
        events = hub.edgectl("get", "events", "--for", "ModelDeployment/det", "-o", "json")
        assert "CanaryStepPassed" in events.stdout, analysis

        # 3. a config that reverses the classes: the accuracy with it fails the canary
        reverse = {"logits": {"classMap": list(range(10))[::-1]}}
        apply(hub, tmp_path, config(reverse))
        wait_for(lambda: rollout(hub).get("phase") == "RolledBack", 180, "the rollback",
                 detail=lambda: json.dumps(rollout(hub)))  # fmt: skip
        shown = rollout(hub)
        assert shown["reason"] == "AnalysisFailed", shown
        assert "below minAccuracy 0.9" in shown["message"], shown
        wait_for(lambda: serve(devices, np.where(raw < mean, -50.0, raw)), 60, "stable again")

        # 4. a config the model cannot take (no input "pixels"): refused by the worker, said
        # at the hub, rolled back; the workers serve the stable config throughout
        apply(hub, tmp_path, config(second, inputs={"pixels": {"scale": 2.0}}))
        wait_for(lambda: rollout(hub).get("phase") == "RolledBack" and rollout(hub).get(
            "revision", 0) >= 4, 180, "the unfit config rolled back",
            detail=lambda: json.dumps(rollout(hub)))  # fmt: skip
        said = json.dumps(rollout(hub))
        assert "ModelConfigRefused" in said and "the model has no such input" in said, said
        assert serve(devices, np.where(raw < mean, -50.0, raw))
        assert [e.worker_pids("det") for e in devices] == pids
    # every request answered through four config changes, two rollbacks and a refusal
    assert set(traffic.answers) == {200} and traffic.answers[200] > 20, traffic.answers
    wait_for(lambda: status(hub).get("config", {}).get("runningDesired") == N, 60,
             "both devices on the stable config, no error",
             detail=lambda: json.dumps(status(hub).get("config")))  # fmt: skip
