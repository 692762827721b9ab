"""The planner with providers chosen by discovery: revisions, fallback, no usable provider.

Pure: a table of observed states and the plan; no processes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edged.reconcile.applying import build_launch_spec
from edged.reconcile.model import (
    ObservedWorkload,
    Phase,
    ProviderChoice,
    ReplicaObservation,
    StartReplica,
    StopReplica,
)
from edged.reconcile.planning import plan, replica_id
from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.api import API_VERSION, ModelDeployment, parse_manifest

NAME = WorkloadName("det")
CPU, OV = "CPUExecutionProvider", "OpenVINOExecutionProvider"
T = 1000.0


def desired(providers: list[str]) -> DesiredWorkload:
    dep = parse_manifest(
        {
            "apiVersion": API_VERSION,
            "kind": "ModelDeployment",
            "metadata": {"name": NAME},
            "spec": {
                "model": {"name": "det", "version": "1"},
                "runtime": {"executionProviders": providers},
                "replicas": {"perDevice": 1},
            },
        }
    )
    assert isinstance(dep, ModelDeployment)
    return DesiredWorkload(dep, "a" * 64)


D = desired([OV, CPU])
BOTH = ProviderChoice((OV, CPU))
FALLBACK = ProviderChoice((CPU,), True, "OpenVINOExecutionProvider needs an Intel GPU, NPU or VPU")
NONE = ProviderChoice((), False, "OpenVINOExecutionProvider needs an Intel GPU, NPU or VPU")


def ready(revision: str, **kw: Any) -> ReplicaObservation:
    return ReplicaObservation(
        replica_id=replica_id(NAME, revision, 0),
        revision=revision,
        slot=0,
        phase=Phase.READY,
        pid=10,
        started_at=T - 100,
        ready_since=T - 90,
        **kw,
    )


def test_revision_is_the_base_one_when_the_spec_list_is_used_as_is() -> None:
    assert D.revision_with((OV, CPU)) == D.revision
    assert D.revision_with(None) == D.revision
    assert D.revision_with((CPU,)) != D.revision
    assert D.revision_with((CPU,)) == desired([OV, CPU]).revision_with((CPU,))


def test_first_start_carries_the_chosen_providers_into_the_launch_spec() -> None:
    p = plan(NAME, D, ObservedWorkload(providers=FALLBACK), T)
    rev = D.revision_with((CPU,))
    assert p.actions == (StartReplica(NAME, replica_id(NAME, rev, 0), rev, 0, (CPU,)),)
    assert p.status is not None
    assert p.status.providers == (CPU,)
    cond = {c.type: c for c in p.status.conditions}["AcceleratorUnavailable"]
    assert (cond.status, cond.reason) == ("True", "FellBack")
    assert "running on CPUExecutionProvider: OpenVINOExecutionProvider needs" in cond.message
    (action,) = p.actions
    assert isinstance(action, StartReplica)
    spec = build_launch_spec(D, action, artifact_path=Path("/x"), cgroup_root=None, cpu_count=2)
    assert spec.providers == (CPU,)


def test_accelerator_lost_is_a_zero_downtime_switch_to_cpu_and_back() -> None:
    base, cpu = D.revision, D.revision_with((CPU,))
    # serving on OpenVINO; the NPU goes: a CPU replica starts, the old one keeps serving
    p = plan(NAME, D, ObservedWorkload((ready(base),), providers=FALLBACK), T)
    assert p.actions == (StartReplica(NAME, replica_id(NAME, cpu, 0), cpu, 0, (CPU,)),)
    # the CPU replica is ready: the old one is drained
    p = plan(NAME, D, ObservedWorkload((ready(base), ready(cpu)), providers=FALLBACK), T)
    assert p.actions == (StopReplica(NAME, replica_id(NAME, base, 0), "Superseded"),)
    # the NPU is back: switch back the same way
    p = plan(NAME, D, ObservedWorkload((ready(cpu),), providers=BOTH), T)
    assert p.actions == (StartReplica(NAME, replica_id(NAME, base, 0), base, 0, (OV, CPU)),)
    assert p.status is not None
    assert "AcceleratorUnavailable" not in {c.type for c in p.status.conditions}


def test_no_usable_provider_stops_every_replica_and_says_why() -> None:
    d = desired([OV])
    p = plan(NAME, d, ObservedWorkload((ready(d.revision),), providers=NONE), T)
    assert p.actions == (
        StopReplica(NAME, replica_id(NAME, d.revision, 0), "AcceleratorUnavailable"),
    )
    assert p.status is not None
    assert p.status.phase == "Pending"
    assert p.status.ready_replicas == 0
    types = {c.type: c for c in p.status.conditions}
    assert types["Ready"].status == "False"
    assert types["AcceleratorUnavailable"].reason == "NoUsableProvider"
    assert "Intel GPU, NPU or VPU" in types["AcceleratorUnavailable"].message
    # nothing more to do once they are stopping
    stopping = ready(d.revision, live=True)
    stopping = ReplicaObservation(**{**_fields(stopping), "phase": Phase.STOPPING})
    assert plan(NAME, d, ObservedWorkload((stopping,), providers=NONE), T).actions == ()


def _fields(r: ReplicaObservation) -> dict[str, Any]:
    return {f: getattr(r, f) for f in r.__slots__}  # type: ignore[attr-defined]
