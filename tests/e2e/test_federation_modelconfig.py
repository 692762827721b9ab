"""ModelConfigs across federation (issue 36, docs/model-config.md "Federation"): a real root hub,
a real regional hub enrolled with it (``hub init --parent``), a real edged enrolled with the
region, real ONNX Runtime workers.

* a ModelConfig applied at the root, for a deployment that goes to the region, travels in the
  region's slice with the deployment: the region's device gets it merged for itself (an
  override by the region's device name), and its worker serves with it;
* the root shows the region's config figures (its devices on the desired config);
* a change at the root reaches the device as a new revision of the region's rollout, on the
  same worker process;
* the region refuses to change what the root owns, and its own ModelConfig for the same
  model is refused (one config per model);
* a second deployment of the model giving the region a model variant is refused at the root,
  naming both (the region would need two configs of one name). Waves:
  tests/hub/test_hub_waves_modelconfig.py; a variant alone:
  tests/hub/test_hub_federation_slices.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from federationtesting import SLACK, serving
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import Edged, wait_for

from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.modelprocessing import PROCESSING_KEY

pytestmark = pytest.mark.scenario

DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {name: det}
spec:
  model: {name: det, version: "1.0.0"}
  runtime: {executionProviders: [CPUExecutionProvider]}
  replicas: {perDevice: 1}
  placement: {regions: [eu], nodeSelector: {site: a}}
  probes:
    readiness: {periodSeconds: 1, timeoutSeconds: 1}
"""


def config(below: float, name: str = "det") -> str:
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelConfig",
        "metadata": {"name": name},
        "spec": {
            "model": "det",
            "data": {"site": "any"},
            "overrides": [
                {
                    "devices": ["dev-eu-0"],
                    "data": {
                        "site": "eu-0",
                        PROCESSING_KEY: {"outputs": {"logits": {"threshold": 0.0, "below": below}}},
                    },
                }
            ],
        },
    }
    return json.dumps(doc)


def apply(hub: HubProcess, tmp_path: Path, text: str) -> Any:
    path = tmp_path / "applied.yaml"
    path.write_text(text)
    return hub.edgectl("apply", "-f", str(path), check=False)


def answers(e: Edged, x: np.ndarray) -> np.ndarray | None:
    code, doc = e.infer("det", x.tolist())
    if code != 200:
        return None
    (out,) = doc["outputs"]
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def test_a_root_sends_its_regions_the_model_configs_of_their_deployments(
    tmp_path: Path, edged_factory: Callable[..., Edged]
) -> None:
    import onnxruntime as ort

    root = HubProcess(tmp_path / "root", tmp_path / "root.log").init("--region", "root").start()
    eu: HubProcess | None = None
    try:
        token, pin = root.token("--for-region", "eu")
        eu = HubProcess(tmp_path / "eu", tmp_path / "eu.log")
        eu.init("--region", "eu", "--parent", root.address, "--token", token,
                "--parent-ca-hash", pin)  # fmt: skip
        eu.start()
        out = enroll(eu, tmp_path / "dev-eu-0", "dev-eu-0", {"site": "a"})
        assert out.returncode == 0, out.stdout + out.stderr
        device_config = SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "no-root")
        dev = edged_factory(None, data=tmp_path / "dev-eu-0", config=device_config).start()

        model = build_mlp(tmp_path / "det.onnx", TINY_MLP, seed=1)
        pushed = root.edgectl("models", "push", str(model), "--name", "det", "--version", "1.0.0")
        assert "pushed" in pushed.stdout, pushed.stdout + pushed.stderr
        x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        raw = np.asarray(session.run(None, {"input": x})[0])

        # 1. applied at the root with a deployment that goes to eu: accepted (no longer refused)
        done = apply(root, tmp_path, DEPLOYMENT + "---\n" + config(-1.0))
        assert done.returncode == 0, done.stdout + done.stderr
        assert "modelconfig/det created" in done.stdout, done.stdout

        # the region holds it as the root's; the device gets its own merge, the worker applies it
        wait_for(lambda: serving(dev), SLACK, "dev-eu-0 serving det")
        path = dev.data / "configs" / "det" / "config.json"
        wait_for(path.exists, SLACK, "the config on the region's device")
        got = json.loads(path.read_text())
        assert got["data"]["site"] == "eu-0", got  # the override naming the device
        wait_for(
            lambda: (
                (a := answers(dev, x)) is not None and np.allclose(a, np.where(raw < 0, -1, raw))
            ),
            SLACK,
            "the root's config in force on the region's device",
        )
        (pid,) = dev.worker_pids("det")
        shown = json.loads(eu.edgectl("get", "modelconfig", "det", "-o", "json").stdout)
        assert shown["spec"]["overrides"][0]["devices"] == ["dev-eu-0"]
        wait_for(
            lambda: (
                json.loads(eu.edgectl("get", "deployment", "det", "-o", "json").stdout)["status"]
                .get("config", {})
                .get("runningDesired")
                == 1
            ),
            SLACK,
            "the region to count its device on the desired config",
        )

        def at_root() -> dict[str, Any]:
            doc = json.loads(root.edgectl("get", "deployment", "det", "-o", "json").stdout)
            return dict(doc["status"])

        wait_for(
            lambda: at_root().get("config", {}).get("runningDesired") == 1,
            SLACK,
            "the root to show eu's device on the desired config",
            detail=lambda: json.dumps(at_root()),
        )
        shown = at_root()
        assert shown["config"] == {"modelConfig": "det", "devices": 1, "runningDesired": 1,
                                   "notRunningDesired": {}}, shown  # fmt: skip
        assert shown["regions"]["eu"]["config"]["devices"] == 1, shown

        # 2. the region refuses to change what the root owns, and a second config of the model
        changed = apply(eu, tmp_path, config(-3.0))
        assert changed.returncode != 0 and "root" in changed.stderr, changed.stderr
        second = apply(eu, tmp_path, config(-3.0, name="local"))
        assert second.returncode != 0 and "one config per model" in second.stderr, second.stderr

        # 3. a change at the root: a revision in the region, the same worker serves it
        done = apply(root, tmp_path, config(-2.0))
        assert done.returncode == 0 and "modelconfig/det configured" in done.stdout, done.stdout
        wait_for(
            lambda: (
                (a := answers(dev, x)) is not None and np.allclose(a, np.where(raw < 0, -2, raw))
            ),
            SLACK,
            "the changed config on the region's device",
        )
        assert dev.worker_pids("det") == [pid]
        rollout = json.loads(eu.edgectl("get", "deployment", "det", "-o", "json").stdout)
        assert rollout["status"]["rollout"]["revision"] >= 2, rollout["status"]

        # 4. a second deployment of the model giving eu a model variant, beside det: refused
        # at the root, naming both (eu would need the config for det and for det-int8)
        variant = DEPLOYMENT.replace(
            "metadata: {name: det}",
            'metadata: {name: det-b, annotations: {"federation.edgefleet.io/model.eu": det-int8}}',
        )
        refused = apply(root, tmp_path, variant)
        assert refused.returncode != 0, refused.stdout
        assert "giving region eu a model variant beside another deployment" in refused.stderr
        assert "(ModelDeployment det)" in refused.stderr and "not supported yet" in refused.stderr
        # 5. det alone giving eu a variant: its config is checked against the variant's schema
        # (the publisher's, signed with it): one the config breaks refuses the apply
        int8 = tmp_path / "int8" / "det-int8.onnx"
        int8.parent.mkdir()
        build_mlp(int8, TINY_MLP, seed=1)
        schema = int8.parent / "config.schema.json"
        schema.write_text(
            json.dumps({"type": "object", "properties": {"site": {"type": "integer"}}})
        )
        pushed = root.edgectl("models", "push", str(int8), "--name", "det-int8",
                              "--version", "1.0.0", "--extra", str(schema))  # fmt: skip
        assert "pushed" in pushed.stdout, pushed.stdout + pushed.stderr
        alone = DEPLOYMENT.replace(
            "metadata: {name: det}",
            'metadata: {name: det, annotations: {"federation.edgefleet.io/model.eu": det-int8}}',
        )
        refused = apply(root, tmp_path, alone)
        assert refused.returncode != 0, refused.stdout
        assert "the config schema of model det-int8 1.0.0" in refused.stderr, refused.stderr
        assert "ModelConfig det does not validate" in refused.stderr, refused.stderr
        assert dev.terminate() == 0
    finally:
        if eu is not None:
            eu.stop()
        root.stop()
