"""Version skew, end to end (docs/agent-updates.md, "Version skew"): the previous release's
edged with this hub, and this edged with the previous release's hub. The previous release is
built from git history (tests/releasetesting.py: the commit packaging/releases.toml names) and
runs as real processes: enrollment, Sync, status reports, a signed model pushed, a
ModelDeployment applied and served, the hub's view of the device.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import Edged, wait_for
from hubfleettesting import apply, push, serving
from releasetesting import CURRENT, Release, previous_release, reporting

X = np.ones((1, 64), dtype=np.float32)


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Release:
    return previous_release(tmp_path_factory.mktemp("releases"))


def _get(hub: HubProcess, *args: str) -> Any:
    return json.loads(hub.edgectl("get", *args, "-o", "json").stdout)


def _device(
    hub: HubProcess,
    tmp_path: Path,
    edged_factory: Callable[..., Edged],
    name: str,
    release: Release,
) -> Edged:
    """``name`` enrolled and started with ``release``'s edged."""
    data = tmp_path / name
    out = enroll(hub, data, name, {"site": "a"}, env=release.env(), cwd=release.cwd)
    assert out.returncode == 0, out.stdout + out.stderr
    e = edged_factory(None, data=data, config=SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "x"))
    e.env, e.cwd = release.env(), release.cwd
    return e.start()


def _deploys_serves_and_reports(hub: HubProcess, e: Edged, tmp_path: Path) -> dict[str, Any]:
    """Push, apply, served by the device, and its report seen by the hub; the Device."""
    push(hub, tmp_path, "det", "1.0.0")
    apply(hub, tmp_path, name="det", model="det", version="1.0.0", site="a")
    wait_for(lambda: serving(e, "det", "1.0.0"), 90, "the device to serve det 1.0.0")
    code, out = e.infer("det", X)
    assert code == 200, out
    wait_for(
        lambda: _get(hub, "deployments", "det")["status"]["readyDevices"] == 1,
        60,
        "the hub to see the device's report: det ready",
    )
    device: dict[str, Any] = _get(hub, "devices", e.data.name)
    assert device["status"]["phase"] == "Ready", device
    assert device["status"]["workloads"]["det"]["readyReplicas"] == 1, device
    return device


def test_the_previous_edged_syncs_reports_and_serves_with_this_hub(
    hub: HubProcess,
    tmp_path: Path,
    edged_factory: Callable[..., Edged],
    previous: Release,
) -> None:
    e = _device(hub, tmp_path, edged_factory, "old-edged", previous)
    e.wait_ready(60)
    assert e.status()["device"]["edgedVersion"] == previous.version  # it is the previous release
    device = _deploys_serves_and_reports(hub, e, tmp_path)
    assert device["status"]["agentVersion"] == previous.version
    assert device["status"]["agentRefused"] == ""
    wide = hub.edgectl("get", "devices", "-o", "wide").stdout
    assert "AGENT" in wide and previous.version in wide, wide
    assert e.terminate() == 0


@pytest.fixture
def previous_hub(tmp_path: Path, previous: Release) -> Iterator[HubProcess]:
    h = HubProcess(tmp_path / "old-hub", tmp_path / "old-hub.log", env=previous.env(),
                   cwd=previous.cwd)  # fmt: skip
    h.init().start()
    yield h
    h.stop()


def test_this_edged_syncs_reports_and_serves_with_the_previous_hub(
    previous_hub: HubProcess,
    tmp_path: Path,
    edged_factory: Callable[..., Edged],
    previous: Release,
) -> None:
    """A hub upgraded last: this edged with the previous release's hub and edgectl."""
    version = previous_hub.edgectl("--version").stdout
    assert version.strip() == f"edgectl {previous.version}", version
    assert "AGENT" not in previous_hub.edgectl("get", "devices", "-o", "wide").stdout
    e = _device(previous_hub, tmp_path, edged_factory, "new-edged", CURRENT)
    e.wait_ready(60)
    assert e.status()["device"]["edgedVersion"] == CURRENT.version
    _deploys_serves_and_reports(previous_hub, e, tmp_path)
    assert e.terminate() == 0


def test_an_edged_outside_the_window_is_refused_shown_and_accepted_once_inside(
    hub: HubProcess,
    tmp_path: Path,
    edged_factory: Callable[..., Edged],
    previous: Release,
) -> None:
    """A real edged stating a version newer than this hub: refused at its Hello, and the hub
    says so (get -o wide, describe, an event); the same device with a version inside the
    window is accepted and its refusal cleared."""
    major = CURRENT.version.split(".")[0]
    newer = reporting(previous, f"{int(major) + 1}.0.0", tmp_path)
    e = _device(hub, tmp_path, edged_factory, "too-new", newer)
    wait_for(
        lambda: f"{newer.version}(refused)" in hub.edgectl("get", "devices", "-o", "wide").stdout,
        60,
        "the hub to show the refused version",
    )
    described = hub.edgectl("describe", "device", "too-new").stdout
    assert f"edged {newer.version}, refused: AgentVersionOutsideWindow:" in described, described
    assert "AgentVersionOutsideWindow" in hub.edgectl("get", "events").stdout
    assert e.status()["workloads"] == []  # it was given nothing
    assert e.terminate() == 0
    e.env, e.cwd = previous.env(), previous.cwd  # the device's edged moved into the window
    e.start()
    wait_for(
        lambda: _get(hub, "devices", "too-new")["status"]["agentVersion"] == previous.version,
        60,
        "the hub to accept the device",
    )
    assert _get(hub, "devices", "too-new")["status"]["agentRefused"] == ""
    assert e.terminate() == 0
