"""The real edged under the real launcher switches releases: a release built by
packaging/agent/build-release from this checkout with a higher version is installed into the
inactive slot, smoke-tested, asked for as the controller asks (request.json, then edged
exits), and commits by itself once it serves the workload that served before (workers stopped
with each edged, or kept and adopted by the next); then a broken
release (it passes its smoke test but crashes at every start) rolls back by itself, and the
committed edged reports why. Real processes, a real ONNX model, no fakes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from polltesting import wait_for

from edged.agent.installing import install_release
from edged.agent.smoketesting import smoke_test
from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.devicestatus import fetch_status
from edgefleet.trust.agentreleases import this_platform

pytestmark = [pytest.mark.scenario, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "packaging" / "agent" / "build-release"
MANIFEST = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {name: mlp}
spec:
  model: {name: mlp, version: "1.0.0", path: mlp.onnx}
  runtime: {executionProviders: [CPUExecutionProvider]}
  resources: {cpu: 500m, memory: 1Gi}
  probes:
    startup: {timeoutSeconds: 60}
    readiness: {periodSeconds: 1, timeoutSeconds: 1}
"""


def build_release(version: str, out: Path, source: Path = REPO) -> Any:
    """``packaging/agent/build-release``, and the VerifiedRelease the fetch would return."""
    import hashlib

    from edged.hublink.agentreleases import VerifiedRelease

    subprocess.run(
        [sys.executable, str(BUILD), "--version", version, "--out", str(out),
         "--source", str(source)],
        check=True, capture_output=True,
    )  # fmt: skip
    data = out.read_bytes()
    with_platform = this_platform()
    return VerifiedRelease(
        path=out,
        version=version,
        arch=with_platform.arch,
        python_abi=with_platform.python_abi,
        sha256=hashlib.sha256(data).hexdigest(),
        length=len(data),
    )


def broken_source(tmp: Path) -> Path:
    """This checkout whose ``edged run`` exits 3 at once (its ``edged check`` still passes)."""
    src = tmp / "broken-src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("edged", "edgefleet"):
        shutil.copytree(REPO / package, src / package, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", src / "pyproject.toml")
    cli = src / "edged" / "cli.py"
    text = cli.read_text()
    marker = "def _run(args: argparse.Namespace) -> int:\n"
    assert marker in text
    cli.write_text(text.replace(marker, marker + "    raise SystemExit(3)  # broken release\n"))
    return src


def status(data: Path) -> dict[str, Any]:
    return fetch_status(str(data / "edged.sock"))


def serving(data: Path) -> bool:
    doc = status(data)
    return any(
        w["name"] == "mlp" and any(r.get("ready") for r in w.get("replicas", []))
        for w in doc.get("workloads", [])
    )


def launcher_state(data: Path) -> dict[str, Any]:
    return json.loads((data / "agent" / "launcher.json").read_text())


class Device:
    def __init__(self, tmp: Path, *, keep_workers: bool = False) -> None:
        self.tmp = tmp
        self.data = tmp / "d"
        self.manifests = tmp / "manifests"
        self.manifests.mkdir()
        build_mlp(self.manifests / "mlp.onnx", TINY_MLP, seed=1)
        (self.manifests / "mlp.yaml").write_text(MANIFEST)
        self.config = tmp / "edged.toml"
        self.config.write_text(
            f'[trust]\nallowUnsigned = true\nrootFile = "{tmp / "absent.json"}"\n'
            f"[workers]\nkeepOnExit = {'true' if keep_workers else 'false'}\n"
        )
        self.log = tmp / "launcher.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        env["PYTHONPATH"] = str(REPO)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "edged.launcher", "--launcher-restart-delay=0.2",
                 "run", "--data-dir", str(self.data), "--manifests", str(self.manifests),
                 "--config", str(self.config)],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.tmp,
                start_new_session=True,
            )  # fmt: skip

    def edged(self) -> psutil.Process:
        assert self.proc is not None
        children = psutil.Process(self.proc.pid).children()
        edged = [c for c in children if "edged" in " ".join(c.cmdline())]
        assert edged, "no edged under the launcher"
        return edged[0]

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            for proc in psutil.process_iter(["cmdline"]):  # kept workers: sessions of their own
                if str(self.data) in " ".join(proc.info["cmdline"] or ()):
                    proc.kill()


@pytest.fixture(params=[False, True], ids=["workers-stop", "workers-kept"])
def device(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Device]:
    """Workers stopped with each edged, or kept and adopted by the next one (the default
    under the launcher: keepOnExit auto)."""
    dev = Device(tmp_path, keep_workers=request.param)
    try:
        yield dev
    finally:
        dev.stop()


def switch(device: Device, slot: str, version: str, *, max_tries: int = 3) -> None:
    """What the agent controller does once a release is installed and smoke-tested."""
    served = ["mlp"] if serving(device.data) else []
    request = {
        "action": "try", "id": f"{version}-{time.time_ns()}", "slot": slot, "version": version,
        "maxTries": max_tries, "commitDeadlineSeconds": 120, "upgrade": "test",
        "upgradeRevision": 1, "context": {"servedBefore": served},
    }  # fmt: skip
    path = device.data / "agent" / "request.json"
    path.with_suffix(".tmp").write_text(json.dumps(request))
    path.with_suffix(".tmp").replace(path)
    device.edged().send_signal(signal.SIGTERM)  # edged stops for the launcher


def install(device: Device, release: Any, slot: str) -> None:
    installed = install_release(release, device.data, slot)
    import asyncio

    asyncio.run(
        smoke_test(installed.root, release.version, data_dir=device.data, config_path=device.config)
    )


def test_a_release_commits_and_a_broken_one_rolls_back_by_itself(
    device: Device, tmp_path: Path
) -> None:
    device.start()
    wait_for(lambda: serving(device.data), 90, "mlp serving from the package",
             detail=device.logs)  # fmt: skip
    before = status(device.data)["agent"]
    assert before["slot"] == "package" and before["launcher"] is True
    package_version = before["version"]

    # -- a good release, higher version: installed, smoke-tested, tried, committed ----------
    good = build_release("9.0.1", tmp_path / "good.tar.gz")
    install(device, good, "a")
    switch(device, "a", "9.0.1")
    wait_for(lambda: launcher_state(device.data)["committed"] == "a", 120, "the commit",
             detail=device.logs)  # fmt: skip
    state = launcher_state(device.data)
    assert state["committedVersion"] == "9.0.1" and state["last"]["outcome"] == "Committed"
    wait_for(lambda: status(device.data)["agent"]["phase"] == "Committed", 30, "Committed")
    agent = status(device.data)["agent"]
    assert agent["version"] == "9.0.1" and agent["slot"] == "a"
    assert agent["committedVersion"] == "9.0.1"
    assert serving(device.data)

    # -- a broken release: passes its smoke test, crashes at every start, rolls back ------
    broken = build_release("9.0.2", tmp_path / "broken.tar.gz", source=broken_source(tmp_path))
    install(device, broken, "b")
    switch(device, "b", "9.0.2", max_tries=2)
    wait_for(
        lambda: (launcher_state(device.data).get("last") or {}).get("outcome") == "RolledBack",
        120, "the rollback", detail=device.logs,
    )  # fmt: skip
    last = launcher_state(device.data)["last"]
    assert last["reason"] == "CrashLoop" and last["tries"] == 2 and last["version"] == "9.0.2"
    assert launcher_state(device.data)["committed"] == "a"
    wait_for(lambda: serving(device.data), 90, "mlp serving again", detail=device.logs)
    wait_for(lambda: status(device.data)["agent"]["phase"] == "RolledBack", 30, "RolledBack")
    agent = status(device.data)["agent"]
    assert agent["version"] == "9.0.1" and agent["phase"] == "RolledBack"
    assert agent["reason"] == "CrashLoop" and agent["tries"] == 2
    assert package_version != agent["version"]
