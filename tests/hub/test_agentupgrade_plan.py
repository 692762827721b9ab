"""The AgentUpgrade planner (hub.decide.agentupgrade), pure: steps, budget, thresholds,
deadlines, rollback, and what a lying device can and cannot claim."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from edgefleet.api import AgentUpgrade, parse_manifest
from hub.decide.agentdesired import desired_agent, desired_agent_of
from hub.decide.agentreleases import AgentReleaseRecord
from hub.decide.agentrevisions import AgentDeviceView, AgentPlan, AgentUpgradeState
from hub.decide.agentupgrade import plan_upgrade, retry_plan, step_target, takes_up
from hub.decide.devices import AgentReport
from hub.decide.regionslice import ROOT_REVISION
from hub.decide.revisions import RolloutPhase

HUB = "0.2.0"
OLD, NEW = "0.2.0", "0.2.1"


def release(version: str, arch: str = "x86_64", abi: str = "cp311") -> AgentReleaseRecord:
    return AgentReleaseRecord(version, arch, abi, "0" * 64, 10, f"env-{version}".encode(), 1.0)


RELEASES = {r.key: r for r in (release(OLD), release(NEW), release(NEW, "aarch64"))}


def upgrade(**rollout: Any) -> AgentUpgrade:
    spec: dict[str, Any] = {"version": NEW, "rollout": {"progressDeadlineSeconds": 900, **rollout}}
    got = parse_manifest(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "AgentUpgrade",
            "metadata": {"name": "up"},
            "spec": spec,
        }
    )
    assert isinstance(got, AgentUpgrade)
    return got


def report(**changes: Any) -> AgentReport:
    base = AgentReport(
        version=OLD,
        committed_version=OLD,
        phase="Idle",
        arch="x86_64",
        python_abi="cp311",
        launcher=True,
    )
    return replace(base, **changes)


def committed(revision: int = 1, upgrade_name: str = "up") -> AgentReport:
    return report(
        version=NEW,
        committed_version=NEW,
        phase="Committed",
        upgrade=upgrade_name,
        upgrade_revision=revision,
    )


def rolled_back(revision: int = 1, reason: str = "CrashLoop") -> AgentReport:
    return report(
        phase="RolledBack",
        reason=reason,
        message="exited 3 times",
        upgrade="up",
        upgrade_revision=revision,
    )


def fleet(n: int, **changes: Any) -> dict[str, AgentDeviceView]:
    return {f"d{i:02}": AgentDeviceView(f"d{i:02}", True, report(**changes)) for i in range(n)}


class Run:
    """An upgrade driven by the planner, with the fleet's reports changed between steps."""

    def __init__(self, up: AgentUpgrade, devices: dict[str, AgentDeviceView]) -> None:
        self.up = up
        self.devices = devices
        self.state: AgentUpgradeState | None = None
        self.now = 1000.0
        self.events: list[str] = []
        self.releases: dict[str, AgentReleaseRecord] = dict(RELEASES)
        self.last: AgentPlan | None = None
        self.away: dict[str, AgentDeviceView] = {}  # no longer selected (not deleted)

    def step(self, dt: float = 1.0) -> AgentPlan:
        self.now += dt
        plan = plan_upgrade(
            self.up, self.state, list(self.devices.values()), self.releases, HUB, self.now,
            self.away,
        )  # fmt: skip
        self.last = plan
        if plan.state is not None:
            self.state = plan.state
        self.events += [e.reason for e in plan.events]
        return plan

    def settle(self) -> AgentPlan:
        plan = self.step()
        for _ in range(20):
            if self.step(0).state is None:
                break
        return plan

    @property
    def sent(self) -> list[str]:
        assert self.state is not None
        return sorted(d for d, s in self.state.sent.items() if s.revision == self.state.revision)

    def report(self, name: str, r: AgentReport, *, connected: bool = True) -> None:
        self.devices[name] = replace(self.devices[name], report=r, connected=connected)

    def commit_all_sent(self) -> None:
        assert self.state is not None
        for name in self.sent:
            if name not in self.state.failed:
                self.report(name, committed(self.state.revision))


def test_a_new_upgrade_is_revision_1_and_sends_nothing_until_the_next_step() -> None:
    run = Run(upgrade(), fleet(3))
    plan = run.step()
    assert plan.state is not None and plan.state.revision == 1
    assert plan.state.sent == {} and run.events == ["RolloutStarted"]
    assert plan.state.current.version == NEW


def test_canary_steps_by_percentage_then_all() -> None:
    run = Run(upgrade(canary={"steps": ["10%", "50%"]}, maxUnavailable="100%"), fleet(20))
    run.settle()
    assert run.sent == ["d00", "d01"]  # 10% of 20
    run.settle()
    assert run.sent == ["d00", "d01"]  # not back healthy yet: nothing more
    run.commit_all_sent()
    run.settle()
    assert len(run.sent) == 10  # 50%
    assert "CanaryStepPassed" in run.events
    run.commit_all_sent()
    run.settle()
    assert len(run.sent) == 20
    run.commit_all_sent()
    run.settle()
    assert run.state is not None and run.state.phase is RolloutPhase.COMPLETE
    assert "20 of 20" in run.state.message


def test_max_unavailable_bounds_the_devices_mid_update() -> None:
    run = Run(upgrade(maxUnavailable=2), fleet(7))
    run.settle()
    assert run.sent == ["d00", "d01"]
    run.report("d00", committed())
    run.settle()
    assert run.sent == ["d00", "d01", "d02"]  # one came back: one more
    plan = run.step(0)
    assert len(plan.progress.updating) == 2 and plan.progress.max_unavailable == 2


def test_max_unavailable_percent_rounds_down_but_at_least_one() -> None:
    run = Run(upgrade(maxUnavailable="10%"), fleet(5))
    run.settle()
    assert run.sent == ["d00"]


def test_step_target_rounds_up_at_least_one() -> None:
    assert step_target((1, 50), 0, 10) == 1
    assert step_target((1, 50), 1, 3) == 2
    assert step_target((1, 50), 2, 3) == 3
    assert step_target((10,), 0, 0) == 0


def test_a_failure_at_the_canary_stops_and_reverts() -> None:
    run = Run(upgrade(canary={"steps": ["20%"]}, maxUnavailable="100%"), fleet(10))
    run.settle()
    assert run.sent == ["d00", "d01"]
    run.report("d00", committed())  # came back healthy: must be sent back explicitly
    run.report("d01", rolled_back())
    run.settle()
    state = run.state
    assert state is not None and state.phase is RolloutPhase.ROLLED_BACK
    assert state.reason == "FailureThresholdReached"
    assert state.failed == {"d01": "CrashLoop: exited 3 times"}
    assert "d01 (CrashLoop: exited 3 times)" in state.message
    assert state.rollback == {"d00": OLD}
    assert run.sent == ["d00", "d01"]  # no more devices were sent
    assert "RolledBack" in run.events and "DeviceFailed" in run.events
    shown = run.step(0).progress  # the counts as the devices report them now
    assert shown.done == ("d00",) and list(shown.failed) == ["d01"] and shown.waiting == 8
    # what each device is sent now
    d00 = desired_agent(state, "d00", run.devices["d00"].report, RELEASES)
    assert d00 is not None and d00.version == OLD and d00.signed_metadata == b"env-0.2.0"
    assert desired_agent(state, "d01", run.devices["d01"].report, RELEASES) is None
    assert desired_agent(state, "d05", run.devices["d05"].report, RELEASES) is None


def test_a_device_is_sent_back_to_its_base_install_the_hub_holds_no_release_of() -> None:
    """The first upgrade of a fleet starts from the base install's edged, which nobody pushes
    as a release: a device that committed the rejected version is still sent back to it, by
    version alone (its launcher switches to the base install; nothing to fetch)."""
    held = {k: r for k, r in RELEASES.items() if r.version != OLD}
    run = Run(upgrade(canary={"steps": ["20%"]}, maxUnavailable="100%"), fleet(10))
    run.releases = held
    run.settle()
    run.report("d00", committed())
    run.report("d01", rolled_back())
    run.settle()
    state = run.state
    assert state is not None and state.phase is RolloutPhase.ROLLED_BACK
    assert state.rollback == {"d00": OLD}
    assert run.last is not None and "rollbackBlocked" not in run.last.progress.to_json()
    d00 = desired_agent(state, "d00", run.devices["d00"].report, held)
    assert d00 is not None and (d00.version, d00.signed_metadata) == (OLD, b"")
    assert desired_agent(state, "d01", run.devices["d01"].report, held) is None


def test_a_device_that_commits_after_the_rollback_is_sent_back_too() -> None:
    run = Run(upgrade(maxUnavailable=3), fleet(5))
    run.settle()
    run.report("d00", rolled_back())
    run.settle()
    assert run.state is not None and run.state.rollback == {}
    run.report("d01", committed())
    run.settle()
    assert run.state.rollback == {"d01": OLD}
    assert "DevicesRolledBack" in run.events


def test_failure_threshold_as_a_count() -> None:
    run = Run(upgrade(failureThreshold=2, maxUnavailable=3), fleet(6))
    run.settle()
    run.report("d00", rolled_back())
    run.settle()
    assert run.state is not None and run.state.phase is RolloutPhase.PROGRESSING
    assert run.state.failed.keys() == {"d00"}
    assert desired_agent(run.state, "d00", run.devices["d00"].report, RELEASES) is None
    run.report("d01", rolled_back(reason="SmokeTestFailed"))
    run.settle()
    assert run.state.phase is RolloutPhase.ROLLED_BACK
    assert run.state.failed.keys() == {"d00", "d01"}


@pytest.mark.parametrize(
    ("threshold", "pool", "stops_at"), [("10%", 20, 2), ("10%", 5, 1), ("50%", 4, 2)]
)
def test_failure_threshold_as_a_percentage_of_the_pool(
    threshold: str, pool: int, stops_at: int
) -> None:
    run = Run(upgrade(failureThreshold=threshold, maxUnavailable="100%"), fleet(pool))
    run.settle()
    for i in range(stops_at):
        assert run.state is not None and run.state.phase is RolloutPhase.PROGRESSING
        run.report(f"d{i:02}", rolled_back())
        run.settle()
    assert run.state is not None and run.state.phase is RolloutPhase.ROLLED_BACK
    assert len(run.state.failed) == stops_at


def test_no_commit_within_the_progress_deadline_is_a_failure() -> None:
    run = Run(upgrade(progressDeadlineSeconds=900), fleet(3))
    run.settle()
    run.report(
        "d00",
        report(phase="Trying", version=NEW, upgrade="up", upgrade_revision=1),
        connected=False,
    )
    run.step(899)
    assert run.state is not None and run.state.phase is RolloutPhase.PROGRESSING
    run.step(2)
    assert run.state.phase is RolloutPhase.ROLLED_BACK
    why = run.state.failed["d00"]
    assert why.startswith("ProgressDeadlineExceeded") and "not connected" in why


def test_a_device_failed_at_its_deadline_under_the_threshold_is_held_until_it_is_back() -> None:
    run = Run(upgrade(progressDeadlineSeconds=900, failureThreshold=2, maxUnavailable=2), fleet(4))
    run.settle()
    assert run.sent == ["d00", "d01"]
    trying = report(phase="Trying", version=NEW, desired_version=NEW, upgrade="up",
                    upgrade_revision=1)  # fmt: skip
    run.report("d00", trying)
    run.report("d01", committed())
    run.step(901)
    run.settle()
    assert run.state is not None and run.state.phase is RolloutPhase.PROGRESSING
    assert run.state.failed.keys() == {"d00"} and run.state.held == {"d00": OLD}
    assert "DevicesHeld" in run.events
    # still on trial: sent its committed release, so that it aborts and never commits NEW late
    spec = desired_agent(run.state, "d00", trying, RELEASES)
    assert spec is not None and spec.version == OLD
    # the rollout goes on meanwhile
    assert {"d02", "d03"} <= set(run.sent)
    # back on OLD, nothing in flight: let go (sent nothing, keeps OLD)
    back = report(phase="RolledBack", reason="RolledBackByHub", desired_version=OLD,
                  upgrade="up", upgrade_revision=1)  # fmt: skip
    run.report("d00", back)
    run.settle()
    assert run.state.held == {} and desired_agent(run.state, "d00", back, RELEASES) is None


def test_a_device_failed_that_ended_its_attempt_by_itself_is_not_held() -> None:
    run = Run(upgrade(failureThreshold=2), fleet(3))
    run.settle()
    run.report("d00", rolled_back())
    run.settle()
    assert run.state is not None and run.state.failed.keys() == {"d00"}
    assert run.state.held == {}


def test_committed_but_a_workload_that_served_before_does_not_serve_again() -> None:
    devices = fleet(2)
    devices["d00"] = replace(devices["d00"], serving=("cam", "det"))
    run = Run(upgrade(), devices)
    run.settle()
    assert run.state is not None and run.state.sent["d00"].serving == ("cam", "det")
    run.devices["d00"] = replace(run.devices["d00"], report=committed(), serving=("cam",))
    run.settle()
    assert run.sent == ["d00"]  # not done: det does not serve
    run.step(1000)
    assert "det do not serve again" in run.state.failed["d00"]
    again = fleet(2)
    again["d00"] = replace(again["d00"], serving=("cam", "det"))
    run2 = Run(upgrade(), again)
    run2.settle()
    run2.devices["d00"] = replace(run2.devices["d00"], report=committed(), serving=("cam", "det"))
    run2.settle()
    assert run2.sent == ["d00", "d01"]


def test_refused_devices_are_named_and_out_of_the_pool() -> None:
    devices = fleet(6)
    devices["d01"] = replace(devices["d01"], report=None)
    devices["d02"] = replace(devices["d02"], report=report(launcher=False))
    devices["d03"] = replace(
        devices["d03"], report=report(version="0.9.0", committed_version="0.9.0")
    )
    devices["d04"] = replace(devices["d04"], report=report(arch="riscv64"))
    devices["d05"] = replace(devices["d05"], claimed_by="other")
    run = Run(upgrade(maxUnavailable="100%"), devices)
    plan = run.settle()
    plan = run.step(0)
    refused = plan.progress.refused
    assert refused["d01"].startswith("AgentStatusNotReported")
    assert refused["d02"].startswith("NoLauncher")
    assert refused["d03"].startswith("AgentVersionOutsideWindow")
    assert refused["d04"].startswith("NoReleaseForPlatform") and "riscv64/cp311" in refused["d04"]
    assert refused["d05"].startswith("ClaimedByAnotherUpgrade")
    assert run.sent == ["d00"] and plan.progress.pool == 1


def test_a_device_whose_report_is_not_in_yet_holds_the_rollout_and_is_not_refused() -> None:
    """A 0.2.0 edged just connected (or a hub just started) has not reported its release yet:
    it is neither refused as too old nor left out; nothing completes until it reports. An edged
    older than the first self-updating release never reports: it is refused."""
    devices = fleet(3)
    devices["d01"] = replace(devices["d01"], report=None, agent_version="0.2.0")
    devices["d02"] = replace(devices["d02"], report=None, agent_version="0.1.0")
    run = Run(upgrade(maxUnavailable=3), devices)
    run.settle()
    assert run.sent == ["d00"]
    run.commit_all_sent()
    plan = run.settle()
    plan = run.step(0)
    assert run.state is not None and run.state.phase is RolloutPhase.PROGRESSING
    assert "d01" not in plan.progress.refused
    assert plan.progress.refused["d02"].startswith("AgentStatusNotReported")
    run.report("d01", report())
    run.settle()
    assert run.sent == ["d00", "d01"]
    run.commit_all_sent()
    run.settle()
    assert run.state.phase is RolloutPhase.COMPLETE


def test_devices_not_connected_are_skipped_and_hold_completion() -> None:
    devices = fleet(2)
    devices["d01"] = replace(devices["d01"], connected=False)
    run = Run(upgrade(maxUnavailable=2), devices)
    run.settle()
    assert run.sent == ["d00"]
    run.commit_all_sent()
    plan = run.settle()
    plan = run.step(0)
    assert run.state is not None and run.state.phase is RolloutPhase.PROGRESSING
    assert plan.progress.skipped == {"d01": "not connected"}
    run.devices["d01"] = replace(run.devices["d01"], connected=True)
    run.settle()
    run.commit_all_sent()
    run.settle()
    assert run.state.phase is RolloutPhase.COMPLETE


def test_an_up_to_date_device_is_not_sent_and_not_counted() -> None:
    devices = fleet(3)
    devices["d00"] = replace(devices["d00"], report=report(version=NEW, committed_version=NEW))
    run = Run(upgrade(canary={"steps": ["50%"]}, maxUnavailable="100%"), devices)
    run.settle()
    assert run.sent == ["d01"]  # 50% of the two that need it
    assert run.state is not None
    assert desired_agent(run.state, "d00", devices["d00"].report, RELEASES) is None


# -- liars ----------------------------------------------------------------------------------


def test_committed_for_an_upgrade_never_sent_counts_for_nothing() -> None:
    run = Run(upgrade(canary={"steps": ["10%"]}, maxUnavailable="100%"), fleet(20))
    run.settle()
    assert run.sent == ["d00", "d01"]
    # d05 claims it committed this very upgrade and revision: it was never sent it
    run.report("d05", committed())
    # d00 claims Committed for another upgrade; d01 for another revision
    run.report("d00", committed(upgrade_name="elsewhere"))
    run.report("d01", committed(revision=7))
    plan = run.settle()
    plan = run.step(0)
    assert run.sent == ["d00", "d01"]  # the canary step did not pass
    assert plan.progress.done == ()
    assert "d05" in plan.progress.up_to_date  # it can only take itself out


def test_rolled_back_for_an_upgrade_never_sent_does_not_fail_the_rollout() -> None:
    run = Run(upgrade(), fleet(5))
    run.settle()
    run.report("d03", rolled_back())  # never sent
    run.report("d00", rolled_back(revision=9))  # sent, but another revision
    run.settle()
    assert run.state is not None and run.state.phase is RolloutPhase.PROGRESSING
    assert run.state.failed == {}


def test_a_failed_device_counts_once() -> None:
    run = Run(upgrade(failureThreshold=2, maxUnavailable=1), fleet(5))
    run.settle()
    run.report("d00", rolled_back())
    for _ in range(5):
        run.settle()
    assert run.state is not None and run.state.phase is RolloutPhase.PROGRESSING
    assert list(run.state.failed) == ["d00"]


def test_a_device_cannot_step_the_canary_for_another() -> None:
    # one device reporting Committed many times is still one device
    run = Run(upgrade(canary={"steps": ["50%"]}, maxUnavailable="100%"), fleet(4))
    run.settle()
    assert run.sent == ["d00", "d01"]
    run.report("d00", committed())
    for _ in range(3):
        run.settle()
    assert run.sent == ["d00", "d01"]


# -- revisions, pause, resume, complete -----------------------------------------------------


def test_a_new_version_is_a_new_revision_and_starts_over() -> None:
    run = Run(upgrade(), fleet(3))
    run.settle()
    assert run.sent == ["d00"]
    run.up = replace(run.up, spec=replace(run.up.spec, version="0.2.2"))
    run.settle()
    assert run.state is not None and run.state.revision == 2
    assert [r.version for r in run.state.revisions] == [NEW, "0.2.2"]
    assert run.sent == []  # no release 0.2.2 held: every device refused


def test_a_release_the_hub_does_not_hold_yet_is_waited_for_then_canaried() -> None:
    """Applied before its release was pushed (or read by the hub): no device is refused, no
    step passes and nothing completes; once the release is there, the canary goes first
    (found by the VM lab: 0 of 0 Complete, then every device sent it as a late arrival)."""
    run = Run(upgrade(canary={"steps": ["33%", "100%"]}, maxUnavailable=2), fleet(3))
    run.releases = {k: r for k, r in RELEASES.items() if r.version != NEW}
    run.settle()
    assert run.state is not None and run.state.phase is RolloutPhase.PROGRESSING
    assert run.state.reason == "ReleaseMissing" and run.sent == [], run.state
    assert run.last is not None and run.last.progress is not None
    assert run.last.progress.refused == {}
    assert run.events.count("ReleaseMissing") == 1  # said once
    run.settle()
    assert run.events.count("ReleaseMissing") == 1
    run.releases = dict(RELEASES)  # pushed
    run.settle()
    assert run.state.phase is RolloutPhase.PROGRESSING and run.sent == ["d00"]  # the canary


def test_a_platform_without_a_release_is_refused_when_the_version_is_held() -> None:
    devices = fleet(2)
    devices["d01"] = AgentDeviceView("d01", True, report(arch="riscv64"))
    run = Run(upgrade(maxUnavailable=2), devices)
    run.settle()
    assert run.last is not None and run.last.progress is not None
    assert run.last.progress.refused["d01"].startswith("NoReleaseForPlatform")
    assert run.sent == ["d00"]


def region_upgrade(root_revision: int, **rollout: Any) -> AgentUpgrade:
    """The upgrade as a root's waves send it to a region: annotated with the root's revision."""
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "AgentUpgrade",
        "metadata": {"name": "up", "annotations": {ROOT_REVISION: str(root_revision)}},
        "spec": {"version": NEW, "rollout": {"progressDeadlineSeconds": 900, **rollout}},
    }
    got = parse_manifest(doc)
    assert isinstance(got, AgentUpgrade)
    return got


def test_a_roots_next_revision_of_a_version_the_region_rolled_back_is_a_new_revision() -> None:
    """The root's undo to a version this region rolled back in an earlier root revision (the
    region not sent the revision in between: another region failed first) is rolled out again
    here as a new revision, a copy; it is never that earlier rollback, which the region's
    report would claim for the root's new revision and stop its waves with."""
    run = Run(region_upgrade(1, maxUnavailable=1), fleet(2))
    run.settle()
    assert run.state is not None and run.sent == ["d00"]
    run.report("d00", rolled_back(run.state.revision))
    run.settle()
    assert run.state.phase is RolloutPhase.ROLLED_BACK and run.state.revision == 1
    assert run.state.current.root_revision == 1
    assert takes_up(run.up, run.state)
    run.up = region_upgrade(3, maxUnavailable=1)  # the root's revision 3: the same version
    assert not takes_up(run.up, run.state)  # the record is the root's revision 1's
    run.settle()
    state = run.state
    assert state.phase is RolloutPhase.PROGRESSING and state.revision == 2, state
    assert (state.current.source, state.current.root_revision) == (1, 3)
    assert run.sent == ["d00"] and state.failed == {}  # its report was about revision 1
    assert takes_up(run.up, state)
    again = AgentUpgradeState.from_json(state.to_json())
    assert again.current.root_revision == 3 and takes_up(run.up, again)
    # a record that names no root revision (made before records carried it) takes any
    old = replace(state, revisions=tuple(replace(r, root_revision=0) for r in state.revisions))
    assert "rootRevision" not in old.to_json()["revisions"][-1]
    assert takes_up(run.up, old)


def test_pause_stops_sending_but_failures_still_count() -> None:
    run = Run(upgrade(maxUnavailable=1), fleet(4))
    run.settle()
    assert run.state is not None
    run.state = replace(run.state, phase=RolloutPhase.PAUSED)
    run.commit_all_sent()
    run.settle()
    assert run.sent == ["d00"]
    run.state = replace(run.state, phase=RolloutPhase.PROGRESSING)
    run.settle()
    assert run.sent == ["d00", "d01"]
    run.state = replace(run.state, phase=RolloutPhase.PAUSED)
    run.report("d01", rolled_back())
    run.settle()
    assert run.state.phase is RolloutPhase.ROLLED_BACK


def test_resume_after_a_rollback_retries_as_a_new_revision() -> None:
    run = Run(upgrade(), fleet(3))
    run.settle()
    run.report("d00", rolled_back())
    run.settle()
    assert run.state is not None and run.state.phase is RolloutPhase.ROLLED_BACK
    plan = retry_plan(run.up, run.state, run.now)
    assert plan.state is not None and plan.state.revision == 2 and plan.state.current.source == 1
    run.state = plan.state
    run.settle()
    # d00's report is about revision 1: it does not fail revision 2
    assert run.state.phase is RolloutPhase.PROGRESSING and run.sent == ["d00"]


def test_after_complete_a_late_failure_reverts_nothing() -> None:
    devices = fleet(2)
    run = Run(upgrade(maxUnavailable=2), devices)
    run.settle()
    run.commit_all_sent()
    run.settle()
    assert run.state is not None and run.state.phase is RolloutPhase.COMPLETE
    run.devices["d02"] = AgentDeviceView("d02", True, report())  # selected later
    run.settle()
    assert "d02" in run.sent
    run.report("d02", rolled_back())
    run.settle()
    assert run.state.phase is RolloutPhase.COMPLETE and "d02" in run.state.failed


def test_desired_agent_carries_the_commit_settings_and_the_first_upgrade_wins() -> None:
    run = Run(upgrade(), fleet(1))
    run.settle()
    assert run.state is not None
    spec = desired_agent(run.state, "d00", run.devices["d00"].report, RELEASES)
    assert spec is not None
    assert (spec.version, spec.upgrade, spec.upgrade_revision) == (NEW, "up", 1)
    assert (spec.commit_deadline_s, spec.max_tries) == (300, 3)
    other = replace(run.state, upgrade="aaa")
    assert (
        desired_agent_of(
            {"up": run.state, "aaa": other}, "d00", run.devices["d00"].report, RELEASES
        ).upgrade
        == "aaa"
    )
    # another platform's release
    arm = report(arch="aarch64")
    got = desired_agent(run.state, "d00", arm, RELEASES)
    assert got is not None and got.signed_metadata == b"env-0.2.1"


def test_state_round_trips_through_json() -> None:
    run = Run(upgrade(maxUnavailable=2), fleet(3))
    run.settle()
    run.report("d00", rolled_back())
    run.settle()
    assert run.state is not None
    assert AgentUpgradeState.from_json(run.state.to_json()) == run.state


def test_apply_refuses_a_version_outside_the_hub_window() -> None:
    from hub.decide.agentdesired import version_refusal

    assert version_refusal("0.3.0", "0.2.0") is not None  # a newer minor than the hub
    assert version_refusal("0.2.1", "0.2.0") is None  # a patch: same minor
    assert version_refusal("0.1.5", "0.2.0") is None
    assert version_refusal("0.4.0", "0.4.9") is None
    refused = version_refusal("0.1.0", "0.4.0")
    assert refused is not None and "0.2.x to 0.4.x" in refused and "spec.version" in refused


def test_metrics_series_per_upgrade() -> None:
    from hub.state.cache import Cache
    from hub.state.metrics import HubMetrics, agent_upgrade_series

    run = Run(upgrade(maxUnavailable=2), fleet(4))
    run.settle()
    run.report("d00", rolled_back())
    run.settle()
    cache = Cache()
    assert run.state is not None
    cache.agent_upgrades["up"] = run.state
    assert agent_upgrade_series(cache) == {
        ("up", "sent"): 2,
        ("up", "failed"): 1,
        ("up", "rolledBack"): 0,
    }
    metrics = HubMetrics()
    metrics.count_event(
        {"object": {"kind": "AgentUpgrade"}, "type": "Warning", "reason": "RolledBack"}
    )
    assert 'hub_agent_upgrade_steps_total{reason="RolledBack"} 1' in metrics.render()


# -- devices that leave the selector or are deleted ---------------------------------------------


def trying(revision: int = 1) -> AgentReport:
    return report(version=NEW, phase="Trying", desired_version=NEW, upgrade="up",
                  upgrade_revision=revision)  # fmt: skip


def test_a_device_that_leaves_the_selector_mid_trial_is_held_at_its_release_then_let_go() -> None:
    run = Run(upgrade(maxUnavailable=2), fleet(4))
    run.settle()
    assert run.sent == ["d00", "d01"]
    run.report("d00", trying())  # on trial, not committed
    run.report("d01", committed())  # committed: keeps it
    run.away = {n: run.devices.pop(n) for n in ("d00", "d01")}  # their labels changed
    run.settle()
    state = run.state
    assert state is not None and "d00" not in state.sent and "d01" not in state.sent
    assert state.leaving == {"d00": OLD} and "DevicesLeft" in run.events
    # the trial aborts: it is sent the release it had committed; the committed one nothing
    d00 = desired_agent(state, "d00", run.away["d00"].report, RELEASES)
    assert d00 is not None and d00.version == OLD
    assert desired_agent(state, "d01", run.away["d01"].report, RELEASES) is None
    # no longer the upgrade's: out of the pool, never failed at the deadline
    assert run.sent == ["d02", "d03"] and run.last is not None and run.last.progress.pool == 2
    run.step(1000.0)
    assert run.state is not None and set(run.state.failed) == {"d02", "d03"}
    assert "d00" not in run.state.failed
    # still on trial: held; once it says it runs what it had committed, nothing in flight: let go
    run.away["d00"] = replace(run.away["d00"], report=report(
        phase="RolledBack", reason="RolledBackByHub", desired_version=OLD, upgrade="up",
        upgrade_revision=1))  # fmt: skip
    run.settle()
    assert run.state.leaving == {}
    assert desired_agent(run.state, "d00", run.away["d00"].report, RELEASES) is None


def test_a_device_that_leaves_before_it_started_is_let_go_once_it_saw_the_hold() -> None:
    run = Run(upgrade(maxUnavailable=1), fleet(2))
    run.settle()
    assert run.sent == ["d00"]  # sent, still reporting Idle on OLD (the report may lag)
    run.away = {"d00": run.devices.pop("d00")}
    run.settle()
    assert run.state is not None and run.state.leaving == {"d00": OLD}  # not settled: lagging
    run.away["d00"] = replace(run.away["d00"], report=report(desired_version=OLD))
    run.settle()
    assert run.state.leaving == {} and run.sent == ["d01"]


def test_a_device_selected_again_is_the_upgrades_again() -> None:
    run = Run(upgrade(maxUnavailable=1), fleet(2))
    run.settle()
    run.report("d00", trying())
    run.away = {"d00": run.devices.pop("d00")}
    run.settle()
    assert run.state is not None and run.state.leaving == {"d00": OLD}
    run.devices["d00"] = run.away.pop("d00")
    run.settle()
    assert run.state.leaving == {}


def test_a_deleted_device_is_no_longer_the_upgrades() -> None:
    run = Run(upgrade(maxUnavailable=2), fleet(3))
    run.settle()
    run.report("d00", trying())
    del run.devices["d00"]  # deleted: not among the others either
    run.settle()
    assert run.state is not None and "d00" not in run.state.sent and run.state.leaving == {}
    run.step(1000.0)  # past the deadline: d00 is not failed
    assert "d00" not in run.state.failed


def test_a_device_sent_back_that_leaves_the_selector_keeps_what_it_has() -> None:
    run = Run(upgrade(canary={"steps": ["20%"]}, maxUnavailable="100%"), fleet(10))
    run.settle()
    run.report("d00", committed())
    run.report("d01", rolled_back())
    run.settle()
    assert run.state is not None and run.state.rollback == {"d00": OLD}
    run.away = {"d00": run.devices.pop("d00")}
    run.settle()
    assert run.state.rollback == {} and run.state.phase is RolloutPhase.ROLLED_BACK
    assert desired_agent(run.state, "d00", run.away["d00"].report, RELEASES) is None
    assert run.state.failed == {"d01": "CrashLoop: exited 3 times"}  # failures stay recorded


def test_leaving_round_trips_through_json() -> None:
    run = Run(upgrade(maxUnavailable=1), fleet(2))
    run.settle()
    run.report("d00", trying())
    run.away = {"d00": run.devices.pop("d00")}
    run.settle()
    assert run.state is not None and run.state.leaving
    assert AgentUpgradeState.from_json(run.state.to_json()) == run.state


def test_a_device_on_trial_when_the_upgrade_rolls_back_is_held_at_its_release_then_let_go() -> None:
    """Sent nothing, a trial edged would commit the rejected version once healthy, and only
    then be sent back (two switches, and a while on a version the fleet rejected): it is held
    at the release it had committed instead, so that the trial aborts; an install under way
    is held too (it never switches). Let go once it runs and committed that release, nothing
    in flight."""
    run = Run(upgrade(maxUnavailable=4), fleet(5))
    run.settle()
    assert run.sent == ["d00", "d01", "d02", "d03"]
    run.report("d00", rolled_back())  # the failure that stops it: ended on the device
    run.report("d01", trying())  # on trial
    run.report("d02", report(phase="Downloading", desired_version=NEW, upgrade="up",
                             upgrade_revision=1))  # fmt: skip
    run.report("d03", committed())  # committed: sent back explicitly
    run.settle()
    state = run.state
    assert state is not None and state.phase is RolloutPhase.ROLLED_BACK
    assert state.rollback == {"d03": OLD}
    assert state.held == {"d01": OLD, "d02": OLD}
    for name in ("d01", "d02", "d03"):
        got = desired_agent(state, name, run.devices[name].report, RELEASES)
        assert got is not None and got.version == OLD, name
    assert desired_agent(state, "d00", run.devices["d00"].report, RELEASES) is None
    assert desired_agent(state, "d04", run.devices["d04"].report, RELEASES) is None  # never sent
    # a report that lags (still on trial, or back on OLD before it saw the hold) keeps it held
    run.report("d01", report(phase="RolledBack", reason="RolledBackByHub", upgrade="up",
                             upgrade_revision=1))  # fmt: skip
    run.settle()
    assert run.state is not None and run.state.held == {"d01": OLD, "d02": OLD}
    # the trial aborted and it says so, having seen the hold: let go (sent nothing)
    run.report("d01", report(phase="RolledBack", reason="RolledBackByHub", desired_version=OLD,
                             upgrade="up", upgrade_revision=1))  # fmt: skip
    run.report("d02", report(desired_version=OLD))  # the install stopped: Idle on OLD
    run.settle()
    assert run.state.held == {} and run.state.rollback == {"d03": OLD}
    assert desired_agent(run.state, "d01", run.devices["d01"].report, RELEASES) is None
    assert "d01" not in run.state.rollback  # never committed the rejected version: no switch


def test_a_held_device_that_commits_anyway_is_sent_back_and_no_longer_held() -> None:
    run = Run(upgrade(maxUnavailable=2), fleet(3))
    run.settle()
    run.report("d00", rolled_back())
    run.report("d01", trying())
    run.settle()
    assert run.state is not None and run.state.held == {"d01": OLD}
    run.report("d01", committed())  # it committed before it saw the hold
    run.settle()
    assert run.state.held == {} and run.state.rollback == {"d01": OLD}
    assert "DevicesRolledBack" in run.events


def test_no_device_is_held_later_than_the_rollback() -> None:
    run = Run(upgrade(maxUnavailable=1), fleet(3))
    run.settle()
    run.report("d00", rolled_back())
    run.settle()
    assert run.state is not None and run.state.held == {} and run.sent == ["d00"]
    run.report("d01", trying(revision=1))  # claims a trial it was never sent: nothing
    run.settle()
    assert run.state.held == {}
    assert desired_agent(run.state, "d01", run.devices["d01"].report, RELEASES) is None


def test_a_held_device_that_leaves_the_selector_stays_held_then_is_let_go() -> None:
    run = Run(upgrade(maxUnavailable=2), fleet(3))
    run.settle()
    run.report("d00", rolled_back())
    run.report("d01", trying())
    run.settle()
    assert run.state is not None and run.state.held == {"d01": OLD}
    run.away = {"d01": run.devices.pop("d01")}
    run.settle()
    assert run.state.held == {} and run.state.leaving == {"d01": OLD}
    d01 = desired_agent(run.state, "d01", run.away["d01"].report, RELEASES)
    assert d01 is not None and d01.version == OLD


def test_held_round_trips_through_json_and_shows_in_status() -> None:
    from hub.decide.agentupgradestatus import upgrade_status

    run = Run(upgrade(maxUnavailable=2), fleet(3))
    run.settle()
    run.report("d00", rolled_back())
    run.report("d01", trying())
    run.settle()
    assert run.state is not None and run.state.held
    assert AgentUpgradeState.from_json(run.state.to_json()) == run.state
    plan = run.step(0)
    assert upgrade_status(run.up, run.state, plan.progress)["heldDevices"] == {"d01": OLD}


def test_a_device_that_came_back_healthy_and_is_away_later_is_not_failed_by_the_deadline() -> None:
    # d00 and d01 committed and came back healthy, then went away for longer than
    # progressDeadlineSeconds (an edge device offline for the night) while the rollout went
    # on: they were counted failed (ProgressDeadlineExceeded, "not connected"), which
    # reached the threshold and rolled back every device, d02 healthy and connected too
    run = Run(upgrade(maxUnavailable=1, failureThreshold=2), fleet(4))
    for name in ("d00", "d01"):
        run.settle()
        run.report(name, committed())
    run.settle()
    assert run.state is not None and run.state.sent["d00"].done_at > 0
    run.report("d00", committed(), connected=False)
    run.report("d01", committed(), connected=False)
    run.report("d02", committed())
    run.step(1000)
    run.settle()
    assert run.state.phase is RolloutPhase.PROGRESSING and not run.state.failed, run.state
    assert run.last is not None and {"d00", "d01", "d02"} <= set(run.last.progress.done)
    run.report("d03", committed())
    run.settle()
    assert run.state.phase is RolloutPhase.COMPLETE and not run.state.held, run.state
    # still away, long after Complete: neither failed nor held at the release before
    run.step(5000)
    run.settle()
    assert not run.state.failed and not run.state.held and not run.state.rollback
    # the record keeps when each was seen done (a hub restarted reads it back)
    again = AgentUpgradeState.from_json(run.state.to_json())
    assert again == run.state and again.sent["d00"].done_at == run.state.sent["d00"].done_at


def test_a_device_done_that_reports_a_failure_for_the_revision_still_fails() -> None:
    run = Run(upgrade(maxUnavailable=1, failureThreshold=5), fleet(2))
    run.settle()
    run.report("d00", committed())
    run.settle()
    assert run.state is not None and run.state.sent["d00"].done_at > 0
    run.report("d00", rolled_back())
    run.settle()
    assert "d00" in run.state.failed and "CrashLoop" in run.state.failed["d00"]
