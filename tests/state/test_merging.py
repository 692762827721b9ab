"""Merging the static and the hub's desired state, as a table: sources in, merged state out.

Workloads and policies are real documents (``parse_manifest``); no files, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from edged.state.merging import (
    HUB_SOURCE,
    MergedState,
    NameConflict,
    SourceState,
    merge_sources,
    static_workloads,
)
from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.api import API_VERSION, DeviceHealthPolicy, ModelDeployment, parse_manifest


def workload(name: str, source: str, sha: str = "a" * 64) -> DesiredWorkload:
    dep = parse_manifest(
        {
            "apiVersion": API_VERSION,
            "kind": "ModelDeployment",
            "metadata": {"name": name},
            "spec": {"model": {"name": name, "version": "1.0"}},
        }
    )
    assert isinstance(dep, ModelDeployment)
    return DesiredWorkload(dep, sha, source)


def policy(name: str) -> DeviceHealthPolicy:
    pol = parse_manifest(
        {
            "apiVersion": API_VERSION,
            "kind": "DeviceHealthPolicy",
            "metadata": {"name": name},
            "spec": {"maxCpuTemperature": 80},
        }
    )
    assert isinstance(pol, DeviceHealthPolicy)
    return pol


# The workloads and policies of the cases: a name, and the source that gives it.
CAMERA = workload("camera", "camera.yaml")
CAMERA_HUB = workload("camera", HUB_SOURCE, sha="b" * 64)
DOORS = workload("doors", "doors.yaml")
SHELF_HUB = workload("shelf", HUB_SOURCE)
WARM, COOL = policy("warm"), policy("cool")


def named(*items: DesiredWorkload) -> dict[WorkloadName, DesiredWorkload]:
    return {w.name: w for w in items}


@dataclass(frozen=True)
class Case:
    static: SourceState | None  # None: the static source has not read its directory yet
    hub: SourceState | None  # None: not enrolled
    accepted: tuple[DesiredWorkload, ...] = ()  # the accepted (persisted) state
    workloads: tuple[DesiredWorkload, ...] = ()
    policies: tuple[DeviceHealthPolicy, ...] = ()
    conflicts: tuple[NameConflict, ...] = ()


CONFLICT = NameConflict(WorkloadName("camera"), "camera.yaml", HUB_SOURCE)

CASES = {
    # -- one source -----------------------------------------------------------------------------
    "nothing at all": Case(static=SourceState({}), hub=None),
    "static only": Case(
        static=SourceState(named(CAMERA, DOORS), (WARM,)),
        hub=None,
        workloads=(CAMERA, DOORS),
        policies=(WARM,),
    ),
    "hub only": Case(
        static=SourceState({}),
        hub=SourceState(named(SHELF_HUB), (COOL,)),
        workloads=(SHELF_HUB,),
        policies=(COOL,),
    ),
    # -- both ---------------------------------------------------------------------------------
    "different names: all of them": Case(
        static=SourceState(named(CAMERA)),
        hub=SourceState(named(SHELF_HUB)),
        workloads=(CAMERA, SHELF_HUB),
    ),
    "same name: the static one runs, the conflict is returned": Case(
        static=SourceState(named(CAMERA)),
        hub=SourceState(named(CAMERA_HUB, SHELF_HUB)),
        workloads=(CAMERA, SHELF_HUB),
        conflicts=(CONFLICT,),
    ),
    "policies of both apply, static ones first": Case(
        static=SourceState({}, (WARM,)),
        hub=SourceState({}, (COOL,)),
        policies=(WARM, COOL),
    ),
    "the hub took a workload away: it is gone": Case(
        static=SourceState(named(CAMERA)),
        hub=SourceState({}),
        accepted=(CAMERA, SHELF_HUB),
        workloads=(CAMERA,),
    ),
    "the static source dropped a file: its workload is gone": Case(
        static=SourceState({}),
        hub=SourceState(named(SHELF_HUB)),
        accepted=(CAMERA, SHELF_HUB),
        workloads=(SHELF_HUB,),
    ),
    # -- before the static source has read its directory (after a restart) --------------------
    "static not read yet: the accepted static workloads stand in": Case(
        static=None,
        hub=SourceState(named(SHELF_HUB), (COOL,)),
        accepted=(CAMERA, DOORS, SHELF_HUB),
        workloads=(CAMERA, DOORS, SHELF_HUB),
        policies=(COOL,),
    ),
    "static not read yet: accepted hub workloads do not stand in": Case(
        static=None,
        hub=SourceState({}),
        accepted=(CAMERA, SHELF_HUB),
        workloads=(CAMERA,),
    ),
    "static not read yet, no hub: the accepted state stays": Case(
        static=None, hub=None, accepted=(CAMERA, DOORS), workloads=(CAMERA, DOORS)
    ),
    "static not read yet: a stand-in still wins a conflict": Case(
        static=None,
        hub=SourceState(named(CAMERA_HUB)),
        accepted=(CAMERA,),
        workloads=(CAMERA,),
        conflicts=(CONFLICT,),
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_merge_sources(case: Case) -> None:
    accepted = named(*case.accepted)

    merged = merge_sources(case.static, case.hub, accepted)

    assert merged == MergedState(named(*case.workloads), case.policies, case.conflicts)
    assert merged == merge_sources(case.static, case.hub, accepted)  # deterministic
    assert accepted == named(*case.accepted)  # inputs untouched


def test_static_workloads_are_those_not_from_the_hub() -> None:
    assert static_workloads(named(CAMERA, SHELF_HUB, DOORS)) == named(CAMERA, DOORS)
