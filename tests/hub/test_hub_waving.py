"""Federated rollouts in waves (hub.decide.wave): the spec's validation, what each region is sent,
and the planner's steps as tables. Pure: no store, no clock, no network."""

from __future__ import annotations

from typing import Any

import pytest

from edgefleet.api import API_VERSION, CanaryAnalysis, ModelDeployment, Wave, parse_manifest
from edgefleet.api.explaining import explain
from edgefleet.errors import ValidationError
from edgefleet.v1 import federation_pb2
from hub.decide import regionslice
from hub.decide.analysis import Sample
from hub.decide.rollout import (
    MAX_WEIGHT,
    Revision,
    RolloutPhase,
    RolloutState,
    max_weight_of,
    template_hash,
)
from hub.decide.wave import (
    RegionSide,
    RegionView,
    RevisionFigures,
    WavePhase,
    WaveState,
    analyze_regions,
    expected_template,
    pause,
    plan_waves,
    region_manifest,
    resume,
    side_figures,
    start,
)
from hub.decide.wavestatus import waves_status
from hub.state import regionmapping


def manifest(version: str = "2.0.0", waves: list[Any] | None = None, **spec: Any) -> dict[str, Any]:
    rollout: dict[str, Any] = {"maxSurge": 1}
    if waves is not None:
        rollout["waves"] = waves
    doc = {
        "apiVersion": API_VERSION,
        "kind": "ModelDeployment",
        "metadata": {"name": "det"},
        "spec": {
            "model": {"name": "det", "version": version},
            "replicas": {"perDevice": 1},
            "rollout": rollout,
            **spec,
        },
    }
    return parse_manifest(doc).to_dict()


def problems_of(doc: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ValidationError) as info:
        parse_manifest(doc)
    return {p.path: p.message for p in info.value.problems}


# -- the spec ----------------------------------------------------------------------------------


def test_waves_parse_and_round_trip() -> None:
    doc = manifest(
        waves=[{"regions": ["eu-west"]}, {"pause": {"duration": "10m"}}, {"regions": ["us", "ap"]}]
    )
    dep = parse_manifest(doc)
    assert isinstance(dep, ModelDeployment)
    assert dep.spec.rollout.waves == (
        Wave(regions=("eu-west",)),
        Wave(pause=True, pause_s=600.0),
        Wave(regions=("us", "ap")),
    )
    assert parse_manifest(dep.to_dict()) == dep
    assert doc["spec"]["rollout"]["waves"][1] == {"pause": {"duration": "600s"}}


@pytest.mark.parametrize(
    ("waves", "path", "words"),
    [
        ([], "spec.rollout.waves", "at least one wave"),
        ([{"regions": []}], "spec.rollout.waves[0].regions", "at least one region"),
        ([{"regions": ["Not A Label"]}], "spec.rollout.waves[0].regions[0]", ""),
        ([{"regions": ["eu"]}, {"regions": ["eu"]}], "spec.rollout.waves[1].regions[0]", "already"),
        ([{"regions": ["eu", "eu"]}], "spec.rollout.waves[0].regions[1]", "duplicates"),
        ([{"regions": ["eu"], "pause": {}}], "spec.rollout.waves[0]", "exactly one"),
        ([{}], "spec.rollout.waves[0]", "exactly one of regions, percent or pause"),
        ([{"percent": 25}], "spec.rollout.waves[0].percent", "must be a percentage"),
        ([{"percent": "100%"}], "spec.rollout.waves[0].percent", "from 1% to 99%"),
        ([{"percent": "50%"}, {"percent": "25%"}], "spec.rollout.waves", "strictly increasing"),
        ([{"percent": "5%", "regions": ["eu"]}], "spec.rollout.waves[0]", "exactly one"),
        ([{"pause": {}}], "spec.rollout.waves", "at least one wave of regions"),
        ([{"pause": {"duration": "soon"}}, {"regions": ["eu"]}], "spec.rollout.waves[0].pause", ""),
        ([{"regions": ["eu"], "extra": 1}], "spec.rollout.waves[0].extra", "unknown field"),
        ([{"regions": [f"r{i}"]} for i in range(21)], "spec.rollout.waves", "at most 20"),
        ("eu", "spec.rollout.waves", "must be a list"),
    ],
)
def test_bad_waves_are_refused_naming_the_field(waves: Any, path: str, words: str) -> None:
    doc = {
        "apiVersion": API_VERSION,
        "kind": "ModelDeployment",
        "metadata": {"name": "det"},
        "spec": {"model": {"name": "det", "version": "1"}, "rollout": {"waves": waves}},
    }
    problems = problems_of(doc)
    hits = {p: m for p, m in problems.items() if p.startswith(path)}
    assert hits, problems
    assert any(words in m for m in hits.values()), problems


def test_a_wave_region_must_be_placed() -> None:
    doc = {
        "apiVersion": API_VERSION,
        "kind": "ModelDeployment",
        "metadata": {"name": "det"},
        "spec": {
            "model": {"name": "det", "version": "1"},
            "placement": {"regions": ["eu"]},
            "rollout": {"waves": [{"regions": ["eu"]}, {"regions": ["us"]}]},
        },
    }
    assert problems_of(doc) == {
        "spec.rollout.waves[1].regions[0]": "'us' is not in placement.regions (eu)"
    }


def test_explain_has_the_waves() -> None:
    node = explain("ModelDeployment", "spec.rollout.waves")
    assert "root hub" in node.description
    assert {"regions", "pause", "percent"} <= set(node.fields)
    assert "percentage" in node.fields["percent"].description


# -- what regions are sent ----------------------------------------------------------------------

WAVES = [{"regions": ["eu"]}, {"pause": {"duration": "60s"}}, {"regions": ["us"]}]


def revision(number: int, version: str) -> Revision:
    m = manifest(version, WAVES)
    return Revision("det", number, template_hash(m), m, 1.0)


def progressing(**fields: Any) -> WaveState:
    base = WaveState(
        "det",
        2,
        1,
        revision(1, "1.0.0").manifest,
        version="2.0.0",
        stable_version="1.0.0",
        phase=WavePhase.PROGRESSING,
        step_at=100.0,
    )
    return _replace(base, **fields)


def _replace(state: WaveState, **fields: Any) -> WaveState:
    from dataclasses import replace

    return replace(state, **fields)


def test_a_region_not_released_gets_the_stable_revision_and_never_the_waves() -> None:
    current = manifest("2.0.0", WAVES, placement={"nodeSelector": {"site": "a"}})
    state = progressing(released=frozenset({"eu"}))
    eu = region_manifest(current, state, "eu")
    us = region_manifest(current, state, "us")
    assert eu["spec"]["model"]["version"] == "2.0.0"
    assert us["spec"]["model"]["version"] == "1.0.0"
    for sent in (eu, us):
        assert "waves" not in sent["spec"]["rollout"]
        assert sent["spec"]["placement"] == {"nodeSelector": {"site": "a"}}  # the current one
        parse_manifest(dict(sent))  # a region can take it
    assert template_hash(us) == template_hash(revision(1, "1.0.0").manifest)
    back = _replace(state, phase=WavePhase.ROLLED_BACK)
    assert region_manifest(current, back, "eu")["spec"]["model"]["version"] == "1.0.0"
    done = _replace(state, phase=WavePhase.COMPLETE)
    assert region_manifest(current, done, "us")["spec"]["model"]["version"] == "2.0.0"
    assert region_manifest(current, None, "us")["spec"]["model"]["version"] == "2.0.0"


def test_a_regions_replica_override_is_no_other_template() -> None:
    """Replicas are outside a revision's template (a scale is no rollout): a region with its
    own replica count expects the same template as the others."""
    m = manifest("2.0.0", WAVES)
    m["metadata"]["annotations"] = {f"{regionslice.REPLICAS_OVERRIDE}eu": "3"}
    assert expected_template(m, "eu") == expected_template(m, "us")
    assert expected_template(m, "eu") == template_hash(regionslice.with_overrides(m, "eu"))


def test_a_regions_model_variant_moves_with_the_waves() -> None:
    """eu runs the variant det-int8: before its wave at the stable version, after it at the
    new one; the template the root expects from eu is the variant's."""
    current = manifest("2.0.0", WAVES)
    current["metadata"]["annotations"] = {f"{regionslice.MODEL_OVERRIDE}eu": "det-int8"}
    waiting = progressing()
    released = progressing(released=frozenset({"eu"}))

    def sent(state: WaveState, region: str) -> dict[str, Any]:
        out = regionslice.with_overrides(region_manifest(current, state, region), region)
        return dict(out["spec"]["model"])

    assert sent(waiting, "eu") == {"name": "det-int8", "version": "1.0.0"}
    assert sent(released, "eu") == {"name": "det-int8", "version": "2.0.0"}
    assert sent(released, "us") == {"name": "det", "version": "1.0.0"}
    assert expected_template(current, "eu") != expected_template(current, "us")
    assert expected_template(current, "eu") == template_hash(
        regionslice.with_overrides(current, "eu")
    )


# -- a new revision -----------------------------------------------------------------------------


def test_a_new_revision_starts_waves_from_the_stable_one() -> None:
    revisions = {1: revision(1, "1.0.0"), 2: revision(2, "2.0.0")}
    waves = parse_waves(WAVES)
    first, events = start(None, None, revisions[1], {1: revisions[1]}, waves, 10.0)
    assert (first.phase, first.revision, first.stable, events) == (WavePhase.COMPLETE, 1, 1, ())
    second, events = start(first, None, revisions[2], revisions, waves, 20.0)
    assert (second.phase, second.revision, second.stable) == (WavePhase.PROGRESSING, 2, 1)
    assert second.stable_manifest == revisions[1].manifest
    assert [e.reason for e in events] == ["WavesStarted"]
    # a third revision during the second's waves: from the same stable revision
    third, _ = start(second, None, revision(3, "3.0.0"), {**revisions, 3: revision(3, "3.0.0")},
                     waves, 30.0)  # fmt: skip
    assert (third.revision, third.stable, third.released) == (3, 1, frozenset())
    # the stable revision's template again (rollout undo after a rollback): nothing to wave
    back = _replace(second, phase=WavePhase.ROLLED_BACK)
    copy = Revision("det", 3, revisions[1].template, revisions[1].manifest, 30.0, source=1)
    undone, events = start(back, None, copy, {**revisions, 3: copy}, waves, 30.0)
    assert (undone.phase, undone.stable, events) == (WavePhase.COMPLETE, 3, ())
    # without waves: every region at once
    plain, events = start(first, None, revisions[2], revisions, (), 20.0)
    assert (plain.phase, plain.stable, events) == (WavePhase.COMPLETE, 2, ())
    # a deployment the root knew before waves: from its own rollout's stable revision
    rollout = RolloutState("det", 1, 1, phase=RolloutPhase.COMPLETE)
    old, _ = start(None, rollout, revisions[2], revisions, waves, 20.0)
    assert (old.phase, old.stable) == (WavePhase.PROGRESSING, 1)


def parse_waves(waves: list[Any]) -> tuple[Wave, ...]:
    dep = parse_manifest(manifest("1.0.0", waves))
    assert isinstance(dep, ModelDeployment)
    return dep.spec.rollout.waves


# -- the planner -----------------------------------------------------------------------------

PLACED = ["ap", "eu", "us"]
NEW = {r: f"new-{r}" for r in PLACED}


def view(region: str, template: str = "", phase: str = "Complete", **fields: Any) -> RegionView:
    return RegionView(
        region,
        connected=fields.pop("connected", True),
        reported=fields.pop("reported", True),
        template=template or f"old-{region}",
        phase=phase,
        desired=fields.pop("desired", 2),
        updated=fields.pop("updated", 2),
        ready=fields.pop("ready", 2),
        **fields,
    )


def done(region: str) -> RegionView:
    return view(region, NEW[region], "Complete")


def plan(state: WaveState, *views: RegionView, now: float = 100.0, waves: Any = None) -> Any:
    return plan_waves(
        parse_waves(WAVES if waves is None else waves),
        state,
        PLACED,
        NEW,
        {v.name: v for v in views},
        now,
    )


@pytest.mark.parametrize(
    ("state", "views", "now", "expected"),
    [
        # wave 1 starts: eu is released
        (progressing(), [view("eu"), view("us")], 100.0, ("WaveStarted", 0, {"eu"})),
        # eu rolling out: nothing to do
        (
            progressing(released=frozenset({"eu"}), reason="WaveStarted"),
            [view("eu", NEW["eu"], "Progressing")],
            100.0,
            None,
        ),
        # eu still on the old template though Complete (the slice has not arrived): waits
        (progressing(released=frozenset({"eu"})), [view("eu")], 100.0, None),
        # eu done: the wave passes, the pause starts
        (
            progressing(released=frozenset({"eu"})),
            [done("eu")],
            100.0,
            ("WavePassed", 1, {"eu"}),
        ),
        # the pause: waits its 60 s, then passes
        (progressing(released=frozenset({"eu"}), step=1, step_at=50.0), [done("eu")], 100.0, None),
        (
            progressing(released=frozenset({"eu"}), step=1, step_at=30.0),
            [done("eu")],
            100.0,
            ("WavePassed", 2, {"eu"}),
        ),
        # wave 3: us
        (
            progressing(released=frozenset({"eu"}), step=2),
            [done("eu")],
            100.0,
            ("WaveStarted", 2, {"eu", "us"}),
        ),
        # us done: past the last wave, ap (named by no wave) follows
        (
            progressing(released=frozenset({"eu", "us"}), step=2),
            [done("eu"), done("us")],
            100.0,
            ("WavePassed", 3, {"eu", "us"}),
        ),
        (
            progressing(released=frozenset({"eu", "us"}), step=3),
            [done("eu"), done("us"), view("ap")],
            100.0,
            ("WaveStarted", 3, {"ap", "eu", "us"}),
        ),
        (
            progressing(released=frozenset(PLACED), step=3),
            [done("eu"), done("us"), done("ap")],
            100.0,
            ("RolloutComplete", 3, set(PLACED)),
        ),
    ],
)
def test_waves_move_on_as_their_regions_complete(
    state: WaveState, views: list[RegionView], now: float, expected: Any
) -> None:
    step = plan(state, *views, now=now)
    if expected is None:
        assert step.state is None and step.events == ()
        return
    reason, index, released = expected
    assert step.state is not None
    assert (step.state.reason, step.state.step, set(step.state.released)) == (
        reason,
        index,
        released,
    )
    assert [e.reason for e in step.events] == [reason]
    if reason == "RolloutComplete":
        assert step.state.phase is WavePhase.COMPLETE and step.state.stable == 2


def test_a_region_that_rolled_back_rolls_every_region_back_naming_it_and_its_figures() -> None:
    state = progressing(released=frozenset({"eu"}))
    failed = view(
        "eu",
        NEW["eu"],
        "RolledBack",
        reason="RevisionFailed",
        message="revision 2 (2.0.0) failed on 1 device(s) (cam-1: Refused: bad signature)",
        updated=1,
        ready=0,
        failing={"cam-1": "Refused"},
    )
    step = plan(state, failed, view("us"))
    assert step.state is not None
    assert (step.state.phase, step.state.reason) == (WavePhase.ROLLED_BACK, "RegionFailed")
    message = step.state.message
    assert "failed in region eu at wave 1 of 3 (eu)" in message
    assert "1 of 2 devices updated, 0 ready" in message and "cam-1: Refused" in message
    assert "is sent revision 1 (1.0.0) again" in message
    assert [(e.type, e.reason) for e in step.events] == [("Warning", "RolledBack")]
    assert step.state.history[-1]["regions"]["eu"]["failing"] == {"cam-1": "Refused"}
    assert not any(step.state.sends_new(r) for r in PLACED)
    # a region's rollback of an older template (before the wave) is not this revision's
    assert plan(state, view("eu", "old-eu", "RolledBack")).state is None
    # rolled back: nothing more happens; resume retries from the first wave
    assert plan(step.state, failed).state is None
    retried = resume(parse_waves(WAVES), step.state, 200.0)
    assert retried is not None
    assert (retried.phase, retried.step, retried.released) == (
        WavePhase.PROGRESSING,
        0,
        frozenset(),
    )


def test_an_unreachable_region_holds_the_wave_neither_pass_nor_fail() -> None:
    state = progressing(released=frozenset({"eu"}))
    step = plan(state, view("eu", NEW["eu"], "Complete", connected=False))
    assert step.state is not None
    assert step.state.phase is WavePhase.PROGRESSING and step.state.reason == "RegionUnreachable"
    assert "region eu is unreachable" in step.state.message and step.state.step == 0
    assert [(e.type, e.reason) for e in step.events] == [("Warning", "WaveWaiting")]
    # said once, and as a condition
    assert plan(step.state, view("eu", NEW["eu"], "Complete", connected=False)).state is None
    shown = waves_status(parse_waves(WAVES), step.state, PLACED, NEW, {})
    assert shown["conditions"] == [
        {
            "type": "RegionsReachable",
            "status": "False",
            "reason": "RegionUnreachable",
            "message": step.state.message,
        }
    ]
    # a region not heard from at all (a root restarted): the same
    quiet = plan(state, RegionView("eu", connected=True)).state
    assert quiet is not None and "has not reported the deployment yet" in quiet.message
    # back, still rolling out: the condition is cleared
    back = plan(step.state, view("eu", NEW["eu"], "Progressing"))
    assert back.state is not None and back.state.reason == "WaveProgressing"
    # back and done: the wave passes
    passed = plan(step.state, done("eu"))
    assert passed.state is not None and passed.state.reason == "WavePassed"


def deadline_plan(state: WaveState, *views: RegionView, now: float, waves: Any = None) -> Any:
    return plan_waves(
        parse_waves(WAVES if waves is None else waves),
        state,
        PLACED,
        NEW,
        {v.name: v for v in views},
        now,
        None,
        30,
    )


SLOW = view("eu", NEW["eu"], "Progressing", updated=1, ready=0, failing={"cam-2": "Loading"})


@pytest.mark.parametrize(
    ("state", "views", "now", "outcome"),
    [
        # within the deadline (30 s from the wave's start at 100): waits
        (progressing(released=frozenset({"eu"})), [SLOW], 130.0, None),
        # past it: the wave fails
        (progressing(released=frozenset({"eu"})), [SLOW], 130.5, "ProgressDeadlineExceeded"),
        # the region finished just in time: the wave passes, however late the pass looks
        (progressing(released=frozenset({"eu"})), [done("eu")], 500.0, "WavePassed"),
        # the deadline counts from when the regions were sent it (deadline_from), the later
        (progressing(released=frozenset({"eu"}), deadline_from=120.0), [SLOW], 140.0, None),
        (
            progressing(released=frozenset({"eu"}), deadline_from=120.0),
            [SLOW],
            150.5,
            "ProgressDeadlineExceeded",
        ),
        # a region unreachable holds the wave, deadline or not (neither pass nor fail)
        (
            progressing(released=frozenset({"eu"})),
            [_replace(SLOW, connected=False)],
            1000.0,
            "RegionUnreachable",
        ),
        # back after the deadline: it counts again from now
        (
            progressing(released=frozenset({"eu"}), reason="RegionUnreachable", message="x"),
            [SLOW],
            1000.0,
            "WaveProgressing",
        ),
        # a pause wave is not bounded by it
        (progressing(released=frozenset({"eu"}), step=1), [done("eu")], 159.0, None),
        # nor a wave held for the operator
        (
            progressing(released=frozenset({"eu"}), phase=WavePhase.PAUSED),
            [SLOW],
            1000.0,
            None,
        ),
    ],
)
def test_a_wave_not_passed_within_the_progress_deadline_fails(
    state: WaveState, views: list[RegionView], now: float, outcome: str | None
) -> None:
    waves = [{"regions": ["eu"]}, {"pause": {"duration": "60s"}}, {"regions": ["us"]}]
    step = deadline_plan(state, *views, now=now, waves=waves)
    if outcome is None:
        assert step.state is None, step.state
        return
    assert step.state is not None and step.state.reason == outcome, step.state
    if outcome == "WaveProgressing":
        assert step.state.deadline_from == now
        assert deadline_plan(step.state, *views, now=now + 30).state is None
        late = deadline_plan(step.state, *views, now=now + 31).state
        assert late is not None and late.reason == "ProgressDeadlineExceeded"
    if outcome != "ProgressDeadlineExceeded":
        return
    assert step.state.phase is WavePhase.ROLLED_BACK
    message = step.state.message
    assert (
        "revision 2 (2.0.0) did not pass wave 1 of 3 (eu) within progressDeadlineSeconds 30 s: "
        "not finished in eu (eu: 1 of 2 devices updated, 0 ready, rollout Progressing)"
    ) in message, message
    assert "every region (eu) is sent revision 1 (1.0.0) again" in message
    assert [(e.type, e.reason) for e in step.events] == [("Warning", "RolledBack")]
    assert step.events[0].message == message
    last = step.state.history[-1]
    assert (last["wave"], last["outcome"]) == (1, "Failed")
    assert last["regions"]["eu"]["failing"] == {"cam-2": "Loading"}
    assert not any(step.state.sends_new(r) for r in PLACED)
    # the state survives the store
    assert WaveState.from_json(step.state.to_json()) == step.state


def test_the_progress_deadline_bounds_a_percent_wave_and_the_remaining_regions() -> None:
    held = view("eu", NEW["eu"], "Progressing", reason="WeightHeld", updated=1)
    slow_us = view("us", NEW["us"], "Progressing", updated=0, ready=0)
    percent = progressing(weights={"eu": 10, "us": 10, "ap": 10})
    # eu held at its weight counts as finished; us did not get there
    step = deadline_plan(percent, held, slow_us, done("ap"), now=131.0, waves=[{"percent": "10%"}])
    assert step.state is not None and step.state.reason == "ProgressDeadlineExceeded"
    assert "not finished in us (us: 0 of 2" in step.state.message
    assert "every region (ap, eu, us) is sent revision 1 (1.0.0) again" in step.state.message
    # the remaining regions after the last wave too
    rest = progressing(released=frozenset(PLACED), step=3)
    slow_ap = view("ap", NEW["ap"], "Progressing", updated=0, ready=0)
    step = deadline_plan(rest, done("eu"), done("us"), slow_ap, now=131.0)
    assert step.state is not None and step.state.reason == "ProgressDeadlineExceeded"
    assert "did not pass the remaining regions within" in step.state.message
    # resume after it: the same revision again from the first wave, the deadline from then
    retried = resume(parse_waves(WAVES), step.state, 500.0)
    assert retried is not None and retried.deadline_from == 500.0
    # resume after an operator's pause: the deadline counts from the resume
    paused = pause(progressing(released=frozenset({"eu"})), 110.0)
    assert paused is not None
    resumed = resume(parse_waves(WAVES), paused, 400.0)
    assert resumed is not None and resumed.deadline_from == 400.0
    assert deadline_plan(resumed, SLOW, now=430.0).state is None


def test_a_pause_without_duration_waits_for_resume_and_an_operator_can_pause() -> None:
    waves = [{"regions": ["eu"]}, {"pause": {}}, {"regions": ["us"]}]
    state = progressing(released=frozenset({"eu"}), step=1)
    step = plan(state, done("eu"), waves=waves, now=10_000.0)
    assert step.state is not None
    assert (step.state.phase, step.state.reason) == (WavePhase.PAUSED, "WavePause")
    assert plan(step.state, done("eu"), waves=waves, now=20_000.0).state is None
    resumed = resume(parse_waves(waves), step.state, 300.0)
    assert resumed is not None and (resumed.phase, resumed.step) == (WavePhase.PROGRESSING, 2)
    # an operator's pause holds the next wave, resume goes on at the same wave
    held = pause(progressing(released=frozenset({"eu"})), 100.0)
    assert held is not None and held.phase is WavePhase.PAUSED
    assert plan(held, done("eu")).state is None
    again = resume(parse_waves(WAVES), held, 110.0)
    assert again is not None and (again.phase, again.step) == (WavePhase.PROGRESSING, 0)
    assert resume(parse_waves(WAVES), progressing(), 1.0) is None
    assert pause(_replace(progressing(), phase=WavePhase.COMPLETE), 1.0) is None


def test_removing_the_waves_releases_every_region() -> None:
    step = plan_waves((), progressing(), PLACED, NEW, {}, 100.0)
    assert step.state is not None and step.state.phase is WavePhase.COMPLETE
    assert step.state.sends_new("us")


def test_status_shows_each_wave_its_regions_state_and_figures() -> None:
    state = progressing(released=frozenset({"eu"}), step=1, step_at=90.0)
    views = {"eu": done("eu"), "us": view("us", connected=False), "ap": view("ap")}
    shown = waves_status(parse_waves(WAVES), state, PLACED, NEW, views)
    assert [(w["wave"], w["state"]) for w in shown["waves"]] == [
        (1, "Passed"),
        (2, "Progressing"),
        (3, "Pending"),
        (4, "Pending"),
    ]
    assert shown["waves"][3]["rest"] and list(shown["waves"][3]["regions"]) == ["ap"]
    eu = shown["waves"][0]["regions"]["eu"]
    assert (eu["sent"], eu["updatedToRevision"], eu["readyDevices"]) == ("new", True, 2)
    us = shown["waves"][2]["regions"]["us"]
    assert (us["sent"], us["connected"]) == ("stable", False)
    from edgectl.rollouts import render

    doc = {"metadata": {"name": "det"}, "status": {"rollout": {"waves": shown}}}
    text, phase = render(doc)
    assert phase == "Progressing"
    assert "det: revision 2 (2.0.0) across regions, stable revision 1 (1.0.0)" in text
    assert "wave 1 [Passed]: regions eu" in text and "wave 2 [Progressing]: pause 60s" in text
    assert "then [Pending]: the remaining regions ap" in text
    assert "unreachable" in text


# -- the analysis across regions ----------------------------------------------------------------


def test_side_figures_add_up_regions_over_the_window() -> None:
    eu = RegionSide(
        "eu",
        RevisionFigures("t", devices=2, requests=150, errors=15, latency_p95_s=0.02, accuracy=0.97,
                        accuracy_devices=2),
        (Sample(0.0, 100, 5), Sample(50.0, 120, 10), Sample(100.0, 150, 15)),
    )  # fmt: skip
    us = RegionSide(
        "us",
        RevisionFigures("t", devices=1, requests=10, errors=0, latency_p95_s=0.05,
                        validation_problems={"cam-9": "NoValidationSet"}),
        (Sample(95.0, 10, 0),),
    )  # fmt: skip
    f = side_figures([eu, us], now=100.0, window=60.0)
    # eu: from its newest sample at least a window old (at 0 s); us: one sample, nothing yet
    assert (f.devices, f.requests, f.errors) == (3, 50, 10)
    assert (f.latency_p95_s, f.accuracy, f.accuracy_devices) == (0.05, 0.97, 2)
    assert f.validation_problems == {"us/cam-9": "NoValidationSet"}


SPEC = CanaryAnalysis(max_error_rate_increase=0.05, min_requests=10, window_s=30.0)


def analysis_of(canary_errors: int, canary_requests: int = 100) -> Any:
    canary = [
        RegionSide(
            "eu",
            RevisionFigures("new-eu", devices=1, requests=canary_requests, errors=canary_errors),
            (Sample(0.0, 0, 0), Sample(100.0, canary_requests, canary_errors)),
        )
    ]
    stable = [
        RegionSide(
            "us",
            RevisionFigures("old-us", devices=1, requests=100, errors=1),
            (Sample(0.0, 0, 0), Sample(100.0, 100, 1)),
        )
    ]
    return analyze_regions(SPEC, canary, stable, 100.0)


def test_a_wave_is_held_for_the_window_and_passes_on_the_analysis() -> None:
    state = progressing(released=frozenset({"eu"}))
    good = analysis_of(2)
    ready = plan_waves(parse_waves(WAVES), state, PLACED, NEW, {"eu": done("eu")}, 100.0, good)
    assert ready.state is not None and ready.state.reason == "WaveReady"
    assert ready.state.ready_at == 100.0 and ready.state.step == 0
    views = {"eu": done("eu")}
    waves = parse_waves(WAVES)
    assert plan_waves(waves, ready.state, PLACED, NEW, views, 120.0, good).state is None  # window
    waiting = analysis_of(0, canary_requests=3)  # too few canary requests: waits
    assert waiting.verdict.value == "Wait"
    assert plan_waves(waves, ready.state, PLACED, NEW, views, 200.0, waiting).state is None
    passed = plan_waves(waves, ready.state, PLACED, NEW, views, 131.0, good)
    assert passed.state is not None and passed.state.reason == "WavePassed"
    assert passed.state.ready_at == 0.0 and passed.state.step == 1
    assert "analysis across regions: error rate 2.00%" in passed.state.message
    assert passed.state.history[-1]["analysis"]["verdict"] == "Pass"


def test_a_failing_analysis_rolls_every_region_back_with_its_figures() -> None:
    state = progressing(released=frozenset({"eu"}), ready_at=100.0)
    bad = analysis_of(30)
    step = plan_waves(parse_waves(WAVES), state, PLACED, NEW, {"eu": done("eu")}, 105.0, bad)
    assert step.state is not None
    assert (step.state.phase, step.state.reason) == (WavePhase.ROLLED_BACK, "AnalysisFailed")
    assert "failed the analysis across regions at wave 1 of 3 (eu)" in step.state.message
    assert "error rate 30.00% (30/100) vs stable 1.00% (1/100)" in step.state.message
    assert "above maxErrorRateIncrease 5.00%" in step.state.message
    assert [(e.type, e.reason) for e in step.events] == [("Warning", "RolledBack")]


def region_report(**figures: Any) -> federation_pb2.RegionReport:
    d = federation_pb2.RegionDeploymentStatus(
        name="det", desired=1, rollout_template="a" * 16, rollout_message="ok"
    )
    d.revision_figures.add(template="a" * 16, devices=1, requests=10, errors=1, **figures)
    return federation_pb2.RegionReport(deployments=[d])


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda r: setattr(r.deployments[0], "rollout_template", "x" * 65), "rollout_template"),
        (lambda r: setattr(r.deployments[0], "rollout_message", "x" * 2000), "rollout_message"),
        (lambda r: setattr(r.deployments[0].revision_figures[0], "errors", 11), "errors: more"),
        (lambda r: setattr(r.deployments[0].revision_figures[0], "accuracy", -1.0), "accuracy"),
        (
            lambda r: setattr(r.deployments[0].revision_figures[0], "latency_p95_s", float("nan")),
            "latency_p95_s",
        ),
        (
            lambda r: [r.deployments[0].revision_figures.add() for _ in range(4)],
            "revision_figures: at most 4",
        ),
        (
            lambda r: (
                r.deployments[0]
                .revision_figures[0]
                .validation_problems.update({f"d{i}": "NoValidationSet" for i in range(9)})
            ),
            "validation_problems: at most 8",
        ),
    ],
)
def test_a_regions_rollout_figures_are_bounded(change: Any, problem: str) -> None:
    r = region_report(accuracy=0.9, latency_p95_s=0.01)
    assert regionmapping.check_report(r) == []
    change(r)
    problems = regionmapping.check_report(r)
    assert any(problem in p and "report.deployments[0]" in p for p in problems), problems


# -- waves of a percentage of every region --------------------------------------------------------

PERCENT_WAVES = [{"percent": "10%"}, {"regions": ["eu"]}]


def test_a_percent_wave_caps_every_region_then_a_region_wave_releases_one_whole() -> None:
    waves = parse_waves(PERCENT_WAVES)
    state = progressing()
    step = plan(state, view("eu"), view("us"), view("ap"), waves=PERCENT_WAVES)
    assert step.state is not None and step.state.weights == {"ap": 10, "eu": 10, "us": 10}
    assert "sent to 10% of the devices of ap, eu, us" in step.state.message
    current = manifest("2.0.0", PERCENT_WAVES)
    sent = region_manifest(current, step.state, "eu")
    assert sent["spec"]["model"]["version"] == "2.0.0"
    assert sent["metadata"]["annotations"] == {MAX_WEIGHT: "10"}
    assert max_weight_of(sent) == 10 and template_hash(sent) == template_hash(current)
    # held at the weight in two regions, rolling out in the third: waits
    held = view("eu", NEW["eu"], "Progressing", reason="WeightHeld")
    going = view("ap", NEW["ap"], "Progressing", reason="RollingUpdate")
    us_held = view("us", NEW["us"], "Progressing", reason="WeightHeld")
    assert plan(step.state, held, going, us_held, waves=PERCENT_WAVES).state is None
    # all held (or complete: a small region): the wave passes
    small = view("ap", NEW["ap"], "Complete")
    passed = plan(step.state, held, small, us_held, waves=PERCENT_WAVES)
    assert passed.state is not None and passed.state.reason == "WavePassed"
    # a region that fails at the weight rolls everything back
    failed = view("us", NEW["us"], "RolledBack", reason="RevisionFailed")
    back = plan(step.state, held, going, failed, waves=PERCENT_WAVES)
    assert back.state is not None and back.state.phase is WavePhase.ROLLED_BACK
    assert "every region (ap, eu, us) is sent revision 1" in back.state.message
    assert region_manifest(current, back.state, "eu")["spec"]["model"]["version"] == "1.0.0"
    # wave 2 releases eu whole: its cap goes
    assert passed.state is not None
    eu_wave = plan(passed.state, held, small, us_held, waves=PERCENT_WAVES)
    assert eu_wave.state is not None and eu_wave.state.released == frozenset({"eu"})
    whole = region_manifest(current, eu_wave.state, "eu")
    assert MAX_WEIGHT not in (whole["metadata"].get("annotations") or {})
    assert region_manifest(current, eu_wave.state, "us")["metadata"]["annotations"] == {
        MAX_WEIGHT: "10"
    }
    shown = waves_status(waves, eu_wave.state, PLACED, NEW, {"eu": held, "us": us_held})
    assert shown["waves"][0]["percent"] == 10 and shown["waves"][0]["state"] == "Passed"
    assert list(shown["waves"][0]["regions"]) == ["ap", "eu", "us"]
    assert shown["waves"][2]["regions"]["us"]["sent"] == "10%"
    from edgectl.rollouts import render

    text, _ = render({"metadata": {"name": "det"}, "status": {"rollout": {"waves": shown}}})
    assert "wave 1 [Passed]: 10% of the devices of ap, eu, us" in text


def test_the_max_weight_annotation_is_refused_at_apply() -> None:
    m = manifest("1.0.0")
    m["metadata"]["annotations"] = {MAX_WEIGHT: "10"}
    problems = regionslice.override_problems(m)
    assert problems and problems[0][0] == f'metadata.annotations["{MAX_WEIGHT}"]'
