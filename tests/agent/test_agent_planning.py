"""The agent controller's planner as a table: what the hub asks, what runs, what the launcher
says and how healthy edged is, in; the next step out."""

from __future__ import annotations

import pytest

from edged.agent.planning import (
    AbortTrial,
    Commit,
    Desired,
    Health,
    LauncherView,
    Outcome,
    Phase,
    Report,
    Running,
    SwitchTo,
    Update,
    WaitHealthy,
    inactive_slot,
    plan,
)

HEALTHY = Health(connected=True, state_loaded=True, reconcile_running=True,
                 serving=frozenset({"mlp"}))  # fmt: skip
ON_PACKAGE = Running("0.2.0", "package", package_version="0.2.0")
WANT = Desired("0.2.1", upgrade="u", upgrade_revision=2)
TRIAL_VIEW = LauncherView.of(
    {"committed": "package", "trying": {"slot": "b", "version": "0.2.1", "tries": 1,
     "upgrade": "u", "upgradeRevision": 2, "context": {"servedBefore": ["mlp"]}}},
    {"b": "0.2.1"},
)  # fmt: skip
ON_TRIAL = Running("0.2.1", "b", trial=True, package_version="0.2.0")


def test_nothing_asked_nothing_done() -> None:
    assert plan(None, ON_PACKAGE, LauncherView(), HEALTHY) == Report(Phase.IDLE)
    assert plan(Desired("0.2.0"), ON_PACKAGE, LauncherView(), HEALTHY) == Report(Phase.IDLE)


def test_a_new_version_is_installed_into_the_inactive_slot() -> None:
    assert plan(WANT, ON_PACKAGE, LauncherView(), HEALTHY) == Update("0.2.1", "a")
    on_a = Running("0.2.1", "a", package_version="0.2.0")
    view = LauncherView(committed="a", committed_version="0.2.1", slots={"a": "0.2.1"})
    assert plan(Desired("0.2.2"), on_a, view, HEALTHY) == Update("0.2.2", "b")
    assert inactive_slot("package", "package") == "a"
    assert inactive_slot("a", "package") == "b"


def test_an_installed_version_is_switched_to_and_the_package_is_a_rollback() -> None:
    on_b = Running("0.2.1", "b", package_version="0.2.0")
    view = LauncherView(committed="b", committed_version="0.2.1",
                        slots={"a": "0.2.2", "b": "0.2.1"})  # fmt: skip
    assert plan(Desired("0.2.0"), on_b, view, HEALTHY) == SwitchTo("package", "0.2.0")
    assert plan(Desired("0.2.2"), on_b, view, HEALTHY) == SwitchTo("a", "0.2.2")


def test_a_trial_commits_once_healthy_and_waits_otherwise() -> None:
    assert plan(WANT, ON_TRIAL, TRIAL_VIEW, HEALTHY) == Commit()
    assert plan(None, ON_TRIAL, TRIAL_VIEW, HEALTHY) == Commit()  # the hub asks nothing now
    for health, missing in [
        (Health(False, True, True, frozenset({"mlp"})), "not connected"),
        (Health(True, False, True, frozenset({"mlp"})), "state is not loaded"),
        (Health(True, True, False, frozenset({"mlp"})), "reconcile is not running"),
        (Health(True, True, True, frozenset()), "not serving again: mlp"),
    ]:
        step = plan(WANT, ON_TRIAL, TRIAL_VIEW, health)
        assert isinstance(step, WaitHealthy) and missing in step.missing


def test_a_trial_the_hub_no_longer_wants_is_aborted() -> None:
    step = plan(Desired("0.2.0"), ON_TRIAL, TRIAL_VIEW, HEALTHY)
    assert isinstance(step, AbortTrial) and step.reason == "RolledBackByHub"


def test_a_rolled_back_or_failed_release_is_not_tried_again_for_that_revision() -> None:
    rolled = LauncherView(last=Outcome("RolledBack", "0.2.1", "CrashLoop", "3 exits",
                                       upgrade="u", upgrade_revision=2))  # fmt: skip
    assert plan(WANT, ON_PACKAGE, rolled, HEALTHY) == Report(
        Phase.ROLLED_BACK, "CrashLoop", "3 exits"
    )
    failed = Outcome(Phase.FAILED, "0.2.1", "SmokeTestFailed", "no", "u", 2)
    assert plan(WANT, ON_PACKAGE, LauncherView(), HEALTHY, failed) == Report(
        Phase.FAILED, "SmokeTestFailed", "no"
    )
    # a new revision of the upgrade (the hub decided to try again): tried again
    again = Desired("0.2.1", upgrade="u", upgrade_revision=3)
    assert plan(again, ON_PACKAGE, rolled, HEALTHY, failed) == Update("0.2.1", "a")


def test_after_a_rollback_the_committed_release_reports_it() -> None:
    rolled = LauncherView(last=Outcome("RolledBack", "0.2.1", "CommitDeadlineExceeded", "m"))
    assert plan(None, ON_PACKAGE, rolled, HEALTHY).phase == Phase.ROLLED_BACK  # type: ignore[union-attr]
    done = LauncherView(committed="b", committed_version="0.2.1",
                        last=Outcome("Committed", "0.2.1"))  # fmt: skip
    assert plan(WANT, Running("0.2.1", "b"), done, HEALTHY) == Report(Phase.COMMITTED, "Committed")


@pytest.mark.parametrize("desired", [None, WANT])
def test_outside_the_launcher_edged_cannot_update_itself(desired: Desired | None) -> None:
    step = plan(desired, Running("0.2.0", ""), LauncherView(), HEALTHY)
    if desired is None:
        assert step == Report(Phase.IDLE)
    else:
        assert step == Report(Phase.FAILED, "NoLauncher", step.message)  # type: ignore[union-attr]


def test_a_refusal_stays_the_reported_outcome_once_the_hub_stops_asking() -> None:
    failed = Outcome(Phase.FAILED, "0.2.1", "SmokeTestFailed", "no", "u", 2)
    for desired in (None, Desired("0.2.0")):  # the hub asks for nothing, or for what runs
        assert plan(desired, ON_PACKAGE, LauncherView(), HEALTHY, failed) == Report(
            Phase.FAILED, "SmokeTestFailed", "no"
        )
    # newer than a rollback the launcher still remembers (a new attempt clears failed)
    rolled = LauncherView(last=Outcome("RolledBack", "0.2.1", "CrashLoop", "3 exits", "u", 1))
    assert plan(None, ON_PACKAGE, rolled, HEALTHY, failed).phase == Phase.FAILED  # type: ignore[union-attr]
    # at start, before the first DesiredState, too
    assert plan(None, ON_PACKAGE, LauncherView(), Health(False, False, False), failed) == Report(
        Phase.FAILED, "SmokeTestFailed", "no"
    )
