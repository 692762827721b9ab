"""Revisions and rolling updates as tables: the pure planner, no store, no clock."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from edgefleet.api import IntOrPercent, ModelDeployment, parse_manifest
from hub.decide.analysis import Analysis, Check, Figures, Verdict
from hub.decide.devices import (
    Device,
    DevicePhase,
    Health,
    RevisionPhase,
    RevisionReport,
    WorkloadReport,
)
from hub.decide.rollout import (
    MAX_REVISIONS,
    MAX_WEIGHT,
    Budget,
    DeviceView,
    Revision,
    RolloutPhase,
    RolloutState,
    TargetPhase,
    canary_target,
    max_weight_of,
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


def test_devices_down_on_a_broken_revision_are_given_the_fix_beyond_the_budget() -> None:
    """Found by the soak harness (seed 3, docs/soak.md): a deployment created at a broken
    version, then fixed. Every device serves nothing, more than maxUnavailable: the budget left
    no room, the fix made no progress, and the rollout went back to the broken revision after
    its progress deadline. Switching a device that serves nothing costs no availability; a
    device that serves still waits for the budget."""
    dep, m = rolling(maxSurge=0, maxUnavailable=1)
    devices = [DeviceView("a", down=True), DeviceView("b", down=True), on_stable("c")]
    step = plan_rollout(dep, m, REVS, STARTED, devices, T)
    assert step.state is not None and step.state.updated == frozenset({"a", "b"})
    assert step.progress is not None
    assert step.progress.updating == 2 and step.progress.unavailable == 0
    # c serves: it waits until the budget has room (a and b ready)
    again = plan_rollout(dep, m, REVS, step.state, devices, T + 1)
    assert again.state is None or again.state.updated == frozenset({"a", "b"})


def test_devices_still_starting_the_previous_revision_wait_for_the_budget() -> None:
    """Found by the soak harness (seed 35, 1 CI run in 2): soak-a created at 1.0.0, then applied
    at 1.1.0 two seconds later, before either device had reported 1.0.0 serving. Both were
    given 1.1.0 at once as if they served nothing for good, and a moment later both served
    1.0.0 and switched together: two devices switching, budget 1. A device that serves nothing
    yet (starting, or no report) waits for room like one that serves."""
    dep, m = rolling(maxSurge=0, maxUnavailable=1)
    devices = [DeviceView("a"), DeviceView("b")]  # not serving, not down: starting
    step = plan_rollout(dep, m, REVS, STARTED, devices, T)
    assert step.state is None or not step.state.updated
    # b still starting uses the budget: nothing moves; once both serve, one device at a time
    step = plan_rollout(dep, m, REVS, STARTED, [on_stable("a"), DeviceView("b")], T + 1)
    assert step.state is None or not step.state.updated
    step = plan_rollout(dep, m, REVS, STARTED, [on_stable("a"), on_stable("b")], T + 2)
    assert step.state is not None and step.state.updated == frozenset({"a"})


def test_down_is_every_reported_revision_failed_or_refused() -> None:
    """``view_device``: a device is down only by its own report (pure)."""

    def view(*phases: RevisionPhase) -> DeviceView:
        revisions = tuple(
            RevisionReport("1.0.0", "s1", p, 1 if p is RevisionPhase.READY else 0) for p in phases
        )
        report = WorkloadReport("1.0.0", desired_replicas=1, revisions=revisions)
        return view_device(Device("x", workloads={"det": report}), "det", "2.0.0", "s2")

    assert view(RevisionPhase.FAILED).down
    assert view(RevisionPhase.REFUSED, RevisionPhase.FAILED).down
    assert not view(RevisionPhase.LOADING).down
    assert not view(RevisionPhase.PENDING, RevisionPhase.FAILED).down
    assert not view(RevisionPhase.READY).down and view(RevisionPhase.READY).serving
    assert not view().down


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
    assert step.state.failed == {"d00": "2.0.0 Failed: ModelLoadFailed"}  # for status
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


def test_nothing_moves_while_the_targeted_devices_are_not_all_placed() -> None:
    """A set of targeted devices the projector has yet to place (none, or some) decides
    nothing: no completion on no device, no step; the same set placed does."""
    dep, m = rolling()
    assert plan_rollout(dep, m, REVS, STARTED, [], T, placed=False).state is None
    assert plan_rollout(dep, m, REVS, STARTED, [on_stable("a")], T, placed=False).state is None
    done = plan_rollout(dep, m, REVS, STARTED, [], T).state
    assert done is not None and done.phase is RolloutPhase.COMPLETE  # placed: none targeted
    step = plan_rollout(dep, m, REVS, STARTED, [on_stable("a")], T)
    assert step.state is not None and step.state.updated == frozenset({"a"})


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


# -- canary steps ---------------------------------------------------------------------------


def canary(steps: list[Any], analysis: dict[str, Any] | None = None, **rollout: Any) -> Any:
    spec: dict[str, Any] = {"steps": steps}
    if analysis is not None:
        spec["analysis"] = analysis
    return rolling(canary=spec, **rollout)


def verdict(v: Verdict, message: str = "") -> Analysis:
    check = Check("errorRate", v, 0.5, 0.02, message or v.value)
    return Analysis(v, (check,), Figures(), Figures(), 10.0)


def views_of(names: list[str], state: RolloutState, phase: TargetPhase) -> list[DeviceView]:
    return [
        DeviceView(n, target=phase if n in state.updated else TargetPhase.ABSENT, serving=True)
        for n in names
    ]


@pytest.mark.parametrize(
    ("weight", "targeted", "devices"),
    [(5, 10, 1), (10, 10, 1), (50, 10, 5), (51, 10, 6), (100, 10, 10), (5, 0, 0), (1, 1000, 10)],
)
def test_a_weight_is_rounded_up_to_at_least_one_device(
    weight: int, targeted: int, devices: int
) -> None:
    assert canary_target(weight, targeted) == devices


def test_a_canary_rolls_through_every_step_with_the_analysis_passing() -> None:
    """10 devices, steps 10% (analysis window 10 s), 50%, then the rest; the analysis passes."""
    dep, m = canary(["10%", "50%"], {"maxErrorRateIncrease": 0.02, "window": "10s"})
    state, t = STARTED, T
    seen: list[tuple[int, int]] = []
    for _ in range(200):
        devices = views_of(DEVICES, state, TargetPhase.READY)
        step = plan_rollout(dep, m, REVS, state, devices, t, analysis=verdict(Verdict.PASS))
        state = step.state or state
        seen.append((state.step, len(state.updated)))
        if state.phase is RolloutPhase.COMPLETE:
            break
        t += 1
    assert state.phase is RolloutPhase.COMPLETE and state.updated == frozenset(DEVICES)
    # one device at step 1, five at step 2, then everyone; each step held for the window
    by_step: dict[int, set[int]] = {}
    for s, n in seen:
        by_step.setdefault(s, set()).add(n)
    assert max(by_step[0]) == 1 and max(by_step[1]) == 5 and max(by_step[2]) == 10
    assert sum(1 for s, _ in seen if s == 0) >= 10  # held for the 10 s window


def test_a_step_waits_for_its_devices_the_window_and_enough_data() -> None:
    dep, m = canary(["20%", "100%"], {"minAccuracy": 0.9, "window": "30s"})
    state = replace(STARTED, updated=frozenset({"d00", "d01"}))
    # not ready yet: nothing moves, no more devices
    loading = views_of(DEVICES, state, TargetPhase.PROGRESSING)
    assert (
        plan_rollout(dep, m, REVS, state, loading, T, analysis=verdict(Verdict.PASS)).state is None
    )
    ready_views = views_of(DEVICES, state, TargetPhase.READY)
    step = plan_rollout(dep, m, REVS, state, ready_views, T, analysis=verdict(Verdict.WAIT))
    assert step.state is not None and step.state.step_ready_at == T  # marked ready once
    state = step.state
    for analysis, at in ((verdict(Verdict.WAIT), T + 100), (verdict(Verdict.PASS), T + 29)):
        assert plan_rollout(dep, m, REVS, state, ready_views, at, analysis=analysis).state is None
    assert plan_rollout(dep, m, REVS, state, ready_views, T + 31, analysis=None).state is None
    step = plan_rollout(dep, m, REVS, state, ready_views, T + 30, analysis=verdict(Verdict.PASS))
    assert step.state is not None and step.state.step == 1 and step.state.step_ready_at == 0
    assert [e.reason for e in step.events] == ["CanaryStepPassed"]


def test_a_failing_analysis_rolls_every_canary_device_back_and_says_why() -> None:
    dep, m = canary(["20%"], {"maxErrorRateIncrease": 0.02})
    state = replace(STARTED, updated=frozenset({"d00", "d01"}))
    failed = verdict(Verdict.FAIL, "error rate 50.00% (50/100) vs stable 0.00%")
    step = plan_rollout(
        dep, m, REVS, state, views_of(DEVICES, state, TargetPhase.READY), T, analysis=failed
    )
    assert step.state is not None
    assert (step.state.phase, step.state.reason) == (RolloutPhase.ROLLED_BACK, "AnalysisFailed")
    assert "step 1 of 1 (20%)" in step.state.message
    assert "error rate 50.00% (50/100)" in step.state.message
    assert sorted(step.state.failed) == ["d00", "d01"]  # the canary devices, with the why
    assert all(
        r.startswith("AnalysisFailed: revision 2 (2.0.0)") for r in step.state.failed.values()
    )
    assert all(step.state.revision_for(d) == 1 for d in DEVICES)
    assert [e.reason for e in step.events] == ["RolledBack"]


def test_the_progress_deadline_rolls_back_a_rollout_that_waits_too_long() -> None:
    dep, m = canary(["20%"], {"minAccuracy": 0.9}, progressDeadlineSeconds=60)
    state = replace(STARTED, updated=frozenset({"d00", "d01"}), progress_at=T)
    devices = views_of(DEVICES, state, TargetPhase.READY)
    waiting = verdict(Verdict.WAIT, "accuracy: 0 of 2 canary devices reported")
    assert plan_rollout(dep, m, REVS, state, devices, T + 60, analysis=waiting).state is not None
    step = plan_rollout(dep, m, REVS, state, devices, T + 61, analysis=waiting)
    assert step.state is not None
    assert step.state.reason == "ProgressDeadlineExceeded"
    assert "no progress for 60 s" in step.state.message and "0 of 2" in step.state.message
    # a paused rollout does not run out of time
    paused = replace(state, phase=RolloutPhase.PAUSED)
    late = plan_rollout(dep, m, REVS, paused, devices, T + 1000, analysis=waiting)
    assert late.state is None or late.state.phase is not RolloutPhase.ROLLED_BACK


def test_pauses_wait_their_duration_or_for_resume() -> None:
    dep, m = canary(["10%", {"pause": {"duration": "20s"}}, {"pause": {}}, "100%"])
    state = replace(STARTED, updated=frozenset({"d00"}), step=1, step_at=T)
    devices = views_of(DEVICES, state, TargetPhase.READY)
    assert plan_rollout(dep, m, REVS, state, devices, T + 19).state is None
    step = plan_rollout(dep, m, REVS, state, devices, T + 20)
    assert step.state is not None and step.state.step == 2
    step = plan_rollout(dep, m, REVS, step.state, devices, T + 21)
    assert step.state is not None
    assert (step.state.phase, step.state.reason) == (RolloutPhase.PAUSED, "CanaryPause")
    assert plan_rollout(dep, m, REVS, step.state, devices, T + 9999).state is None
    assert [e.reason for e in step.events] == ["CanaryPaused"]
    assert step.state.updated == frozenset({"d00"})  # nobody else moved during the pauses


def test_a_canary_step_keeps_the_budget() -> None:
    dep, m = canary(["50%"], maxSurge=0, maxUnavailable=2)
    step = plan_rollout(dep, m, REVS, STARTED, views_of(DEVICES, STARTED, TargetPhase.ABSENT), T)
    assert step.state is not None and step.state.updated == frozenset({"d00", "d01"})


def test_neither_a_timed_pause_nor_the_analysis_window_is_a_lack_of_progress() -> None:
    dep, m = canary(
        ["10%", {"pause": {"duration": "1h"}}, "50%"],
        {"minAccuracy": 0.9, "window": "10m"},
        progressDeadlineSeconds=60,
    )
    pausing = replace(STARTED, updated=frozenset({"d00"}), step=1, step_at=T, progress_at=T)
    devices = views_of(DEVICES, pausing, TargetPhase.READY)
    assert plan_rollout(dep, m, REVS, pausing, devices, T + 3000).state is None
    held = replace(pausing, step=0, step_ready_at=T)
    waiting = verdict(Verdict.WAIT)
    assert plan_rollout(dep, m, REVS, held, devices, T + 600, analysis=waiting).state is None
    late = plan_rollout(dep, m, REVS, held, devices, T + 661, analysis=waiting)
    assert late.state is not None and late.state.reason == "ProgressDeadlineExceeded"


def test_a_root_hubs_max_weight_holds_the_rollout_there() -> None:
    """A region's rollout under a root hub's percent wave (hub.decide.wave): 10 devices at 30%:
    three get the new revision, then it is held (WeightHeld), never Complete; no progress
    deadline while held; the cap raised or lifted, it goes on."""
    dep, m = rolling(maxSurge="100%", maxUnavailable=0, progressDeadlineSeconds=10)
    state, t = replace(STARTED, started_at=T, progress_at=T), T
    for i in range(20):
        step = plan_rollout(
            dep, m, REVS, state, views_of(DEVICES, state, TargetPhase.READY), t, max_weight=30
        )
        state = step.state or state
        t += 1 if i < 5 else 100  # held: then far past the progress deadline
    assert (state.phase, state.reason, len(state.updated)) == (
        RolloutPhase.PROGRESSING,
        "WeightHeld",
        3,
    )
    assert "held at 30% by the root hub's waves" in state.message
    lifted = plan_rollout(dep, m, REVS, state, views_of(DEVICES, state, TargetPhase.READY), t)
    assert lifted.state is not None and len(lifted.state.updated) == 10
    # within a canary: the smaller of the step's weight and the cap
    dep, m = canary(["20%", "80%"])
    state = STARTED
    for _ in range(20):
        step = plan_rollout(
            dep, m, REVS, state, views_of(DEVICES, state, TargetPhase.READY), t, max_weight=50
        )
        state = step.state or state
        t += 1
    assert (state.step, len(state.updated), state.reason) == (1, 5, "WeightHeld")
    assert max_weight_of({"metadata": {"annotations": {MAX_WEIGHT: "30"}}}) == 30
    assert max_weight_of({"metadata": {"annotations": {MAX_WEIGHT: "x"}}}) is None
    assert max_weight_of({"metadata": {}}) is None


def test_what_devices_ran_before_the_stable_revision_is_kept() -> None:
    """``previous``: the stable revision before the current stable one, with another model
    (rollout undo to it needs no rollback allowance: devices still hold it)."""
    dep, m = rolling()
    state = replace(STARTED, updated=frozenset({"a"}), failed={"x": "old"}, previous=0)
    done = plan_rollout(dep, m, REVS, state, [ready("a")], T).state
    assert done is not None and (done.phase, done.stable, done.previous) == (
        RolloutPhase.COMPLETE, 2, 1,
    )  # fmt: skip
    # a new template that keeps the model (a label only): 3 completes, previous stays 1
    m3 = {**m, "metadata": {**m["metadata"], "labels": {"tier": "gold"}}}
    revs = {**REVS, 3: Revision("det", 3, template_hash(m3), m3, T)}
    started = plan_rollout(dep_of(m3), m3, REVS, done, [ready("a")], T).state
    assert started is not None and (started.revision, started.previous) == (3, 1)
    started = replace(started, updated=frozenset({"a"}))
    again = plan_rollout(dep_of(m3), m3, revs, started, [ready("a")], T).state
    assert again is not None and (again.phase, again.stable, again.previous) == (
        RolloutPhase.COMPLETE, 3, 1,
    )  # fmt: skip
    # stored and read back
    assert RolloutState.from_json(replace(again, failed={"a": "why"}).to_json()) == replace(
        again, failed={"a": "why"}
    )


# -- revisions only for what restarts workers (issue 33) -----------------------------------


def test_the_template_leaves_out_replicas_and_scaling() -> None:
    a = manifest("1.0.0")
    b = manifest("1.0.0")
    b["spec"]["replicas"] = {"perDevice": 3}
    b["spec"]["scaling"] = {"minReplicas": 1, "maxReplicas": 4}
    assert template_hash(a) == template_hash(b)
    c = manifest("1.0.0")
    c["spec"]["replicas"] = {"total": 7}
    assert template_hash(a) == template_hash(c)


def test_a_scale_is_no_revision_and_no_rollout() -> None:
    """``replicas`` (perDevice or total), ``scaling`` and ``placement`` changed alone: no
    revision, no step: the rollout stays Complete on the same revision."""
    done = RolloutState("det", 2, 2, phase=RolloutPhase.COMPLETE)
    for change in (
        {"replicas": {"perDevice": 4}},
        {"replicas": {"total": 9}},
        {"scaling": {"minReplicas": 1, "maxReplicas": 3}},
        {"placement": {"nodeSelector": {"site": "x"}}},
    ):
        m = manifest("2.0.0")
        m["spec"].update(change)
        step = plan_rollout(dep_of(m), m, REVS, done, [ready("a")], T)
        assert step.revision is None and step.state is None, change


def test_a_revision_stored_with_the_old_template_compares_equal() -> None:
    """A revision stored when the template held replicas: read back, its template is hashed
    again, so the hub's upgrade rolls nothing out."""
    m = manifest("1.0.0")
    m["spec"]["replicas"] = {"perDevice": 2}
    doc = Revision("det", 1, "hash-with-replicas", m, T).to_json()
    assert Revision.from_json(doc).template == template_hash(manifest("1.0.0"))


def test_the_stable_template_again_after_a_rollback_is_no_new_revision() -> None:
    """``rollout undo`` (or an apply) of the stable template after a rollback: the stable
    revision is current again, no "copy of 1"; revision 2 keeps "rolled back" and why."""
    dep, m = rolling()
    state = replace(STARTED, updated=frozenset({"a"}))
    broken = DeviceView("a", target=TargetPhase.BROKEN, broken_reason="2.0.0 Failed: OOM")
    back = plan_rollout(dep, m, REVS, state, [broken, on_stable("b")], T).state
    assert back is not None and back.phase is RolloutPhase.ROLLED_BACK
    m1 = manifest("1.0.0")
    step = plan_rollout(dep_of(m1), m1, REVS, back, [on_stable("a"), on_stable("b")], T + 5)
    assert step.revision is None
    assert step.state is not None
    assert (step.state.revision, step.state.stable, step.state.phase) == (
        1, 1, RolloutPhase.PROGRESSING,
    )  # fmt: skip
    assert step.state.reason == "StableTemplate" and not step.state.failed
    assert "every device is sent revision 1" in step.state.message
    assert [e.reason for e in step.events] == ["RolloutReverted"]
    assert step.state.revision_for("a") == 1
    outcome = step.state.outcome_of(2)
    assert outcome is not None and (outcome.phase, outcome.reason) == (
        "RolledBack", "RevisionFailed",
    )  # fmt: skip
    assert "a: 2.0.0 Failed: OOM" in outcome.message
    # Complete once every device says it serves revision 1, all replicas ready
    waiting = plan_rollout(dep_of(m1), m1, REVS, step.state, [ready("a"), on_stable("b")], T + 6)
    assert waiting.state is None
    done = plan_rollout(dep_of(m1), m1, REVS, step.state, [ready("a"), ready("b")], T + 6).state
    assert done is not None and (done.phase, done.reason) == (
        RolloutPhase.COMPLETE, "RolloutComplete",
    )  # fmt: skip
    # nothing more to do: the same template again is no step
    again = plan_rollout(dep_of(m1), m1, REVS, done, [ready("a")], T + 7)
    assert again.state is None and again.revision is None


def test_devices_refusing_the_stable_template_applied_again_hold_it_saying_why() -> None:
    """Soak defect 4: 1.0.0 applied again after 1.1.0 and the devices refuse it (signed
    metadata older than what they accepted since, no rollback allowance): the rollout is not
    Complete, names the devices, why and how to allow it, and never gives up on it (there is
    nothing before the stable revision), even past its progress deadline."""
    state = replace(STARTED, updated=frozenset({"a"}))
    m1 = manifest("1.0.0", progressDeadlineSeconds=60)
    back = plan_rollout(dep_of(m1), m1, REVS, state, [ready("a"), on_stable("b")], T).state
    assert back is not None and back.phase is RolloutPhase.PROGRESSING
    why = "1.0.0 Refused: MetadataRollback: metadata version 5 is older than 9"
    refusing = [
        DeviceView(d, target=TargetPhase.BROKEN, broken_reason=why, serving=True)
        for d in ("a", "b")
    ]
    step = plan_rollout(dep_of(m1), m1, REVS, back, refusing, T + 5)
    held = step.state
    assert held is not None and (held.phase, held.reason) == (
        RolloutPhase.PROGRESSING, "RevisionRefused",
    )  # fmt: skip
    assert "refused or failed on 2 of 2 device(s) (a: 1.0.0 Refused: MetadataRollback" in (
        held.message
    )
    assert "edgectl rollback allow --name det --version 1.0.0" in held.message
    assert "edgectl models push MODEL_FILE --name det --version 1.0.0" in held.message
    assert [(e.type, e.reason) for e in step.events] == [("Warning", "RevisionRefused")]
    assert held.revision_for("a") == 1 and not held.failed
    # the same again is no step (no event each pass); past the deadline it stays so
    assert plan_rollout(dep_of(m1), m1, REVS, held, refusing, T + 5000).state is None
    # allowed, the devices serve it: Complete
    done = plan_rollout(dep_of(m1), m1, REVS, held, [ready("a"), ready("b")], T + 5001).state
    assert done is not None and done.phase is RolloutPhase.COMPLETE


def test_a_device_failing_the_stable_template_applied_again_names_no_allowance() -> None:
    state = replace(STARTED, updated=frozenset({"a"}))
    m1 = manifest("1.0.0")
    back = plan_rollout(dep_of(m1), m1, REVS, state, [ready("a"), on_stable("b")], T).state
    assert back is not None
    failed = DeviceView("a", target=TargetPhase.BROKEN, broken_reason="1.0.0 Failed: OOM")
    held = plan_rollout(dep_of(m1), m1, REVS, back, [failed, ready("b")], T + 5).state
    assert held is not None and held.reason == "RevisionRefused"
    assert "a: 1.0.0 Failed: OOM" in held.message and "rollback allow" not in held.message


def test_the_stable_template_again_during_a_rollout_aborts_it() -> None:
    state = replace(STARTED, updated=frozenset({"a"}))
    m1 = manifest("1.0.0")
    step = plan_rollout(dep_of(m1), m1, REVS, state, [ready("a"), on_stable("b")], T)
    assert step.revision is None and step.state is not None
    assert step.state.revision == 1 and step.state.phase is RolloutPhase.PROGRESSING
    assert step.state.revision_for("a") == 1  # sent the stable one again
    outcome = step.state.outcomes[2]
    assert (outcome.phase, outcome.reason, outcome.at) == ("Aborted", "Superseded", T)


def test_an_older_template_than_the_stable_one_is_still_a_new_revision() -> None:
    """Its workers restart (devices run the stable one): a rollout, "a copy of" it."""
    revs = {**REVS, 3: rev(3, "3.0.0")}
    done = RolloutState("det", 3, 3, phase=RolloutPhase.COMPLETE)
    m1 = manifest("1.0.0")
    step = plan_rollout(dep_of(m1), m1, revs, done, [ready("a")], T)
    assert step.revision is not None and (step.revision.number, step.revision.source) == (4, 1)
    assert step.state is not None and step.state.outcomes[3].phase == "Complete"


def test_at_a_root_with_waves_the_stable_template_again_is_a_new_revision() -> None:
    """The root's waves move regions back with a revision of their own."""
    waves = [{"regions": ["eu"]}]
    m2 = manifest("2.0.0", waves=waves)
    state = replace(STARTED, phase=RolloutPhase.ROLLED_BACK)
    m1 = manifest("1.0.0", waves=waves)
    revs = {1: Revision("det", 1, template_hash(m1), m1, T), 2: rev(2, "2.0.0")}
    assert template_hash(m2) == revs[2].template
    step = plan_rollout(dep_of(m1), m1, revs, state, [], T)
    assert step.revision is not None and step.revision.number == 3


def test_each_revision_keeps_its_outcome_after_later_ones() -> None:
    """Rolled back (with its reason), then a new revision that completes, then another: the
    history still says revision 2 was rolled back and 3 completed; outcomes go with the
    revisions pruned."""
    rolled = replace(
        STARTED,
        phase=RolloutPhase.ROLLED_BACK,
        reason="AnalysisFailed",
        message="revision 2 (2.0.0) failed the canary analysis",
        changed_at=T,
    )
    revs = dict(REVS)
    state: RolloutState | None = rolled
    for number in (3, 4):
        mn = manifest(f"{number}.0.0")
        step = plan_rollout(dep_of(mn), mn, revs, state, [ready("a")], T + number)
        assert step.revision is not None and step.revision.number == number
        revs[number] = step.revision
        state = replace(step.state, updated=frozenset({"a"})) if step.state else None
        step = plan_rollout(dep_of(mn), mn, revs, state, [ready("a")], T + number)
        state = step.state
        assert state is not None and state.phase is RolloutPhase.COMPLETE
    assert state is not None
    two, three = state.outcome_of(2), state.outcome_of(3)
    assert two is not None and (two.phase, two.reason) == ("RolledBack", "AnalysisFailed")
    assert "canary analysis" in two.message
    assert three is not None and three.phase == "Complete"
    assert state.outcome_of(1) is None  # stable when 2 started, never left by a step
    assert RolloutState.from_json(state.to_json()) == state
    # pruned revisions lose their outcome at the next step
    many = {n: rev(n, f"9.0.{n}") for n in range(1, MAX_REVISIONS + 6)}
    crowded = replace(state, outcomes={n: two for n in range(1, MAX_REVISIONS + 4)},
                      revision=MAX_REVISIONS + 4, stable=MAX_REVISIONS + 4)  # fmt: skip
    mn = manifest(f"9.0.{MAX_REVISIONS + 5}")
    step = plan_rollout(dep_of(mn), mn, many, crowded, [], T + 50)
    assert step.state is not None
    assert set(step.state.outcomes) <= set(many) - set(prune(many.values(), step.state))
    assert len(step.state.outcomes) <= MAX_REVISIONS + 1


def test_an_aborted_revision_keeps_aborted_after_the_next_one() -> None:
    """``rollout abort`` leaves the state RolledBack with reason Aborted; the next template's
    revision keeps that as revision 2's outcome."""
    aborted = replace(STARTED, phase=RolloutPhase.ROLLED_BACK, reason="Aborted", changed_at=T)
    m3 = manifest("3.0.0")
    step = plan_rollout(dep_of(m3), m3, REVS, aborted, [], T + 1)
    assert step.revision is not None and step.state is not None
    outcome = step.state.outcomes[2]
    assert (outcome.phase, outcome.reason, outcome.at) == ("RolledBack", "Aborted", T)
