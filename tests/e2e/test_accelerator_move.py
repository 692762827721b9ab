"""Scenario: a GPU unplugged from a device moves an ``anyOf: [gpu, npu]`` replica to the device
with an NPU. A real hub process, two real ``edged run`` devices, each under its own umockdev
testbed (one with an Intel GPU, one with an Intel NPU), real ONNX Runtime workers, real
uevents: the GPU is removed from its testbed, edged's discovery drops the label, its Status
tells the hub, the scheduler moves the replica; the old one serves until the new one does
(``maxUnavailable: 0``). What runs where is read from the devices' own status sockets.

The one stand-in, as in tests/discovery/test_hotplug_scenario.py: this onnxruntime build has
no OpenVINO provider, so edged is told (``[discovery] executionProviders``) that the workers'
build offers it (which makes the mocked Intel GPU and NPU usable); the workers fall back to CPU.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from discovery.umockdevs import DEVICES, HERE, SYSTEM_PYTHON, check_umockdev
from fleet import HubProcess, enroll, quick_rescheduling
from harness import Edged, wait_for

from edgefleet.demo import TINY_MLP, build_mlp

pytestmark = pytest.mark.scenario

GPU = str(DEVICES / "intel-gpu.umockdev")
NPU = str(DEVICES / "intel-npu.umockdev")
CPU, OV = "CPUExecutionProvider", "OpenVINOExecutionProvider"
CONFIG = f"""\
[trust]
rootFile = "{{absent}}"

[discovery]
executionProviders = ["{OV}", "{CPU}"]
healthPeriod = "1s"
"""
DEPLOYMENT = f"""\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: det}}
spec:
  model: {{name: det, version: "1.0.0"}}
  runtime: {{executionProviders: [{OV}, {CPU}]}}
  replicas: {{total: 1}}
  resources: {{accelerator: {{anyOf: [gpu, npu]}}}}
  rollout: {{maxUnavailable: 0, maxSurge: 1}}
  probes:
    readiness: {{periodSeconds: 1, timeoutSeconds: 1}}
"""


class EdgedUnderTestbed(Edged):
    """``edged run`` (connected to its hub) started by tests/discovery/testbed.py, which
    plugs devices in and out of its umockdev testbed."""

    testbed: subprocess.Popen[str] | None = None

    @property
    def proc(self) -> subprocess.Popen[str] | None:  # type: ignore[override]
        return self.testbed

    def start_on(self, device: str) -> EdgedUnderTestbed:
        config = self.log_path.with_suffix(".toml")
        config.write_text(self.config_text)
        cmd = [
            "umockdev-wrapper", SYSTEM_PYTHON, str(HERE / "testbed.py"), "--device", device,
            "--", sys.executable, "-m", "edged", "run", "--data-dir", str(self.data),
            "--config", str(config),
        ]  # fmt: skip
        with open(self.log_path, "ab") as log:
            self.testbed = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True
            )
        assert self.testbed.stdout is not None
        line = self.testbed.stdout.readline()
        assert line.startswith("pid "), line + self.logs()
        self.all_pids |= {self.testbed.pid, int(line.split()[1])}
        return self

    def plug(self, verb: str, file: str) -> None:
        assert self.testbed is not None and self.testbed.stdin is not None
        assert self.testbed.stdout is not None
        self.testbed.stdin.write(f"{verb} {file}\n")
        self.testbed.stdin.flush()
        assert self.testbed.stdout.readline().strip() == "ok"

    def stop(self, timeout: float = 40.0) -> None:
        if self.testbed is not None and self.testbed.poll() is None:
            assert self.testbed.stdin is not None
            self.testbed.stdin.write("quit\n")
            self.testbed.stdin.close()
            self.testbed.wait(timeout)


@pytest.fixture
def testbeds() -> Iterator[list[EdgedUnderTestbed]]:
    problem = check_umockdev()
    if problem:
        pytest.fail(f"umockdev is required ({problem}): scripts/install-system-deps")
    started: list[EdgedUnderTestbed] = []
    yield started
    for e in started:
        try:
            e.stop()
        except subprocess.TimeoutExpired:
            assert e.testbed is not None
            e.testbed.kill()


def serving(e: Edged) -> bool:
    try:
        w = e.workload("det")
    except (KeyError, StopIteration, OSError):
        return False
    return any(r.get("ready") for r in w.get("replicas", []))


def test_a_gpu_unplugged_moves_the_replica_to_the_device_with_an_npu(
    tmp_path: Path, testbeds: list[EdgedUnderTestbed]
) -> None:
    hub = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init()
    quick_rescheduling(hub)
    hub.start()
    try:
        boxes: dict[str, EdgedUnderTestbed] = {}
        for name, device in (("gpu-box", GPU), ("npu-box", NPU)):
            data = tmp_path / name
            out = enroll(hub, data, name, {"site": "a"})
            assert out.returncode == 0, out.stdout + out.stderr
            e = EdgedUnderTestbed(
                data, None, tmp_path / f"{name}.log", CONFIG.format(absent=tmp_path / "no-root")
            )
            testbeds.append(e)
            boxes[name] = e.start_on(device)
        gpu, npu = boxes["gpu-box"], boxes["npu-box"]
        model = tmp_path / "det.onnx"
        build_mlp(model, TINY_MLP, seed=1)
        out = hub.edgectl("models", "push", str(model), "--name", "det", "--version", "1.0.0")
        assert "pushed" in out.stdout, out.stdout + out.stderr
        wait_for(
            lambda: all(
                e.status()["device"]["labels"].get("accelerator") == cls
                for e, cls in ((gpu, "gpu"), (npu, "npu"))
            ),
            60,
            "both devices to discover their accelerator",
        )
        doc = tmp_path / "det.yaml"
        doc.write_text(DEPLOYMENT)
        hub.edgectl("apply", "-f", str(doc))
        # the GPU is the first choice: the replica runs on gpu-box only
        wait_for(lambda: serving(gpu), 120, "det to serve on gpu-box\n" + gpu.logs()[-3000:])
        assert not serving(npu)

        gpu.plug("remove", GPU)
        wait_for(
            lambda: "accelerator" not in gpu.status()["device"]["labels"],
            30,
            "gpu-box to drop its accelerator label",
        )
        wait_for(lambda: serving(npu), 120, "det to serve on npu-box\n" + npu.logs()[-3000:])
        # the old replica stops once the new one serves
        wait_for(lambda: not serving(gpu), 60, "det to stop on gpu-box")
        described = " ".join(hub.edgectl("describe", "deployment", "det").stdout.split())
        assert (
            "replica taken off gpu-box: no longer fits: lack accelerator gpu|npu "
            "(it serves until its replacement is ready)"
        ) in described
        assert "replica(s) on gpu-box stopped: 1/1 serving where placed" in described
    finally:
        hub.stop()
