"""A hub's store lost and restored from a backup, end to end: a real ``hub serve``, a real
enrolled ``edged run`` serving a real model, ``hub backup`` taken while the hub serves,
``hub restore`` into the stopped hub; the device reconverges to what the backup says."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from fleet import HubProcess
from harness import Edged, wait_for
from hubfleettesting import apply, push, serving

from edgefleet.launching import program_command


def _hub(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        program_command("hub", *map(str, args)),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_lost_store_refuses_to_start_and_a_restored_fleet_reconverges(
    hub: HubProcess,
    device: Callable[..., Edged],
    tmp_path: Path,
) -> None:
    a = device("dev-a", {"site": "a"})
    push(hub, tmp_path, "det", "1.0.0")
    apply(hub, tmp_path, name="det", model="det", version="1.0.0", site="a")
    wait_for(lambda: serving(a, "det", "1.0.0"), 60, "dev-a to serve det 1.0.0")
    backup = tmp_path / "hub-backup.db"
    out = _hub("backup", "--data-dir", hub.data, "--out", backup)  # while serving
    assert out.returncode == 0, out.stderr

    # after the backup the deployment goes away, and the device stops serving it
    hub.edgectl("delete", "deployments", "det")
    wait_for(lambda: a.status()["workloads"] == [], 60, "dev-a to stop serving det")

    # the database is lost: the hub refuses to start instead of starting empty
    hub.stop()
    (hub.data / "hub.db").unlink()
    for suffix in ("-wal", "-shm"):
        (hub.data / f"hub.db{suffix}").unlink(missing_ok=True)
    out = _hub("serve", "--data-dir", hub.data, "--listen", hub.address)
    assert out.returncode == 1 and "is missing" in out.stderr, out.stdout + out.stderr

    out = _hub("restore", "--data-dir", hub.data, "--from", backup)
    assert out.returncode == 0, out.stderr
    hub.start()
    # the device acknowledged a newer generation than the restored store ever issued: the hub
    # issues the backup's state above it, and the device serves det again
    wait_for(lambda: serving(a, "det", "1.0.0"), 90, "dev-a to serve det 1.0.0 again")
