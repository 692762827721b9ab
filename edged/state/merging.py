"""Merging the desired state of the two sources (pure: data in, merged state out).

The static manifests directory (local, like kubelet's static pods) and the hub each give
workloads and DeviceHealthPolicy documents. :func:`merge_sources` decides what the device
runs: a workload name defined by both is the static one (the conflict is returned, so it can
be reported); the policies of both apply. Until the static source has read its directory once
(``static is None``), the static workloads of the accepted state stand in for it, so a
restart drops nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.api import DeviceHealthPolicy, SecurityBaseline

HUB_SOURCE = "hub"  # DesiredWorkload.source of every workload the hub gave


@dataclass(frozen=True, slots=True)
class SourceState:
    """What one source holds: its workloads and its DeviceHealthPolicy documents."""

    workloads: Mapping[WorkloadName, DesiredWorkload]
    policies: Sequence[DeviceHealthPolicy] = ()
    baselines: Sequence[SecurityBaseline] = ()


@dataclass(frozen=True, slots=True)
class NameConflict:
    """Both sources define ``name``: the static one (from ``kept``) runs, the hub's does not."""

    name: WorkloadName
    kept: str  # source of the workload that runs (a manifest file)
    dropped: str  # source of the one that does not (the hub)


@dataclass(frozen=True, slots=True)
class MergedState:
    workloads: dict[WorkloadName, DesiredWorkload]
    policies: tuple[DeviceHealthPolicy, ...]
    conflicts: tuple[NameConflict, ...] = ()
    baselines: tuple[SecurityBaseline, ...] = ()  # of both sources: every one applies


def merge_sources(
    static: SourceState | None,
    hub: SourceState | None,
    accepted: Mapping[WorkloadName, DesiredWorkload],
) -> MergedState:
    """The desired state of the device from both sources (``None``: no such source yet).

    ``static is None``: the static source has not been read yet; the non-hub workloads of
    ``accepted`` (the persisted state) stand in for it, with no policies.
    """
    if static is None:
        static = SourceState(static_workloads(accepted))
    hub_workloads = hub.workloads if hub is not None else {}
    merged = dict(hub_workloads)
    merged.update(static.workloads)
    conflicts = tuple(
        NameConflict(name, static.workloads[name].source, hub_workloads[name].source)
        for name in sorted(static.workloads.keys() & hub_workloads.keys())
    )
    policies = (*static.policies, *(hub.policies if hub is not None else ()))
    baselines = (*static.baselines, *(hub.baselines if hub is not None else ()))
    return MergedState(merged, policies, conflicts, baselines)


def static_workloads(
    accepted: Mapping[WorkloadName, DesiredWorkload],
) -> dict[WorkloadName, DesiredWorkload]:
    """The workloads of ``accepted`` that did not come from the hub."""
    return {n: w for n, w in accepted.items() if w.source != HUB_SOURCE}
