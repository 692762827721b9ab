"""A fleet updates its edged, every part real (issue 32, "Tests"; docs/agent-updates.md): a
``hub serve``, three devices enrolled with it, each run by the real ``edged-launcher`` and
serving a signed model with a real ONNX Runtime worker, releases built by
``packaging/agent/build-release`` and pushed with ``edgectl agent push``, AgentUpgrades applied
and driven with edgectl (tests/e2e/agentupgradetesting.py).

* the same code as the next patch version, rolled out canary first (33% of three: one device,
  the others untouched while it updates), then all: every device commits, the hub shows the new
  version, ``rollout status|history`` say so, and the workloads serve throughout (the workers
  adopted, not restarted; a client retrying once misses nothing);
* three broken releases (crashes at start; never connects; connects but cannot serve): the
  canary's launcher goes back by itself, the device says why, the rollout stops at the canary,
  the other devices are never sent anything, and the hub names the device and the reason;
* pause, resume and undo of a running upgrade, and two upgrades in a row;
* the launcher and edged killed (-9) during the install and during the switch: the device
  comes back to a working edged and the rollout completes.

Seconds to commit per device are printed (``-s``)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentupgradetesting import (
    OLD,
    Fleet,
    LaunchedDevice,
    Load,
    build,
    kill_workers,
    patch_version,
    poll,
    push,
    timed_commits,
    upgrade_yaml,
)
from harness import wait_for

pytestmark = [pytest.mark.scenario, pytest.mark.timeout(900)]

NEW = patch_version(1)
NEWER = patch_version(2)
UPGRADE = "agentupgrade/edged-next"


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The releases the tests push, built once: NEW and NEWER (this checkout)."""
    tmp = tmp_path_factory.mktemp("releases")
    return {NEW: build(tmp, NEW), NEWER: build(tmp, NEWER)}


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path)
    try:
        yield f.start()
    finally:
        f.stop()


def report(what: str, seconds: dict[str, float]) -> None:
    shown = ", ".join(f"{n} {s:.1f} s" for n, s in sorted(seconds.items(), key=lambda x: x[1]))
    print(f"\n[agent upgrade] {what}: seconds to commit: {shown}")


def connected_as(fleet: Fleet, version: str) -> dict[str, str]:
    def shown() -> dict[str, str] | None:
        column = fleet.agent_column()
        return column if column and set(column.values()) == {version} else None

    found: dict[str, str] = wait_for(shown, 60, f"every device shown with {version}",
                                     interval=1.0, detail=fleet.logs)  # fmt: skip
    return found


def test_canary_then_all_while_serving(fleet: Fleet, releases: dict[str, Path]) -> None:
    push(fleet.hub, releases[NEW], NEW)
    assert len(connected_as(fleet, OLD)) == 3
    workers = {d.name: d.worker_pids() for d in fleet.devices}
    assert all(len(p) == 1 for p in workers.values()), workers
    canary, others = fleet.devices[0], fleet.devices[1:]
    with Load(fleet.devices) as load:
        started = time.monotonic()
        fleet.apply(upgrade_yaml(NEW))
        # while the canary step holds, the canary alone is sent the release
        held = wait_for(
            lambda: (s := fleet.upgrade()).get("updatingDevices") == 1 and s, 60,
            "the canary updating", interval=0.2, detail=fleet.logs,
        )  # fmt: skip
        assert held["stepDevices"] == 1 and held["phase"] == "Progressing", held

        def untouched_while_the_canary_updates(done: dict[str, float]) -> None:
            if canary.name in done:
                return
            for d in others:
                assert d.committed() in ("", "package", OLD), d.launcher()
                assert d.agent().get("phase", "Idle") == "Idle", (d.name, d.agent())
                assert not (d.data / "agent" / "request.json").exists()

        seconds = timed_commits(fleet, NEW, 300, since=started,
                                each=untouched_while_the_canary_updates)  # fmt: skip
        done = fleet.wait_phase("Complete", 120)
    report("canary then all", seconds)
    print(f"[agent upgrade] requests during the rollout: {load.summary()}")
    assert done["doneDevices"] == 3 and not done.get("failedDevices"), done
    assert seconds[canary.name] < min(seconds[d.name] for d in others)
    assert connected_as(fleet, NEW)
    for d in fleet.devices:
        agent = d.agent()
        assert (agent["version"], agent["phase"], agent["upgrade"]) == (
            NEW,
            "Committed",
            "edged-next",
        ), agent
        assert d.launcher()["committed"] in ("a", "b")
    # the workers were adopted by the new edged, not restarted
    assert {d.name: d.worker_pids() for d in fleet.devices} == workers
    # a client that retries once missed no request while edged switched
    assert sum(load.failed.values()) == 0, (load.summary(), load.errors)
    assert all(load.sent[n] > 10 for n in load.sent), load.summary()
    shown = fleet.hub.edgectl("rollout", "status", UPGRADE).stdout
    assert "Complete" in shown and "3/3" in shown, shown
    history = fleet.hub.edgectl("rollout", "history", UPGRADE).stdout
    assert NEW in history and "complete" in history.lower(), history
    reasons = [e["reason"] for e in fleet.events()]
    assert "CanaryStepPassed" in reasons and "RolloutComplete" in reasons, reasons


# broken release -> the launcher's reason for going back
BROKEN_REASONS = {
    "crash": "CrashLoop",
    "silent": "CommitDeadlineExceeded",
    "noserve": "CommitDeadlineExceeded",
}


@pytest.mark.parametrize("broken", sorted(BROKEN_REASONS))
def test_a_broken_release_stops_at_the_canary(fleet: Fleet, broken: str, tmp_path: Path) -> None:
    version = patch_version(3)
    push(fleet.hub, build(tmp_path, version, broken), version)
    connected_as(fleet, OLD)
    reason = BROKEN_REASONS[broken]
    canary, others = fleet.devices[0], fleet.devices[1:]
    workers = {d.name: d.worker_pids() for d in others}
    canary_workers = canary.worker_pids()
    started = time.monotonic()
    fleet.apply(upgrade_yaml(version, deadline=15, tries=2, progress=120))

    def untouched() -> None:
        for d in others:
            assert d.launcher() == {}, (d.name, d.launcher())
            agent = d.agent()  # {} when its status socket did not answer in time
            assert agent.get("phase", "Idle") == "Idle", (d.name, agent)
            assert agent.get("desiredVersion", "") == "", (d.name, agent)
            assert not (d.data / "agent" / "downloads").exists() or not any(
                (d.data / "agent" / "downloads").iterdir()
            ), d.name

    def rolled_back() -> dict[str, object] | None:
        untouched()
        last = canary.launcher().get("last") or {}
        return last if last.get("outcome") == "RolledBack" else None

    last = wait_for(rolled_back, 120, "the canary's launcher going back", interval=0.3,
                    detail=fleet.logs)  # fmt: skip
    back = time.monotonic() - started
    assert last["reason"] == reason and last["version"] == version, last
    assert canary.committed() in ("", OLD), canary.launcher()
    # the device says why, from the release it went back to
    agent = wait_for(
        lambda: (a := canary.agent()).get("phase") == "RolledBack" and a, 60,
        "the canary reporting RolledBack", detail=fleet.logs,
    )  # fmt: skip
    assert agent["version"] == OLD and agent["reason"] == reason, agent
    # the hub stops the rollout at the canary and names the device and the reason
    stopped = fleet.wait_phase("RolledBack", 120)
    took = time.monotonic() - started
    print(f"\n[agent upgrade] broken ({broken}): the canary back on {OLD} after {back:.1f} s, "
          f"the rollout stopped after {took:.1f} s")  # fmt: skip
    assert stopped["reason"] == "FailureThresholdReached", stopped
    assert list(stopped["failedDevices"]) == [canary.name], stopped
    assert stopped["failedDevices"][canary.name].startswith(reason), stopped
    assert f"{canary.name} ({reason}" in stopped["message"], stopped
    assert not stopped.get("rollbackDevices"), stopped
    condition = stopped["conditions"][0]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "Progressing", "False", "RolledBack"), condition  # fmt: skip
    failed = [e for e in fleet.events() if e["reason"] == "DeviceFailed"]
    assert failed and canary.name in failed[0]["message"] and reason in failed[0]["message"]
    watched = fleet.hub.edgectl("rollout", "status", UPGRADE, check=False)
    assert watched.returncode == 1 and f"failed {canary.name}: {reason}" in watched.stdout
    # reverted: the canary is sent no release and serves on its committed edged; the others
    # were never sent anything and kept their workers
    wait_for(lambda: canary.agent().get("desiredVersion") == "", 30, "the canary sent nothing")
    wait_for(canary.serving, 60, "the canary serving again", detail=fleet.logs)
    assert canary.infer() == 200
    if broken == "noserve":  # the broken edged killed the worker it would not adopt
        assert canary.worker_pids() != canary_workers
        assert "NotAdopted" in canary.log.read_text(errors="replace")
    else:  # adopted by the trial edged (if it got that far), then by the committed one
        assert canary.worker_pids() == canary_workers
    time.sleep(2)
    untouched()
    assert {d.name: d.worker_pids() for d in others} == workers
    assert set(fleet.agent_column().values()) == {OLD}


def slot_versions(d: LaunchedDevice) -> set[str]:
    """The versions the device's slots hold."""
    found = set()
    for installed in (d.data / "agent" / "slots").glob("*/installed.json"):
        found.add(json.loads(installed.read_text())["version"])
    return found


def untouched(devices: list[LaunchedDevice]) -> None:
    for d in devices:
        assert d.committed() in ("", OLD), (d.name, d.launcher())
        assert d.agent().get("desiredVersion", "") == "", (d.name, d.agent())


def test_pause_resume_undo_and_two_upgrades_in_a_row(
    fleet: Fleet, releases: dict[str, Path]
) -> None:
    push(fleet.hub, releases[NEW], NEW)
    push(fleet.hub, releases[NEWER], NEWER)
    connected_as(fleet, OLD)
    workers = {d.name: d.worker_pids() for d in fleet.devices}
    canary, others = fleet.devices[0], fleet.devices[1:]
    with Load(fleet.devices) as load:
        fleet.apply(upgrade_yaml(NEW))
        wait_for(lambda: fleet.upgrade().get("updatingDevices") == 1, 60, "the canary sent",
                 interval=0.2, detail=fleet.logs)  # fmt: skip
        out = fleet.hub.edgectl("rollout", "pause", UPGRADE)
        assert "paused" in out.stdout, out.stdout
        # the canary sent before the pause finishes; nobody else is sent anything
        wait_for(lambda: fleet.upgrade().get("doneDevices") == 1, 120, "the canary done",
                 detail=fleet.logs)  # fmt: skip
        assert canary.committed() == NEW
        time.sleep(3)
        untouched(others)
        table = fleet.hub.edgectl("get", "agentupgrades").stdout
        assert "Paused" in table and "1/3" in table, table
        fleet.hub.edgectl("rollout", "resume", UPGRADE)
        first = timed_commits(fleet, NEW, 300)
        fleet.wait_phase("Complete", 120)
        report(f"{OLD} -> {NEW} after resume", first)
        assert connected_as(fleet, NEW)
        # a second upgrade in a row: the same object, the next version (revision 2)
        started = time.monotonic()
        fleet.apply(upgrade_yaml(NEWER))
        second = timed_commits(fleet, NEWER, 300, since=started)
        done = wait_for(
            lambda: (s := fleet.upgrade()).get("phase") == "Complete" and s["revision"] == 2
            and s, 120, "revision 2 Complete", detail=fleet.logs,
        )  # fmt: skip
        report(f"{NEW} -> {NEWER}", second)
        assert done["doneDevices"] == 3, done
        assert connected_as(fleet, NEWER)
        slots = {d.name: d.launcher()["committed"] for d in fleet.devices}
        # undo: revision 1's version again, as revision 3 (its slot is still installed)
        started = time.monotonic()
        out = fleet.hub.edgectl("rollout", "undo", UPGRADE)
        assert f"rolling back to revision 1 ({NEW})" in out.stdout, out.stdout
        third = timed_commits(fleet, NEW, 300, since=started)
        wait_for(
            lambda: (s := fleet.upgrade()).get("phase") == "Complete" and s["revision"] == 3,
            120, "revision 3 Complete", detail=fleet.logs,
        )  # fmt: skip
        report(f"undo {NEWER} -> {NEW}", third)
    print(f"[agent upgrade] requests during the three rollouts: {load.summary()}")
    assert connected_as(fleet, NEW)
    for d in fleet.devices:  # each went back to the slot it had installed NEW into
        assert d.launcher()["committed"] != slots[d.name], d.launcher()
        assert d.agent()["phase"] == "Committed", d.agent()
    assert {d.name: d.worker_pids() for d in fleet.devices} == workers
    assert sum(load.failed.values()) == 0, (load.summary(), load.errors)
    history = fleet.hub.edgectl("rollout", "history", UPGRADE).stdout
    assert NEW in history and NEWER in history and "copy of 1" in history, history
    shown = fleet.hub.edgectl("rollout", "status", UPGRADE).stdout
    assert "Complete" in shown and "3/3" in shown, shown


def power_cut(d: LaunchedDevice, *, workers: bool) -> None:
    """kill -9 of the launcher and its edged (and of the workers: a power cut takes them)."""
    pids = d.worker_pids() if workers else []
    d.kill9()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("moment", ["request", "trial"])
def test_kill9_during_the_install_and_during_the_switch(
    fleet: Fleet, releases: dict[str, Path], moment: str
) -> None:
    """r0 (the canary) loses its launcher and edged while it installs the release, r1 loses
    them and its workers (a power cut) while it switches to it (``request``: its edged asked
    for the trial, the launcher has not taken it; ``trial``: the new edged runs on trial, not
    committed); each starts again (systemd's restart, the next boot), comes back to a working
    edged, and the rollout completes."""
    push(fleet.hub, releases[NEW], NEW)
    connected_as(fleet, OLD)
    r0, r1, r2 = fleet.devices
    r2_workers = r2.worker_pids()
    started = time.monotonic()
    fleet.apply(upgrade_yaml(NEW, deadline=60, tries=3, progress=300))

    caught = poll(lambda: (p := r0.agent().get("phase")) in ("Installing", "SmokeTesting") and p,
                  60)  # fmt: skip
    assert caught, f"r0 never seen installing: {r0.agent()}"
    power_cut(r0, workers=False)
    left = {p.name for p in (r0.data / "agent" / "slots").iterdir()}
    print(f"\n[agent upgrade] r0 killed while {caught}; its slots folder held {sorted(left)}")
    r0.start()
    wait_for(lambda: r0.committed() == NEW, 180, "r0 committed after its restart",
             detail=fleet.logs)  # fmt: skip
    r0_s = time.monotonic() - started

    def switching() -> str:
        if moment == "request" and (r1.data / "agent" / "request.json").exists():
            return "request.json written"
        if moment == "trial" and r1.launcher().get("trying"):
            return "on trial"
        return ""

    caught = poll(switching, 120, interval=0.02)
    assert caught, f"r1 never seen switching: {r1.launcher()} {r1.agent()}"
    power_cut(r1, workers=True)
    print(f"[agent upgrade] r1 killed with its workers: {caught}; launcher.json "
          f"{json.dumps(r1.launcher())}")  # fmt: skip
    r1.start()
    # a working edged again, the committed one or the trial: it serves
    wait_for(r1.serving, 120, "r1 serving after the power cut", detail=fleet.logs)
    seconds = timed_commits(fleet, NEW, 300, since=started)
    done = fleet.wait_phase("Complete", 180)
    report("with r0 killed installing and r1 killed switching", {**seconds, "r0": r0_s})
    assert done["doneDevices"] == 3 and not done.get("failedDevices"), done
    assert connected_as(fleet, NEW)
    for d in fleet.devices:
        assert d.agent()["phase"] == "Committed" and d.infer() == 200, d.agent()
    assert r2.worker_pids() == r2_workers
    # what the install cut short was cleaned up
    assert not [p for p in (r0.data / "agent" / "slots").iterdir() if p.name.startswith(".")]


def test_a_failure_after_the_canary_sends_the_committed_devices_back(
    fleet: Fleet, tmp_path: Path
) -> None:
    """A release that works on the canary (r0 commits it) and crashes on r1: the rollout stops
    there, r0 is sent the release it had (the package's) and goes back to it, r2 is never
    sent anything; every device serves throughout on the workers it had."""
    version = patch_version(3)
    push(fleet.hub, build(tmp_path, version, "crash-r1"), version)
    connected_as(fleet, OLD)
    r0, r1, r2 = fleet.devices
    workers = {d.name: d.worker_pids() for d in fleet.devices}
    with Load([r0, r2]) as load:
        fleet.apply(upgrade_yaml(version, deadline=30, tries=2, progress=120))
        wait_for(lambda: r0.committed() == version, 120, "r0 committed", detail=fleet.logs)
        stopped = fleet.wait_phase("RolledBack", 120)
        assert list(stopped["failedDevices"]) == ["r1"], stopped
        assert stopped["failedDevices"]["r1"].startswith("CrashLoop"), stopped
        assert stopped["rollbackDevices"] == {"r0": OLD}, json.dumps(stopped, indent=1)
        started = time.monotonic()
        wait_for(
            lambda: (a := r0.agent()).get("version") == OLD and a.get("phase") == "Committed",
            120, "r0 back on its release, committed", detail=fleet.logs,
        )  # fmt: skip
        back = time.monotonic() - started
        assert r0.launcher()["committed"] == "package", r0.launcher()
    print(f"\n[agent upgrade] r0 sent back to {OLD}: committed after {back:.1f} s; requests: "
          f"{load.summary()}")  # fmt: skip
    assert sum(load.failed.values()) == 0, (load.summary(), load.errors)
    last = r1.launcher()["last"]
    assert (last["outcome"], last["reason"]) == ("RolledBack", "CrashLoop"), last
    assert r2.launcher() == {} and r2.agent()["desiredVersion"] == "", r2.agent()
    wait_for(lambda: set(fleet.agent_column().values()) == {OLD}, 60, "every device on OLD")
    wait_for(r1.serving, 60, "r1 serving", detail=fleet.logs)
    assert {d.name: d.worker_pids() for d in fleet.devices} == workers
    # the hub's record of it stays RolledBack, r0 pinned to its release
    assert fleet.upgrade()["phase"] == "RolledBack"


def test_a_release_that_fails_its_smoke_test_is_never_switched_to(
    fleet: Fleet, tmp_path: Path
) -> None:
    """Its ``edged check`` fails on the canary (its daemon does not import): the device
    refuses it before any switch (Failed, SmokeTestFailed, the check's own reason in the
    message), its edged and workers never stop, and the hub stops the rollout naming it."""
    version = patch_version(3)
    push(fleet.hub, build(tmp_path, version, "nocheck"), version)
    connected_as(fleet, OLD)
    canary, others = fleet.devices[0], fleet.devices[1:]
    edged = canary.edged_pids()
    workers = {d.name: d.worker_pids() for d in fleet.devices}
    fleet.apply(upgrade_yaml(version, deadline=15, tries=2, progress=120))
    stopped = fleet.wait_phase("RolledBack", 120)
    assert list(stopped["failedDevices"]) == [canary.name], stopped
    assert stopped["failedDevices"][canary.name].startswith("SmokeTestFailed"), stopped
    assert "RuntimeImportFailed" in stopped["failedDevices"][canary.name], stopped
    # the device recorded its refusal (not tried again for this revision) and, sent nothing
    # now, runs what it ran
    failed = json.loads((canary.data / "agent" / "agent.json").read_text())["failed"]
    assert (failed["version"], failed["reason"]) == (version, "SmokeTestFailed"), failed
    assert "RuntimeImportFailed" in failed["message"], failed
    agent = canary.agent()
    assert (agent["version"], agent["desiredVersion"]) == (OLD, ""), agent
    # its own status keeps saying so (not Idle) until a new desired release replaces it
    agent = wait_for(lambda: (a := canary.agent()).get("phase") == "Failed" and a, 30, "Failed")
    assert agent["reason"] == "SmokeTestFailed" and agent["upgradeRevision"] >= 1, agent
    assert canary.launcher() == {}, canary.launcher()  # never switched
    assert canary.edged_pids() == edged
    for d in others:
        assert d.launcher() == {} and d.agent()["desiredVersion"] == "", d.agent()
    assert {d.name: d.worker_pids() for d in fleet.devices} == workers
    assert canary.infer() == 200


def test_a_new_version_while_the_canary_is_on_trial(
    fleet: Fleet, releases: dict[str, Path], tmp_path: Path
) -> None:
    """A release that connects but never commits is on trial on the canary when the upgrade
    is changed to a good version (revision 2): the trial edged aborts its own trial
    (RolledBackByHub), the launcher goes back, and the device updates to the new version;
    revision 2 completes on every device, and nobody else ever ran the first one."""
    stuck = patch_version(3)
    push(fleet.hub, build(tmp_path, stuck, "nocommit"), stuck)
    push(fleet.hub, releases[NEWER], NEWER)
    connected_as(fleet, OLD)
    canary, others = fleet.devices[0], fleet.devices[1:]
    workers = {d.name: d.worker_pids() for d in fleet.devices}
    with Load(fleet.devices) as load:
        fleet.apply(upgrade_yaml(stuck, deadline=120, tries=2, progress=300))
        wait_for(lambda: (t := canary.launcher().get("trying")) and t["version"] == stuck, 120,
                 "the canary on trial", detail=fleet.logs)  # fmt: skip
        wait_for(lambda: canary.agent().get("reason") == "WaitingForHealth", 60,
                 "the trial edged connected, waiting", detail=fleet.logs)  # fmt: skip
        started = time.monotonic()
        fleet.apply(upgrade_yaml(NEWER, deadline=60, tries=2, progress=300))
        seconds = timed_commits(fleet, NEWER, 300, since=started)
        done = wait_for(
            lambda: (s := fleet.upgrade()).get("phase") == "Complete" and s["revision"] == 2
            and s, 120, "revision 2 Complete", detail=fleet.logs,
        )  # fmt: skip
    report(f"{stuck} on trial on the canary, then {NEWER}", seconds)
    print(f"[agent upgrade] requests: {load.summary()}")
    assert done["doneDevices"] == 3 and not done.get("failedDevices"), done
    last_outcomes = canary.log.read_text(errors="replace")
    assert "RolledBackByHub" in last_outcomes, canary.logs()
    assert connected_as(fleet, NEWER)
    assert {d.name: d.worker_pids() for d in fleet.devices} == workers
    assert sum(load.failed.values()) == 0, (load.summary(), load.errors)
    for d in others:  # never sent the first version
        assert stuck not in slot_versions(d), (d.name, slot_versions(d))


def test_the_hub_killed_mid_rollout_and_a_device_away(
    fleet: Fleet, releases: dict[str, Path]
) -> None:
    """r2 is off when the upgrade starts (skipped, it holds completion); the hub is killed
    (-9) while r1 runs the release on trial (it cannot commit without its hub) and started
    again: the rollout goes on from its record, r1 commits, and r2, started later, is
    updated too."""
    push(fleet.hub, releases[NEW], NEW)
    connected_as(fleet, OLD)
    r0, r1, r2 = fleet.devices
    r2.stop()
    kill_workers(r2.data)
    time.sleep(1)  # its stream closed as edged stopped
    fleet.apply(upgrade_yaml(NEW, deadline=60, tries=2, progress=300))
    wait_for(lambda: r0.committed() == NEW, 120, "r0 committed", detail=fleet.logs)
    wait_for(lambda: r1.launcher().get("trying"), 120, "r1 on trial", interval=0.05,
             detail=fleet.logs)  # fmt: skip
    fleet.hub.kill9()
    time.sleep(2)
    assert r1.committed() != NEW  # no hub: no commit
    fleet.hub.start()
    started = time.monotonic()
    wait_for(lambda: r1.committed() == NEW, 120, "r1 committed once its hub is back",
             detail=fleet.logs)  # fmt: skip
    after = time.monotonic() - started
    shown = wait_for(lambda: (s := fleet.upgrade()).get("doneDevices") == 2 and s, 60,
                     "two done", detail=fleet.logs)  # fmt: skip
    assert shown["phase"] == "Progressing", shown  # r2 holds completion
    r2.start()
    wait_for(lambda: r2.committed() == NEW, 180, "r2 updated once back", detail=fleet.logs)
    done = fleet.wait_phase("Complete", 120)
    print(f"\n[agent upgrade] r1 committed {after:.1f} s after its hub came back")
    assert done["doneDevices"] == 3 and not done.get("failedDevices"), done
    assert connected_as(fleet, NEW)


def test_a_power_cut_while_the_hub_sends_a_device_back(fleet: Fleet, tmp_path: Path) -> None:
    """The canary committed a release that then crashes on r1; while the canary switches back
    to its base install as the hub asks, its launcher, edged and workers are killed (-9): it
    starts again on a working edged and ends on its base install, committed."""
    version = patch_version(3)
    push(fleet.hub, build(tmp_path, version, "crash-r1"), version)
    connected_as(fleet, OLD)
    r0 = fleet.devices[0]
    fleet.apply(upgrade_yaml(version, deadline=30, tries=2, progress=120))
    wait_for(lambda: r0.committed() == version, 120, "r0 committed", detail=fleet.logs)

    def switching_back() -> str:
        trying = r0.launcher().get("trying") or {}
        if trying.get("version") == OLD:
            return "on trial"
        return "request.json written" if (r0.data / "agent" / "request.json").exists() else ""

    caught = poll(switching_back, 120, interval=0.02)
    assert caught, f"r0 never seen switching back: {r0.launcher()} {r0.agent()}"
    power_cut(r0, workers=True)
    print(f"\n[agent upgrade] r0 killed while going back ({caught})")
    r0.start()
    wait_for(r0.serving, 120, "r0 serving after the power cut", detail=fleet.logs)
    wait_for(
        lambda: (a := r0.agent()).get("version") == OLD and a.get("phase") == "Committed",
        120, "r0 back on its base install, committed", detail=fleet.logs,
    )  # fmt: skip
    assert r0.launcher()["committed"] == "package", r0.launcher()
    assert r0.infer() == 200
    stopped = fleet.upgrade()
    assert stopped["phase"] == "RolledBack" and stopped["rollbackDevices"] == {"r0": OLD}


def test_every_device_at_once(fleet: Fleet, releases: dict[str, Path]) -> None:
    """maxUnavailable 3, one step of 100%: the three devices fetch the release from the hub,
    install and switch at the same time, and all commit; nothing is lost meanwhile."""
    push(fleet.hub, releases[NEW], NEW)
    connected_as(fleet, OLD)
    workers = {d.name: d.worker_pids() for d in fleet.devices}
    with Load(fleet.devices) as load:
        started = time.monotonic()
        fleet.apply(upgrade_yaml(NEW, steps="100%", unavailable=3))
        seen = wait_for(
            lambda: (s := fleet.upgrade()).get("updatingDevices", 0) >= 2 and s, 60,
            "devices updating at once", interval=0.2, detail=fleet.logs,
        )  # fmt: skip
        seconds = timed_commits(fleet, NEW, 300, since=started)
        done = fleet.wait_phase("Complete", 120)
    report("every device at once", seconds)
    print(f"[agent upgrade] requests: {load.summary()} (at most {seen['updatingDevices']} at once)")
    assert done["doneDevices"] == 3 and not done.get("failedDevices"), done
    assert connected_as(fleet, NEW)
    assert {d.name: d.worker_pids() for d in fleet.devices} == workers
    assert sum(load.failed.values()) == 0, (load.summary(), load.errors)
