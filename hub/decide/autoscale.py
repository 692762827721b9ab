"""Fleet autoscaling of ``replicas.total`` deployments (pure: device reports, state and ``now``
in; the desired totals and decisions out).

The devices that hold a placement report, per workload, the latest sample of their load
(requests in flight per ready replica, the workers' CPU %: ``WorkloadSizing.queue_depth``,
``cpu_percent``, refreshed at most every 5 s). :func:`fleet_sample` adds them up into one
sample of the whole deployment (requests in flight of every device, CPU weighted by ready
replicas), and :func:`plan_totals` runs the same autoscaler as edged's
(:mod:`edgefleet.autoscaler`: Kubernetes HPA semantics, up and down stabilization windows,
``minReplicas..maxReplicas``) over the fleet's count: up when the requests in flight per
ready replica stay above ``queueDepthUp``, down when CPU stays below ``cpuDownBelow``. The
result is the ``total`` the scheduler places (``hub/controllers/placement.py``); ``replicas.total``
of
the spec is the starting count, and a change of the spec (total or scaling) starts afresh.
Devices that report no figures (yet) are left out of the sample; with none at all the sample
is empty and only the bounds apply.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from edgefleet.api import ModelDeployment
from edgefleet.api.manifests import Scaling
from edgefleet.autoscaler import (
    Bounds,
    Decision,
    LoadSample,
    ScalerState,
    autoscale,
    initial_state,
)


@dataclass(frozen=True, slots=True)
class DeviceLoad:
    """What one device holding a placement reports of the deployment's workload."""

    device: str
    ready: int  # ready replicas there
    queue_depth: float | None  # requests in flight per ready replica (None: not reported)
    cpu_percent: float | None


@dataclass(frozen=True, slots=True)
class FleetScaler:
    """The autoscaler's state of one deployment, and the spec it started from."""

    spec_key: tuple[int, str]  # (replicas.total, scaling) it started from
    state: ScalerState


@dataclass(frozen=True, slots=True)
class FleetPlan:
    scalers: Mapping[str, FleetScaler]
    totals: Mapping[str, int]  # deployment -> the total to place
    decisions: tuple[tuple[str, Decision], ...] = ()


def fleet_sample(loads: Sequence[DeviceLoad]) -> LoadSample:
    """One sample of the whole deployment from the devices' reports."""
    reporting = [x for x in loads if x.ready > 0 and x.queue_depth is not None]
    ready = sum(x.ready for x in reporting)
    inflight = sum((x.queue_depth or 0.0) * x.ready for x in reporting)
    with_cpu = [x for x in reporting if x.cpu_percent is not None]
    cpu = None
    if with_cpu and len(with_cpu) == len(reporting):  # partial CPU figures would mislead
        cpu = sum((x.cpu_percent or 0.0) * x.ready for x in with_cpu) / ready
    return LoadSample(ready=ready, inflight=inflight, cpu_percent=cpu)


def _bounded(scaling: Scaling, spec_total: int, total: int, now: float) -> Decision:
    reason = "BelowMinimum" if total > spec_total else "AboveMaximum"
    message = f"scaling bounds are {scaling.min_replicas}..{scaling.max_replicas}"
    return Decision(now, spec_total, total, reason, message)


def _spec_key(dep: ModelDeployment) -> tuple[int, str]:
    scaling = dep.spec.scaling
    return (dep.spec.replicas.total or 0, repr(scaling.to_dict() if scaling else None))


def scaled(dep: ModelDeployment) -> bool:
    """Whether the hub scales this deployment (``replicas.total`` with ``spec.scaling``)."""
    return dep.spec.replicas.total is not None and dep.spec.scaling is not None


def plan_totals(
    deployments: Sequence[ModelDeployment],
    loads: Mapping[str, Sequence[DeviceLoad]],
    scalers: Mapping[str, FleetScaler],
    now: float,
) -> FleetPlan:
    """One sample for every scaled deployment: the next states, totals and decisions."""
    out: dict[str, FleetScaler] = {}
    totals: dict[str, int] = {}
    decisions: list[tuple[str, Decision]] = []
    for dep in sorted(deployments, key=lambda d: d.metadata.name):
        scaling = dep.spec.scaling
        if not scaled(dep) or scaling is None:
            continue
        name = dep.metadata.name
        key = _spec_key(dep)
        held = scalers.get(name)
        if held is None or held.spec_key != key:
            spec_total = dep.spec.replicas.total or 0
            held = FleetScaler(key, initial_state(scaling, spec_total, now))
            if held.state.current != spec_total:  # brought within the bounds: say so
                decisions.append((name, _bounded(scaling, spec_total, held.state.current, now)))
        state, decision = autoscale(
            scaling, held.state, fleet_sample(loads.get(name, ())), Bounds(), now
        )
        out[name] = FleetScaler(key, state)
        totals[name] = state.current
        if decision is not None:
            decisions.append((name, decision))
    return FleetPlan(out, totals, tuple(decisions))
