"""What the device tells the hub about itself (Hello and Status), as plain data.

:func:`build_device_report` is pure: discovery's view of the device, the accepted desired
state, the planned status of each workload and the hub source's problems in, a
:class:`DeviceReport` out. Only workloads the hub gave are reported (static ones are the
device's own business); a hub workload that was refused before it ever ran is reported with
``Ready=False`` and the refusal's reason. ``mapping.py`` turns the report into protobuf, so
nothing outside the hub link touches the generated stubs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from edged.reconcile.model import WorkloadStatus
from edged.sources.static import SourceProblem
from edged.state.merging import HUB_SOURCE
from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.api.conditions import Condition, ConditionStatus


@dataclass(frozen=True, slots=True)
class WorkloadReport:
    name: str
    revision: str = ""
    ready_replicas: int = 0
    desired_replicas: int = 0
    model_version: str = ""
    conditions: tuple[Condition, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceReport:
    inventory: dict[str, Any]  # facts, accelerators, execution providers
    labels: dict[str, str]
    schedulable: bool
    reasons: tuple[str, ...]
    workloads: tuple[WorkloadReport, ...]


def build_device_report(
    device: Mapping[str, Any],
    desired: Mapping[WorkloadName, DesiredWorkload],
    status_of: Callable[[WorkloadName], WorkloadStatus | None],
    problems: Sequence[SourceProblem],
) -> DeviceReport:
    """``device``: discovery's status (``{}`` when discovery is off); ``status_of``: the
    status the reconciler planned for a workload (None: not reconciled yet)."""
    health = device.get("health") or {}
    workloads = []
    for name, w in sorted(desired.items()):
        if w.source != HUB_SOURCE:
            continue
        st = status_of(name)
        workloads.append(
            WorkloadReport(
                name=name,
                revision=st.revision if st else "",
                ready_replicas=st.ready_replicas if st else 0,
                desired_replicas=st.desired_replicas if st else 0,
                model_version=w.deployment.spec.model.version,
                conditions=st.conditions if st else (),
            )
        )
    for p in problems:
        if not p.workload:
            continue
        kept = next((i for i, x in enumerate(workloads) if x.name == p.workload), None)
        if kept is None:
            refused = Condition("Ready", ConditionStatus.FALSE, p.reason, p.message)
            workloads.append(WorkloadReport(name=p.workload, conditions=(refused,)))
        else:
            # the previous version keeps serving; the hub still learns why the new one is
            # not taken (InsufficientDisk, a refused signature...)
            not_updated = Condition("Updated", ConditionStatus.FALSE, p.reason, p.message)
            old = workloads[kept]
            workloads[kept] = replace(old, conditions=(*old.conditions, not_updated))
    return DeviceReport(
        inventory={
            "facts": device.get("facts"),
            "accelerators": device.get("accelerators", []),
            "executionProviders": device.get("executionProviders"),
        },
        labels=dict(device.get("labels") or {}),
        schedulable=bool(health.get("schedulable", True)),
        reasons=tuple(health.get("reasons", ())),
        workloads=tuple(workloads),
    )
