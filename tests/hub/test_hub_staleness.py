"""A device's silence as this hub saw it (``hub.decide.staleness``), as tables: the pure decision,
the
lifecycle phase and the scheduler's NotReady eviction after a hub start. Pure: no hub, no
store, no clock (``now`` and the observation start are passed in)."""

from __future__ import annotations

import pytest
from schedulingtesting import NOW, dep, node

from edgefleet.api import TaintEffect
from hub.decide.devices import Device, DevicePhase, Taint
from hub.decide.placement import TAINT_NOT_READY, lifecycle_phase
from hub.decide.schedule import schedule
from hub.decide.staleness import ObservedSince, silent_for

NOT_READY = Taint(TAINT_NOT_READY, TaintEffect.NO_SCHEDULE)


@pytest.mark.parametrize(
    ("last", "now", "since", "silent"),
    [
        pytest.param(100.0, 150.0, None, 50.0, id="no-observation-start:-from-the-heartbeat"),
        pytest.param(100.0, 150.0, 90.0, 50.0, id="heard-after-the-start:-from-the-heartbeat"),
        pytest.param(100.0, 150.0, 140.0, 10.0, id="hub-down-since-then:-from-the-start"),
        pytest.param(None, 150.0, 140.0, 10.0, id="never-heard:-from-the-start"),
        pytest.param(None, 150.0, None, float("inf"), id="never-heard-no-start:-forever"),
    ],
)
def test_silence_counts_from_the_later_of_the_heartbeat_and_the_hubs_start(
    last: float | None, now: float, since: float | None, silent: float
) -> None:
    assert silent_for(last, now, since) == silent


def test_the_observation_start_restarts() -> None:
    observed = ObservedSince(10.0)
    observed.restart(25.0)
    assert observed.since == 25.0


GRACE = 40.0
READY = DevicePhase.READY
NOT = DevicePhase.NOT_READY


@pytest.mark.parametrize(
    ("was", "last", "now", "since", "phase"),
    [
        pytest.param(READY, 100.0, 140.0, None, READY, id="within-the-grace"),
        pytest.param(READY, 100.0, 140.1, None, NOT, id="past-the-grace-no-start"),
        # the hub was down from 110 to 1000 (longer than any grace): started at 1000
        pytest.param(READY, 100.0, 1000.5, 1000.0, READY, id="hub-restarted:-full-grace"),
        pytest.param(READY, 100.0, 1040.0, 1000.0, READY, id="hub-restarted:-grace-edge"),
        pytest.param(READY, 100.0, 1040.1, 1000.0, NOT, id="stays-away-past-the-grace"),
        pytest.param(NOT, 100.0, 1000.5, 1000.0, NOT, id="notready-before-stays-notready"),
        pytest.param(NOT, 1000.2, 1000.5, 1000.0, READY, id="a-message-makes-it-ready"),
    ],
)
def test_lifecycle_gives_each_device_a_full_grace_after_the_hubs_start(
    was: DevicePhase, last: float, now: float, since: float | None, phase: DevicePhase
) -> None:
    device = Device("d", phase=was, last_heartbeat=last)
    got, again = lifecycle_phase(device, now=now, grace_s=GRACE, observed_since=since)
    assert got is phase
    assert again > 0


RESCHEDULE = 60.0


@pytest.mark.parametrize(
    ("last", "since", "kept"),
    [
        pytest.param(NOW - 10, None, True, id="notready-briefly:-kept"),
        pytest.param(NOW - 100, None, False, id="notready-long:-moved"),
        # the hub restarted 5 s ago after being down 10 minutes: the device's replica stays
        pytest.param(NOW - 600, NOW - 5, True, id="hub-restarted-5s-ago:-kept"),
        pytest.param(NOW - 600, NOW - 59, True, id="hub-restarted-59s-ago:-kept"),
        # the device did not come back within the full grace after the start: moved
        pytest.param(NOW - 600, NOW - 61, False, id="away-past-the-grace-after-the-start"),
    ],
)
def test_the_scheduler_counts_silence_from_the_hubs_start(
    last: float, since: float | None, kept: bool
) -> None:
    nodes = [node("away", taints=(NOT_READY,), last_heartbeat=last), node("spare")]
    result = schedule(
        [dep("x", 1)],
        nodes,
        {"x": ["away"]},
        NOW,
        not_ready_grace_s=RESCHEDULE,
        observed_since=since,
    )
    assert result.placements == {"x": ("away",) if kept else ("spare",)}
    moved = [(e.device, e.reason) for e in result.evictions]
    assert moved == ([] if kept else [("away", "no longer fits: not ready for longer than 60s")])
