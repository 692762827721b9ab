"""The sizing component without processes: what it hands the planner, when it samples, and
that it forgets a workload's autoscaler state with its ``spec.scaling``."""

from __future__ import annotations

import asyncio
from typing import Any

from edged.reconcile.evicting import EvictionPolicy
from edged.reconcile.sizing import Sizer
from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.api import API_VERSION, ModelDeployment, parse_manifest

MI = 1 << 20


def workload(name: str, replicas: int = 1, **spec: Any) -> DesiredWorkload:
    m = parse_manifest(
        {
            "apiVersion": API_VERSION,
            "kind": "ModelDeployment",
            "metadata": {"name": name},
            "spec": {
                "model": {"name": name, "version": "1"},
                "replicas": {"perDevice": replicas},
                **spec,
            },
        }
    )
    assert isinstance(m, ModelDeployment)
    return DesiredWorkload(m, "a" * 64)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def sizer(
    workloads: dict[WorkloadName, DesiredWorkload],
    *,
    eviction: EvictionPolicy | None = None,
    available: list[int] | None = None,
) -> tuple[Sizer, list[str]]:
    enqueued: list[str] = []
    s = Sizer(
        workloads=lambda: workloads,
        replicas=lambda name: [],
        enqueue=enqueued.append,
        period_s=0.01,
        eviction=eviction,
        cpu_count=2,
        clock=Clock(),
        read_available=lambda: available[-1] if available else None,
    )
    return s, enqueued


def test_without_scaling_or_eviction_the_spec_counts_and_nothing_samples() -> None:
    w = {WorkloadName("a"): workload("a", 3)}
    s, _ = sizer(w)
    assert s.size(WorkloadName("a"), w[WorkloadName("a")]) == (None, ())
    assert s.status(WorkloadName("a")) is None and s.device_status() is None
    ticks = 0

    def tick() -> None:
        nonlocal ticks
        ticks += 1

    s.tick = tick  # type: ignore[method-assign]

    async def go() -> None:
        stop = asyncio.Event()
        task = asyncio.ensure_future(s.run(stop))
        await asyncio.sleep(0.1)  # ten periods
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(go())
    assert ticks == 0  # no wake-ups


def test_scaled_workload_starts_from_the_clamped_spec_count_and_forgets() -> None:
    a = WorkloadName("a")
    w = {a: workload("a", 5, scaling={"minReplicas": 1, "maxReplicas": 3})}
    s, _ = sizer(w)
    assert s.size(a, w[a]) == (3, ())
    status = s.status(a)
    assert status is not None and status["scaling"]["desiredReplicas"] == 3
    assert status["scaling"]["lastDecision"] is None
    s._scalers[a] = s._scalers[a].__class__(current=2, since=0.0)  # as after a decision
    w[a] = workload("a", 5)  # scaling removed
    s.desired_changed()
    w[a] = workload("a", 1, scaling={"minReplicas": 1, "maxReplicas": 3})
    assert s.size(a, w[a]) == (1, ())  # afresh, not the old 2


def test_eviction_hands_the_planner_fewer_replicas_and_a_condition() -> None:
    crit, low = WorkloadName("crit"), WorkloadName("low")
    w = {crit: workload("crit", 1, priority=100), low: workload("low", 2)}
    readings = [1000 * MI]
    policy = EvictionPolicy(floor_bytes=500 * MI, hysteresis_bytes=50 * MI, settle_s=0.0)
    s, enqueued = sizer(w, eviction=policy, available=readings)
    s.tick()
    assert s.size(low, w[low]) == (None, ()) and enqueued == []
    readings.append(100 * MI)
    s.tick()
    want, why = s.size(low, w[low])
    assert want == 1 and why[0].type == "Evicted" and why[0].reason == "MemoryPressure"
    assert enqueued == ["low"]
    assert s.size(crit, w[crit]) == (None, ())
    assert s.device_status() == {
        "memoryAvailableFloor": 500 * MI,
        "memoryAvailable": 100 * MI,
        "underPressure": True,
    }
    status = s.status(low)
    assert status is not None and status["eviction"]["evictedReplicas"] == 1
    readings.append(2000 * MI)
    s.tick()
    assert s.size(low, w[low]) == (None, ())
