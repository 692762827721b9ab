"""Revisions and rolling updates as tables: the pure planner, no store, no clock."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from edgefleet.api import IntOrPercent, ModelDeployment, parse_manifest
from hub.devices import Device, DevicePhase, Health, RevisionPhase, RevisionReport, WorkloadReport
from hub.rolling import (
    MAX_REVISIONS,
    Budget,
    DeviceView,
    Revision,
    RolloutPhase,
    RolloutState,
    TargetPhase,
    plan_rollout,
    prune,
    resolve_budget,
    template_hash,
    view_device,
)

T = 1_000.0


def manifest(version: str, **rollout: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": "det"},
        "spec": {"model": {"name": "det", "version": version}},
    }
    if rollout:
        doc["spec"]["rollout"] = rollout
    dep = parse_manifest(doc)
    assert isinstance(dep, ModelDeployment)
    return dep.to_dict()


def dep_of(m: dict[str, Any]) -> ModelDeployment:
    d = parse_manifest(m)
    assert isinstance(d, ModelDeployment)
    return d


def rev(number: int, version: str) -> Revision:
    m = manifest(version)
    return Revision("det", number, template_hash(m), m, T - 100)


def test_the_template_leaves_out_placement_and_rollout() -> None:
    a = manifest("1.0.0")
    b = manifest("1.0.0", maxUnavailable=3)
    b["spec"]["placement"]["nodeSelector"] = {"site": "x"}
    assert template_hash(a) == template_hash(b)
    assert template_hash(a) != template_hash(manifest("1.0.1"))


@pytest.mark.parametrize(
    ("surge", "unavailable", "targeted", "expected"),
    [
        ("25%", "25%", 10, Budget(3, 2)),  # surge rounds up, unavailable down
        ("25%", "25%", 3, Budget(1, 0)),
        ("0%", "10%", 1000, Budget(0, 100)),
        ("0%", "10%", 5, Budget(0, 1)),  # both 0 after rounding: 1 unavailable
        (0, 0, 10, Budget(0, 1)),
        (2, 0, 10, Budget(2, 0)),
        (0, 1, 0, Budget(0, 1)),
    ],
)
def test_budget(surge: Any, unavailable: Any, targeted: int, expected: Budget) -> None:
    def parse(v: Any) -> IntOrPercent:
        return IntOrPercent(int(str(v).rstrip("%")), str(v).endswith("%"))

    assert resolve_budget(parse(surge), parse(unavailable), targeted) == expected


def ready(name: str) -> DeviceView:
    return DeviceView(name, target=TargetPhase.READY, serving=True)


def on_stable(name: str) -> DeviceView:
    return DeviceView(name, serving=True)


def test_the_first_revision_goes_everywhere_at_once() -> None:
    m = manifest("1.0.0")
    step = plan_rollout(dep_of(m), m, {}, None, [on_stable("a")], T)
    assert step.revision is not None and step.revision.number == 1
    assert step.state is not None
    assert (step.state.phase, step.state.revision, step.state.stable) == (
        RolloutPhase.COMPLETE,
        1,
        1,
    )
    assert step.state.revision_for("a") == 1


def test_a_new_template_is_a_new_revision_rolled_out_from_the_stable_one() -> None:
    m = manifest("2.0.0")
    done = RolloutState("det", 1, 1, phase=RolloutPhase.COMPLETE)
    step = plan_rollout(dep_of(m), m, {1: rev(1, "1.0.0")}, done, [on_stable("a")], T)
    assert step.revision is not None and step.revision.number == 2
    assert step.state is not None
    assert (step.state.revision, step.state.stable, step.state.phase) == (
        2,
        1,
        RolloutPhase.PROGRESSING,
    )
    assert step.state.updated == frozenset()
    assert step.state.revision_for("a") == 1  # nobody moved yet
    # changed again mid-rollout: the stable one stays the base
    m3 = manifest("3.0.0")
    step3 = plan_rollout(
        dep_of(m3), m3, {1: rev(1, "1.0.0"), 2: rev(2, "2.0.0")}, step.state, [], T
    )
    assert step3.state is not None and (step3.state.revision, step3.state.stable) == (3, 1)


def test_applying_an_older_template_again_is_a_new_revision_copied_from_it() -> None:
    m = manifest("1.0.0")
    state = RolloutState("det", 2, 2, phase=RolloutPhase.COMPLETE)
    step = plan_rollout(dep_of(m), m, {1: rev(1, "1.0.0"), 2: rev(2, "2.0.0")}, state, [], T)
    assert step.revision is not None and (step.revision.number, step.revision.source) == (3, 1)
    assert step.state is not None and "a copy of revision 1" in step.state.message


DEVICES = [f"d{i:02d}" for i in range(10)]


def rolling(version: str = "2.0.0", **rollout: Any) -> tuple[ModelDeployment, dict[str, Any]]:
    m = manifest(version, **rollout)
    return dep_of(m), m


REVS = {1: rev(1, "1.0.0"), 2: rev(2, "2.0.0")}
STARTED = RolloutState("det", 2, 1, phase=RolloutPhase.PROGRESSING)


@pytest.mark.parametrize(
    ("rollout", "updated", "views", "expected"),
    [
        # maxSurge 0, maxUnavailable 2: two devices at a time, in name order
        ({"maxSurge": 0, "maxUnavailable": 2}, set(), {}, {"d00", "d01"}),
        # one of them still updating: room for one more
        (
            {"maxSurge": 0, "maxUnavailable": 2},
            {"d00", "d01"},
            {"d00": TargetPhase.READY, "d01": TargetPhase.PROGRESSING},
            {"d00", "d01", "d02"},
        ),
        # serving but not every replica ready is still updating
        (
            {"maxSurge": 0, "maxUnavailable": 1},
            {"d00"},
            {"d00": TargetPhase.SERVING},
            {"d00"},
        ),
        # 25% / 25% of 10: 3 + 2 = 5 at once
        ({}, set(), {}, {"d00", "d01", "d02", "d03", "d04"}),
    ],
)
def test_devices_are_assigned_within_the_budget(
    rollout: dict[str, Any],
    updated: set[str],
    views: dict[str, TargetPhase],
    expected: set[str],
) -> None:
    dep, m = rolling(**rollout)
    state = replace(STARTED, updated=frozenset(updated))
    devices = [
        DeviceView(n, target=views.get(n, TargetPhase.ABSENT), serving=True) for n in DEVICES
    ]
    step = plan_rollout(dep, m, REVS, state, devices, T)
    got = step.state.updated if step.state is not None else state.updated
    assert got == frozenset(expected)


def test_devices_serving_nothing_use_the_budget_and_skipped_ones_are_reported() -> None:
    dep, m = rolling(maxSurge=0, maxUnavailable=2)
    devices = [
        DeviceView("a", serving=False),  # eligible, nothing serves: unavailable
        DeviceView("b", eligible=False, skip_reason="device is NotReady"),
        on_stable("c"),
        on_stable("d"),
    ]
    step = plan_rollout(dep, m, REVS, STARTED, devices, T)
    assert step.state is not None and step.state.updated == frozenset({"a"})
    assert step.progress is not None
    assert step.progress.skipped == {"b": "device is NotReady"}
    assert step.progress.unavailable == 0 and step.progress.updating == 1


def test_a_failure_or_refusal_on_an_updated_device_rolls_everything_back() -> None:
    dep, m = rolling(maxSurge=0, maxUnavailable=2)
    state = replace(STARTED, updated=frozenset({"d00", "d01"}))
    devices = [
        DeviceView("d00", target=TargetPhase.BROKEN, broken_reason="2.0.0 Failed: ModelLoadFailed"),
        ready("d01"),
        on_stable("d02"),
    ]
    step = plan_rollout(dep, m, REVS, state, devices, T)
    assert step.state is not None
    assert (step.state.phase, step.state.reason) == (RolloutPhase.ROLLED_BACK, "RevisionFailed")
    assert "d00: 2.0.0 Failed: ModelLoadFailed" in step.state.message
    assert all(step.state.revision_for(d) == 1 for d in ("d00", "d01", "d02"))
    assert [e.reason for e in step.events] == ["RolledBack"]
    # and it stays rolled back: the same template is not retried by itself
    again = plan_rollout(dep, m, REVS, step.state, devices, T + 1)
    assert again.state is None and again.revision is None


def test_a_device_not_given_the_new_revision_cannot_fail_it() -> None:
    dep, m = rolling(maxSurge=0, maxUnavailable=1)
    devices = [DeviceView("d00", target=TargetPhase.BROKEN, broken_reason="x", serving=True)]
    step = plan_rollout(dep, m, REVS, STARTED, devices, T)
    assert step.state is not None and step.state.phase is RolloutPhase.PROGRESSING


def test_complete_when_every_device_is_ready_on_the_new_revision() -> None:
    dep, m = rolling()
    state = replace(STARTED, updated=frozenset({"a", "b"}))
    away = DeviceView("c", eligible=False, skip_reason="offline", serving=True)
    step = plan_rollout(dep, m, REVS, state, [ready("a"), ready("b"), away], T)
    assert step.state is None  # c holds completion; it keeps the stable revision meanwhile
    assert step.progress is not None and step.progress.skipped == {"c": "offline"}
    assert state.revision_for("c") == 1
    back = replace(away, eligible=True, skip_reason="")
    step = plan_rollout(dep, m, REVS, state, [ready("a"), ready("b"), back], T)
    assert step.state is not None and step.state.updated == frozenset({"a", "b", "c"})
    step = plan_rollout(dep, m, REVS, step.state, [ready("a"), ready("b"), ready("c")], T)
    assert step.state is not None
    assert (step.state.phase, step.state.stable) == (RolloutPhase.COMPLETE, 2)


def test_nothing_moves_while_paused_without_a_model_or_without_eligible_devices() -> None:
    dep, m = rolling()
    devices = [on_stable("a")]
    paused = replace(STARTED, phase=RolloutPhase.PAUSED)
    assert plan_rollout(dep, m, REVS, paused, devices, T).state is None
    assert plan_rollout(dep, m, REVS, STARTED, devices, T, model_pushed=False).state is None
    offline = [DeviceView("a", eligible=False, skip_reason="offline")]
    assert plan_rollout(dep, m, REVS, STARTED, offline, T).state is None


@pytest.mark.parametrize(
    ("surge", "unavailable", "n", "load_steps"),
    [(0, 1, 7, 2), (1, 1, 12, 3), ("10%", 0, 30, 1), (0, "10%", 40, 4), ("25%", "25%", 9, 2)],
)
def test_a_whole_rollout_never_exceeds_its_budget(
    surge: Any, unavailable: Any, n: int, load_steps: int
) -> None:
    """Devices become ready ``load_steps`` steps after they are assigned; at every step the
    devices updating plus those unavailable stay within maxSurge + maxUnavailable, and the
    rollout ends Complete with every device on the new revision."""
    dep, m = rolling(maxSurge=surge, maxUnavailable=unavailable)
    budget = resolve_budget(dep.spec.rollout.max_surge, dep.spec.rollout.max_unavailable, n)
    names = [f"d{i:03d}" for i in range(n)]
    assigned_at: dict[str, int] = {}
    state = STARTED
    for t in range(10 * n):
        devices = [
            DeviceView(
                d,
                target=(
                    TargetPhase.READY
                    if d in assigned_at and t - assigned_at[d] >= load_steps
                    else TargetPhase.PROGRESSING
                    if d in assigned_at
                    else TargetPhase.ABSENT
                ),
                serving=True,
            )
            for d in names
        ]
        step = plan_rollout(dep, m, REVS, state, devices, T + t)
        state = step.state or state
        assert step.progress is not None
        assert step.progress.updating + step.progress.unavailable <= budget.total
        for d in state.updated:
            assigned_at.setdefault(d, t)
        if state.phase is RolloutPhase.COMPLETE:
            break
    assert state.phase is RolloutPhase.COMPLETE and state.updated == frozenset(names)


def test_view_of_a_device() -> None:
    def device(*revisions: RevisionReport, phase: str = "Ready", ok: bool = True) -> Device:
        report = WorkloadReport("2.0.0", desired_replicas=1, revisions=revisions)
        return Device(
            "x",
            phase=DevicePhase(phase),
            health=Health(ok, () if ok else ("Overheating",)),
            workloads={"det": report},
        )

    new_ready = RevisionReport("2.0.0", "s2", RevisionPhase.READY, 1, wanted=True)
    old_ready = RevisionReport("1.0.0", "s1", RevisionPhase.READY, 1)
    failed = RevisionReport("2.0.0", "s2", RevisionPhase.FAILED, 0, reason="ModelLoadFailed")
    loading = RevisionReport("2.0.0", "s2", RevisionPhase.LOADING, wanted=True)
    v = view_device(device(new_ready), "det", "2.0.0", "s2")
    assert (v.eligible, v.target, v.serving) == (True, TargetPhase.READY, True)
    v = view_device(device(loading, old_ready), "det", "2.0.0", "s2")
    assert (v.target, v.serving) == (TargetPhase.PROGRESSING, True)
    v = view_device(device(failed, old_ready), "det", "2.0.0", "s2")
    assert (v.target, v.broken_reason) == (TargetPhase.BROKEN, "2.0.0 Failed: ModelLoadFailed")
    v = view_device(device(old_ready, phase="NotReady"), "det", "2.0.0", "s2")
    assert (v.eligible, v.skip_reason, v.target) == (
        False,
        "device is NotReady",
        TargetPhase.ABSENT,
    )
    v = view_device(device(old_ready, ok=False), "det", "2.0.0", "s2")
    assert not v.eligible and "Overheating" in v.skip_reason
    v = view_device(device(new_ready), "det", "2.0.0", "other-artifact")
    assert v.target is TargetPhase.ABSENT


def test_prune_keeps_the_newest_and_the_stable_one() -> None:
    revisions = [rev(n, f"1.0.{n}") for n in range(1, MAX_REVISIONS + 5)]
    state = RolloutState("det", MAX_REVISIONS + 4, 2, phase=RolloutPhase.PROGRESSING)
    assert prune(revisions, state) == [1, 3, 4]
