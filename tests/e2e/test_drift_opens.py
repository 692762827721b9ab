"""Opens of a model file seen by the kernel (fanotify) under a real ``edged run``: an open
between two drift checks (the file closed again long before the next one) is found and
remediated per the baseline at once; edged's own workers opening their models are not
findings; without CAP_SYS_ADMIN the watch is reported not in force, and a baseline that
requires it holds every worker with the reason. Needs root (the tests run as root here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness import Edged, python_without_sys_admin, wait_for, write_manifest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="fanotify needs CAP_SYS_ADMIN")

BASELINE = """\
apiVersion: edgefleet.io/v1
kind: SecurityBaseline
metadata: {{name: fleet}}
spec:
  drift: {{action: {action}, period: 1h{extra}}}
"""
# opens a blob, reads a little, closes it, then stays: no descriptor for a check to find
BRIEF_OPENER = """\
import sys, time
with open(sys.argv[1], 'rb') as f:
    f.read(16)
print('closed', flush=True)
time.sleep(300)
"""


def compliance(e: Edged) -> dict:
    return e.status()["device"]["compliance"]


def opened(e: Edged) -> list[dict]:
    return [f for f in compliance(e)["findings"] if f["kind"] == "ModelFileOpened"]


def test_a_brief_open_between_two_checks_is_seen_by_the_kernel_and_killed(
    model_dir: Path, edged_factory
) -> None:
    write_manifest(model_dir)
    (model_dir / "baseline.yaml").write_text(BASELINE.format(action="restartWorkload", extra=""))
    e: Edged = edged_factory(model_dir).start()
    e.wait_ready()
    wait_for(lambda: compliance(e)["action"] == "restartWorkload", 30, "the baseline")
    c = compliance(e)
    assert c["opensWatched"] is True, c["opensWatch"]
    assert c["compliant"] is True, c["findings"]
    # edged's own worker opened its model under the watch: seen, not a finding
    assert c["opensWatch"]["edged"] >= 1
    (worker,) = e.worker_pids("mlp")
    seen = c["opensWatch"]["edged"]
    os.kill(worker, 9)  # started again by its workload: opens the model again
    wait_for(lambda: e.worker_pids("mlp") not in ([], [worker]), 60, "a new worker")
    wait_for(lambda: compliance(e)["opensWatch"]["edged"] > seen, 30, "its open to be seen")
    wait_for(lambda: e.request("GET", "/v2/models/mlp/ready")[0] == 200, 60, "ready again")
    assert not opened(e)
    checked_at = compliance(e)["checkedAt"]

    blob = next((e.data / "artifacts" / "sha256").iterdir())
    reader = subprocess.Popen(
        [sys.executable, "-c", BRIEF_OPENER, str(blob)], stdout=subprocess.DEVNULL
    )
    try:
        # killed as soon as edged hears of the open: before or after the close, whichever
        # comes first on a loaded machine
        wait_for(lambda: reader.poll() is not None, 30, "the reader to be killed")
        assert reader.returncode == -9
    finally:
        reader.kill()
        reader.wait()
    (finding,) = opened(e)
    assert finding["subject"] == str(reader.pid)
    assert f"opened model file {blob.name[:12]} (seen by fanotify)" in finding["message"]
    assert "python" in finding["message"]  # the opener's executable
    assert compliance(e)["checkedAt"] == checked_at  # no drift check ran meanwhile
    cond = compliance(e)["condition"]
    assert cond["status"] == "False" and cond["reason"] == "ModelFileOpened"
    logs = e.logs()
    assert "ModelFileOpened" in logs and "killed process" in logs
    assert e.infer("mlp", [[0.5] * 64])[0] == 200  # edged's own worker was left alone
    assert e.terminate() == 0


def test_an_open_by_a_process_gone_at_once_quarantines(model_dir: Path, edged_factory) -> None:
    write_manifest(model_dir)
    (model_dir / "baseline.yaml").write_text(BASELINE.format(action="quarantine", extra=""))
    e: Edged = edged_factory(model_dir).start()
    e.wait_ready()
    wait_for(lambda: compliance(e)["action"] == "quarantine", 30, "the baseline")
    assert compliance(e)["compliant"] is True
    blob = next((e.data / "artifacts" / "sha256").iterdir())
    subprocess.run(["head", "-c", "16", str(blob)], check=True, stdout=subprocess.DEVNULL)
    wait_for(lambda: compliance(e)["quarantined"], 30, "the device to be quarantined")
    assert "(seen by fanotify)" in compliance(e)["quarantined"]
    wait_for(lambda: not e.workload("mlp")["replicas"], 60, "every replica to stop")
    assert e.terminate() == 0


@pytest.mark.parametrize("required", [False, True])
def test_without_cap_sys_admin_the_watch_is_reported_not_in_force(
    model_dir: Path, edged_factory, tmp_path: Path, required: bool
) -> None:
    python = python_without_sys_admin(tmp_path)
    if python is None:
        pytest.skip("setpriv cannot drop CAP_SYS_ADMIN here")
    write_manifest(model_dir)
    extra = ", requireOpenWatch: true" if required else ""
    (model_dir / "baseline.yaml").write_text(BASELINE.format(action="alert", extra=extra))
    e: Edged = edged_factory(model_dir)
    e.python = python
    e.start()
    if not required:
        e.wait_ready()
        c = compliance(e)
        assert c["opensWatched"] is False
        assert "CAP_SYS_ADMIN" in c["opensWatch"]["reason"]
        wait_for(lambda: compliance(e)["compliant"] is True, 30, "the polling check")
        assert e.infer("mlp", [[0.5] * 64])[0] == 200
    else:
        wait_for(lambda: e.request("GET", "/v1/status", sock=e.status_sock)[0] == 200, 60, "up")

        held = "requires the open watch (drift.requireOpenWatch) and it is not in force"
        wait_for(lambda: held in e.logs(), 60, "the workload to be held, with the reason")
        assert "fanotify needs CAP_SYS_ADMIN" in e.logs()
        assert compliance(e)["opensWatched"] is False
        assert e.request("GET", "/v2/models/mlp/ready")[0] != 200
    assert e.terminate() == 0
