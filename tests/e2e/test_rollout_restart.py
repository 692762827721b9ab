"""``edgectl rollout restart``, end to end: a real hub, two real edged, real ONNX Runtime
workers (issue 33).

The Complete revision is rolled out again as a new revision of the same template carrying
``edgefleet.io/restartedAt``: each device (within maxUnavailable 1) starts a new worker and
stops the old one (a new pid: the revision edged computes changed), the rollout completes,
``rollout history`` says "restarted", the event names the admin, and applying the same
manifest again makes no revision.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deploymenttesting import DET_ROLLING
from fleet import HubProcess
from harness import Edged
from polltesting import wait_for
from rollouttesting import push


@pytest.fixture
def fleet_size() -> int:
    return 2


def ready_pids(device: Edged) -> list[int]:
    return sorted(
        r["pid"] for r in device.workload("det")["replicas"] if r.get("ready") and r.get("pid")
    )


def rollout(hub: HubProcess) -> dict[str, object]:
    doc = json.loads(hub.edgectl("get", "deployments", "det", "-o", "json").stdout)
    shown: dict[str, object] = doc["status"]["rollout"]
    return shown


def test_restart_starts_new_workers_on_every_device(
    hub: HubProcess, devices: list[Edged], tmp_path: Path
) -> None:
    push(hub, tmp_path, "1.0.0")
    manifest = tmp_path / "det.yaml"
    manifest.write_text(DET_ROLLING.format(version="1.0.0"))
    assert hub.edgectl("apply", "-f", str(manifest)).returncode == 0
    before = [
        wait_for(lambda d=d: len(ready_pids(d)) == 1 and ready_pids(d), 120, "ready")[0]
        for d in devices
    ]
    wait_for(lambda: rollout(hub)["phase"] == "Complete", 60, "revision 1 complete")

    done = hub.edgectl("rollout", "restart", "deployment/det")
    assert "det: revision 1 restarted: rolling out its template again as revision 2" in (
        done.stdout
    ), done.stdout
    wait_for(
        lambda: rollout(hub)["phase"] == "Complete" and rollout(hub)["revision"] == 2,
        180,
        "the restart to complete",
    )
    for i, d in enumerate(devices):
        after = wait_for(lambda d=d: len(ready_pids(d)) == 1 and ready_pids(d), 60, "one ready")
        assert after[0] != before[i], f"device {i} kept its worker"
    history = hub.edgectl("rollout", "history", "det").stdout.splitlines()
    assert "restarted" in history[2] and history[2].split()[0] == "2", history
    events = hub.edgectl("get", "events", "--for", "deployment/det").stdout
    assert 'rollout revision 1 restarted by admin "' in events, events

    # the same manifest again: no revision, so no restart (apply answers once the rollout
    # controller acted on it)
    assert hub.edgectl("apply", "-f", str(manifest)).returncode == 0
    assert rollout(hub)["revision"] == 2
