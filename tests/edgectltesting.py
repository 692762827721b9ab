"""Running the real ``edgectl`` console script against a test hub, and the hub's seed data."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from hubserving import AdminHub

from hub.decide.devices import Device, DevicePhase, WorkloadReport

EDGECTL = str(Path(sys.executable).with_name("edgectl"))

MANIFESTS = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {name: fraud, labels: {team: risk}}
spec:
  model: {name: fraud, version: "2.4.1"}
  replicas: {perDevice: 1}
  placement: {nodeSelector: {site: retail}}
---
apiVersion: edgefleet.io/v1
kind: SecurityBaseline
metadata: {name: fleet}
spec: {requireAttestation: false}
---
apiVersion: edgefleet.io/v1
kind: DeviceHealthPolicy
metadata: {name: needs-gpu}
spec: {requiredAccelerators: [gpu]}
"""


def edgectl(
    config: Path, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EDGECTL, "--config", str(config), *args],
        check=False,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )


async def seed(hub: AdminHub) -> None:
    hub.ctx.writer.update(
        Device(
            name="cam-1",
            labels={"site": "retail"},
            reported_labels={"accelerator": "npu"},
            phase=DevicePhase.READY,
            last_heartbeat=time.time(),
            certificate_serial="abc1",
            enrolled_at=time.time() - 3600,
            # as a Sync stream leaves them: protobuf Struct numbers are doubles
            facts={
                "cpuCount": 2.0,
                "executionProviders": {
                    "available": ["CPUExecutionProvider"],
                    "source": "onnxruntime",
                },
            },
            workloads={"fraud": WorkloadReport("2.4.1", desired_replicas=1, ready_replicas=1)},
        )
    )
    hub.ctx.writer.update(Device(name="cam-2", labels={"site": "depot"}))
    await hub.ctx.writer.flush()
