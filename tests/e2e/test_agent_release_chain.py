"""The whole chain of an edged release, with every real part: ``packaging/agent/build-release``
builds the checkout as the next patch version, ``edgectl agent push`` signs and publishes it
(TUF agent delegation of ``hub init``), an edged enrolled with the hub runs under the real
``edged-launcher``, ``edgectl apply`` an AgentUpgrade; the device fetches the release through
its verified fetch (TUF, envelope, FetchArtifact), installs it, switches and commits, and the
hub shows the new version and the upgrade Complete."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agentreleasetesting import build_release
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import wait_for

from edgefleet.trust import agentreleases
from edgefleet.versioning import installed_version

pytestmark = [pytest.mark.scenario, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
OLD = installed_version()
_MAJOR, _MINOR, _PATCH = (int(x) for x in OLD.split(".")[:3])
NEW = f"{_MAJOR}.{_MINOR}.{_PATCH + 1}"

UPGRADE = """\
apiVersion: edgefleet.io/v1
kind: AgentUpgrade
metadata: {{name: edged-next}}
spec:
  version: "{version}"
  selector: {{matchLabels: {{site: lab}}}}
  rollout: {{progressDeadlineSeconds: 300}}
  commit: {{deadlineSeconds: 120, maxTries: 2}}
"""


class LaunchedDevice:
    def __init__(self, data: Path, config: Path, log: Path) -> None:
        self.data, self.config, self.log = data, config, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        env["PYTHONPATH"] = str(REPO)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "edged.launcher", "--launcher-restart-delay=0.2",
                 "run", "--data-dir", str(self.data), "--config", str(self.config)],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.data.parent,
                start_new_session=True,
            )  # fmt: skip

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-8000:]

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


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[tuple[HubProcess, LaunchedDevice]]:
    hub = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init().start()
    device: LaunchedDevice | None = None
    try:
        out = enroll(hub, tmp_path / "dev", "dev-0", {"site": "lab"})
        assert out.returncode == 0, out.stdout + out.stderr
        config = tmp_path / "edged.toml"
        config.write_text(SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "no-root"))
        device = LaunchedDevice(tmp_path / "dev", config, tmp_path / "launcher.log")
        yield hub, device
    finally:
        if device is not None:
            device.stop()
        hub.stop()


def upgrade_status(hub: HubProcess) -> dict[str, Any]:
    out = hub.edgectl("get", "agentupgrade", "edged-next", "-o", "json", check=False)
    return dict(json.loads(out.stdout).get("status", {})) if out.returncode == 0 else {}


def device_agent(hub: HubProcess) -> str:
    return hub.edgectl("get", "devices", "-o", "wide").stdout


def test_a_pushed_release_reaches_a_device_and_commits(
    chain: tuple[HubProcess, LaunchedDevice], tmp_path: Path
) -> None:
    hub, device = chain
    release = build_release(tmp_path / f"edged-{NEW}.tar.gz", NEW)
    sha, _ = agentreleases.file_digest(release)
    pushed = hub.edgectl("agent", "push", str(release), "--version", NEW)
    assert "pushed" in pushed.stdout, pushed.stdout + pushed.stderr
    device.start()
    wait_for(
        lambda: OLD in device_agent(hub), 90, "the device connected", interval=1.0,
        detail=device.logs,
    )  # fmt: skip
    doc = tmp_path / "upgrade.yaml"
    doc.write_text(UPGRADE.format(version=NEW))
    out = hub.edgectl("apply", "-f", str(doc), check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    done = wait_for(
        lambda: (s := upgrade_status(hub)).get("phase") == "Complete" and s,
        300,
        "the upgrade Complete",
        interval=1.0,
        detail=lambda: f"{upgrade_status(hub)}\n{device.logs()}",
    )
    assert done["doneDevices"] == 1 and not done.get("failedDevices"), done
    # the device fetched exactly the pushed bytes (its verified fetch), installed and committed
    launcher = json.loads((device.data / "agent" / "launcher.json").read_text())
    slot = launcher["committed"]
    assert slot in ("a", "b"), launcher
    installed = json.loads((device.data / "agent" / "slots" / slot / "installed.json").read_text())
    assert (installed["version"], installed["sha256"]) == (NEW, sha), installed
    assert NEW in device_agent(hub)
