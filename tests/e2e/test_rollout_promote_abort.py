"""``edgectl rollout abort`` and ``promote``, end to end: a real hub, three real edged, real
ONNX Runtime workers (issue 33).

A canary of 2.0.0 paused after its first step is aborted: the canary device serves 1.0.0
again and the rollout stays aborted; ``resume`` retries it; ``promote`` goes past the pause
until resume, then past the timed pause of an hour, and every device ends on 2.0.0.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from deploymenttesting import det_canary
from fleet import HubProcess
from harness import Edged
from polltesting import wait_for
from rollouttesting import apply, on_device, push, status

CANARY = det_canary('["33%", {{pause: {{}}}}, "66%", {{pause: {{duration: 1h}}}}, "100%"]')


@pytest.fixture
def fleet_size() -> int:
    return 3


def serving(devices: list[Edged]) -> list[set[str]]:
    """The versions with a ready replica on each device."""
    return [on_device(d)[0] for d in devices]


def rollout(hub: HubProcess) -> dict[str, object]:
    shown: dict[str, object] = status(hub).get("rollout", {})
    return shown


def test_abort_sends_the_canary_back_and_promote_skips_the_pauses(
    hub: HubProcess, devices: list[Edged], tmp_path: Path
) -> None:
    push(hub, tmp_path, "1.0.0")
    push(hub, tmp_path, "2.0.0")
    apply(hub, tmp_path, "1.0.0", CANARY)
    wait_for(lambda: serving(devices) == [{"1.0.0"}] * 3, 120, "1.0.0 everywhere")

    apply(hub, tmp_path, "2.0.0", CANARY)
    wait_for(lambda: rollout(hub).get("reason") == "CanaryPause", 120, "the pause after 33%")
    wait_for(
        lambda: sorted(map(sorted, serving(devices))).count(["2.0.0"]) == 1,
        60,
        "1 canary",
        detail=lambda: f"serving {serving(devices)}, rollout {rollout(hub)}",
    )

    done = hub.edgectl("rollout", "abort", "det")
    assert "revision 2 aborted by admin" in done.stdout, done.stdout
    wait_for(lambda: serving(devices) == [{"1.0.0"}] * 3, 120, "the canary back on 1.0.0")
    shown = rollout(hub)
    assert (shown["phase"], shown["reason"]) == ("RolledBack", "Aborted"), shown
    conditions = {c["type"]: c for c in status(hub)["conditions"]}
    assert conditions["Progressing"]["reason"] == "RolloutAborted", conditions
    events = hub.edgectl("get", "events", "--for", "deployment/det").stdout
    assert "Warning" in events and "aborted by admin" in events, events

    assert hub.edgectl("rollout", "resume", "det").returncode == 0  # retried from the start
    wait_for(lambda: rollout(hub).get("reason") == "CanaryPause", 120, "the pause again")
    done = hub.edgectl("rollout", "promote", "det")
    assert "past the pause of canary step 2" in done.stdout, done.stdout
    wait_for(
        lambda: rollout(hub).get("canary", {}).get("step") == 4,  # type: ignore[union-attr]
        120,
        "the timed pause after 66%",
    )
    assert sorted(map(sorted, serving(devices))).count(["2.0.0"]) == 2
    done = hub.edgectl("rollout", "promote", "det")  # an hour's pause, skipped
    assert "past the pause of canary step 4" in done.stdout, done.stdout
    wait_for(lambda: rollout(hub).get("phase") == "Complete", 120, "Complete")
    wait_for(lambda: serving(devices) == [{"2.0.0"}] * 3, 60, "2.0.0 everywhere")
