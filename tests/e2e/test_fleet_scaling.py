"""Fleet autoscaling of ``replicas.total`` end to end: a real hub, three real edged devices,
real ONNX Runtime workers. A load generator keeps the queue of the one placed replica deep:
the device reports it, the hub's autoscaler raises the total after its window and the
scheduler places the new replicas, which serve on the other devices; the load stops: the CPU
is low and the total comes back down after the down window. What runs where is read from
the devices' own status sockets; the decisions from the hub's events."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import Edged, wait_for
from loading import Load, infer_bytes

from edgefleet.demo import MEDIUM_MLP, build_mlp

DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {name: det}
spec:
  model: {name: det, version: "1.0.0"}
  runtime: {maxBatchSize: 1, executionProviders: [CPUExecutionProvider]}
  replicas: {total: 1}
  placement: {nodeSelector: {site: a}}
  probes:
    readiness: {periodSeconds: 1, timeoutSeconds: 1}
  scaling:
    minReplicas: 1
    maxReplicas: 3
    queueDepthUp: 2
    cpuDownBelow: 40%
    scaleUpWindow: 5s
    scaleDownWindow: 10s
"""
DEVICE_CONFIG = SIGNED_DEVICE_CONFIG + '\n[scaling]\nsamplePeriod = "250ms"\n'


def serving(e: Edged) -> bool:
    if e.proc is None or e.proc.poll() is not None:
        return False
    try:
        w = e.workload("det")
    except (KeyError, StopIteration, OSError):
        return False
    return any(r.get("ready") for r in w.get("replicas", []))


@pytest.mark.scenario
def test_queue_depth_on_the_devices_scales_the_fleets_total_up_and_idle_down(
    tmp_path: Path, edged_factory: Callable[..., Edged]
) -> None:
    hub = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init()
    hub.start()
    devices: list[Edged] = []
    try:
        for i in range(3):
            data = tmp_path / f"dev-{i}"
            out = enroll(hub, data, f"dev-{i}", {"site": "a"})
            assert out.returncode == 0, out.stdout + out.stderr
            config = DEVICE_CONFIG.format(absent=tmp_path / "no-root")
            devices.append(edged_factory(None, data=data, config=config).start())
        model = tmp_path / "det.onnx"
        build_mlp(model, MEDIUM_MLP, seed=1)
        out = hub.edgectl("models", "push", str(model), "--name", "det", "--version", "1.0.0")
        assert "pushed" in out.stdout, out.stdout + out.stderr
        doc = tmp_path / "det.yaml"
        doc.write_text(DEPLOYMENT)
        hub.edgectl("apply", "-f", str(doc))

        wait_for(lambda: sum(serving(e) for e in devices) == 1, 120, "one device serving det")
        placed = next(e for e in devices if serving(e))
        # the device never scales a hub-scaled workload itself: min = max = 1 there
        assert placed.workload("det")["scaling"]["maxReplicas"] == 1

        request = infer_bytes("det", MEDIUM_MLP[0])
        with Load(placed.infer_sock, request, connections=3, window=6) as load:
            wait_for(lambda: sum(serving(e) for e in devices) == 3, 180, "three devices serving")
        assert load.failed == 0 and load.errors == [], (load.failed, load.errors[:3])
        events = hub.edgectl("get", "events", "--for", "deployment/det").stdout
        assert "QueueDepthHigh" in events and re.search(r"replicas.total \d -> 3", events), events

        # idle: the CPU is low everywhere; after the down window, back to one
        wait_for(lambda: sum(serving(e) for e in devices) == 1, 180, "back to one device")
        events = hub.edgectl("get", "events", "--for", "deployment/det").stdout
        assert "CpuLow" in events and re.search(r"replicas.total \d -> 1", events), events
    finally:
        for e in devices:
            if e.proc is not None and e.proc.poll() is None:
                e.terminate()
        hub.stop()
