"""Eviction by priority as tables: policy, state, workloads, MemAvailable and ``now`` in."""

from __future__ import annotations

from edged.reconcile.evicting import (
    Candidate,
    EvictionPolicy,
    EvictionState,
    plan_eviction,
)

MI = 1 << 20
POLICY = EvictionPolicy(floor_bytes=500 * MI, hysteresis_bytes=50 * MI, settle_s=5.0)
T = 1000.0
CRITICAL = Candidate("critical", 1000, 1, 100 * MI)
BATCH = Candidate("batch", 0, 2, 200 * MI)
LOW = Candidate("low", -10, 1, 50 * MI)


def step(
    state: EvictionState, available: int, now: float, candidates: list[Candidate] | None = None
) -> tuple[EvictionState, list[tuple[str, str]]]:
    state, events = plan_eviction(
        POLICY, state, candidates or [CRITICAL, BATCH, LOW], available, now
    )
    return state, [(e.kind, e.workload) for e in events]


def test_lowest_priority_first_one_per_interval_never_the_critical() -> None:
    s = EvictionState()
    s, ev = step(s, 400 * MI, T)
    assert ev == [("evicted", "low")] and s.evicted == {"low": 1}
    s, ev = step(s, 400 * MI, T + 1)  # settling: the stopped replica's memory comes back first
    assert ev == []
    s, ev = step(s, 400 * MI, T + 5)
    assert ev == [("evicted", "batch")]
    s, ev = step(s, 400 * MI, T + 10)
    assert ev == [("evicted", "batch")] and s.evicted == {"low": 1, "batch": 2}
    s, ev = step(s, 400 * MI, T + 15)  # only the critical one runs: it is what is protected
    assert ev == [("nothing to evict", "")]
    s, ev = step(s, 400 * MI, T + 20)  # said once
    assert ev == []


def test_equal_priorities_are_never_evicted() -> None:
    a, b = Candidate("a", 5, 2), Candidate("b", 5, 1)
    s, ev = step(EvictionState(), 10 * MI, T, [a, b])
    assert ev == [("nothing to evict", "")] and s.evicted == {}


def test_restore_highest_priority_first_with_hysteresis() -> None:
    s = EvictionState({"low": 1, "batch": 2}, last_action_at=T)
    # above the floor but not by hysteresis + one batch replica (500 + 50 + 200)
    s, ev = step(s, 700 * MI, T + 10)
    assert ev == []
    s, ev = step(s, 750 * MI, T + 11)
    assert ev == [("restored", "batch")] and s.evicted == {"low": 1, "batch": 1}
    s, ev = step(s, 2000 * MI, T + 12)  # settling
    assert ev == []
    s, ev = step(s, 2000 * MI, T + 16)
    assert ev == [("restored", "batch")]
    s, ev = step(s, 2000 * MI, T + 21)
    assert ev == [("restored", "low")] and s.evicted == {}


def test_between_floor_and_restore_level_nothing_moves() -> None:
    s = EvictionState({"low": 1}, last_action_at=T)
    for i in range(10):
        s, ev = step(s, 520 * MI, T + 10 + i)
        assert ev == []
    assert s.evicted == {"low": 1}


def test_evictions_lapse_with_the_workload_or_its_replicas() -> None:
    s = EvictionState({"gone": 1, "batch": 2})
    s, _ = step(s, 510 * MI, T, [CRITICAL, Candidate("batch", 0, 1)])
    assert s.evicted == {"batch": 1}


def test_no_reading_changes_nothing() -> None:
    s = EvictionState({"low": 1})
    s2, events = plan_eviction(POLICY, s, [CRITICAL, LOW], None, T)
    assert events == [] and s2.evicted == {"low": 1}
