"""What ``edgectl rollout status`` prints for a canary: the step and the analysis against its
thresholds (pure: a deployment document in, text out)."""

from __future__ import annotations

from typing import Any

from edgectl.rollouts import render


def doc(phase: str, canary: dict[str, Any], **rollout: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "det"},
        "spec": {"model": {"version": "2.0.0"}},
        "status": {
            "desiredDevices": 10,
            "updatedDevices": 1,
            "readyDevices": 1,
            "availableDevices": 10,
            "failing": {},
            "rollout": {
                "revision": 2,
                "stableRevision": 1,
                "phase": phase,
                "reason": rollout.pop("reason", ""),
                "message": rollout.pop("message", ""),
                "targetedDevices": 10,
                "canary": canary,
                **rollout,
            },
        },
    }


CANARY = {
    "step": 1,
    "stepCount": 3,
    "pastLastStep": False,
    "weight": 10,
    "weightDevices": 1,
    "steps": ["10%", {"pause": {}}, "100%"],
    "analysis": {
        "verdict": "Wait",
        "windowSeconds": 60.0,
        "checks": [
            {
                "name": "accuracy",
                "verdict": "Pass",
                "message": "accuracy 0.9500 >= minAccuracy 0.9",
            },
            {
                "name": "errorRate",
                "verdict": "Wait",
                "message": "error rate: 3 canary requests in the window, waiting for 20",
            },
        ],
    },
}


def test_the_step_and_the_analysis_against_its_thresholds() -> None:
    text, phase = render(doc("Progressing", CANARY))
    assert phase == "Progressing"
    assert "canary step 1 of 3: 10% (1 devices)" in text
    assert "analysis over 60s: Wait" in text
    assert "accuracy    Pass  accuracy 0.9500 >= minAccuracy 0.9" in text
    assert "errorRate   Wait  error rate: 3 canary requests" in text


def test_a_pause_and_a_rollback() -> None:
    paused = {**CANARY, "step": 2, "analysis": None}
    text, _ = render(doc("Paused", paused))
    assert "canary step 2 of 3: pause until rollout resume" in text
    failed = doc(
        "RolledBack",
        CANARY,
        reason="AnalysisFailed",
        message="revision 2 (2.0.0) failed the canary analysis at step 1 of 3 (10%): accuracy "
        "0.5000 on the validation set is below minAccuracy 0.9",
    )
    text, phase = render(failed)
    assert phase == "RolledBack" and "(AnalysisFailed)" in text and "0.5000" in text
    assert "analysis over" not in text  # the figures of a rollout that ended: in its message


def test_a_device_left_out_of_the_analysis_is_named() -> None:
    analysis = {**CANARY["analysis"], "stable": {"excluded": {"dev-3": "2^40 requests in 3 s"}}}
    text, _ = render(doc("Progressing", {**CANARY, "analysis": analysis}))
    assert "left out    dev-3 (stable): 2^40 requests in 3 s" in text


def test_devices_held_and_returning_are_named() -> None:
    text, phase = render(
        doc(
            "RolledBack",
            {},
            reason="AnalysisFailed",
            heldDevices={"dev-3": 2, "dev-1": 2},
            returningDevices=["dev-0"],
        )
    )
    assert phase == "RolledBack"
    assert "held dev-1 on revision 2 (switches within the budget)" in text
    assert text.index("held dev-1") < text.index("held dev-3")
    assert "returning dev-0" in text
    assert "held" not in render(doc("Progressing", CANARY))[0]
