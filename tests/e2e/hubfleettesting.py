"""A real hub and its devices, for the hub fleet scenarios: the deployment template with its
fields, pushing a model, applying a deployment, and whether a device serves a version."""

from __future__ import annotations

from pathlib import Path

from fleet import HubProcess
from harness import Edged

from edgefleet.demo import TINY_MLP, build_mlp

DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: {name}}}
spec:
  model: {{name: {model}, version: "{version}"}}
  runtime: {{executionProviders: [CPUExecutionProvider]}}
  replicas: {{perDevice: 1}}
  placement: {{nodeSelector: {{site: {site}}}}}
  probes:
    readiness: {{periodSeconds: 1, timeoutSeconds: 1}}
"""


def push(hub: HubProcess, tmp_path: Path, model: str, version: str, seed: int = 1) -> Path:
    path = tmp_path / f"{model}-{version}.onnx"
    build_mlp(path, TINY_MLP, seed=seed)
    out = hub.edgectl("models", "push", str(path), "--name", model, "--version", version)
    assert "pushed" in out.stdout or "unchanged" in out.stdout, out.stdout
    return path


def apply(hub: HubProcess, tmp_path: Path, **fields: str) -> str:
    doc = tmp_path / f"{fields['name']}.yaml"
    doc.write_text(DEPLOYMENT.format(**fields))
    return hub.edgectl("apply", "-f", str(doc)).stdout


def serving(e: Edged, model: str, version: str) -> bool:
    try:
        w = e.workload(model)
    except (KeyError, StopIteration):
        return False
    return w.get("model", {}).get("version") == version and w.get("readyReplicas") == 1
