"""A scale is no rollout, end to end: a real hub, a real edged, real ONNX Runtime workers
(issue 33).

``replicas.perDevice`` changed from 1 to 2 and back makes no revision: the device is sent the
same revision with the new count, starts one more worker beside the one that serves (same
pid: nothing restarted) and stops it again; ``rollout history`` keeps one revision, and
``get placements`` says the device holds it with its replicas ready.
"""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest
from deploymenttesting import DET_ROLLING
from fleet import HubProcess
from harness import Edged
from polltesting import wait_for
from rollouttesting import push


@pytest.fixture
def fleet_size() -> int:
    return 1


def apply(hub: HubProcess, tmp_path: Path, per_device: int) -> None:
    doc = tmp_path / f"det-{per_device}.yaml"
    text = DET_ROLLING.format(version="1.0.0").replace("perDevice: 1", f"perDevice: {per_device}")
    doc.write_text(text)
    done = hub.edgectl("apply", "-f", str(doc))
    assert done.returncode == 0, done.stderr


def ready_pids(device: Edged) -> list[int]:
    return sorted(
        r["pid"] for r in device.workload("det")["replicas"] if r.get("ready") and r.get("pid")
    )


def test_a_scale_starts_and_stops_workers_beside_the_ones_that_serve(
    hub: HubProcess, devices: list[Edged], tmp_path: Path
) -> None:
    (device,) = devices
    push(hub, tmp_path, "1.0.0")
    apply(hub, tmp_path, 1)
    (first,) = wait_for(lambda: len(ready_pids(device)) == 1 and ready_pids(device), 120, "1 ready")

    apply(hub, tmp_path, 2)  # no revision: the same one with two replicas
    two = wait_for(lambda: len(ready_pids(device)) == 2 and ready_pids(device), 120, "2 ready")
    assert first in two  # the worker that served was never restarted
    shown = json.loads(hub.edgectl("get", "placements", "-o", "json").stdout)["items"]
    assert [(p["spec"]["device"], p["status"]["revision"]) for p in shown] == [("dev-0", 1)], shown
    wait_for(
        lambda: (
            json.loads(hub.edgectl("get", "placements", "-o", "json").stdout)["items"][0]["status"][
                "readyReplicas"
            ]
            == 2
        ),
        60,
        "the hub sees both replicas ready",
    )

    apply(hub, tmp_path, 1)
    wait_for(lambda: len(ready_pids(device)) == 1, 120, "back to one replica")
    assert psutil.pid_exists(first) and ready_pids(device) == [first]

    rollout = json.loads(hub.edgectl("get", "deployments", "det", "-o", "json").stdout)["status"][
        "rollout"
    ]
    assert (rollout["revision"], rollout["phase"]) == (1, "Complete"), rollout
    history = hub.edgectl("rollout", "history", "det").stdout.splitlines()
    assert len(history) == 2 and history[1].split()[0] == "1", history  # header + revision 1
