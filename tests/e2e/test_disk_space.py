"""Disk space as a resource: a device whose disk cannot hold a new model (a real 20 MiB tmpfs
mounted here) refuses it as InsufficientDisk with the sizes, keeps serving the previous
version, leaves no download behind, tells its hub why, and keeps taking desired state."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from bystander import Bystander
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import Edged, wait_for

from edgefleet.demo import TINY_MLP, build_mlp

DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: det}}
spec:
  model: {{name: det, version: "{version}"}}
  runtime: {{executionProviders: [CPUExecutionProvider]}}
  replicas: {{perDevice: 1}}
  placement: {{nodeSelector: {{site: lab}}}}
  probes:
    readiness: {{periodSeconds: 1, timeoutSeconds: 1}}
"""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    d = tmp_path / "device-disk"
    d.mkdir()
    out = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(d)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {out.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def push(hub: HubProcess, tmp_path: Path, version: str, sizes: tuple[int, ...], seed: int) -> Path:
    path = tmp_path / f"det-{version}.onnx"
    build_mlp(path, sizes, seed=seed)
    out = hub.edgectl("models", "push", str(path), "--name", "det", "--version", version)
    assert "pushed" in out.stdout, out.stdout
    return path


def deploy(hub: HubProcess, tmp_path: Path, version: str) -> None:
    doc = tmp_path / "det.yaml"
    doc.write_text(DEPLOYMENT.format(version=version))
    hub.edgectl("apply", "-f", str(doc))


def serving(e: Edged, version: str) -> bool:
    try:
        w = e.workload("det")
    except KeyError:
        return False
    return w["model"]["version"] == version and w["readyReplicas"] == 1


def test_a_model_the_disk_cannot_hold_is_refused_and_the_link_goes_on(
    tmp_path: Path, small_disk: Path, edged_factory
) -> None:
    hub = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init().start()
    try:
        data = small_disk / "dev"
        out = enroll(hub, data, "disk-1", {"site": "lab"})
        assert out.returncode == 0, out.stdout + out.stderr
        config = SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "no-root")
        e: Edged = edged_factory(None, data=data, config=config).start()
        v1 = push(hub, tmp_path, "1.0.0", TINY_MLP, seed=1)
        deploy(hub, tmp_path, "1.0.0")
        wait_for(lambda: serving(e, "1.0.0"), 60, "det 1.0.0 served")
        pid = e.worker_pids("det")

        with Bystander(e.infer_sock, "det", v1) as by:
            by.wait_for_answers(10)
            big = push(hub, tmp_path, "2.0.0", (512, 1024, 1024, 8), seed=2)  # ~6 MB
            deploy(hub, tmp_path, "2.0.0")

            def refused() -> dict[str, str] | None:
                for p in [*e.status()["hub"]["problems"], *e.refusals()]:
                    if p["reason"] == "InsufficientDisk":
                        return dict(p)
                return None

            problem = wait_for(refused, 60, "InsufficientDisk on the device")
            size = big.stat().st_size
            assert f"det 2.0.0: needs {2 * size} bytes" in problem["message"]
            assert "bytes are free" in problem["message"]
            assert list((data / "downloads").iterdir()) == []
            assert e.worker_pids("det") == pid and serving(e, "1.0.0")

            def hub_knows() -> bool:
                # the device's status says it only until the rollout rolls back (at once:
                # the only device refused the revision), so look for the hub's record of it
                shown = hub.edgectl("get", "events", "--for", "deployment/det").stdout
                return "RevisionRefused" in shown and "InsufficientDisk" in shown

            wait_for(hub_knows, 90, "the hub to record the device's InsufficientDisk")
            assert e.status()["hub"]["connected"]
            by.wait_for_answers(10)
        assert not by.errors, by.errors[:3]

        # the device still takes desired state
        push(hub, tmp_path, "3.0.0", TINY_MLP, seed=3)
        deploy(hub, tmp_path, "3.0.0")
        wait_for(lambda: serving(e, "3.0.0"), 60, "det 3.0.0 served")
        code, _ = e.infer("det", np.ones((1, 64), np.float32))
        assert code == 200
        assert e.terminate() == 0
    finally:
        hub.stop()
