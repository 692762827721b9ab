"""An AgentUpgrade's waves across regions (hub.decide.agentwaves), as tables: two waves in
order, a failing region stops the waves and every released region is told to roll back, a
region without the release holds its wave, and what a lying region can claim. Pure: no store,
no clock, no network. With processes: tests/e2e/test_agent_waves.py."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from typing import Any

import pytest

from edgefleet.api import API_VERSION, Wave, parse_manifest
from edgefleet.errors import ValidationError
from hub.decide.agentrevisions import MAX_REVISIONS
from hub.decide.agentwaves import (
    MAX_FAILED,
    MAX_NAME,
    MAX_TEXT,
    AgentWavePhase,
    AgentWaveState,
    RegionAgentView,
    pause,
    plan_agent_waves,
    read_region_claim,
    resume,
    start,
    summed_figures,
)

WAVES = (Wave(regions=("eu",)), Wave(regions=("us",)))
PLACED = ("ap", "eu", "us")
T0 = 1_000.0


def view(
    region: str,
    *,
    phase: str = "Complete",
    revision: int = 1,
    failed: dict[str, str] | None = None,
    releases: tuple[str, ...] = ("0.3.0",),
    connected: bool = True,
    reported: bool = True,
) -> RegionAgentView:
    return RegionAgentView(
        name=region,
        connected=connected,
        reported=reported,
        revision=revision,
        phase=phase,
        pool=3,
        done=3 if phase == "Complete" else 1,
        updating=0,
        failed=failed or {},
        releases=frozenset(releases),
    )


def fresh() -> AgentWaveState:
    return start("edged-0-3-0", 1, "0.3.0", T0)


def ready(**phases: str) -> dict[str, RegionAgentView]:
    """Every region connected, holding the release, not reported yet unless a phase is given."""
    out = {r: view(r, reported=False, phase="") for r in PLACED}
    out.update({r: view(r, phase=p) for r, p in phases.items()})
    return out


def test_two_waves_complete_in_order_then_the_remaining_regions() -> None:
    state = fresh()
    step = plan_agent_waves(WAVES, state, PLACED, ready(), T0 + 1)
    assert step.state is not None and step.state.released == {"eu"}
    assert [e.reason for e in step.events] == ["WaveStarted"]
    state = step.state
    assert state.sends("eu") and not state.sends("us") and not state.sends("ap")
    # eu still progressing: nothing moves, us is not sent
    assert plan_agent_waves(WAVES, state, PLACED, ready(eu="Progressing"), T0 + 2).state is None
    # eu complete: wave 1 passes, then wave 2 sends us
    step = plan_agent_waves(WAVES, state, PLACED, ready(eu="Complete"), T0 + 3)
    assert step.state is not None and step.state.step == 1 and step.state.reason == "WavePassed"
    step = plan_agent_waves(WAVES, step.state, PLACED, ready(eu="Complete"), T0 + 4)
    assert step.state is not None and step.state.released == {"eu", "us"}
    state = step.state
    step = plan_agent_waves(WAVES, state, PLACED, ready(eu="Complete", us="Complete"), T0 + 5)
    assert step.state is not None and step.state.step == 2
    # past the last wave: the regions no wave names (ap)
    step = plan_agent_waves(WAVES, step.state, PLACED, ready(eu="Complete", us="Complete"), T0 + 6)
    assert step.state is not None and step.state.released == {"ap", "eu", "us"}
    done = ready(eu="Complete", us="Complete", ap="Complete")
    step = plan_agent_waves(WAVES, step.state, PLACED, done, T0 + 7)
    assert step.state is not None and step.state.phase is AgentWavePhase.COMPLETE
    assert [h["outcome"] for h in step.state.history] == ["Passed", "Passed", "Passed"]
    assert plan_agent_waves(WAVES, step.state, PLACED, done, T0 + 8).state is None
    assert AgentWaveState.from_json(step.state.to_json()) == step.state


def test_a_failing_region_stops_the_waves_and_every_released_region_rolls_back() -> None:
    state = plan_agent_waves(WAVES, fresh(), PLACED, ready(), T0 + 1).state
    assert state is not None
    failed = {"eu-dev-1": "CommitDeadline: did not connect within 300 s"}
    step = plan_agent_waves(
        WAVES,
        state,
        PLACED,
        ready(eu="RolledBack") | {"eu": view("eu", phase="RolledBack", failed=failed)},
        T0 + 2,
    )
    new = step.state
    assert new is not None and new.phase is AgentWavePhase.ROLLED_BACK
    assert new.reason == "RegionFailed" and new.failed_region == "eu"
    assert new.failed == failed
    assert "region eu" in new.message and "eu-dev-1 (CommitDeadline" in new.message
    assert new.undo("eu") and not new.undo("us") and not new.sends("us")
    assert [e.type for e in step.events] == ["Warning"]
    # stopped: us is never sent, whatever comes later
    later = plan_agent_waves(WAVES, new, PLACED, ready(eu="Complete"), T0 + 3)
    assert later.state is None


def test_a_failure_in_a_later_wave_rolls_back_the_regions_already_done() -> None:
    state = fresh()
    for t, views in enumerate((ready(), ready(eu="Complete"), ready(eu="Complete")), start=1):
        step = plan_agent_waves(WAVES, state, PLACED, views, T0 + t)
        assert step.state is not None
        state = step.state
    assert state.released == {"eu", "us"}
    step = plan_agent_waves(WAVES, state, PLACED, ready(eu="Complete", us="Failed"), T0 + 9)
    assert step.state is not None and step.state.failed_region == "us"
    assert step.state.undo("eu") and step.state.undo("us")


def test_a_report_about_another_revision_neither_passes_nor_fails_a_wave() -> None:
    state = plan_agent_waves(WAVES, fresh(), PLACED, ready(), T0 + 1).state
    assert state is not None
    for phase in ("Complete", "RolledBack"):
        views = ready() | {"eu": view("eu", phase=phase, revision=7)}
        assert plan_agent_waves(WAVES, state, PLACED, views, T0 + 2).state is None


def test_a_region_without_the_release_holds_its_wave_then_fails_at_the_deadline() -> None:
    views = ready() | {"eu": view("eu", reported=False, phase="", releases=("0.2.0",))}
    step = plan_agent_waves(WAVES, fresh(), PLACED, views, T0 + 1, deadline_s=600)
    assert step.state is not None and step.state.reason == "ReleaseMissing"
    assert not step.state.released
    assert "region eu's hub holds no release of edged 0.3.0" in step.state.message
    assert plan_agent_waves(WAVES, step.state, PLACED, views, T0 + 2, deadline_s=600).state is None
    late = plan_agent_waves(WAVES, step.state, PLACED, views, T0 + 700, deadline_s=600)
    assert late.state is not None and late.state.reason == "ProgressDeadlineExceeded"
    assert late.state.phase is AgentWavePhase.ROLLED_BACK
    assert "it fetches the root's" in step.state.message
    # fetched from the root in time: the wave goes on
    pushed = plan_agent_waves(WAVES, step.state, PLACED, ready(), T0 + 3, deadline_s=600)
    assert pushed.state is not None and pushed.state.released == {"eu"}


def test_a_region_that_refused_the_roots_release_says_why_in_release_missing() -> None:
    refused = dataclasses.replace(
        view("eu", reported=False, phase="", releases=()),
        refusals={"0.3.0": "SignerNotDelegated: a model key signed it"},
    )
    step = plan_agent_waves(WAVES, fresh(), PLACED, ready() | {"eu": refused}, T0 + 1)
    assert step.state is not None and step.state.reason == "ReleaseMissing"
    assert not step.state.released
    assert (
        "region eu's hub holds no release of edged 0.3.0: it refused the root's release "
        "(SignerNotDelegated: a model key signed it)" in step.state.message
    ), step.state.message


def test_an_unreachable_region_holds_its_wave_without_failing_it() -> None:
    views = ready() | {"eu": view("eu", connected=False, reported=False, phase="")}
    step = plan_agent_waves(WAVES, fresh(), PLACED, views, T0 + 1, deadline_s=60)
    assert step.state is not None and step.state.reason == "RegionUnreachable"
    assert plan_agent_waves(WAVES, step.state, PLACED, views, T0 + 999, deadline_s=60).state is None


def test_a_released_wave_not_done_by_its_deadline_fails() -> None:
    state = plan_agent_waves(WAVES, fresh(), PLACED, ready(), T0 + 1, deadline_s=60).state
    assert state is not None
    views = ready(eu="Progressing")
    assert plan_agent_waves(WAVES, state, PLACED, views, T0 + 30, deadline_s=60).state is None
    step = plan_agent_waves(WAVES, state, PLACED, views, T0 + 62, deadline_s=60)
    assert step.state is not None and step.state.reason == "ProgressDeadlineExceeded"
    assert step.state.undo("eu")


def test_a_pause_wave_waits_for_resume() -> None:
    waves = (Wave(regions=("eu",)), Wave(pause=True), Wave(regions=("us",)))
    state = plan_agent_waves(waves, fresh(), PLACED, ready(), T0 + 1).state
    assert state is not None
    state = plan_agent_waves(waves, state, PLACED, ready(eu="Complete"), T0 + 2).state
    assert state is not None and state.step == 1
    paused = plan_agent_waves(waves, state, PLACED, ready(eu="Complete"), T0 + 3).state
    assert paused is not None and paused.phase is AgentWavePhase.PAUSED
    assert plan_agent_waves(waves, paused, PLACED, ready(eu="Complete"), T0 + 4).state is None
    resumed = resume(waves, paused, T0 + 5)
    assert resumed is not None and resumed.step == 2
    # a failure while paused still stops everything
    step = plan_agent_waves(waves, paused, PLACED, ready(eu="RolledBack"), T0 + 6)
    assert step.state is not None and step.state.phase is AgentWavePhase.ROLLED_BACK


def test_an_operators_pause_holds_the_next_wave_and_resume_goes_on_from_there() -> None:
    state = plan_agent_waves(WAVES, fresh(), PLACED, ready(), T0 + 1).state
    assert state is not None and state.released == {"eu"}
    paused = pause(WAVES, state, T0 + 2)
    assert paused is not None and paused.phase is AgentWavePhase.PAUSED
    assert paused.reason == "Paused" and "by an operator" in paused.message
    assert pause(WAVES, paused, T0 + 3) is None  # nothing to pause
    # eu done: no next wave while paused
    assert plan_agent_waves(WAVES, paused, PLACED, ready(eu="Complete"), T0 + 4).state is None
    resumed = resume(WAVES, paused, T0 + 500)
    assert resumed is not None and resumed.phase is AgentWavePhase.PROGRESSING
    assert resumed.step == state.step and resumed.deadline_from == T0 + 500
    assert resume(WAVES, resumed, T0 + 501) is None  # nothing to resume
    step = plan_agent_waves(WAVES, resumed, PLACED, ready(eu="Complete"), T0 + 502)
    assert step.state is not None and step.state.step == state.step + 1
    # a failure while paused still stops everything
    failed = plan_agent_waves(WAVES, paused, PLACED, ready(eu="RolledBack"), T0 + 5)
    assert failed.state is not None and failed.state.phase is AgentWavePhase.ROLLED_BACK


def test_a_new_revision_keeps_the_ones_before_with_their_outcomes() -> None:
    first = start("up", 1, "0.3.0", T0, commit=(300, 3))
    done = plan_agent_waves(WAVES, first, PLACED, ready(), T0 + 1).state
    assert done is not None
    done = replace(done, phase=AgentWavePhase.COMPLETE)
    second = start("up", 2, "0.3.1", T0 + 10, done, commit=(300, 3))
    assert [r["number"] for r in second.revisions] == [1]
    assert second.revisions[0]["outcome"] == "complete" and second.source == 0
    failed = replace(second, phase=AgentWavePhase.ROLLED_BACK, reason="RegionFailed")
    third = start("up", 3, "0.3.0", T0 + 20, failed, commit=(300, 3))  # undo: a copy of 1
    assert third.source == 1
    assert [r["outcome"] for r in third.revisions] == ["complete", "rolled back: RegionFailed"]
    fourth = start("up", 4, "0.3.2", T0 + 30, third, commit=(60, 2))  # superseded mid-way
    assert fourth.revisions[-1]["outcome"] == "superseded"
    assert [r["number"] for r in fourth.history_records()] == [1, 2, 3, 4]
    assert "outcome" not in fourth.history_records()[-1]
    assert AgentWaveState.from_json(fourth.to_json()) == fourth
    state = fourth
    for n in range(5, 5 + MAX_REVISIONS + 3):  # bounded
        state = start("up", n, f"0.4.{n}", T0 + n, state, commit=(60, 2))
    assert len(state.revisions) == MAX_REVISIONS - 1
    assert state.revisions[-1]["number"] == state.revision - 1


# -- what a region can claim --------------------------------------------------------------------


def claim(**over: Any) -> dict[str, Any]:
    return {
        "name": "edged-0-3-0",
        "rootRevision": 1,
        "version": "0.3.0",
        "phase": "Complete",
        "pool": 3,
        "done": 3,
        "updating": 0,
        "failed": {},
        "releases": ["0.3.0"],
    } | over


def read(c: Any, total: int = 3, revision: int = 1, version: str = "0.3.0") -> RegionAgentView:
    return read_region_claim(
        "eu",
        c,
        upgrade="edged-0-3-0",
        connected=True,
        inventory_total=total,
        revision=revision,
        version=version,
    )


def test_a_region_claims_no_more_devices_than_it_has() -> None:
    v = read(claim(pool=10**9, done=10**9, updating=5), total=3)
    assert (v.pool, v.done, v.updating) == (3, 3, 0)
    v = read(claim(pool=3, done=2, updating=7))
    assert (v.done, v.updating) == (2, 1)
    v = read(claim(pool=-5, done=True, updating="7"))
    assert (v.pool, v.done, v.updating) == (0, 0, 0)


def test_a_region_names_a_bounded_number_of_failed_devices_in_bounded_text() -> None:
    many = {f"d{i:05}" + "x" * 1000: "y" * 10_000 for i in range(5_000)}
    v = read(claim(pool=10_000, done=0, phase="RolledBack", failed=many), total=10_000)
    assert len(v.failed) == MAX_FAILED
    assert all(len(k) <= MAX_NAME and len(w) <= MAX_TEXT for k, w in v.failed.items())
    # no more failed devices than its pool has left
    v = read(claim(pool=3, done=3, failed={"a": "x", "b": "y"}))
    assert v.failed == {}


def test_a_claim_about_another_upgrade_or_an_unknown_phase_counts_for_nothing() -> None:
    v = read(claim(name="another"))
    assert not v.reported and v.phase == "" and v.releases == {"0.3.0"}
    assert read(claim(phase="Done!")).phase == ""
    assert read(claim(rootRevision=True)).revision == 0
    assert not read(None).reported
    assert not read(["not", "a", "mapping"]).reported
    assert read(claim(releases=["v"] * 10_000 + [7])).releases == {"v"}


def test_the_regions_figures_summed_for_get_and_the_dashboard_are_bounded() -> None:
    views = {
        "eu": view("eu"),  # 3 of 3 done
        "us": view("us", phase="Progressing", failed={"us1": "CrashLoop"}),  # 1 of 3 done
        "ap": view("ap", revision=2),  # another root revision: not counted
        "sa": view("sa", reported=False),
    }
    assert summed_figures(views, 1) == {
        "poolDevices": 6, "doneDevices": 4, "updatingDevices": 0, "failedCount": 1,
        "reportingRegions": 2,
    }  # fmt: skip
    # a lying region adds no more than its inventory and MAX_FAILED failed devices
    liar = read(claim(pool=10**9, done=0, phase="RolledBack",
                      failed={f"d{i}": "x" for i in range(500)}), total=100)  # fmt: skip
    figures = summed_figures({"eu": liar}, liar.revision)
    assert figures["poolDevices"] == 100 and figures["failedCount"] == MAX_FAILED
    assert summed_figures({}, 1)["poolDevices"] == 0


# -- the API reads the waves as a ModelDeployment's, without percent waves ----------------------


def test_an_agentupgrade_reads_waves_and_refuses_regions() -> None:
    doc: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "AgentUpgrade",
        "metadata": {"name": "edged-0-3-0"},
        "spec": {
            "version": "0.3.0",
            "rollout": {"waves": [{"regions": ["eu"]}, {"pause": {}}, {"regions": ["us"]}]},
        },
    }
    upgrade = parse_manifest(doc)
    assert upgrade.to_dict()["spec"]["rollout"]["waves"] == doc["spec"]["rollout"]["waves"]
    doc["spec"]["rollout"]["regions"] = ["eu"]
    with pytest.raises(ValidationError, match=r"spec.rollout.regions.*not supported yet"):
        parse_manifest(doc)


def test_a_claim_of_the_roots_revision_naming_another_version_counts_for_nothing() -> None:
    """A regional hub from before regions claimed a revision only once running it (or a
    hostile one) says the root's revision 2 is RolledBack, or Complete, naming the version of
    its previous record (revision 1's): neither stops nor passes revision 2's wave, as a claim
    of revision 0; the view says what it claimed. A claim of an older revision is left alone
    (it is not counted for the current one anyway)."""
    waves = (Wave(regions=("eu",)), Wave(regions=("us",)))
    root = replace(start("edged-0-3-0", 2, "0.4.0", T0), released=frozenset({"eu"}))
    for phase in ("RolledBack", "Failed", "Complete"):
        stale = read(
            claim(rootRevision=2, phase=phase, done=0 if phase != "Complete" else 3,
                  failed={"eu0": "CrashLoop"}, releases=["0.3.0", "0.4.0"]),
            revision=2, version="0.4.0",
        )  # fmt: skip
        assert stale.revision == 0 and stale.stale == "0.3.0", stale
        assert "claims the root's revision with edged 0.3.0" in stale.text()
        step = plan_agent_waves(waves, root, PLACED, {"eu": stale}, T0 + 1)
        assert step.state is None or step.state.phase is AgentWavePhase.PROGRESSING, step
        assert step.state is None or step.state.reason != "WavePassed", step
        assert summed_figures({"eu": stale}, 2)["reportingRegions"] == 0
    # a claim naming no version, or not a string, is no claim of revision 2 either
    for version in (None, "", 7, ["0.4.0"]):
        bad = read(claim(rootRevision=2, version=version), revision=2, version="0.4.0")
        assert bad.revision == 0 and bad.stale, version
    # a hostile version is bounded
    long = read(claim(rootRevision=2, version="x" * 10_000), revision=2, version="0.4.0")
    assert len(long.stale) == MAX_NAME
    # the right version: counted, and its wave passes
    good = read(claim(rootRevision=2, version="0.4.0"), revision=2, version="0.4.0")
    assert good.revision == 2 and good.stale == ""
    step = plan_agent_waves(waves, root, PLACED, {"eu": good}, T0 + 1)
    assert step.state is not None and step.state.reason == "WavePassed", step
    # an older revision's claim is kept as it is (never counted for revision 2)
    older = read(claim(rootRevision=1, version="0.3.0"), revision=2, version="0.4.0")
    assert older.revision == 1 and older.stale == ""
