"""Readiness and liveness decisions as tables: probe state, probes and ``now`` in, verdict out."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from edged.runtime.probing import ProbeCheck, ProbeState, check_probes, record_pong
from edgefleet.api import Probe, Probes

# Readiness: a PING unanswered for 1 s fails; 2 failures in a row take a replica out.
# Liveness: silent for more than 10 * 3 + 2 = 32 s, or one batch running over 2 * 3 = 6 s.
PROBES = Probes(
    readiness=Probe(timeout_s=1.0, period_s=5.0, failure_threshold=2),
    liveness=Probe(timeout_s=2.0, period_s=10.0, failure_threshold=3),
)
T = 1000.0  # "now", monotonic seconds


@dataclass(frozen=True)
class Tick:
    state: ProbeState
    ready: bool
    expected: ProbeCheck


TICKS = {
    # -- pinging ------------------------------------------------------------------------------
    "nothing outstanding: ping": Tick(
        ProbeState(last_pong=T - 5),
        ready=True,
        expected=ProbeCheck(ProbeState(T - 5, ping_sent_at=T), ping=True),
    ),
    "ping outstanding within its timeout: wait for the pong": Tick(
        ProbeState(last_pong=T - 5, ping_sent_at=T - 0.5),
        ready=True,
        expected=ProbeCheck(ProbeState(T - 5, ping_sent_at=T - 0.5)),
    ),
    # -- readiness ----------------------------------------------------------------------------
    "ping timed out once: a failure, ping again, still serving": Tick(
        ProbeState(last_pong=T - 5, ping_sent_at=T - 1),
        ready=True,
        expected=ProbeCheck(ProbeState(T - 5, ping_sent_at=T, failures=1), ping=True),
    ),
    "failure threshold reached while ready: unready": Tick(
        ProbeState(last_pong=T - 10, ping_sent_at=T - 5, failures=1),
        ready=True,
        expected=ProbeCheck(
            ProbeState(T - 10, ping_sent_at=T, failures=2), unready=True, ping=True
        ),
    ),
    "failure threshold passed while already unready: no second transition": Tick(
        ProbeState(last_pong=T - 15, ping_sent_at=T - 5, failures=2),
        ready=False,
        expected=ProbeCheck(ProbeState(T - 15, ping_sent_at=T, failures=3), ping=True),
    ),
    # -- liveness -----------------------------------------------------------------------------
    "silent just up to the liveness limit: still live": Tick(
        ProbeState(last_pong=T - 32),
        ready=True,
        expected=ProbeCheck(ProbeState(T - 32, ping_sent_at=T), ping=True),
    ),
    "silent past the liveness limit: not live, no ping": Tick(
        ProbeState(last_pong=T - 32.5, ping_sent_at=T - 0.5, failures=1),
        ready=False,
        expected=ProbeCheck(
            ProbeState(T - 32.5, ping_sent_at=T - 0.5, failures=1),
            not_live="no answer to probes for 32.5s",
        ),
    ),
    "unready and not live in one tick: both": Tick(
        ProbeState(last_pong=T - 40, ping_sent_at=T - 5, failures=1),
        ready=True,
        expected=ProbeCheck(
            ProbeState(T - 40, failures=2),
            unready=True,
            not_live="no answer to probes for 40.0s",
        ),
    ),
}


@pytest.mark.parametrize("tick", TICKS.values(), ids=TICKS.keys())
def test_check_probes(tick: Tick) -> None:
    assert check_probes(tick.state, PROBES, ready=tick.ready, now=T) == tick.expected


PONGS = {
    "idle worker: live, failures reset": (0.0, ProbeState(T), ""),
    "batch running within the bound: live": (6.0, ProbeState(T), ""),
    "batch running past the bound: not live, last pong kept": (
        6.5,
        ProbeState(T - 20),
        "one batch has been running for 6.5s",
    ),
}


@pytest.mark.parametrize(("busy_s", "state", "not_live"), PONGS.values(), ids=PONGS.keys())
def test_record_pong(busy_s: float, state: ProbeState, not_live: str) -> None:
    before = ProbeState(last_pong=T - 20, ping_sent_at=T - 0.2, failures=2)
    assert record_pong(before, busy_s, PROBES, now=T) == (state, not_live)
