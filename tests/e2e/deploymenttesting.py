"""The ModelDeployment templates scenarios share (``str.format`` fields in braces; literal
braces doubled). A template used by one scenario only stays in that scenario's module."""

from __future__ import annotations

DET = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: det}}
spec:
  model: {{name: det, version: "{version}"}}
  runtime: {{executionProviders: [CPUExecutionProvider]}}
  replicas: {{perDevice: 1}}
  probes:
    readiness: {{periodSeconds: 1, timeoutSeconds: 1}}
"""
"""det ``{version}`` on every device, one replica each."""

_DET_SITE_A = """\
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

DET_ROLLING = _DET_SITE_A + "  rollout: {{maxSurge: 0, maxUnavailable: 1}}\n"
"""det ``{version}`` on every ``site=a`` device, rolled out one device at a time."""


def det_canary(steps: str, *, analysis: str = "", progress_deadline_s: int = 0) -> str:
    """:data:`DET_ROLLING` as a canary: a template whose rollout takes the canary ``steps``
    and, when given, ``analysis`` and ``progressDeadlineSeconds``. ``steps`` and ``analysis``
    are YAML flow text as the template holds it (literal braces doubled)::

        det_canary('["50%", {{pause: {{}}}}, "100%"]')
    """
    lines = ["  rollout:", "    maxSurge: 0", "    maxUnavailable: 1"]
    if progress_deadline_s:
        lines.append(f"    progressDeadlineSeconds: {progress_deadline_s}")
    lines += ["    canary:", f"      steps: {steps}"]
    if analysis:
        lines.append(f"      analysis: {analysis}")
    return _DET_SITE_A + "\n".join(lines) + "\n"
