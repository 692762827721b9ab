"""Scenario: a real ``edged run`` under a umockdev testbed; the accelerator goes and comes back.

Real: edged, its workers (ONNX Runtime), pyudev reading the testbed, real uevents. The one
stand-in: this onnxruntime build has no OpenVINO provider, so edged is told (``[discovery]
executionProviders``) that the workers' build offers it. The *planned* providers (status
``providers.planned``) follow the NPU; the worker falls back to CPU on its own (``actual``)
and says so (``ProviderFallback``), and keeps serving inference throughout.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from e2e.harness import Edged, wait_for
from umockdevs import DEVICES, HERE, SYSTEM_PYTHON

from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.devicestatus import render_status

pytestmark = [pytest.mark.scenario, pytest.mark.usefixtures("umockdev")]

CPU, OV = "CPUExecutionProvider", "OpenVINOExecutionProvider"
NPU = str(DEVICES / "intel-npu.umockdev")
MANIFEST = f"""\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: det}}
spec:
  model: {{name: det, version: "1", path: mlp.onnx}}
  runtime: {{executionProviders: [{OV}, {CPU}]}}
  replicas: {{perDevice: 1}}
  probes: {{readiness: {{periodSeconds: 1}}, liveness: {{periodSeconds: 1}}}}
---
apiVersion: edgefleet.io/v1
kind: DeviceHealthPolicy
metadata: {{name: needs-npu}}
spec: {{requiredAccelerators: [npu]}}
"""
CONFIG = f"""\
[discovery]
executionProviders = ["{OV}", "{CPU}"]
healthPeriod = "1s"

# Not a trust test: the model is unsigned (tests/e2e/test_trust.py runs signed).
[trust]
allowUnsigned = true
rootFile = "/nonexistent/trust-root.json"
"""


class EdgedOnTestbed(Edged):
    """edged started by ``testbed.py`` (system Python, umockdev) which plugs devices for us."""

    testbed: subprocess.Popen[str] | None = None

    @property
    def proc(self) -> subprocess.Popen[str] | None:  # type: ignore[override]
        return self.testbed

    def start(self, *extra: str) -> EdgedOnTestbed:
        cmd = [
            "umockdev-wrapper",
            SYSTEM_PYTHON,
            str(HERE / "testbed.py"),
            "--device",
            NPU,
            "--",
            sys.executable,
            "-m",
            "edged",
            "run",
            "--data-dir",
            str(self.data),
            "--manifests",
            str(self.manifests),
            *extra,
        ]
        with open(self.log_path, "ab") as log:
            self.testbed = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("pid "), line + self.logs()
        self.all_pids |= {self.proc.pid, int(line.split()[1])}
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        wait_for(
            lambda: self.request("GET", "/readyz", sock=self.status_sock)[0] == 200,
            timeout,
            "edged ready",
        )
        self.status()

    def plug(self, verb: str, file: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(f"{verb} {file}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"

    def terminate(self, timeout: float = 40.0) -> int:
        assert self.proc is not None and self.proc.stdin is not None
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        return self.proc.wait(timeout)


@pytest.fixture
def edged(tmp_path: Path) -> Iterator[EdgedOnTestbed]:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    build_mlp(manifests / "mlp.onnx", TINY_MLP, seed=1)
    (manifests / "det.yaml").write_text(MANIFEST)
    (tmp_path / "edged.toml").write_text(CONFIG)
    e = EdgedOnTestbed(tmp_path / "data", manifests, tmp_path / "edged.log")
    e.start("--config", str(tmp_path / "edged.toml"))
    yield e
    code = e.terminate()
    alive = [p for p in e.all_pids if psutil.pid_exists(p) and _not_zombie(p)]
    assert code == 0 and not alive, f"exit {code}, alive {alive}\n{e.logs()}"


def _not_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _serving_with(e: Edged, planned: list[str]) -> dict[str, Any] | None:
    w = e.workload("det")
    if w.get("providers", {}).get("planned") != planned or w.get("phase") != "Running":
        return None
    if [r["revision"] for r in w["replicas"]] != [w["revision"]]:
        return None  # the switch is not finished: the old replica is still there
    return w


def _infer_ok(e: Edged) -> None:
    x = np.ones((1, TINY_MLP[0]), dtype=np.float32)
    status, body = e.infer("det", x)
    assert status == 200, body


def test_accelerator_goes_and_comes_back(edged: EdgedOnTestbed) -> None:
    e = edged
    e.wait_ready()
    w = wait_for(lambda: _serving_with(e, [OV, CPU]), 60, "det on OpenVINO, CPU")
    assert w["providers"]["actual"] == [CPU]  # this onnxruntime has no OpenVINO: the safety net
    conds = {c["type"]: c for c in w["conditions"]}
    assert "ProviderFallback" in conds
    assert "AcceleratorUnavailable" not in conds
    dev = e.status()["device"]
    (npu,) = dev["accelerators"]
    assert (npu["class"], npu["vendor"], npu["usable"]) == ("npu", "intel", True)
    assert npu["executionProviders"] == [{"name": OV, "inOnnxRuntime": True}]
    assert dev["labels"]["accelerator"] == "npu"
    assert dev["health"]["schedulable"] is True
    first_revision = w["revision"]
    _infer_ok(e)

    e.plug("remove", NPU)
    w = wait_for(lambda: _serving_with(e, [CPU]), 60, "det to move to CPU")
    cond = {c["type"]: c for c in w["conditions"]}["AcceleratorUnavailable"]
    assert cond["reason"] == "FellBack"
    assert "OpenVINOExecutionProvider needs an Intel GPU, NPU or VPU" in cond["message"]
    assert w["revision"] != first_revision
    assert w["providers"]["actual"] == [CPU]
    _infer_ok(e)
    dev = wait_for(
        lambda: (d := e.status()["device"])["health"]["schedulable"] is False and d,
        10,
        "the device to report itself unschedulable",
    )
    assert dev["health"]["reasons"] == ["needs-npu: no usable 'npu' accelerator"]
    assert "accelerator" not in dev["labels"]
    text = render_status(e.status())
    assert "schedulable no  accelerators intel-npu 0000:00:0b.0 (not usable)" in text
    assert "det: AcceleratorUnavailable=True FellBack: running on CPUExecutionProvider" in text

    e.plug("add", NPU)
    w = wait_for(lambda: _serving_with(e, [OV, CPU]), 60, "det to move back")
    assert w["revision"] == first_revision
    assert "AcceleratorUnavailable" not in {c["type"] for c in w["conditions"]}
    _infer_ok(e)
    wait_for(lambda: e.status()["device"]["health"]["schedulable"], 10, "schedulable again")
