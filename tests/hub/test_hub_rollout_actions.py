"""An operator's rollout actions (pause, resume, promote, abort, restart) and what the planner
does after them, as tables: pure, no store, no clock."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from edgefleet.api import ModelDeployment, parse_manifest
from edgefleet.api.deployments import RESTARTED_AT
from hub.decide.analysis import Analysis, Check, Figures, Verdict
from hub.decide.revisions import with_restart
from hub.decide.rollout import (
    DeviceView,
    Revision,
    RolloutPhase,
    RolloutState,
    TargetPhase,
    plan_rollout,
    template_hash,
)
from hub.decide.rolloutactions import ActionRefused, act, restart_refusal

T = 1_000.0
DEVICES = [f"d{i:02d}" for i in range(10)]
STEPS = ["10%", {"pause": {"duration": "10m"}}, {"pause": {}}, "50%", {"pause": {}}, "80%"]


def manifest(version: str, steps: list[Any] | None = STEPS, **more: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": "det"},
        "spec": {"model": {"name": "det", "version": version}},
    }
    rollout: dict[str, Any] = dict(more)
    if steps is not None:
        rollout["canary"] = {"steps": steps, "analysis": {"minAccuracy": 0.9, "window": "10s"}}
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


REVS = {1: rev(1, "1.0.0"), 2: rev(2, "2.0.0")}
STARTED = RolloutState("det", 2, 1, phase=RolloutPhase.PROGRESSING, updated=frozenset({"d00"}))
CANARY = dep_of(manifest("2.0.0")).spec.rollout.canary


def views(state: RolloutState, phase: TargetPhase = TargetPhase.READY) -> list[DeviceView]:
    return [
        DeviceView(n, target=phase if n in state.updated else TargetPhase.ABSENT, serving=True)
        for n in DEVICES
    ]


def failing() -> Analysis:
    check = Check("accuracy", Verdict.FAIL, 0.5, 0.9, "accuracy 0.5000 is below minAccuracy 0.9")
    return Analysis(Verdict.FAIL, (check,), Figures(), Figures(), 10.0)


@pytest.mark.parametrize(
    ("state", "full", "step", "message"),
    [
        # at the timed pause of step 2: past it and the pause until resume right after it
        (replace(STARTED, step=1), False, 3, "promoted by ana past the pauses of canary steps 2-3"),
        # paused at the pause until resume (step 3)
        (
            replace(STARTED, step=2, phase=RolloutPhase.PAUSED, reason="CanaryPause"),
            False,
            3,
            "promoted by ana past the pause of canary step 3",
        ),
        # --full: past every remaining step, from a weight step too
        (STARTED, True, 6, "promoted by ana past every remaining canary step (from step 1 of 6)"),
        (replace(STARTED, step=4), True, 6, "from step 5 of 6"),
    ],
)
def test_promote_goes_past_the_pauses_or_every_step(
    state: RolloutState, full: bool, step: int, message: str
) -> None:
    new = act(state, "promote", CANARY, T, actor="ana", full=full)
    assert (new.phase, new.reason, new.step, new.full) == (
        RolloutPhase.PROGRESSING,
        "Promoted",
        step,
        full,
    )
    assert message in new.message
    assert (new.step_at, new.step_ready_at, new.progress_at) == (T, 0.0, T)
    assert new.updated == state.updated  # promote assigns nobody: the planner does


@pytest.mark.parametrize(
    ("state", "canary", "full", "why"),
    [
        (STARTED, CANARY, False, "at canary step 1 of 6 (10%), not at a pause: nothing to promote"),
        (replace(STARTED, phase=RolloutPhase.COMPLETE), CANARY, False, "Complete: nothing to"),
        (
            replace(STARTED, phase=RolloutPhase.ROLLED_BACK),
            CANARY,
            True,
            "RolledBack: nothing to promote (rollout resume retries it)",
        ),
        (STARTED, None, True, "has no canary steps (spec.rollout.canary): nothing to promote"),
        (replace(STARTED, step=6), CANARY, True, "past its 6 canary steps already"),
        (
            replace(STARTED, step=1, phase=RolloutPhase.PAUSED, reason="Paused"),
            CANARY,
            False,
            "paused by an operator: rollout resume",
        ),
    ],
)
def test_promote_is_refused_where_it_does_not_apply(
    state: RolloutState, canary: Any, full: bool, why: str
) -> None:
    with pytest.raises(ActionRefused, match=why.replace("(", r"\(").replace(")", r"\)")):
        act(state, "promote", canary, T, actor="ana", full=full)


def test_after_promote_full_the_planner_takes_the_rest_and_the_analysis_no_longer_decides() -> None:
    m = manifest("2.0.0", maxSurge=0, maxUnavailable="100%")
    dep = dep_of(m)
    promoted = act(STARTED, "promote", CANARY, T, actor="ana", full=True)
    step = plan_rollout(dep, m, REVS, promoted, views(promoted), T + 1, analysis=failing())
    assert step.state is not None and step.state.phase is RolloutPhase.PROGRESSING
    assert step.state.updated == frozenset(DEVICES)  # 100% within the budget at once
    done = plan_rollout(dep, m, REVS, step.state, views(step.state), T + 2, analysis=failing())
    assert done.state is not None and done.state.phase is RolloutPhase.COMPLETE
    # without --full the same analysis rolls it back
    back = plan_rollout(dep, m, REVS, STARTED, views(STARTED), T + 1, analysis=failing())
    assert back.state is not None and back.state.reason == "AnalysisFailed"
    # a device failing the revision still rolls a promoted rollout back
    broken = [replace(v, target=TargetPhase.BROKEN, broken_reason="x") for v in views(promoted)]
    back = plan_rollout(dep, m, REVS, promoted, broken, T + 1)
    assert back.state is not None and back.state.reason == "RevisionFailed"


def test_abort_sends_the_stable_revision_and_stays_until_the_template_changes() -> None:
    m = manifest("2.0.0")
    dep = dep_of(m)
    aborted = act(replace(STARTED, full=True), "abort", CANARY, T, actor="ana")
    assert (aborted.phase, aborted.reason, aborted.full) == (
        RolloutPhase.ROLLED_BACK,
        "Aborted",
        False,
    )
    assert "revision 2 aborted by ana; every device is back on revision 1" in aborted.message
    assert all(aborted.revision_for(d) == 1 for d in DEVICES)
    # the planner leaves it aborted, whatever the devices report
    assert plan_rollout(dep, m, REVS, aborted, views(aborted), T + 999).state is None
    # a new template is a new rollout from the stable revision
    new = manifest("3.0.0")
    step = plan_rollout(dep_of(new), new, REVS, aborted, views(aborted), T + 1000)
    assert step.revision is not None and step.revision.number == 3
    assert step.state is not None and (step.state.phase, step.state.stable) == (
        RolloutPhase.PROGRESSING,
        1,
    )
    # resume retries the same revision from the start
    retried = act(aborted, "resume", CANARY, T + 5, actor="bo")
    assert (retried.phase, retried.step, retried.updated) == (
        RolloutPhase.PROGRESSING,
        0,
        frozenset(),
    )
    assert "retried from the start by bo" in retried.message


@pytest.mark.parametrize("phase", [RolloutPhase.COMPLETE, RolloutPhase.ROLLED_BACK])
def test_abort_of_a_rollout_not_in_progress_is_refused(phase: RolloutPhase) -> None:
    with pytest.raises(ActionRefused, match=f"is {phase.value}: nothing to abort"):
        act(replace(STARTED, phase=phase), "abort", CANARY, T, actor="ana")


@pytest.mark.parametrize("action", ["abort", "promote"])
def test_the_stable_template_applied_again_has_nothing_to_abort_or_promote(action: str) -> None:
    """Its devices refusing it hold it Progressing (RevisionRefused): an abort would say it
    rolled back to itself."""
    reverting = RolloutState("det", 1, 1, phase=RolloutPhase.PROGRESSING, reason="RevisionRefused")
    with pytest.raises(
        ActionRefused, match=f"stable revision 1 applied again.*nothing to {action}"
    ):
        act(reverting, action, CANARY, T, actor="ana")


def test_restart_rolls_the_complete_revision_out_again_as_a_new_revision() -> None:
    m = manifest("2.0.0")
    dep = dep_of(m)
    complete = RolloutState("det", 2, 2, phase=RolloutPhase.COMPLETE, updated=frozenset(DEVICES))
    restarted = act(complete, "restart", CANARY, T, actor="ana")
    assert restarted.restarted_at == "1970-01-01T00:16:40.000Z"
    assert restarted.phase is RolloutPhase.COMPLETE  # the planner makes the new revision
    step = plan_rollout(dep, m, REVS, restarted, views(restarted), T + 1)
    assert step.revision is not None and step.revision.number == 3
    assert step.revision.manifest["metadata"]["annotations"] == {
        RESTARTED_AT: restarted.restarted_at
    }
    assert step.revision.manifest["spec"] == m["spec"]  # the same template otherwise
    assert step.state is not None
    assert (step.state.phase, step.state.revision, step.state.stable) == (
        RolloutPhase.PROGRESSING,
        3,
        2,
    )
    assert "(a restart of revision 2)" in step.state.message
    assert step.state.restarted_at == restarted.restarted_at  # carried on
    # the same manifest applied again makes no other revision: the restart stays in the state
    revs = {**REVS, 3: step.revision}
    again = plan_rollout(dep, m, revs, step.state, views(step.state), T + 2)
    assert again.revision is None
    # a real change later keeps the restart annotation (no second restart of its own)
    new = manifest("3.0.0")
    later = plan_rollout(dep_of(new), new, revs, step.state, views(step.state), T + 3)
    assert later.revision is not None
    assert later.revision.manifest["metadata"]["annotations"][RESTARTED_AT] == (
        restarted.restarted_at
    )
    assert "restart" not in (later.state.message if later.state else "")


@pytest.mark.parametrize(
    ("phase", "hint"),
    [
        (RolloutPhase.PROGRESSING, "wait for it to end, or abort it"),
        (RolloutPhase.PAUSED, "resume or abort it first"),
        (RolloutPhase.ROLLED_BACK, "rollout resume retries its revision"),
    ],
)
def test_restart_needs_a_complete_rollout(phase: RolloutPhase, hint: str) -> None:
    with pytest.raises(ActionRefused, match=hint):
        act(replace(STARTED, phase=phase), "restart", CANARY, T, actor="ana")


def test_the_restart_annotation_is_part_of_the_template_only_when_set() -> None:
    m = manifest("2.0.0")
    assert with_restart(m, "") is m
    assert template_hash(with_restart(m, "a")) != template_hash(m)
    assert template_hash(with_restart(m, "a")) != template_hash(with_restart(m, "b"))
    # other annotations are not part of the template
    other = {**m, "metadata": {**m["metadata"], "annotations": {"note": "x"}}}
    assert template_hash(other) == template_hash(m)


@pytest.mark.parametrize(
    ("action", "state", "phase", "reason", "message"),
    [
        ("pause", STARTED, RolloutPhase.PAUSED, "Paused", "paused by ana"),
        (
            "resume",
            replace(STARTED, phase=RolloutPhase.PAUSED, reason="CanaryPause", step=2),
            RolloutPhase.PROGRESSING,
            "Resumed",
            "resumed by ana after the pause of canary step 3",
        ),
    ],
)
def test_pause_and_resume_name_who_acted(
    action: str, state: RolloutState, phase: RolloutPhase, reason: str, message: str
) -> None:
    new = act(state, action, CANARY, T, actor="ana")
    assert (new.phase, new.reason, new.message) == (phase, reason, message)


def test_full_applies_to_promote_only_and_unknown_actions_are_refused() -> None:
    with pytest.raises(ActionRefused, match="--full applies to promote only"):
        act(STARTED, "abort", CANARY, T, actor="ana", full=True)
    with pytest.raises(ActionRefused, match="unknown rollout action 'explode'"):
        act(STARTED, "explode", CANARY, T, actor="ana")


def test_the_new_fields_survive_the_store() -> None:
    state = replace(STARTED, full=True, restarted_at="2026-12-06T23:00:00.000Z")
    assert RolloutState.from_json(state.to_json()) == state
    assert "full" not in STARTED.to_json() and "restartedAt" not in STARTED.to_json()


def test_restart_is_refused_while_a_device_runs_an_edged_that_would_not_restart() -> None:
    assert restart_refusal("det", {"a": "0.2.0", "b": "", "c": "0.3.1", "d": "unknown"}) is None
    why = restart_refusal("det", {"a": "0.2.0", "old-1": "0.1.0", "old-2": "0.1.7"})
    assert why == (
        "rollout restart of det is refused: edged before 0.2 keeps its workers for it (a "
        "restart that would not happen) on old-1 (0.1.0), old-2 (0.1.7); upgrade them first "
        "(kind: AgentUpgrade)"
    )
