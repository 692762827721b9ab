"""Readiness and liveness decisions for one replica (pure: timings and counts in, verdict out).

The worker pool runs one timer per replica and asks :func:`check_probes` what to do at each
tick, and :func:`record_pong` what an answer means; ``now`` (monotonic seconds) is passed in.

* Readiness: a PING every ``readiness.periodSeconds``; a PING not answered within
  ``readiness.timeoutSeconds`` is a failure, and ``failureThreshold`` failures in a row take a
  ready replica out of serving. A PONG makes it ready again.
* Liveness: no PONG for ``liveness.periodSeconds * failureThreshold + timeoutSeconds``, or a
  PONG saying one batch has been running longer than ``liveness.timeoutSeconds *
  failureThreshold``, fails it (the planner then kills and restarts the replica).

The startup probe (READY within ``startup.timeoutSeconds``) is the planner's (planning.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from edgefleet.api import Probes


@dataclass(frozen=True, slots=True)
class ProbeState:
    last_pong: float  # monotonic time of the last PONG (or of the start)
    ping_sent_at: float | None = None  # a PING waiting for its PONG
    failures: int = 0  # readiness failures in a row


@dataclass(frozen=True, slots=True)
class ProbeCheck:
    """What one probe tick decided."""

    state: ProbeState
    unready: bool = False  # take the (ready) replica out of serving
    not_live: str = ""  # liveness failed, and why: stop probing, the planner kills it
    ping: bool = False  # send a PING now


def check_probes(state: ProbeState, probes: Probes, *, ready: bool, now: float) -> ProbeCheck:
    """One tick of the probe timer; ``ready``: the replica is serving now."""
    rp, lp = probes.readiness, probes.liveness
    unready = False
    if state.ping_sent_at is not None and now - state.ping_sent_at >= rp.timeout_s:
        state = replace(state, ping_sent_at=None, failures=state.failures + 1)
        unready = ready and state.failures >= rp.failure_threshold
    silent = now - state.last_pong
    if silent > lp.period_s * lp.failure_threshold + lp.timeout_s:
        return ProbeCheck(state, unready, f"no answer to probes for {silent:.1f}s")
    if state.ping_sent_at is None:
        return ProbeCheck(replace(state, ping_sent_at=now), unready, ping=True)
    return ProbeCheck(state, unready)


def record_pong(
    state: ProbeState, busy_s: float, probes: Probes, *, now: float
) -> tuple[ProbeState, str]:
    """A PONG came, saying the current batch has run ``busy_s``: the new state, and why
    liveness failed ("" when it did not)."""
    state = replace(state, ping_sent_at=None, failures=0)
    stuck_after = probes.liveness.timeout_s * probes.liveness.failure_threshold
    if busy_s > stuck_after:
        return state, f"one batch has been running for {busy_s:.1f}s"
    return replace(state, last_pong=now), ""
