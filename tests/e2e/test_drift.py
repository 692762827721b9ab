"""Drift under a real ``edged run``, remediated per the baseline: a file dropped into the
artifact store, the config edited by hand, a stray process in edged's cgroup (a real cgroup
v2 directory; skipped with the reason where none can be made), and quarantine."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet import free_port
from harness import Edged, python_without_sys_admin, wait_for, write_manifest

from edged.compliance.drift import own_cgroup

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


OPENER = (
    "import sys, time\nf = open(sys.argv[1], 'rb')\nprint('open', flush=True)\ntime.sleep(300)\n"
)


def test_a_process_holding_a_model_file_open_is_found_and_killed(
    model_dir: Path, edged_factory, tmp_path: Path
) -> None:
    """Found through the real /proc: a process edged did not start with a blob of its store
    open (its workers, which read the same blob, are not findings). edged runs without
    CAP_SYS_ADMIN, so that the descriptor scan finds it, not the open watch
    (test_drift_opens.py)."""
    python = python_without_sys_admin(tmp_path)
    if python is None:
        pytest.skip("setpriv cannot drop CAP_SYS_ADMIN here")
    write_manifest(model_dir)
    (model_dir / "baseline.yaml").write_text(BASELINE.format(action="restartWorkload"))
    e: Edged = edged_factory(model_dir)
    e.python = python
    e.start()
    e.wait_ready()
    wait_for(lambda: compliance(e)["action"] == "restartWorkload", 30, "the baseline")
    wait_for(lambda: compliance(e)["compliant"] is True, 30, "a clean check")
    assert compliance(e)["descriptorsChecked"] is True
    assert compliance(e)["opensWatched"] is False
    blob = next((e.data / "artifacts" / "sha256").iterdir())
    reader = subprocess.Popen(
        [sys.executable, "-c", OPENER, str(blob)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert reader.stdout is not None and reader.stdout.readline() == "open\n"
        wait_for(lambda: reader.poll() is not None, 30, "the reader to be killed")
        assert reader.returncode == -9
        logs = e.logs()
        assert "ModelFileOpened" in logs and f'"pid":{reader.pid}' in logs
        assert f"has model file {blob.name[:12]} open" in logs
    finally:
        reader.kill()
        reader.wait()
    wait_for(lambda: compliance(e)["compliant"] is True, 30, "compliance again")
    assert e.infer("mlp", [[0.5] * 64])[0] == 200  # edged's own worker was left alone
    assert e.terminate() == 0


LISTENING_BASELINE = """\
apiVersion: edgefleet.io/v1
kind: SecurityBaseline
metadata: {{name: fleet}}
spec:
  drift: {{action: alert, period: 1s}}
  network:
    ingress: {{tcpPorts: [{allowed}]}}
"""
LISTENER = """\
import socket, sys, time
tcp = socket.socket()
tcp.bind(("127.0.0.1", 0))
tcp.listen()
unix = socket.socket(socket.AF_UNIX)
unix.bind(sys.argv[1])
unix.listen()
print(tcp.getsockname()[1], flush=True)
time.sleep(300)
"""


def test_listeners_the_policy_does_not_allow_are_reported(
    model_dir: Path, edged_factory, cgroup: Path, tmp_path: Path
) -> None:
    """A process of edged's cgroup listening on a loopback TCP port the baseline's
    ``tcpPorts`` do not list, and on a unix socket other than edged's: found through the real
    /proc/net/tcp and /proc/net/unix, reported (``alert``), and gone once it stops."""
    write_manifest(model_dir)
    (model_dir / "baseline.yaml").write_text(LISTENING_BASELINE.format(allowed=free_port()))
    e: Edged = edged_factory(model_dir).start()
    e.wait_ready()
    assert e.launched is not None
    (cgroup / "cgroup.procs").write_text(str(e.launched.pid))
    wait_for(lambda: compliance(e)["processesChecked"], 30, "edged to check its cgroup")
    wait_for(lambda: compliance(e)["compliant"] is True, 30, "a clean check")
    path = tmp_path / "other.sock"
    listener = subprocess.Popen(
        [sys.executable, "-c", LISTENER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert listener.stdout is not None
        port = int(listener.stdout.readline())
        (cgroup / "cgroup.procs").write_text(str(listener.pid))

        def listening() -> list[str]:
            found = [
                f["message"]
                for f in compliance(e)["findings"]
                if f["kind"] == "ListeningSocket" and f["subject"] == str(listener.pid)
            ]
            return found if len(found) == 2 else []

        messages = sorted(wait_for(listening, 30, "both listeners to be found"))
        assert f"listens on 127.0.0.1:{port}; the baselines' tcpPorts allow" in messages[0]
        assert f"listens on unix socket {path}" in messages[1]
        cond = compliance(e)["condition"]
        assert cond["type"] == "Compliant" and cond["status"] == "False"
        assert listener.poll() is None  # alert: reported only
    finally:
        listener.kill()
        listener.wait()
    wait_for(lambda: compliance(e)["compliant"] is True, 30, "compliance again")
    assert e.terminate() == 0
