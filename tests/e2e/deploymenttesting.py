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

DET_ROLLING = """\
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
  rollout: {{maxSurge: 0, maxUnavailable: 1}}
"""
"""det ``{version}`` on every ``site=a`` device, rolled out one device at a time."""
