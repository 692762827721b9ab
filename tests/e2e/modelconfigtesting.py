"""What the ModelConfig end-to-end tests share (test_model_config_rollout.py,
test_model_config_processing.py): det's ModelDeployment on the site=a devices, one replica
each, rolled out one device at a time through a canary of 50%, a pause and 100%; a document
applied with edgectl; the deployment's rollout status."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleet import HubProcess
from rollouttesting import status

DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: det}}
spec:
  model: {{name: det, version: "1.0.0"}}
  runtime: {{executionProviders: [CPUExecutionProvider]}}
  replicas: {{perDevice: 1}}
  placement: {{nodeSelector: {{site: a}}}}
  probes:
    readiness: {{periodSeconds: 1, timeoutSeconds: 1}}
  rollout:
    maxSurge: 0
    maxUnavailable: 1
{rollout}    canary:
      steps: ["50%", {{pause: {pause}}}, "100%"]
{canary}"""


def deployment(pause: str = "{}", rollout: str = "", canary: str = "") -> str:
    """det's ModelDeployment; ``pause``: the canary's pause (``{}``: until promoted);
    ``rollout``, ``canary``: more lines under ``spec.rollout`` and its ``canary``."""
    return DEPLOYMENT.format(pause=pause, rollout=rollout, canary=canary)


def apply(hub: HubProcess, tmp_path: Path, text: str, name: str = "applied") -> str:
    """``edgectl apply`` of ``text`` (written to ``name``.yaml); what it said."""
    doc = tmp_path / f"{name}.yaml"
    doc.write_text(text)
    done = hub.edgectl("apply", "-f", str(doc), check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def rollout(hub: HubProcess) -> dict[str, Any]:
    """det's ``status.rollout``."""
    shown: dict[str, Any] = status(hub).get("rollout", {})
    return shown
