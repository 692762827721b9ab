"""``edged doctor`` as a person and a machine see it: a real process under umockdev."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from umockdevs import DEVICES, HERE

pytestmark = pytest.mark.usefixtures("umockdev")

POLICY = """\
apiVersion: edgefleet.io/v1
kind: DeviceHealthPolicy
metadata: {name: needs-gpu}
spec: {requiredAccelerators: [gpu]}
"""


def doctor(
    tmp_path: Path, *args: str, devices: tuple[str, ...]
) -> subprocess.CompletedProcess[str]:
    cmd = ["umockdev-run"]
    for f in devices:
        cmd += ["--device", str(DEVICES / f)]
    cmd += ["--", sys.executable, "-m", "edged", "doctor", "--data-dir", str(tmp_path), *args]
    env = dict(os.environ, PYTHONPATH=str(HERE.parents[1]))
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60, env=env)


def test_json_report(tmp_path: Path) -> None:
    (tmp_path / "labels.json").write_text('{"site": "lab"}')
    m = tmp_path / "m"
    m.mkdir()
    (m / "policy.yaml").write_text(POLICY)
    r = doctor(
        tmp_path,
        "-o",
        "json",
        "--manifests",
        str(m),
        devices=("intel-npu.umockdev", "hailo-nodriver.umockdev", "coral-usb.umockdev"),
    )
    assert r.returncode == 1, r.stderr  # something is missing
    report = json.loads(r.stdout)
    by_vendor = {a["vendor"]: a for a in report["accelerators"]}
    assert by_vendor["intel"]["executionProviders"] == [
        {"name": "OpenVINOExecutionProvider", "inOnnxRuntime": False}
    ]
    assert by_vendor["hailo"]["note"].startswith("no ONNX Runtime execution provider")
    assert by_vendor["google"]["note"].startswith("no ONNX Runtime execution provider")
    assert report["missing"] == [
        "intel-npu 0000:00:0b.0: enables OpenVINOExecutionProvider, "
        "but this onnxruntime build lacks it",
        "hailo-npu 0000:05:00.0: no kernel driver is bound to the device",
    ]
    assert report["labels"]["site"] == "lab"
    assert report["labels"]["accelerator"] == "npu"
    assert report["health"]["schedulable"] is False
    assert report["health"]["reasons"] == ["needs-gpu: no usable 'gpu' accelerator"]
    assert "CPUExecutionProvider" in report["onnxruntime"]["providers"]


def test_text_report(tmp_path: Path) -> None:
    r = doctor(tmp_path, devices=("coral-pcie.umockdev",))
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert (
        "tpu google Coral Edge TPU (PCIe) (0000:04:00.0), driver apex, /dev/apex_0: usable" in out
    )
    assert "use the vendor runtime" in out
    assert "policy default: schedulable" in out
    assert "nothing missing" in out
