"""``replicas.total`` end to end: a real hub, three real edged devices, real ONNX Runtime
workers. A device that runs a replica is killed (SIGKILL); once it has been silent for
``devices.rescheduleAfter`` the scheduler moves its replica, and the third device serves it.
What runs where is read from the devices' own status sockets, not from the hub."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fleet import RESCHEDULE_AFTER, SIGNED_DEVICE_CONFIG, HubProcess, enroll, quick_rescheduling
from harness import Edged, wait_for

from edgefleet.demo import TINY_MLP, build_mlp

DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {name: det}
spec:
  model: {name: det, version: "1.0.0"}
  runtime: {executionProviders: [CPUExecutionProvider]}
  replicas: {total: 2}
  placement: {nodeSelector: {site: a}}
  probes:
    readiness: {periodSeconds: 1, timeoutSeconds: 1}
"""
SLACK = 45.0  # a deadline for a loaded machine, not a timed assertion: the figure is printed


def serving(e: Edged) -> bool:
    """Whether ``e`` has a ready replica of det (its own status socket says so)."""
    if e.proc is None or e.proc.poll() is not None:
        return False
    try:
        w = e.workload("det")
    except (KeyError, StopIteration, OSError):
        return False
    return any(r.get("ready") for r in w.get("replicas", []))


@pytest.mark.scenario
def test_a_killed_device_has_its_replica_moved_to_another(
    tmp_path: Path, edged_factory: Callable[..., Edged]
) -> None:
    hub = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init()
    quick_rescheduling(hub)
    hub.start()
    devices: list[Edged] = []
    try:
        for i in range(3):
            data = tmp_path / f"dev-{i}"
            out = enroll(hub, data, f"dev-{i}", {"site": "a"})
            assert out.returncode == 0, out.stdout + out.stderr
            config = SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "no-root")
            devices.append(edged_factory(None, data=data, config=config).start())
        model = tmp_path / "det.onnx"
        build_mlp(model, TINY_MLP, seed=1)
        out = hub.edgectl("models", "push", str(model), "--name", "det", "--version", "1.0.0")
        assert "pushed" in out.stdout, out.stdout + out.stderr
        doc = tmp_path / "det.yaml"
        doc.write_text(DEPLOYMENT)
        hub.edgectl("apply", "-f", str(doc))

        wait_for(lambda: sum(serving(e) for e in devices) == 2, 120, "two devices serving det")
        placed = [i for i, e in enumerate(devices) if serving(e)]
        spare = next(i for i in range(3) if i not in placed)
        status = json.loads(hub.edgectl("get", "deployments", "det", "-o", "json").stdout)
        scheduled = {c["type"]: c for c in status["status"]["conditions"]}["Scheduled"]
        assert (scheduled["status"], scheduled["message"]) == ("True", "2/2 replicas placed")

        victim = devices[placed[0]]
        killed = time.monotonic()
        victim.kill9()
        wait_for(
            lambda: serving(devices[spare]),
            RESCHEDULE_AFTER + SLACK,
            f"dev-{spare} serving det after dev-{placed[0]} was killed",
        )
        took = time.monotonic() - killed
        print(f"replica moved and serving {took:.1f} s after the kill "
              f"(rescheduleAfter {RESCHEDULE_AFTER:g} s)")  # fmt: skip
        assert serving(devices[placed[1]])  # the other replica never moved

        events = hub.edgectl("get", "events", "--for", "deployment/det").stdout
        assert "Rescheduled" in events and f"dev-{placed[0]}" in events, events
        described = hub.edgectl("describe", "deployment", "det").stdout
        assert "Scheduled" in described and "2/2 replicas placed" in described, described
    finally:
        for e in devices:
            if e.proc is not None and e.proc.poll() is None:
                e.terminate()
        hub.stop()
