"""The agent controller applying its steps, in process: an update goes fetch -> install ->
smoke test -> request.json (with what serves now) -> edged stops for the launcher; a refusal
is Failed for that revision and not retried; a trial commits with EDGED_COMMIT=1 once healthy;
the status says each phase."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from tarballtesting import DEVICE, build_release, release_json

from edged.agent import controller as agentcontrol
from edged.agent.controller import AgentController
from edged.agent.installing import InstallRefused, install_release
from edged.agent.planning import Health
from edged.hublink.agentreleases import VerifiedRelease
from edged.state import formats
from edgefleet.errors import ArtifactError
from edgefleet.v1 import device_pb2

HEALTHY = Health(True, True, True, frozenset({"mlp"}))


class Harness:
    def __init__(self, tmp_path: Path, *, env: dict[str, str], version: str = "0.2.0") -> None:
        self.data = tmp_path / "d"
        self.tmp = tmp_path
        self.notified: list[str] = []
        self.stopped: list[str] = []
        self.fetches = 0
        self.health = HEALTHY
        self.fetch_error: Exception | None = None
        self.smoke_error: Exception | None = None
        self.controller = AgentController(
            self.data,
            version=version,
            config_path=None,
            notify=lambda line: self.notified.append(line) or True,  # type: ignore[func-returns-value]
            fetch=self.fetch,
            health=lambda: self.health,
            serving=lambda: {"mlp"},
            request_stop=self.stopped.append,
            environ=env,
            install=lambda r, d, s, device: install_release(
                r, d, s, device=DEVICE, installed={"grpcio": "1.0"}.get
            ),
            smoke=self.smoke,
        )

    async def fetch(self, desired: device_pb2.DesiredAgent) -> VerifiedRelease:
        self.fetches += 1
        if self.fetch_error is not None:
            raise self.fetch_error
        return build_release(self.tmp / f"{desired.version}.tgz", desired.version)

    async def smoke(self, root: Path, version: str, **kw: Any) -> None:
        if self.smoke_error is not None:
            raise self.smoke_error

    def want(self, version: str, revision: int = 1) -> None:
        self.controller.desired_changed(
            device_pb2.DesiredAgent(
                version=version, upgrade="u", upgrade_revision=revision, max_tries=2
            )
        )

    def reconcile(self) -> Any:
        return asyncio.run(self.controller.reconcile("agent"))

    def request(self) -> dict[str, Any]:
        return json.loads((self.data / "agent" / "request.json").read_text())


ON_PACKAGE = {"EDGED_SLOT": "package", "EDGED_TRIAL": "0"}


def test_an_update_installs_smoke_tests_and_asks_the_launcher(tmp_path: Path) -> None:
    h = Harness(tmp_path, env=ON_PACKAGE)
    h.want("0.2.1")
    h.reconcile()
    req = h.request()
    assert req["action"] == "try" and req["slot"] == "a" and req["version"] == "0.2.1"
    assert req["maxTries"] == 2 and req["upgrade"] == "u" and req["upgradeRevision"] == 1
    assert req["context"] == {"servedBefore": ["mlp"]}
    assert h.stopped and h.controller.status()["phase"] == "Switching"
    assert (h.data / "agent" / "slots" / "a" / "installed.json").exists()
    assert not (tmp_path / "0.2.1.tgz").exists()  # the download, once installed


@pytest.mark.parametrize(
    ("where", "error", "reason"),
    [
        ("fetch", ArtifactError("SignatureThresholdNotMet", "bad envelope"),
         "SignatureThresholdNotMet"),
        ("smoke", InstallRefused("SmokeTestFailed", "edged check: StateUnreadable"),
         "SmokeTestFailed"),
    ],
)  # fmt: skip
def test_a_refused_release_fails_for_its_revision_and_is_not_retried(
    tmp_path: Path, where: str, error: Exception, reason: str
) -> None:
    h = Harness(tmp_path, env=ON_PACKAGE)
    setattr(h, f"{where}_error", error)
    h.want("0.2.1")
    h.reconcile()
    status = h.controller.status()
    assert status["phase"] == "Failed" and status["reason"] == reason
    assert not (h.data / "agent" / "request.json").exists() and not h.stopped
    fetches = h.fetches
    h.reconcile()
    assert h.fetches == fetches  # not again for this revision
    # after a restart of edged too (D/agent/agent.json)
    again = Harness(tmp_path, env=ON_PACKAGE)
    again.want("0.2.1")
    again.reconcile()
    assert again.fetches == 0 and again.controller.status()["reason"] == reason
    # the hub's next revision is tried
    setattr(again, f"{where}_error", None)
    again.want("0.2.1", revision=2)
    again.reconcile()
    assert again.request()["upgradeRevision"] == 2


@pytest.mark.parametrize("restart", [False, True])
def test_a_refusal_is_reported_until_a_new_desired_release_replaces_it(
    tmp_path: Path, restart: bool
) -> None:
    h = Harness(tmp_path, env=ON_PACKAGE)
    h.smoke_error = InstallRefused("SmokeTestFailed", "edged check: StateUnreadable")
    h.want("0.2.1", revision=3)
    h.reconcile()
    if restart:  # edged restarted: the refusal read back from D/agent/agent.json
        h = Harness(tmp_path, env=ON_PACKAGE)
    h.controller.desired_changed(None)  # the hub stopped asking (the rollout stopped)
    h.reconcile()
    status = h.controller.status()
    assert (status["phase"], status["reason"]) == ("Failed", "SmokeTestFailed")
    assert status["message"] == "edged check: StateUnreadable"
    assert (status["upgrade"], status["upgradeRevision"]) == ("u", 3)
    assert status["desiredVersion"] == ""
    # a new desired release replaces it: tried, and the refusal is forgotten
    h.smoke_error = None
    h.want("0.2.2", revision=4)
    h.reconcile()
    assert h.request()["version"] == "0.2.2"
    assert json.loads((h.data / "agent" / "agent.json").read_text()) == {}
    assert h.controller.failed is None


def test_a_failure_still_shown_names_its_own_revision_not_the_next_one(tmp_path: Path) -> None:
    """A new desired release arrives while the last attempt's failure is still shown (the
    controller has not acted on it yet): the report names the failed attempt's revision, so
    the hub never takes it for the new revision's failure (the lab saw revision 4 stopped
    0.3 s after being sent, for revision 3's failure). Once acted on, the new one's."""
    h = Harness(tmp_path, env=ON_PACKAGE)
    h.smoke_error = InstallRefused("SmokeTestFailed", "edged check: StateUnreadable")
    h.want("0.2.1", revision=3)
    h.reconcile()
    assert h.controller.status()["upgradeRevision"] == 3
    h.want("0.2.2", revision=4)  # not reconciled yet: still the failure of revision 3
    status = h.controller.status()
    assert (status["phase"], status["upgradeRevision"]) == ("Failed", 3), status
    assert status["desiredVersion"] == "0.2.2"
    h.smoke_error = None
    h.reconcile()
    status = h.controller.status()
    assert status["upgradeRevision"] == 4 and status["phase"] != "Failed", status


def test_a_release_for_another_platform_is_refused_before_the_switch(tmp_path: Path) -> None:
    h = Harness(tmp_path, env=ON_PACKAGE)

    async def other_platform(desired: device_pb2.DesiredAgent) -> VerifiedRelease:
        doc = release_json(desired.version, platform={"arch": "aarch64", "pythonAbi": "cp311"})
        release = build_release(tmp_path / "r.tgz", desired.version, doc=doc)
        return dataclasses.replace(release, arch="aarch64")

    h.controller.set_fetch(other_platform)
    h.want("0.2.1")
    h.reconcile()
    assert h.controller.status()["reason"] == "PlatformMismatch"
    assert not (h.data / "agent" / "slots" / "a").exists() and not h.stopped


def test_a_trial_commits_once_healthy(tmp_path: Path) -> None:
    h = Harness(tmp_path, env={"EDGED_SLOT": "b", "EDGED_TRIAL": "1"}, version="0.2.1")
    (h.data / "agent").mkdir(parents=True)
    (h.data / "agent" / "launcher.json").write_text(json.dumps({
        "format": 1, "committed": "package", "committedVersion": "",
        "trying": {"slot": "b", "version": "0.2.1", "tries": 1, "maxTries": 3,
                   "commitDeadlineSeconds": 30, "context": {"servedBefore": ["mlp"]}},
    }))  # fmt: skip
    formats.set_on_trial(True)
    try:
        h.health = Health(True, True, True, frozenset())
        h.reconcile()
        assert h.notified == [] and h.controller.status()["phase"] == "Trying"
        assert "not serving again: mlp" in h.controller.status()["message"]
        assert formats.on_trial()
        h.health = HEALTHY
        h.reconcile()
        assert h.notified == ["EDGED_COMMIT=1"] and not formats.on_trial()
    finally:
        formats.set_on_trial(False)


def test_the_hub_rolling_back_a_trial_aborts_it(tmp_path: Path) -> None:
    h = Harness(tmp_path, env={"EDGED_SLOT": "b", "EDGED_TRIAL": "1"}, version="0.2.1")
    (h.data / "agent").mkdir(parents=True)
    (h.data / "agent" / "launcher.json").write_text(json.dumps({
        "format": 1, "committed": "package",
        "trying": {"slot": "b", "version": "0.2.1", "tries": 1},
    }))  # fmt: skip
    h.want("0.2.0")
    h.reconcile()
    assert h.request()["action"] == "abort" and h.request()["reason"] == "RolledBackByHub"
    assert h.stopped


def test_status_names_the_platform_and_the_launcher(tmp_path: Path) -> None:
    status = Harness(tmp_path, env=ON_PACKAGE).controller.status()
    assert status["launcher"] is True and status["slot"] == "package"
    assert status["arch"] and status["pythonAbi"].startswith("cp")
    outside = Harness(tmp_path, env={}).controller.status()
    assert outside["launcher"] is False
    assert agentcontrol.desired_of(device_pb2.DesiredAgent()) is None


def test_phases_while_fetching_and_what_edged_status_shows(tmp_path: Path) -> None:
    from edgefleet.devicestatus import render_status

    h = Harness(tmp_path, env=ON_PACKAGE)
    seen: list[str] = []

    async def fetch(desired: device_pb2.DesiredAgent) -> VerifiedRelease:
        seen.append(h.controller.status()["phase"])  # the metadata is checked first
        h.controller.progress(5, 10)
        seen.append(h.controller.status()["phase"])
        return build_release(tmp_path / "r.tgz", desired.version)

    h.controller.set_fetch(fetch)
    h.want("0.2.1")
    h.reconcile()
    assert seen == ["Verifying", "Downloading"]
    text = render_status({"agent": h.controller.status()})
    assert "agent 0.2.0 (slot package), committed 0.2.0: Switching, hub asks 0.2.1" in text
