"""Fleet autoscaling of ``replicas.total`` (``hub/decide/autoscale.py``, pure) as tables, and the
controller with the real scheduler controller on a real SQLite store: the load devices report
moves the number of placements, each decision an event. Faked: the clock and the device
reports (set in the cache as a Status would)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from asynctesting import async_test
from hubtesting import FakeClock

from edgefleet.api import ModelDeployment, parse_manifest
from edgefleet.autoscaler import LoadSample
from hub.controllers.fleetautoscaler import FleetAutoscaler
from hub.controllers.placement import Scheduler
from hub.decide.autoscale import DeviceLoad, FleetScaler, fleet_sample, plan_totals
from hub.decide.desired import manifest_for
from hub.decide.devices import Device, DevicePhase, WorkloadReport
from hub.decide.rollout import Revision, template_hash
from hub.state import feed as kinds
from hub.state.cache import Cache
from hub.state.projector import Projector
from hub.state.sessions import Sessions
from hub.state.store import SqliteStore
from hub.state.writer import DeviceWriter

GiB = 1024**3
T = 1000.0


def deployment(name: str = "fraud", total: int = 2, **scaling: Any) -> ModelDeployment:
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": name, "version": "1.0.0"},
            "replicas": {"total": total},
            "scaling": {
                "minReplicas": 1,
                "maxReplicas": 5,
                "queueDepthUp": 4,
                "cpuDownBelow": "40%",
                "scaleUpWindow": "10s",
                "scaleDownWindow": "30s",
                **scaling,
            },
        },
    }
    m = parse_manifest(doc)
    assert isinstance(m, ModelDeployment)
    return m


def loads(*figures: tuple[int, float | None, float | None]) -> list[DeviceLoad]:
    return [DeviceLoad(f"d{i}", r, q, c) for i, (r, q, c) in enumerate(figures)]


@pytest.mark.parametrize(
    ("figures", "expected"),
    [
        ((), LoadSample(0, 0.0, None)),
        (((1, 10.0, 90.0), (1, 2.0, 50.0)), LoadSample(2, 12.0, 70.0)),
        (((2, 3.0, 30.0), (1, 6.0, 60.0)), LoadSample(3, 12.0, 40.0)),
        # a device without figures (yet) is left out; partial CPU figures give no CPU
        (((1, 10.0, 90.0), (1, None, None)), LoadSample(1, 10.0, 90.0)),
        (((1, 10.0, 90.0), (1, 2.0, None)), LoadSample(2, 12.0, None)),
        (((0, 10.0, 90.0),), LoadSample(0, 0.0, None)),
    ],
)
def test_fleet_sample(figures: tuple[tuple[int, float, float], ...], expected: LoadSample) -> None:
    assert fleet_sample(loads(*figures)) == expected


def run(
    dep: ModelDeployment, samples: list[tuple[float, list[DeviceLoad]]]
) -> list[tuple[float, int, str]]:
    """The totals over a timeline of samples: (time, total, decision reason or "")."""
    scalers: dict[str, FleetScaler] = {}
    out = []
    for at, figures in samples:
        result = plan_totals([dep], {dep.metadata.name: figures}, scalers, at)
        scalers = dict(result.scalers)
        reasons = [d.reason for _, d in result.decisions]
        out.append((at, result.totals[dep.metadata.name], reasons[0] if reasons else ""))
    return out


def every(seconds: float, until: float, figures: list[DeviceLoad], start: float = T) -> list:
    n = int((until - start) / seconds)
    return [(start + i * seconds, figures) for i in range(n + 1)]


def test_sustained_queue_scales_up_after_the_window_and_not_before() -> None:
    busy = loads((1, 10.0, 95.0), (1, 10.0, 95.0))  # 20 in flight, queueDepthUp 4 -> 5
    timeline = run(deployment(), every(5, T + 15, busy))
    assert [(t - T, n, why) for t, n, why in timeline] == [
        (0, 2, ""),
        (5, 2, ""),
        (10, 5, "QueueDepthHigh"),  # the 10 s window is covered by samples that all agree
        (15, 5, ""),
    ]


def test_idle_scales_down_after_the_down_window_to_what_cpu_needs() -> None:
    idle = loads((1, 0.0, 10.0), (1, 0.0, 10.0))  # CPU 10% over 2 replicas, below 40%
    timeline = run(deployment(), every(5, T + 35, idle))
    changes = [(t - T, n, why) for t, n, why in timeline if why]
    assert changes == [(30, 1, "CpuLow")]


def test_a_load_oscillating_around_the_threshold_never_flaps() -> None:
    high = loads((1, 5.0, 90.0), (1, 5.0, 90.0))  # 5 per replica: above 4
    low = loads((1, 3.0, 60.0), (1, 3.0, 60.0))  # below 4, CPU not low
    samples = [(T + 5 * i, high if i % 2 else low) for i in range(40)]
    assert {n for _, n, _ in run(deployment(), samples)} == {2}


def test_bounds_and_a_changed_spec_start_afresh() -> None:
    # a total above maxReplicas is brought down at once, and says why
    timeline = run(deployment(total=8), [(T, loads((1, 1.0, 60.0)))])
    assert timeline == [(T, 5, "AboveMaximum")]
    # scale-up stops at maxReplicas
    busy = loads(*[(1, 100.0, 99.0)] * 2)
    timeline = run(deployment(maxReplicas=3), every(5, T + 10, busy))
    assert timeline[-1][1:] == (3, "QueueDepthHigh")
    # a new spec (another total) is a new starting point
    scalers: dict[str, FleetScaler] = {}
    first = plan_totals([deployment(total=2)], {}, scalers, T)
    again = plan_totals([deployment(total=3)], {}, first.scalers, T + 5)
    assert (first.totals["fraud"], again.totals["fraud"]) == (2, 3)


def test_only_total_deployments_with_scaling_are_the_hubs() -> None:
    per_device = parse_manifest(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "ModelDeployment",
            "metadata": {"name": "p"},
            "spec": {
                "model": {"name": "p", "version": "1"},
                "replicas": {"perDevice": 1},
                "scaling": {"maxReplicas": 3},
            },
        }
    )
    assert isinstance(per_device, ModelDeployment)
    assert plan_totals([per_device], {}, {}, T).totals == {}


def test_a_placed_device_gets_scaling_it_never_acts_on() -> None:
    dep = deployment().to_dict()
    revision = Revision("fraud", 1, template_hash(dep), dep, 0.0)
    sent = orjson.loads(manifest_for(revision, {}))["spec"]
    assert sent["replicas"] == {"perDevice": 1}
    assert (sent["scaling"]["minReplicas"], sent["scaling"]["maxReplicas"]) == (1, 1)
    assert sent["scaling"]["queueDepthUp"] == 4  # it samples the load and reports it


# -- the controller with the scheduler -------------------------------------------------------


def device(name: str, now: float) -> Device:
    return Device(
        name,
        phase=DevicePhase.READY,
        last_heartbeat=now,
        facts={"facts": {"cpuCount": 4, "memoryTotalBytes": 4 * GiB}},
    )


def report(queue_depth: float, cpu: float) -> WorkloadReport:
    sizing = {"queueDepth": queue_depth, "cpuPercent": cpu, "currentReplicas": 1}
    return WorkloadReport("1.0.0", desired_replicas=1, ready_replicas=1, sizing=sizing)


@async_test
async def test_reported_queue_depth_moves_the_number_of_placements(tmp_path: Path) -> None:
    clock = FakeClock()
    store = await SqliteStore.open(tmp_path / "hub.db")
    try:
        cache = Cache(devices={f"d{i}": device(f"d{i}", clock.now) for i in range(6)})
        cache.put_object(deployment(total=2).to_dict(), 1)
        writer = DeviceWriter(store, cache)
        projector = Projector(store, cache, Sessions(), region="eu")
        scheduler = Scheduler(
            store, cache, projector, writer, region="eu", reschedule_after_s=60.0, clock=clock
        )
        woken: list[str] = []  # the scheduler learns of a total through the change feed
        cache.feed.watch((kinds.SCALED,), lambda kind, name: woken.append(name))
        autoscaler = FleetAutoscaler(cache, writer, clock=clock)
        assert not autoscaler.tick()  # the spec's total: nothing to wake for
        await scheduler.pass_now()
        assert len(cache.placements["fraud"]) == 2

        def devices_report(queue_depth: float, cpu: float) -> None:
            for name in cache.placements["fraud"]:
                d = cache.devices[name]
                cache.devices[name] = d.with_(workloads={"fraud": report(queue_depth, cpu)})

        # 10 requests in flight on each replica: 20 over queueDepthUp 4 -> 5, once the 10 s
        # window is covered by samples that agree
        devices_report(10.0, 95.0)
        clock.advance(5)
        assert not autoscaler.tick()  # the window is not covered by samples yet
        clock.advance(5)
        assert autoscaler.tick() and woken == ["fraud"]
        assert autoscaler.total("fraud") == 5
        await scheduler.pass_now()
        assert len(cache.placements["fraud"]) == 5
        scaled = [e for e in cache.events if e["reason"] == "QueueDepthHigh"]
        assert len(scaled) == 1
        assert scaled[0]["object"] == {"kind": "ModelDeployment", "name": "fraud"}
        assert scaled[0]["message"].startswith("replicas.total 2 -> 5: 20.0 requests in flight")

        # idle on all five: down to what the CPU needs after the 30 s window, not before
        devices_report(0.0, 5.0)
        for _ in range(5):
            clock.advance(5)
            assert not autoscaler.tick()
        clock.advance(5)
        assert autoscaler.tick()
        assert autoscaler.total("fraud") == 1
        await scheduler.pass_now()
        assert len(cache.placements["fraud"]) == 1
        assert [e["reason"] for e in cache.events if e["reason"] == "CpuLow"] == ["CpuLow"]
    finally:
        await store.close()
