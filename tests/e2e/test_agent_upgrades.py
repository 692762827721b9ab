"""AgentUpgrade end to end (issue 32, item 2): a real ``hub serve`` process, devices speaking
Sync over mTLS from the test and reporting ``Status.agent`` as edged under its launcher would
(tests/e2e/agentdevice.py), the releases held in the hub's store as the push writes them.

* canary first, then all: one device is sent the release, comes back healthy, then the rest
  one at a time (maxUnavailable 1); a device outside the selector is never sent anything;
* a failure at the canary stops the rollout and reverts it: the device whose launcher rolled
  back is named with its reason, the device that had committed the new release is sent its
  previous one explicitly and goes back, nobody else was sent anything;
* ``edgectl rollout pause|resume|undo|status|history agentupgrade/NAME``, and resume after
  a rollback retrying the same version as a new revision;
* apply refuses a version outside the hub's window and waves at a hub without regions
  (tests/e2e/test_agent_waves.py: at a root), and changes nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agentdevice import ABI, ARCH, AgentDevice, agent_device
from fleet import HubProcess
from harness import wait_for

from edgefleet.versioning import installed_version
from hub.decide.agentreleases import AgentReleaseRecord
from hub.state.agentreleases import put_agent_release
from hub.state.store import open_hub_store

OLD = installed_version()  # what the devices run: the hub's own version
_MAJOR, _MINOR, _PATCH = (int(x) for x in OLD.split(".")[:3])
NEW = f"{_MAJOR}.{_MINOR}.{_PATCH + 1}"  # a patch release: inside the window
NEWER = f"{_MAJOR}.{_MINOR}.{_PATCH + 2}"


def hold_releases(hub: HubProcess, *versions: str) -> None:
    """The release records the push writes (hub.state.agentreleases), before the hub starts."""

    async def put() -> None:
        store = await open_hub_store(None, data_dir=hub.data)
        try:
            for v in versions:
                record = AgentReleaseRecord(
                    v, ARCH, ABI, "ab" * 32, 1000, f'{{"version": "{v}"}}'.encode(), 1.0
                )
                await put_agent_release(store, record)
        finally:
            await store.close()

    asyncio.run(put())


def apply(hub: HubProcess, tmp_path: Path, text: str) -> Any:
    doc = tmp_path / "upgrade.yaml"
    doc.write_text(text)
    return hub.edgectl("apply", "-f", str(doc), check=False)


def upgrade_yaml(version: str, rollout: str = "") -> str:
    return (
        "apiVersion: edgefleet.io/v1\nkind: AgentUpgrade\nmetadata: {name: edged-next}\n"
        f'spec:\n  version: "{version}"\n  selector: {{matchLabels: {{site: retail}}}}\n'
        f"  rollout: {{progressDeadlineSeconds: 900{rollout}}}\n"
    )


def status(hub: HubProcess) -> dict[str, Any]:
    out = hub.edgectl("get", "agentupgrade", "edged-next", "-o", "json")
    return dict(json.loads(out.stdout).get("status", {}))


def events(hub: HubProcess) -> list[str]:
    doc = json.loads(hub.edgectl("get", "events", "-o", "json").stdout)
    items = doc["items"] if isinstance(doc, dict) else doc
    return [e["reason"] for e in items if e.get("object", {}).get("kind") == "AgentUpgrade"]


def desired_version(device: AgentDevice) -> str:
    d = device.desired
    return d.agent.version if d is not None and d.HasField("agent") else ""


def agent_reports_in(hub: HubProcess) -> set[str]:
    """The devices whose agent report the hub holds (``get devices``: status.agent)."""
    out = hub.edgectl("get", "devices", "-o", "json")
    doc = json.loads(out.stdout)
    items = doc.get("items", doc) if isinstance(doc, dict) else doc
    return {d["metadata"]["name"] for d in items if d["status"].get("agent")}


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[HubProcess, dict[str, AgentDevice]]]:
    hub = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init()
    hold_releases(hub, OLD, NEW, NEWER)
    hub.start()
    devices: dict[str, AgentDevice] = {}
    try:
        for i in range(4):
            name = f"r{i}"
            devices[name] = agent_device(hub, tmp_path, name, {"site": "retail"}, version=OLD)
        devices["depot"] = agent_device(hub, tmp_path, "depot", {"site": "depot"}, version=OLD)
        for d in devices.values():
            d.connect()
        # every device's agent report in before a test applies anything, so that the order in
        # which devices are sent a release is by name, as the tests expect (an upgrade applied
        # earlier waits for the reports: test_agentupgrade_plan)
        for d in devices.values():
            assert d.reported.wait(30), f"{d.name} sent no report"
        wait_for(lambda: agent_reports_in(hub) == set(devices), 30, "the agent reports at the hub")
        yield hub, devices
    finally:
        for d in devices.values():
            d.disconnect()
        hub.stop()


def test_canary_first_then_all(
    fleet: tuple[HubProcess, dict[str, AgentDevice]], tmp_path: Path
) -> None:
    hub, devices = fleet
    for d in devices.values():
        d.behaviour = "hold"
    out = apply(hub, tmp_path, upgrade_yaml(NEW, ", canary: {steps: [25%]}"))
    assert out.returncode == 0, out.stdout + out.stderr
    wait_for(lambda: desired_version(devices["r0"]) == NEW, 30, "the canary sent the release")
    shown = wait_for(lambda: (s := status(hub)).get("updatingDevices") == 1 and s, 30)
    assert shown["phase"] == "Progressing" and shown["stepDevices"] == 1, shown
    assert [desired_version(devices[n]) for n in ("r1", "r2", "r3")] == ["", "", ""]
    devices["r0"].behaviour = "good"  # the canary comes back healthy
    for d in devices.values():
        d.behaviour = "good"
    done = wait_for(lambda: (s := status(hub)).get("phase") == "Complete" and s, 60, "Complete")
    assert done["doneDevices"] == 4 and done["failedDevices"] == {}, done
    assert all(devices[f"r{i}"].committed == NEW for i in range(4))
    assert devices["depot"].committed == OLD and desired_version(devices["depot"]) == ""
    # the devices came back with a Hello of the new version: the hub shows it
    wide = hub.edgectl("get", "devices", "-o", "json").stdout
    assert NEW in wide
    reasons = events(hub)
    assert "CanaryStepPassed" in reasons and "RolloutComplete" in reasons, reasons


def test_a_device_that_leaves_the_selector_mid_trial_aborts_it_and_is_let_go(
    fleet: tuple[HubProcess, dict[str, AgentDevice]], tmp_path: Path
) -> None:
    hub, devices = fleet
    r0 = devices["r0"]
    r0.behaviour = "hold"
    text = upgrade_yaml(NEW).replace(
        "selector: {matchLabels: {site: retail}}",
        "selector: {matchLabels: {site: retail}, "
        "matchExpressions: [{key: held, operator: DoesNotExist}]}",
    )
    out = apply(hub, tmp_path, text)
    assert out.returncode == 0, out.stdout + out.stderr
    wait_for(lambda: desired_version(r0) == NEW, 30, "r0 sent the release")
    r0.claim(version=NEW, phase="Trying", upgrade="edged-next", upgrade_revision=1)
    r0.labels = {**r0.labels, "held": "yes"}  # its labels change: out of the selector
    r0.reconnect.set()
    wait_for(lambda: desired_version(r0) == OLD, 30, "r0 held at its committed release")
    shown = status(hub)
    assert shown["leavingDevices"] == {"r0": OLD}, shown
    # its launcher aborts the trial (RolledBackByHub) and runs what it had committed
    r0.claim(version=OLD, phase="RolledBack", reason="RolledBackByHub")
    wait_for(lambda: desired_version(r0) == "", 30, "r0 let go: no longer the upgrade's")
    done = wait_for(lambda: (s := status(hub)).get("phase") == "Complete" and s, 60, "Complete")
    assert done["doneDevices"] == 3 and done["failedDevices"] == {}, done
    assert r0.committed == OLD and "leavingDevices" not in done, done
    assert "DevicesLeft" in events(hub)


def test_a_failure_at_the_canary_stops_and_reverts(
    fleet: tuple[HubProcess, dict[str, AgentDevice]], tmp_path: Path
) -> None:
    hub, devices = fleet
    devices["r1"].behaviour = "hold"  # its launcher will roll back, after r0 committed
    out = apply(hub, tmp_path, upgrade_yaml(NEW, ", maxUnavailable: 2, canary: {steps: [50%]}"))
    assert out.returncode == 0, out.stdout + out.stderr
    wait_for(lambda: devices["r0"].committed == NEW, 30, "r0 committed the new release")
    wait_for(lambda: desired_version(devices["r1"]) == NEW, 30, "r1 was sent it")
    devices["r1"].behaviour = "crash"
    rolled = wait_for(lambda: (s := status(hub)).get("phase") == "RolledBack" and s, 30)
    assert rolled["reason"] == "FailureThresholdReached", rolled
    assert rolled["failedDevices"] == {"r1": f"CrashLoop: edged {NEW} exited 3 times"}, rolled
    assert "r1 (CrashLoop" in rolled["message"], rolled
    assert rolled["rollbackDevices"] == {"r0": OLD}, rolled
    # r0 had committed the new release: sent its previous one, it goes back
    wait_for(lambda: devices["r0"].committed == OLD, 30, "r0 went back to its release")
    assert devices["r1"].committed == OLD and desired_version(devices["r1"]) == ""
    for name in ("r2", "r3", "depot"):  # never sent anything
        assert devices[name].tried == set() and devices[name].committed == OLD
    condition = rolled["conditions"][0]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "Progressing",
        "False",
        "RolledBack",
    )
    assert "RolledBack" in events(hub) and "DeviceFailed" in events(hub)
    watched = hub.edgectl("rollout", "status", "agentupgrade/edged-next", check=False)
    assert watched.returncode == 1 and "failed r1: CrashLoop" in watched.stdout, watched
    # fixed (the same version, a device that no longer crashes): resume retries it
    devices["r1"].behaviour = "good"
    out = hub.edgectl("rollout", "resume", "au/edged-next")
    assert "retrying" in out.stdout and "revision 2" in out.stdout, out.stdout
    done = wait_for(lambda: (s := status(hub)).get("phase") == "Complete" and s, 60, "Complete")
    assert done["revision"] == 2 and done["doneDevices"] == 4, done
    history = hub.edgectl("rollout", "history", "agentupgrade/edged-next").stdout
    assert "copy of 1" in history and "complete" in history, history


def test_apply_refusals_change_nothing(
    fleet: tuple[HubProcess, dict[str, AgentDevice]], tmp_path: Path
) -> None:
    hub, _ = fleet
    outside = f"{_MAJOR}.{_MINOR + 1}.0"  # newer than the hub
    out = apply(hub, tmp_path, upgrade_yaml(outside))
    assert out.returncode != 0
    assert "spec.version" in out.stderr and "outside the versions this hub accepts" in out.stderr
    out = apply(hub, tmp_path, upgrade_yaml(NEW, ", waves: [{regions: [eu]}]"))
    assert out.returncode != 0 and "this hub has no regional hubs enrolled" in out.stderr
    out = apply(hub, tmp_path, upgrade_yaml(NEW, ", maxSurge: 1"))
    assert out.returncode != 0 and "spec.rollout.maxSurge: unknown field" in out.stderr
    listed = hub.edgectl("get", "agentupgrades", "-o", "json").stdout
    assert "edged-next" not in listed


def test_pause_resume_undo(
    fleet: tuple[HubProcess, dict[str, AgentDevice]], tmp_path: Path
) -> None:
    hub, devices = fleet
    for d in devices.values():
        d.behaviour = "hold"
    out = apply(hub, tmp_path, upgrade_yaml(NEW))
    assert out.returncode == 0, out.stdout + out.stderr
    wait_for(lambda: desired_version(devices["r0"]) == NEW, 30, "r0 sent the release")
    out = hub.edgectl("rollout", "pause", "agentupgrade/edged-next")
    assert "paused" in out.stdout, out.stdout
    again = hub.edgectl("rollout", "pause", "agentupgrade/edged-next", check=False)
    assert again.returncode != 0 and "Paused, not Progressing" in again.stderr, again
    for d in devices.values():
        d.behaviour = "good"
    wait_for(lambda: status(hub).get("doneDevices") == 1, 30, "r0 came back healthy")
    table = hub.edgectl("get", "agentupgrades").stdout
    assert "Paused" in table and "1/4" in table and NEW in table, table
    assert [desired_version(devices[n]) for n in ("r1", "r2", "r3")] == ["", "", ""]
    hub.edgectl("rollout", "resume", "agentupgrade/edged-next")
    wait_for(lambda: status(hub).get("phase") == "Complete", 60, "Complete")
    shown = hub.edgectl("rollout", "status", "agentupgrade/edged-next").stdout
    assert "Complete" in shown and "4/4" in shown, shown
    # a newer version: revision 2; then undo goes back to revision 1's version as revision 3
    out = apply(hub, tmp_path, upgrade_yaml(NEWER))
    assert out.returncode == 0, out.stdout + out.stderr
    wait_for(lambda: status(hub).get("phase") == "Complete" and status(hub)["revision"] == 2, 60)
    assert all(devices[f"r{i}"].committed == NEWER for i in range(4))
    out = hub.edgectl("rollout", "undo", "agentupgrade/edged-next")
    assert f"rolling back to revision 1 ({NEW})" in out.stdout, out.stdout
    wait_for(lambda: status(hub).get("phase") == "Complete" and status(hub)["revision"] == 3, 60)
    assert all(devices[f"r{i}"].committed == NEW for i in range(4))
    spec = json.loads(hub.edgectl("get", "agentupgrade", "edged-next", "-o", "json").stdout)
    assert spec["spec"]["version"] == NEW
    history = hub.edgectl("rollout", "history", "au/edged-next").stdout
    assert "copy of 1" in history and NEWER in history, history
    described = hub.edgectl("describe", "agentupgrade", "edged-next").stdout
    assert "RolloutUndo" in described and "phase: Complete" in described, described


def test_a_hub_killed_mid_rollout_resumes_from_the_store(
    fleet: tuple[HubProcess, dict[str, AgentDevice]], tmp_path: Path
) -> None:
    hub, devices = fleet
    for d in devices.values():
        d.behaviour = "hold"
    out = apply(hub, tmp_path, upgrade_yaml(NEW, ", maxUnavailable: 2"))
    assert out.returncode == 0, out.stdout + out.stderr
    wait_for(lambda: status(hub).get("updatingDevices") == 2, 30, "two devices sent")
    hub.kill9()
    hub.start()
    shown = wait_for(lambda: (s := status(hub)).get("updatingDevices") == 2 and s, 30)
    assert shown["revision"] == 1 and shown["phase"] == "Progressing", shown
    wait_for(lambda: desired_version(devices["r0"]) == NEW, 30, "r0 still sent it")
    for d in devices.values():
        d.behaviour = "good"
    done = wait_for(lambda: (s := status(hub)).get("phase") == "Complete" and s, 60, "Complete")
    assert done["revision"] == 1 and done["doneDevices"] == 4, done
    doc = json.loads(hub.edgectl("get", "events", "-o", "json").stdout)
    items = doc["items"] if isinstance(doc, dict) else doc
    sent = [
        e["message"].rsplit(" sent to ", 1)[1]
        for e in items
        if e["reason"] == "DevicesUpdated" and e["object"]["kind"] == "AgentUpgrade"
    ]
    names = [n for m in sent for n in m.split(", ")]
    assert sorted(names) == ["r0", "r1", "r2", "r3"], sent  # no device sent twice


def test_lying_devices_speak_only_for_themselves(
    fleet: tuple[HubProcess, dict[str, AgentDevice]], tmp_path: Path
) -> None:
    """Devices never sent the release claim it committed, or rolled back, for this very
    upgrade and revision: neither passes the canary step nor fails the rollout; the liar who
    claims to be up to date only takes itself out of the pool. Deleting the upgrade sends no
    device a release any more."""
    hub, devices = fleet
    for d in devices.values():
        d.behaviour = "hold"
    out = apply(hub, tmp_path, upgrade_yaml(NEW, ", canary: {steps: [25%]}"))
    assert out.returncode == 0, out.stdout + out.stderr
    wait_for(lambda: desired_version(devices["r0"]) == NEW, 30, "the canary sent the release")
    # never sent: claims it committed this upgrade's revision 1
    devices["r3"].claim(version=NEW, committed=NEW, phase="Committed", upgrade="edged-next",
                        upgrade_revision=1)  # fmt: skip
    # never sent: claims its launcher rolled it back
    devices["r2"].claim(phase="RolledBack", reason="CrashLoop", upgrade="edged-next",
                        upgrade_revision=1)  # fmt: skip
    shown = wait_for(lambda: (s := status(hub)).get("upToDateDevices") == 1 and s, 30)
    assert shown["phase"] == "Progressing" and shown["failedDevices"] == {}, shown
    assert shown["doneDevices"] == 0 and shown["updating"] == ["r0"], shown
    assert [desired_version(devices[n]) for n in ("r1", "r2", "r3")] == ["", "", ""]
    # the canary commits: the controller's next passes, after both claims were in, move on to
    # r1 (the claims counted for nothing: a failure counted would have stopped the rollout)
    devices["r0"].claim(behaviour="good")
    wait_for(lambda: desired_version(devices["r1"]) == NEW, 30, "r1 sent the release next")
    shown = status(hub)
    assert shown["phase"] == "Progressing" and shown["failedDevices"] == {}, shown
    assert shown["doneDevices"] == 1 and shown["updating"] == ["r1"], shown
    assert [desired_version(devices[n]) for n in ("r2", "r3")] == ["", ""]
    hub.edgectl("delete", "agentupgrade", "edged-next")
    wait_for(lambda: desired_version(devices["r0"]) == "", 30, "r0 sent no release any more")


def test_a_device_on_trial_when_the_rollout_rolls_back_is_held_and_never_commits_it(
    fleet: tuple[HubProcess, dict[str, AgentDevice]], tmp_path: Path
) -> None:
    """r0 is on trial and r1 rolls back by itself: the rollout stops, and r0 is held at the
    release it had committed (sent nothing, its trial edged would commit the rejected one,
    then be sent back), so its trial aborts; once it says so it is let go."""
    hub, devices = fleet
    r0, r1 = devices["r0"], devices["r1"]
    r0.behaviour = r1.behaviour = "hold"
    out = apply(hub, tmp_path, upgrade_yaml(NEW, ", maxUnavailable: 2, canary: {steps: [50%]}"))
    assert out.returncode == 0, out.stdout + out.stderr
    wait_for(lambda: desired_version(r0) == desired_version(r1) == NEW, 30, "both sent it")
    r0.claim(version=NEW, phase="Trying", upgrade="edged-next", upgrade_revision=1)
    r1.behaviour = "crash"
    rolled = wait_for(lambda: (s := status(hub)).get("phase") == "RolledBack" and s, 30)
    assert list(rolled["failedDevices"]) == ["r1"], rolled
    wait_for(lambda: desired_version(r0) == OLD, 30, "r0 held at its committed release")
    shown = status(hub)
    assert shown["heldDevices"] == {"r0": OLD} and shown["rollbackDevices"] == {}, shown
    assert desired_version(r1) == ""  # its attempt ended on the device: nothing to abort
    watched = hub.edgectl("rollout", "status", "agentupgrade/edged-next", check=False)
    assert f"held r0 at {OLD}" in watched.stdout, watched.stdout
    # its launcher aborts the trial (RolledBackByHub) and runs what it had committed
    r0.claim(version=OLD, phase="RolledBack", reason="RolledBackByHub")
    wait_for(lambda: desired_version(r0) == "", 30, "r0 let go")
    done = wait_for(lambda: "heldDevices" not in (s := status(hub)) and s, 30, "none held")
    assert done["phase"] == "RolledBack" and done["rollbackDevices"] == {}, done
    assert r0.committed == OLD  # it never committed the rejected version
