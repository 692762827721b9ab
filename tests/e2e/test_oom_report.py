"""A worker OOM-killed once reaches the hub, end to end: a real hub, a real enrolled edged, real
ONNX Runtime workers, edgectl.

What is faked is the kernel, as in tests/runtime/test_limits_exits.py: this host has cgroup v1
controllers, so edged runs in a mount namespace of its own where ``/proc/self/mountinfo`` shows
a cgroup2 mount, with ``[workers] cgroupRoot`` a plain directory laid out as a delegated cgroup
(a fake cgroupfs). edged writes its leaves and limits there and the workers join them as they
would the kernel's; the test then plays the OOM killer: it counts ``oom_kill`` in the leaf's
``memory.events`` and sends the SIGKILL. The real kernel's OOM kill is the VM lab's check
(tests/vmlab/test_limits.py).

Checked: the hub shows ``lastTermination: {reason: OOMKilled, signal: 9, ...}`` for the device
(``edgectl get devices -o json``, ``describe device``, the deployment's status and ``describe
deployment``), one ``OOMKilled`` Warning event on the deployment however many reports follow,
the worker restarted (``restartCount`` 1), and the other workload answering all along.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from bystander import Bystander
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import Edged, wait_for

from edgefleet.demo import TINY_MLP, build_mlp

MIB = 1 << 20
DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: {name}}}
spec:
  model: {{name: {name}, version: "1.0.0"}}
  runtime: {{executionProviders: [CPUExecutionProvider]}}
  replicas: {{perDevice: 1}}
  resources: {{memory: 512Mi}}
  placement: {{nodeSelector: {{site: a}}}}
  probes:
    readiness: {{periodSeconds: 5, timeoutSeconds: 5}}
"""
# a cgroup2 mount where edged looks for one (the rest of mountinfo does not matter to it)
MOUNTINFO = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw\n"


def _unshare() -> list[str] | None:
    """The command that gives edged a mount namespace of its own here (root, or a user
    namespace), or None where neither is allowed."""
    if shutil.which("unshare") is None:
        return None
    for cmd in (["unshare", "-m"], ["unshare", "-Urm"]):
        probe = subprocess.run([*cmd, "true"], check=False, capture_output=True)
        if probe.returncode == 0:
            return cmd
    return None


def fake_cgroupfs(tmp_path: Path) -> tuple[Path, Path]:
    """A directory laid out as a delegated cgroup v2 with cpu and memory, and a "python" that
    runs edged in a mount namespace where the kernel's mountinfo shows cgroup2."""
    cmd = _unshare()
    if cmd is None:
        pytest.skip("needs a mount namespace (unshare -m as root, or a user namespace)")
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory\n")
    (root / "cgroup.procs").write_text("")
    (root / "cgroup.subtree_control").write_text("")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(MOUNTINFO)
    wrapper = tmp_path / "python-fake-cgroup2"
    inner = f'mount --bind {mountinfo} /proc/$$/mountinfo && exec {sys.executable} "$@"'
    wrapper.write_text(f"#!/bin/sh\nexec {' '.join(cmd)} sh -c '{inner}' sh \"$@\"\n")
    wrapper.chmod(0o755)
    return root, wrapper


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubProcess]:
    h = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init().start()
    yield h
    h.stop()


@pytest.fixture
def device(
    hub: HubProcess, tmp_path: Path, edged_factory: Callable[..., Edged]
) -> Iterator[tuple[Edged, Path]]:
    root, wrapper = fake_cgroupfs(tmp_path)
    data = tmp_path / "dev-1"
    out = enroll(hub, data, "dev-1", {"site": "a"})
    assert out.returncode == 0, out.stdout + out.stderr
    config = SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "no-root")
    e = edged_factory(None, data=data, config=config + f'\n[workers]\ncgroupRoot = "{root}"\n')
    e.python = wrapper
    e.start()
    yield e, root
    if e.proc is not None and e.proc.poll() is None:
        e.terminate()


def edgectl_json(hub: HubProcess, *args: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(hub.edgectl(*args, "-o", "json").stdout)
    return doc


def events(hub: HubProcess, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = edgectl_json(
        hub, "get", "events", "--for", f"ModelDeployment/{name}"
    )["items"]
    return items


def worker_leaf(root: Path, pid: int) -> Path | None:
    """The fake leaf a worker joined (it wrote its pid into the leaf's cgroup.procs)."""
    for procs in (root / "workloads").glob("*/cgroup.procs"):
        if procs.read_text().strip() == str(pid):
            return procs.parent
    return None


def worker_pid(e: Edged, workload: str) -> int | None:
    """The pid of the workload's ready replica (edged's status), None while none is ready."""
    for w in e.status()["workloads"]:
        for r in w.get("replicas", []) if w["name"] == workload else ():
            if r["ready"] and r["pid"]:
                return int(r["pid"])
    return None


def test_an_oom_kill_reaches_the_hub_while_the_other_workload_serves(
    hub: HubProcess, device: tuple[Edged, Path], tmp_path: Path
) -> None:
    e, root = device
    for i, name in enumerate(("hog", "det")):
        model = build_mlp(tmp_path / f"{name}.onnx", TINY_MLP, seed=i + 1)
        out = hub.edgectl("models", "push", str(model), "--name", name, "--version", "1.0.0")
        assert "pushed" in out.stdout, out.stdout + out.stderr
        doc = tmp_path / f"{name}.yaml"
        doc.write_text(DEPLOYMENT.format(name=name))
        hub.edgectl("apply", "-f", str(doc))

    def available(name: str) -> bool:
        status = edgectl_json(hub, "get", "deployments", name)["status"]
        return bool(status["availableDevices"] == 1)

    wait_for(lambda: available("hog") and available("det"), 120, "hog and det available")
    pid = worker_pid(e, "hog")
    assert pid is not None
    leaf = worker_leaf(root, pid)
    assert leaf is not None, f"hog's worker {pid} joined no leaf under {root}"
    assert (leaf / "memory.max").read_text() == str(512 * MIB)  # the manifest's limit, applied
    assert (
        edgectl_json(hub, "get", "devices", "dev-1")["status"]["workloads"]["hog"].get(
            "lastTermination"
        )
        is None
    )  # nothing ended yet: nothing shown

    # det is asked all along (tests/e2e/bystander.py): every answer right, progress throughout
    with Bystander(e.infer_sock, "det", tmp_path / "det.onnx") as det:
        det.wait_for_answers(20)
        # the kernel's part: the OOM killer counts in memory.events and kills with SIGKILL
        (leaf / "memory.events").write_text("low 0\nhigh 0\nmax 40\noom 1\noom_kill 1\n")
        os.kill(pid, signal.SIGKILL)

        def terminated() -> dict[str, Any] | None:
            doc = edgectl_json(hub, "get", "devices", "dev-1")
            last: dict[str, Any] | None = doc["status"]["workloads"]["hog"].get("lastTermination")
            return last

        wait_for(terminated, 60, "hog's lastTermination at the hub")
        det.wait_for_answers(20)
        last = terminated()
        assert last is not None
        assert (last["reason"], last["signal"], last["exitCode"]) == ("OOMKilled", 9, 0)
        assert f"memory.max {512 * MIB} bytes" in last["message"]
        assert abs(last["finishedAt"] - time.time()) < 120
        # restarted with the crash-loop backoff, and serving again
        wait_for(lambda: worker_pid(e, "hog") not in (None, pid), 60, "hog's worker restarted")
        wait_for(lambda: available("hog"), 60, "hog available again")
        wait_for(
            lambda: (
                edgectl_json(hub, "get", "devices", "dev-1")["status"]["workloads"]["hog"].get(
                    "restartCount"
                )
                == 1
            ),
            30,
            "restartCount 1 at the hub",
        )
        det.wait_for_answers(20)
    assert det.errors == [], det.errors[:3]

    # the deployment's status and describe show it per device; det's show nothing
    status = edgectl_json(hub, "get", "deployments", "hog")["status"]
    assert status["terminations"]["dev-1"]["lastTermination"]["reason"] == "OOMKilled"
    assert status["terminations"]["dev-1"]["restartCount"] == 1
    assert status["failing"] == {}  # serving again: not failing
    assert "terminations" not in edgectl_json(hub, "get", "deployments", "det")["status"]
    described = hub.edgectl("describe", "deployment", "hog").stdout
    assert "Terminations:     dev-1: OOMKilled (signal 9) at " in described, described
    device_text = hub.edgectl("describe", "device", "dev-1").stdout
    assert "hog: OOMKilled (signal 9)" in device_text, device_text

    # one event for the one termination, whatever reports came after it (the restart's)
    wait_for(lambda: events(hub, "hog"), 30, "an event on hog")
    oom = [ev for ev in events(hub, "hog") if ev["reason"] == "OOMKilled"]
    assert len(oom) == 1, oom
    assert oom[0]["type"] == "Warning" and "device dev-1: replica " in oom[0]["message"]
    assert "OOMKilled" in hub.edgectl("describe", "deployment", "hog").stdout.split("Events:")[1]
    assert not [ev for ev in events(hub, "det") if ev["reason"] == "OOMKilled"]
