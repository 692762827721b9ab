"""Manifests the API tests share: the design document's example."""

from __future__ import annotations

DESIGN_EXAMPLE = """
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {name: fraud-detection}
spec:
  model: {name: fraud-detection, version: 2.4.1}      # an artifact pushed with edgectl models push
  runtime: {maxBatchSize: 8, precision: int8, executionProviders: [CUDAExecutionProvider, CPUExecutionProvider]}
  replicas: {perDevice: 1}            # or {total: 5}: that many, placed across the fleet
  resources: {cpu: 500m, memory: 256Mi, accelerator: npu}
  placement:
    nodeSelector: {site: retail}
    tolerations: [{key: battery, operator: Exists}]
    regions: [eu-frankfurt, eu-dublin]                # data locality
    topologySpread: {key: zone, minPerDomain: 2}
  probes: {startup: {timeoutSeconds: 60}, readiness: {periodSeconds: 5}, liveness: {periodSeconds: 10}}
  rollout:
    maxUnavailable: 10%
    canary: {steps: [5%, 50%, 100%], analysis: {minAccuracy: 0.98, maxErrorRateIncrease: 0.02, window: 60s}}
  scaling: {minReplicas: 1, maxReplicas: 4, queueDepthUp: 50, cpuDownBelow: 40%}
  power: {schedule: [{from: "00:00", to: "06:00", precision: fp16}]}
"""  # noqa: E501 (the sketch from docs, verbatim)
