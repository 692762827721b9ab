"""A root hub's rollout across its regions (hub.decide.regionrollout), as tables: never Complete
before every region it goes to reports that revision Complete; RolledBack naming the region
that rolled it back; a stale report (of another revision) or one that names no revision (a
regional hub older than the field) is not counted; the waves judge a rollout in waves."""

from __future__ import annotations

from typing import Any

import pytest

from hub.decide.regionrollout import across_regions, shown
from hub.decide.wave import RegionView, WavePhase, WaveState

NEW, OLD = "t-new", "t-old"
EXPECTED = {"eu": NEW, "us": NEW}


def view(
    name: str,
    template: str = NEW,
    phase: str = "Complete",
    *,
    connected: bool = True,
    reported: bool = True,
    reason: str = "",
    message: str = "",
) -> RegionView:
    return RegionView(
        name,
        connected=connected,
        reported=reported,
        template=template,
        stable_template=OLD,
        phase=phase,
        reason=reason,
        message=message,
        desired=2,
        updated=2 if phase == "Complete" else 1,
        ready=2 if phase == "Complete" else 0,
    )


def fold(
    views: dict[str, RegionView],
    own: str = "Complete",
    placed: tuple[str, ...] = ("eu", "us"),
    waves: WaveState | None = None,
) -> Any:
    return across_regions(
        own,
        "RolloutComplete" if own == "Complete" else "Started",
        "revision 2 (2.0.0) serves on every targeted device (0)",
        2,
        "2.0.0",
        placed,
        EXPECTED,
        views,
        waves,
        lambda region, template: 1 if template == OLD else None,
    )


CASES = [
    # (what, views, own phase, phase, reason, named in the message)
    ("every region Complete", {"eu": view("eu"), "us": view("us")}, "Complete", "Complete",
     "RolloutComplete", "every region (eu, us) reports revision 2 (2.0.0) Complete"),
    ("one region rolled it back", {"eu": view("eu", phase="RolledBack", reason="RevisionFailed",
     message="failed on 1 device(s)"), "us": view("us")}, "Complete", "RolledBack",
     "RegionRolledBack", "rolled back in region(s) eu: eu: 1 of 2 devices updated"),
    ("rolled back while the root's own devices still roll out", {"eu": view("eu",
     phase="RolledBack")}, "Progressing", "RolledBack", "RegionRolledBack", "region(s) eu"),
    ("a stale report: Complete of the previous revision", {"eu": view("eu", OLD),
     "us": view("us")}, "Complete", "Progressing", "RegionsProgressing",
     "eu: its rollout is still of another revision"),
    ("a stale RolledBack (of another revision) is not this one's", {"eu": view("eu", OLD,
     "RolledBack"), "us": view("us")}, "Complete", "Progressing", "RegionsProgressing",
     "eu: its rollout is still of another revision (rollout RolledBack)"),
    ("an older region names no revision: not counted", {"eu": view("eu", ""), "us": view("us")},
     "Complete", "Progressing", "RegionsProgressing",
     "eu: not counted: its report names no revision"),
    ("an older region's RolledBack names no revision either", {"eu": view("eu", "",
     "RolledBack"), "us": view("us")}, "Complete", "Progressing", "RegionsProgressing",
     "not counted"),
    ("a region still rolling out", {"eu": view("eu", phase="Progressing"), "us": view("us")},
     "Complete", "Progressing", "RegionsProgressing", "eu: 1 of 2 devices updated, 0 ready"),
    ("a region never heard from", {"us": view("us")}, "Complete", "Progressing",
     "RegionUnreachable", "eu: unreachable"),
    ("a region connected, not reported yet", {"eu": view("eu", reported=False),
     "us": view("us")}, "Complete", "Progressing", "RegionUnreachable",
     "eu: has not reported the deployment yet"),
    ("a region away after it completed: its last report counts", {"eu": view("eu",
     connected=False), "us": view("us")}, "Complete", "Complete", "RolloutComplete",
     "every region"),
    ("the root's own rollout decides while it is not done", {"eu": view("eu"), "us": view("us")},
     "Progressing", "Progressing", "Started", "serves on every"),
    ("the root's own devices rolled it back", {"eu": view("eu"), "us": view("us")},
     "RolledBack", "RolledBack", "Started", "serves on every"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("views", "own", "phase", "reason", "named"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_the_roots_rollout_across_its_regions(
    views: dict[str, RegionView], own: str, phase: str, reason: str, named: str
) -> None:
    got = fold(views, own)
    assert (got.phase, got.reason) == (phase, reason), got
    assert named in got.message, got.message


def test_a_region_that_rolled_back_names_the_revision_it_serves_again() -> None:
    got = fold({"eu": view("eu", phase="RolledBack"), "us": view("us")})
    assert got.stable == 1
    assert "revision 1 is served there again" in got.message
    status = {
        "rollout": {"phase": "Complete", "reason": "RolloutComplete", "stableRevision": 2},
        "conditions": [
            {"type": "Available", "status": "False", "reason": "NoDevices", "message": ""},
            {"type": "Progressing", "status": "False", "reason": "NoDevices", "message": ""},
        ],
    }
    out = shown(status, got, "1.0.0")
    assert out["rollout"]["phase"] == "RolledBack"
    assert (out["rollout"]["stableRevision"], out["rollout"]["stableVersion"]) == (1, "1.0.0")
    assert [c["type"] for c in out["conditions"]] == ["Available", "Progressing"]
    progressing = out["conditions"][1]
    assert (progressing["status"], progressing["reason"]) == ("False", "RolledBack")
    assert "region(s) eu" in progressing["message"]
    assert status["rollout"]["phase"] == "Complete"  # not changed in place


def test_not_counted_regions_are_named_in_the_status() -> None:
    got = fold({"eu": view("eu", ""), "us": view("us", phase="Progressing")})
    out = shown({"rollout": {"phase": "Complete"}, "conditions": []}, got)
    assert set(out["rollout"]["notCounted"]) == {"eu", "us"}
    assert "names no revision" in out["rollout"]["notCounted"]["eu"]
    assert out["conditions"][0]["reason"] == "RegionsProgressing"


def test_a_deployment_in_no_enrolled_region_is_the_roots_own() -> None:
    got = fold({}, placed=())
    assert (got.phase, got.reason) == ("Complete", "RolloutComplete")


def wave_state(phase: WavePhase, revision: int = 2) -> WaveState:
    return WaveState("det", revision, 1, {}, "2.0.0", "1.0.0", phase=phase, reason=phase.value,
                     message=f"waves {phase.value}")  # fmt: skip


def test_waves_in_progress_or_rolled_back_judge_the_regions_themselves() -> None:
    views = {"eu": view("eu"), "us": view("us", phase="Progressing")}
    got = fold(views, waves=wave_state(WavePhase.PROGRESSING))
    assert (got.phase, got.message) == ("Progressing", "waves Progressing")
    got = fold(views, waves=wave_state(WavePhase.ROLLED_BACK))
    assert (got.phase, got.message) == ("RolledBack", "waves RolledBack")
    got = fold(views, waves=wave_state(WavePhase.PAUSED))
    assert got.phase == "Paused"


def test_waves_complete_at_once_are_checked_against_the_regions() -> None:
    """A first revision in waves, or one without waves, is sent to every region at once and
    its wave state is Complete from the start: the regions' reports still decide."""
    views = {"eu": view("eu", phase="RolledBack"), "us": view("us")}
    got = fold(views, waves=wave_state(WavePhase.COMPLETE))
    assert (got.phase, got.reason) == ("RolledBack", "RegionRolledBack")
    views = {"eu": view("eu", phase="Progressing"), "us": view("us")}
    assert fold(views, waves=wave_state(WavePhase.COMPLETE)).phase == "Progressing"
    # a wave state of another revision (a new one not yet made there) does not decide
    assert fold(views, waves=wave_state(WavePhase.ROLLED_BACK, revision=1)).phase == "Progressing"


def test_the_stable_revision_across_regions_is_the_one_the_regions_not_done_serve() -> None:
    """What a later rollout in waves starts from (hub.controllers.wave: never a revision a
    region rolled back): the revision the regions not done serve, when they all say the same;
    unknown when a region is not heard from."""
    got = fold({"eu": view("eu", phase="Progressing"), "us": view("us")})
    assert (got.phase, got.stable) == ("Progressing", 1)
    assert fold({"us": view("us", phase="Progressing")}).stable is None  # eu unheard of
    assert fold({"eu": view("eu"), "us": view("us")}).stable is None  # Complete: none needed
