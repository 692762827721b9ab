"""Rollouts across a real fleet, for the rollout scenarios: pushing a version (or an
unloadable one), applying it (by default the deployment template det, one replica per device
on site=a, one device switched at a time; or another of deploymenttesting's), what each device
serves, and sampling the hub and the devices until a rollout is done while checking its budget
at every sample."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deploymenttesting import DET_ROLLING as DEPLOYMENT
from fleet import HubProcess
from harness import Edged

from edgefleet.demo import TINY_MLP, build_mlp


def push(hub: HubProcess, tmp_path: Path, version: str, *, bad: bool = False) -> None:
    path = tmp_path / f"det-{version}.onnx"
    if bad:
        build_unloadable(path)
    else:
        build_mlp(path, TINY_MLP, seed=int(version.replace(".", "")))
    out = hub.edgectl("models", "push", str(path), "--name", "det", "--version", version)
    assert "pushed" in out.stdout, out.stdout + out.stderr


def apply(hub: HubProcess, tmp_path: Path, version: str, template: str = DEPLOYMENT) -> None:
    """``edgectl apply`` of the deployment ``template`` (deploymenttesting) for ``version``."""
    doc = tmp_path / f"det-{version}.yaml"
    doc.write_text(template.format(version=version))
    hub.edgectl("apply", "-f", str(doc))


def status(hub: HubProcess) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(hub.edgectl("get", "deployments", "det", "-o", "json").stdout)
    return doc["status"]  # type: ignore[no-any-return]


def on_device(e: Edged) -> tuple[set[str], set[str]]:
    """(versions with a ready replica, versions with a replica not ready) on one device."""
    ready, not_ready = set(), set()
    try:
        w = e.workload("det")
    except (KeyError, StopIteration, OSError):
        return ready, not_ready
    for r in w.get("replicas", []):
        (ready if r.get("ready") else not_ready).add(r.get("version", "?"))
    return ready, not_ready


def run_until(
    hub: HubProcess,
    devices: list[Edged],
    done: Callable[[dict[str, Any]], bool],
    timeout: float,
    *,
    new: str,
    budget: int,
    hub_counts: bool = True,
) -> list[dict[str, Any]]:
    """Sample the hub and every device until ``done``; at every sample at most ``budget``
    devices are being switched to ``new`` (a replica of it not ready yet, or nothing ready)."""
    samples = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        views = [on_device(e) for e in devices]
        switching = [
            i for i, (ready, not_ready) in enumerate(views) if new in not_ready or not ready
        ]
        assert len(switching) <= budget, (switching, views)
        s = status(hub)
        rollout = s.get("rollout", {})
        if hub_counts and rollout.get("phase") == "Progressing":
            assert rollout["updatingDevices"] + rollout["unavailableDevices"] <= budget, rollout
        samples.append(s)
        if done(s):
            return samples
        time.sleep(0.1)
    raise AssertionError(f"timed out; last status: {samples[-1] if samples else None}")


def build_unloadable(path: Path) -> Path:
    """A valid ONNX file that ONNX Runtime cannot load: an operator that does not exist."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("NoSuchOperator", ["input"], ["logits"])],
        "unloadable",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path
