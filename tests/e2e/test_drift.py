"""Drift under a real ``edged run``, remediated per the baseline: a file dropped into the
artifact store, the config edited by hand, a stray process in edged's cgroup (a real cgroup
v2 directory; skipped with the reason where none can be made), and quarantine."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Edged, wait_for, write_manifest

from edged.compliance.watching import own_cgroup

BASELINE = """\
apiVersion: edgefleet.io/v1
kind: SecurityBaseline
metadata: {{name: fleet}}
spec:
  drift: {{action: {action}, period: 1s}}
"""


def compliance(e: Edged) -> dict:
    return e.status()["device"]["compliance"]


def kinds(e: Edged) -> set[str]:
    return {f["kind"] for f in compliance(e)["findings"]}


def test_a_dropped_file_is_moved_away_and_a_hand_edited_config_reported(
    model_dir: Path, edged_factory
) -> None:
    write_manifest(model_dir)
    (model_dir / "baseline.yaml").write_text(BASELINE.format(action="restartWorkload"))
    e: Edged = edged_factory(model_dir).start()
    e.wait_ready()
    wait_for(lambda: compliance(e)["action"] == "restartWorkload", 30, "the baseline")
    assert compliance(e)["compliant"] is True
    dropped = e.data / "artifacts" / "sha256" / "evil.onnx"
    dropped.write_bytes(b"not edged's")
    quarantined = e.data / "artifacts" / "quarantine"
    wait_for(lambda: any(p.name.startswith("evil.onnx.") for p in quarantined.iterdir()), 30,
             "the dropped file to be moved to quarantine")  # fmt: skip
    assert not dropped.exists()
    assert "ArtifactAdded" in e.logs() and "drift detected" in e.logs()
    wait_for(lambda: compliance(e)["compliant"], 30, "compliance again")
    config = e.log_path.with_suffix(".toml")
    config.write_text(config.read_text() + "\n# edited by hand\n")
    wait_for(lambda: "ConfigChanged" in kinds(e), 30, "the config edit to be found")
    cond = compliance(e)["condition"]
    assert cond["type"] == "Compliant" and cond["status"] == "False"
    assert e.infer("mlp", [[0.5] * 64])[0] == 200  # reported only: still serving
    assert e.terminate() == 0


@pytest.fixture
def cgroup() -> Iterator[Path]:
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    mount = next((m.split()[4] for m in mounts if " - cgroup2 " in m), None)
    if mount is None or not os.access(mount, os.W_OK):
        pytest.skip("no writable cgroup v2 hierarchy here to give edged a cgroup of its own")
    path = Path(mount) / f"ef-drift-{os.getpid()}"
    path.mkdir()
    yield path
    for pid in (path / "cgroup.procs").read_text().split():
        Path(mount, "cgroup.procs").write_text(pid)  # back to the root: rmdir needs it empty
    path.rmdir()


def test_a_stray_process_in_edgeds_cgroup_is_killed(model_dir: Path, edged_factory, cgroup):
    write_manifest(model_dir)
    (model_dir / "baseline.yaml").write_text(BASELINE.format(action="restartWorkload"))
    e: Edged = edged_factory(model_dir).start()
    e.wait_ready()
    assert e.launched is not None
    (cgroup / "cgroup.procs").write_text(str(e.launched.pid))  # edged gets a cgroup of its own
    wait_for(lambda: compliance(e)["processesChecked"], 30, "edged to check its cgroup")
    assert compliance(e)["compliant"] is True
    stray = subprocess.Popen(["sleep", "300"])
    try:
        (cgroup / "cgroup.procs").write_text(str(stray.pid))
        wait_for(lambda: stray.poll() is not None, 30, "the stray process to be killed")
        assert stray.returncode == -9
        assert "StrayProcess" in e.logs() and f'"pid":{stray.pid}' in e.logs()
    finally:
        stray.kill()
        stray.wait()
    assert own_cgroup() is None or own_cgroup() != cgroup  # the test itself stayed outside
    assert e.terminate() == 0


def test_quarantine_stops_every_workload_until_cleared(model_dir: Path, edged_factory) -> None:
    write_manifest(model_dir)
    (model_dir / "baseline.yaml").write_text(BASELINE.format(action="quarantine"))
    e: Edged = edged_factory(model_dir).start()
    e.wait_ready()
    wait_for(lambda: compliance(e)["action"] == "quarantine", 30, "the baseline")
    dropped = e.data / "artifacts" / "sha256" / "evil.onnx"
    dropped.write_bytes(b"not edged's")
    wait_for(lambda: compliance(e)["quarantined"], 30, "the device to be quarantined")
    wait_for(lambda: not e.workload("mlp")["replicas"], 60, "every replica to stop")
    assert dropped.exists()  # the evidence stays
    assert e.request("GET", "/v2/models/mlp/ready")[0] != 200
    dropped.unlink()
    (e.data / "state" / "quarantine.json").unlink()  # the operator clears it
    wait_for(lambda: e.request("GET", "/v2/models/mlp/ready")[0] == 200, 60, "serving again")
    # the next check (its own period, not the quarantine's clearing) reports it compliant
    wait_for(lambda: compliance(e)["compliant"] is True, 30, "the next check to be clean")
    assert e.terminate() == 0
