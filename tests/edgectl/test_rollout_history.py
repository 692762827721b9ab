"""How ``edgectl rollout history`` words each revision's outcome (pure: the rollout record in,
text out)."""

from __future__ import annotations

from typing import Any

from edgectl.rollouts import _outcome_of, _outcome_text

ROLLOUT: dict[str, Any] = {
    "revision": 4,
    "stable": 3,
    "phase": "Progressing",
    "reason": "RollingUpdate",
    "message": "revision 4 (4.0.0) sent to 1 of 3 devices",
    "outcomes": {
        "1": {"phase": "Complete", "reason": "RolloutComplete", "message": "", "at": 1.0},
        "2": {"phase": "RolledBack", "reason": "RevisionFailed", "message": "why", "at": 2.0},
        "3": {"phase": "RolledBack", "reason": "Aborted", "message": "aborted by", "at": 3.0},
    },
}


def test_each_revision_is_worded_by_how_it_ended() -> None:
    words = {}
    for n in (1, 2, 3, 4, 5):
        outcome = _outcome_of(ROLLOUT, n)
        words[n] = _outcome_text(outcome) if outcome is not None else None
    assert words == {
        1: "complete",
        2: "rolled back (RevisionFailed)",
        3: "aborted",  # rollout abort
        4: "progressing",  # the current one: where it stands
        5: None,  # not known (kept before outcomes were)
    }
    superseded = {"phase": "Aborted", "reason": "Superseded", "message": "", "at": 0.0}
    assert _outcome_text(superseded) == "aborted (Superseded)"
    paused = {"phase": "Paused", "reason": "CanaryPause"}
    assert _outcome_text(paused) == "paused (CanaryPause)"
