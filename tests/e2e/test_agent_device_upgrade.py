"""A real device updates its edged as the hub asks (issue 32): ``hub init`` and ``hub serve``,
releases built by ``packaging/agent/build-release`` and pushed with ``edgectl agent push``, an
``AgentUpgrade`` applied with edgectl, and a device enrolled with ``edged enroll`` that runs
under the real ``edged-launcher``: its agent controller fetches the release over its own mTLS
link (TUF and the envelope first), installs it into the inactive slot, smoke-tests it, asks
the launcher for the trial and commits once connected again; the hub shows the new version.
Then a broken release (its check passes, its ``edged run`` crashes): the launcher rolls it
back by itself after maxTries, the device reports CrashLoop, and the hub's rollout says so.
Last, an upgrade back to the base install's version: the device goes back to its package."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agentreleasetesting import build_release
from fleet import HubProcess, enroll
from harness import wait_for

from edgefleet.devicestatus import fetch_status
from edgefleet.versioning import installed_version

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]
OLD = installed_version()
_MAJOR, _MINOR, _PATCH = (int(x) for x in OLD.split(".")[:3])
NEW = f"{_MAJOR}.{_MINOR}.{_PATCH + 1}"
BROKEN = f"{_MAJOR}.{_MINOR}.{_PATCH + 2}"


def broken_source(tmp: Path) -> Path:
    """This checkout whose ``edged run`` exits 3 at once (its ``edged check`` passes)."""
    src = tmp / "broken-src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("edged", "edgefleet"):
        shutil.copytree(REPO / package, src / package, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", src / "pyproject.toml")
    cli = src / "edged" / "cli.py"
    marker = "def _run(args: argparse.Namespace) -> int:\n"
    text = cli.read_text()
    assert marker in text
    cli.write_text(text.replace(marker, marker + "    raise SystemExit(3)  # broken release\n"))
    return src


def upgrade_yaml(version: str) -> str:
    return (
        "apiVersion: edgefleet.io/v1\nkind: AgentUpgrade\nmetadata: {name: edged-next}\n"
        f'spec:\n  version: "{version}"\n  selector: {{matchLabels: {{site: retail}}}}\n'
        "  rollout: {progressDeadlineSeconds: 300}\n"
        "  commit: {deadlineSeconds: 120, maxTries: 2}\n"
    )


class LaunchedDevice:
    def __init__(self, data: Path, config: Path, log: Path) -> None:
        self.data, self.config, self.log = data, config, log
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        env["PYTHONPATH"] = str(REPO)
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "edged.launcher", "--launcher-restart-delay=0.2", "run",
                 "--data-dir", str(data), "--config", str(config)],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=data.parent,
                start_new_session=True,
            )  # fmt: skip

    def agent(self) -> dict[str, Any]:
        return dict(fetch_status(str(self.data / "edged.sock"))["agent"])

    def launcher(self) -> dict[str, Any]:
        return dict(json.loads((self.data / "agent" / "launcher.json").read_text()))

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-8000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[HubProcess, LaunchedDevice]]:
    hub = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init().start()
    device: LaunchedDevice | None = None
    try:
        good = build_release(tmp_path / "good.tar.gz", NEW)
        bad = build_release(
            tmp_path / "bad.tar.gz", BROKEN, "--source", str(broken_source(tmp_path))
        )
        old = build_release(tmp_path / "old.tar.gz", OLD)  # the package's own, for a way back
        for path, version in ((good, NEW), (bad, BROKEN), (old, OLD)):
            out = hub.edgectl("agent", "push", str(path), "--version", version)
            assert "pushed" in out.stdout, out.stdout + out.stderr
        data = tmp_path / "dev"
        out = enroll(hub, data, "dev-u", {"site": "retail"})
        assert out.returncode == 0, out.stdout + out.stderr
        config = tmp_path / "edged.toml"
        config.write_text(
            f'[trust]\nrootFile = "{tmp_path / "absent.json"}"\n[workers]\nkeepOnExit = false\n'
        )
        device = LaunchedDevice(data, config, tmp_path / "launcher.log")
        yield hub, device
    finally:
        if device is not None:
            device.stop()
        hub.stop()


def upgrade_status(hub: HubProcess) -> dict[str, Any]:
    out = hub.edgectl("get", "agentupgrade", "edged-next", "-o", "json")
    return dict(json.loads(out.stdout).get("status", {}))


def apply(hub: HubProcess, tmp_path: Path, version: str) -> None:
    doc = tmp_path / "upgrade.yaml"
    doc.write_text(upgrade_yaml(version))
    out = hub.edgectl("apply", "-f", str(doc), check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_device_updates_itself_and_rolls_a_broken_release_back(
    world: tuple[HubProcess, LaunchedDevice], tmp_path: Path
) -> None:
    hub, device = world
    wait_for(lambda: device.agent()["slot"] == "package", 60, "edged up", detail=device.logs)
    assert device.agent()["version"] == OLD and device.agent()["launcher"] is True

    apply(hub, tmp_path, NEW)
    wait_for(lambda: device.launcher()["committedVersion"] == NEW, 180, "the commit",
             detail=device.logs)  # fmt: skip
    wait_for(lambda: device.agent()["phase"] == "Committed", 60, "Committed reported")
    agent = device.agent()
    assert agent["version"] == NEW and agent["slot"] == "a" and agent["upgrade"] == "edged-next"
    done = wait_for(lambda: (s := upgrade_status(hub)).get("phase") == "Complete" and s, 120,
                    "the hub's rollout Complete", detail=device.logs)  # fmt: skip
    assert done["doneDevices"] == 1, done
    assert NEW in hub.edgectl("get", "devices", "-o", "json").stdout

    apply(hub, tmp_path, BROKEN)
    wait_for(
        lambda: (device.launcher().get("last") or {}).get("outcome") == "RolledBack",
        180, "the launcher's rollback", detail=device.logs,
    )  # fmt: skip
    last = device.launcher()["last"]
    assert last["reason"] == "CrashLoop" and last["version"] == BROKEN and last["tries"] == 2
    assert device.launcher()["committedVersion"] == NEW
    wait_for(lambda: device.agent()["phase"] == "RolledBack", 60, "RolledBack reported",
             detail=device.logs)  # fmt: skip
    agent = device.agent()
    assert agent["version"] == NEW and agent["reason"] == "CrashLoop"
    rolled = wait_for(lambda: (s := upgrade_status(hub)).get("phase") == "RolledBack" and s,
                      120, "the hub's rollout RolledBack", detail=device.logs)  # fmt: skip
    assert "CrashLoop" in json.dumps(rolled.get("failedDevices", {})), rolled

    # the operator goes back to the base install's release: the package, tried and committed
    apply(hub, tmp_path, OLD)
    wait_for(lambda: device.launcher()["committed"] == "package", 180, "back on the package",
             detail=device.logs)  # fmt: skip
    wait_for(lambda: device.agent()["phase"] == "Committed", 60, "Committed reported")
    agent = device.agent()
    assert agent["version"] == OLD and agent["slot"] == "package"
