"""The pure autoscaler as tables: scaling spec, state, sample, bounds and ``now`` in; the next
state and the decision out (Kubernetes HPA's recommendation and stabilization semantics)."""

from __future__ import annotations

from typing import Any

import pytest

from edgefleet.api import API_VERSION, ModelDeployment, parse_manifest
from edgefleet.api.deployments import Scaling
from edgefleet.autoscaler import (
    Bounds,
    LoadSample,
    ScalerState,
    autoscale,
    initial_state,
    recommend,
)

T = 1000.0


def scaling(**kw: Any) -> Scaling:
    doc: dict[str, Any] = {
        "minReplicas": 1,
        "maxReplicas": 4,
        "queueDepthUp": 10,
        "cpuDownBelow": "40%",
        "scaleUpWindow": "10s",
        "scaleDownWindow": "30s",
    }
    doc.update(kw)
    m = parse_manifest(
        {
            "apiVersion": API_VERSION,
            "kind": "ModelDeployment",
            "metadata": {"name": "m"},
            "spec": {
                "model": {"name": "m", "version": "1"},
                "replicas": {"perDevice": 1},
                "scaling": {k: v for k, v in doc.items() if v is not None},
            },
        }
    )
    assert isinstance(m, ModelDeployment) and m.spec.scaling is not None
    return m.spec.scaling


S = scaling()
BUSY = LoadSample(ready=1, inflight=25.0, cpu_percent=95.0)  # 25 per replica > 10
IDLE = LoadSample(ready=1, inflight=0.0, cpu_percent=3.0)


@pytest.mark.parametrize(
    ("current", "sample", "bounds", "want", "reason"),
    [
        # above queueDepthUp: enough replicas for <= 10 each
        (1, LoadSample(1, 25.0, 95.0), Bounds(), 3, "QueueDepthHigh"),
        # exactly at the threshold is not above it
        (1, LoadSample(1, 10.0, 95.0), Bounds(), 1, ""),
        # replicas still starting are counted: 2 wanted, 1 ready, queue 15 -> stays 2
        (2, LoadSample(1, 15.0, 95.0), Bounds(), 2, "QueueDepthHigh"),
        # capped by maxReplicas, by cores, by memory
        (1, LoadSample(1, 100.0, 99.0), Bounds(), 4, "QueueDepthHigh"),
        (1, LoadSample(1, 100.0, 99.0), Bounds(cpu=2), 2, "QueueDepthHigh"),
        (1, LoadSample(1, 100.0, 99.0), Bounds(cpu=8, memory=3), 3, "QueueDepthHigh"),
        # a bound below the current count does not scale down
        (3, LoadSample(3, 100.0, 99.0), Bounds(memory=1), 3, "QueueDepthHigh"),
        # CPU low: the replicas the same work needs under 40%
        (4, LoadSample(4, 0.0, 10.0), Bounds(), 1, "CpuLow"),
        (4, LoadSample(4, 0.0, 30.0), Bounds(), 3, "CpuLow"),
        # ... never fewer than the queue needs
        (4, LoadSample(4, 25.0, 10.0), Bounds(), 3, "CpuLow"),
        # CPU low but the work would not fit in fewer: no change
        (2, LoadSample(2, 0.0, 39.0), Bounds(), 2, ""),
        # CPU low while a wanted replica is not ready: no scale-down
        (3, LoadSample(2, 0.0, 5.0), Bounds(), 3, ""),
        # CPU unknown (first sample of a replica): no scale-down
        (3, LoadSample(3, 0.0, None), Bounds(), 3, ""),
        # nothing ready: nothing measured
        (2, LoadSample(0, 50.0, None), Bounds(), 2, ""),
    ],
)
def test_recommend(
    current: int, sample: LoadSample, bounds: Bounds, want: int, reason: str
) -> None:
    got, why, message = recommend(S, current, sample, bounds)
    assert (got, why) == (want, reason)
    if reason:
        assert message  # the figures


def test_minimum_is_kept_and_no_trigger_means_no_change() -> None:
    assert recommend(scaling(minReplicas=2), 4, LoadSample(4, 0, 1.0), Bounds())[0] == 2
    only_bounds = scaling(queueDepthUp=None, cpuDownBelow=None)
    assert recommend(only_bounds, 2, LoadSample(2, 999.0, 0.0), Bounds())[0] == 2


def run(
    samples: list[tuple[float, LoadSample]], s: Scaling = S, current: int = 1
) -> list[tuple[float, int, int]]:
    """Feed samples at their times; the (time, from, to) of every decision."""
    state = ScalerState(current=current, since=samples[0][0])
    out = []
    for now, sample in samples:
        state, d = autoscale(s, state, sample, Bounds(), now)
        if d is not None:
            out.append((now, d.from_replicas, d.to_replicas))
            assert d.message and d.reason
    return out


def ready(sample: LoadSample, n: int) -> LoadSample:
    return LoadSample(n, sample.inflight, sample.cpu_percent)


def test_scale_up_only_after_the_queue_stayed_high_for_the_window() -> None:
    samples = [(T + i, BUSY) for i in range(0, 15)]
    assert run(samples) == [(T + 10, 1, 3)]  # the 10 s window covered, then every sample agreed


def test_a_dip_inside_the_up_window_restarts_it() -> None:
    samples = [(T + i, BUSY) for i in range(0, 8)] + [(T + 8, IDLE)]
    samples += [(T + i, BUSY) for i in range(9, 25)]
    assert run(samples) == [(T + 18, 1, 3)]


def test_scale_down_only_after_cpu_stayed_low_for_the_window() -> None:
    samples = [(T + i, ready(IDLE, 3)) for i in range(0, 40)]
    assert run(samples, current=3) == [(T + 30, 3, 1)]


def test_oscillating_load_around_the_threshold_does_not_flap() -> None:
    # 2 replicas; every 4 s the queue goes just above, then just below queueDepthUp, with CPU
    # in between: no sample window ever agrees, so the count never moves.
    high = LoadSample(2, 22.0, 70.0)  # 11 per replica > 10
    low = LoadSample(2, 18.0, 30.0)  # 9 per replica, CPU 30% < 40% but the work needs 2
    samples = [(T + i, high if (i // 4) % 2 == 0 else low) for i in range(0, 300)]
    assert run(samples, current=2) == []


def test_oscillating_between_busy_and_idle_does_not_flap_either() -> None:
    # busy (-> 3 wanted) and idle (-> 1 wanted) alternate every 5 s: up needs 10 s of busy,
    # down 30 s of idle; neither ever comes
    samples = [(T + i, BUSY if (i // 5) % 2 == 0 else IDLE) for i in range(0, 300)]
    assert run(samples) == []


def test_a_new_scaler_waits_for_its_windows() -> None:
    state = initial_state(S, 1, T)
    state, d = autoscale(S, state, BUSY, Bounds(), T + 0.5)
    assert d is None and state.current == 1
    state = initial_state(S, 3, T)
    state, d = autoscale(S, state, ready(IDLE, 3), Bounds(), T + 0.5)
    assert d is None and state.current == 3


def test_zero_windows_act_on_one_sample() -> None:
    s = scaling(scaleUpWindow="0s", scaleDownWindow="0s")
    _state, d = autoscale(s, ScalerState(current=1, since=T), BUSY, Bounds(), T + 1)
    assert d is not None and (d.from_replicas, d.to_replicas, d.reason) == (1, 3, "QueueDepthHigh")
    assert "25.0 per replica, above queueDepthUp 10" in d.message


def test_spec_bounds_apply_at_once() -> None:
    state = ScalerState(current=4, since=T)
    state, d = autoscale(scaling(maxReplicas=2), state, ready(BUSY, 4), Bounds(), T + 1)
    assert d is not None and (d.to_replicas, d.reason) == (2, "AboveMaximum")
    state = ScalerState(current=1, since=T)
    state, d = autoscale(scaling(minReplicas=3), state, IDLE, Bounds(), T + 1)
    assert d is not None and (d.to_replicas, d.reason) == (3, "BelowMinimum")


def test_initial_state_clamps_the_spec_count() -> None:
    assert initial_state(S, 0, T).current == 1
    assert initial_state(S, 9, T).current == 4
    assert initial_state(S, 2, T).current == 2


def test_history_is_bounded_by_the_longest_window() -> None:
    state = ScalerState(current=1, since=T)
    for i in range(1000):
        state, _ = autoscale(S, state, LoadSample(1, 5.0, 50.0), Bounds(), T + i)
    assert len(state.history) <= 31
