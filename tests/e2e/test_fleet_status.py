"""Fleet status that is true, end to end: a real hub, two real edged devices, real ONNX Runtime.

The hub's deployment status is sampled all along each change, and every sample is checked:
a version that fails to load is never counted updated or available, a switch between two good
versions never lowers the available count, and refusals and failures reach the hub with their
reasons and as events.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import Edged, wait_for
from rollouttesting import build_unloadable, status

from edgefleet.demo import TINY_MLP, build_mlp

DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: det}}
spec:
  model: {{name: det, version: "{version}"}}
  runtime: {{executionProviders: [CPUExecutionProvider]}}
  replicas: {{perDevice: 1}}
  placement: {{nodeSelector: {{site: a}}}}
  probes:
    readiness: {{periodSeconds: 1, timeoutSeconds: 1}}
"""
X = np.ones((1, 64), dtype=np.float32)


@pytest.fixture
def devices(
    hub: HubProcess, tmp_path: Path, edged_factory: Callable[..., Edged]
) -> Iterator[list[Edged]]:
    started = []
    for name in ("dev-1", "dev-2"):
        data = tmp_path / name
        out = enroll(hub, data, name, {"site": "a"})
        assert out.returncode == 0, out.stdout + out.stderr
        config = SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "no-root")
        started.append(edged_factory(None, data=data, config=config).start())
    yield started
    for e in started:
        if e.proc is not None and e.proc.poll() is None:
            e.terminate()


def push(hub: HubProcess, path: Path, version: str) -> None:
    out = hub.edgectl("models", "push", str(path), "--name", "det", "--version", version)
    assert "pushed" in out.stdout, out.stdout + out.stderr


def apply(hub: HubProcess, tmp_path: Path, version: str) -> None:
    doc = tmp_path / f"det-{version}.yaml"
    doc.write_text(DEPLOYMENT.format(version=version))
    hub.edgectl("apply", "-f", str(doc))


def sample_until(
    hub: HubProcess, done: Callable[[dict[str, Any]], bool], timeout: float, what: str
) -> list[dict[str, Any]]:
    """Every status read until ``done`` holds (each is checked by the caller)."""
    samples = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        samples.append(status(hub))
        if done(samples[-1]):
            return samples
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last status: {samples[-1]}")


def events(hub: HubProcess) -> list[dict[str, Any]]:
    out = hub.edgectl("get", "events", "--for", "ModelDeployment/det", "-o", "json").stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def test_status_counts_only_what_serves(
    hub: HubProcess, devices: list[Edged], tmp_path: Path
) -> None:
    push(hub, build_mlp(tmp_path / "good-1.onnx", TINY_MLP, seed=1), "1.0.0")
    push(hub, build_mlp(tmp_path / "good-2.onnx", TINY_MLP, seed=2), "1.1.0")
    push(hub, build_unloadable(tmp_path / "bad.onnx"), "2.0.0")
    apply(hub, tmp_path, "1.0.0")
    sample_until(hub, lambda s: s["availableDevices"] == 2, 90, "1.0.0 available on both")

    # 1. A zero-downtime switch between good versions: available never drops.
    apply(hub, tmp_path, "1.1.0")
    samples = sample_until(hub, lambda s: s["readyDevices"] == 2, 90, "1.1.0 ready on both")
    assert [s["availableDevices"] for s in samples if s["availableDevices"] != 2] == []
    assert all(s["failing"] == {} for s in samples)
    assert samples[-1]["versions"].keys() >= {"1.1.0"}

    # 2. A version that fails to load: never updated, never available; the device that took it
    # reports the worker's own error, the hub records it as an event and rolls it back; the
    # devices keep serving 1.1.0.
    apply(hub, tmp_path, "2.0.0")
    samples = sample_until(
        hub, lambda s: s["rollout"]["phase"] == "RolledBack", 90, "2.0.0 rolled back"
    )
    assert [s for s in samples if s["updatedDevices"] or "2.0.0" in s["versions"]] == []
    # the worker's own error (ModelLoadFailed; onnxruntime sometimes aborts instead)
    assert "2.0.0 Failed: " in samples[-1]["rollout"]["message"]
    assert samples[-1]["versions"] == {"1.1.0": {"devices": 2, "ready": 2}}
    for e in devices:
        code, _ = e.infer("det", X)
        assert code == 200
    wait_for(
        lambda: {"RevisionFailed", "RolledBack"} <= {e["reason"] for e in events(hub)},
        30,
        "RevisionFailed and RolledBack events",
    )
    (failed,) = [e for e in events(hub) if e["reason"] == "RevisionFailed"]
    assert "2.0.0 Failed: " in failed["message"]
    assert sum("revision failed" in e.logs() for e in devices) == 1

    # 3. A version older than one the devices accepted (signed later, so not a metadata
    # replay: the model version check refuses it): Refused with the trust gate's reason, an
    # event, edged logs it, and the rollout is rolled back.
    push(hub, build_mlp(tmp_path / "older.onnx", TINY_MLP, seed=3), "0.9.0")
    apply(hub, tmp_path, "0.9.0")
    samples = sample_until(
        hub, lambda s: s["rollout"]["phase"] == "RolledBack", 60, "0.9.0 rolled back"
    )
    assert "0.9.0 Refused: ModelVersionRollback" in samples[-1]["rollout"]["message"]
    assert all(s["updatedDevices"] == 0 for s in samples)
    wait_for(
        lambda: "RevisionRefused" in {e["reason"] for e in events(hub)},
        30,
        "a RevisionRefused event",
    )
    assert sum("artifact refused" in e.logs() for e in devices) == 1
