"""Where a deployment's replicas are (``hub.decide.placementview``), as a table: pure, no
store, no clock."""

from __future__ import annotations

from typing import Any

import pytest

from edgefleet.api import ModelDeployment, parse_manifest
from hub.decide.devices import (
    Device,
    DevicePhase,
    RevisionPhase,
    RevisionReport,
    WorkloadReport,
)
from hub.decide.placementview import (
    LEAVING,
    PENDING,
    placement_keys,
    placement_name,
    placement_of,
    split_name,
)
from hub.decide.records import DesiredRecord, ModelRecord
from hub.decide.revisions import Revision, template_hash


def dep(replicas: dict[str, int]) -> ModelDeployment:
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": "det"},
        "spec": {"model": {"name": "det", "version": "2.0.0"}, "replicas": replicas},
    }
    parsed = parse_manifest(doc)
    assert isinstance(parsed, ModelDeployment)
    return parsed


def revision(number: int, version: str) -> Revision:
    m = dep({"perDevice": 1}).to_dict()
    m["spec"]["model"]["version"] = version
    return Revision("det", number, template_hash(m), m, 0.0)


REVISIONS = {1: revision(1, "1.0.0"), 2: revision(2, "2.0.0")}
MODELS = {("det", v): ModelRecord("det", v, v[0] * 64, 1, b"{}", 0.0) for v in ("1.0.0", "2.0.0")}


def sent(number: int) -> DesiredRecord:
    return DesiredRecord(3, ("det",), "digest", (("det", number, 3),))


def device(*revs: RevisionReport, phase: DevicePhase = DevicePhase.READY) -> Device:
    workloads = {"det": WorkloadReport(revs[0].model_version, 2, revisions=revs)} if revs else {}
    return Device("cam", phase=phase, workloads=workloads)


def ready(version: str, replicas: int = 2) -> RevisionReport:
    return RevisionReport(version, version[0] * 64, RevisionPhase.READY, replicas, wanted=True)


@pytest.mark.parametrize(
    ("record", "reports", "phase", "expected"),
    [
        # sent revision 2, ready there with both replicas
        (sent(2), (ready("2.0.0"),), DevicePhase.READY,
         {"revision": 2, "version": "2.0.0", "ready": 2, "phase": "Ready", "serving": ("2.0.0",)}),
        # sent 2, 1.0.0 still serves while 2.0.0 loads
        (sent(2), (RevisionReport("2.0.0", "2" * 64, RevisionPhase.LOADING), ready("1.0.0")),
         DevicePhase.READY,
         {"phase": "Loading", "ready": 0, "serving": ("1.0.0",)}),
        # sent 2, nothing reported of it yet: pending, what serves meanwhile named
        (sent(2), (ready("1.0.0"),), DevicePhase.READY,
         {"phase": PENDING, "reason": "1.0.0 serves meanwhile"}),
        # sent, the device is away
        (sent(1), (), DevicePhase.NOT_READY,
         {"phase": PENDING, "reason": "device is NotReady", "device_phase": "NotReady"}),
        # failed there: why, as the device said it
        (sent(2), (RevisionReport("2.0.0", "2" * 64, RevisionPhase.FAILED, reason="OOM",
                                  message="worker killed"),), DevicePhase.READY,
         {"phase": "Failed", "reason": "2.0.0 Failed: OOM: worker killed"}),
        # no longer sent, still reported: leaving
        (None, (ready("1.0.0", 1),), DevicePhase.READY,
         {"placed": False, "revision": 0, "replicas": 0, "ready": 1, "phase": LEAVING}),
    ],
)  # fmt: skip
def test_one_devices_share_of_a_deployment(
    record: DesiredRecord | None,
    reports: tuple[RevisionReport, ...],
    phase: DevicePhase,
    expected: dict[str, Any],
) -> None:
    shown = placement_of(
        "det",
        device(*reports, phase=phase),
        dep=dep({"perDevice": 2}),
        record=record,
        revisions=REVISIONS,
        models=MODELS,
    )
    for field, value in expected.items():
        assert getattr(shown, field) == value, (field, shown)
    if record is not None:
        assert shown.placed and shown.replicas == 2  # perDevice, as the deployment says now


def test_a_total_deployment_asks_one_replica_per_device_placed() -> None:
    shown = placement_of(
        "det", device(ready("2.0.0", 1)), dep=dep({"total": 5}), record=sent(2),
        revisions=REVISIONS, models=MODELS,
    )  # fmt: skip
    assert (shown.replicas, shown.ready, shown.phase) == (1, 1, "Ready")


def test_the_object_names_and_labels() -> None:
    shown = placement_of(
        "det", device(ready("2.0.0")), dep=dep({"perDevice": 2}), record=sent(2),
        revisions=REVISIONS, models=MODELS,
    ).to_object()  # fmt: skip
    assert shown["kind"] == "Placement"
    assert shown["metadata"] == {
        "name": "det@cam",
        "labels": {"deployment": "det", "device": "cam"},
    }
    assert shown["status"]["readyReplicas"] == 2 and shown["status"]["revision"] == 2
    assert split_name(placement_name("det", "cam")) == ("det", "cam")
    for bad in ("det", "@cam", "det@", "a@b@c"):
        assert split_name(bad) is None


def test_the_keys_are_the_devices_sent_it_and_those_still_reporting_it() -> None:
    leaving = Device("old", workloads={"det": WorkloadReport("1.0.0", 1)})
    other = Device("x", workloads={"gone": WorkloadReport("1.0.0", 1)})  # no such deployment
    keys = placement_keys(["det", "cls"], {"det": ["b", "a"], "zzz": ["q"]}, [leaving, other])
    assert keys == [("det", "a"), ("det", "b"), ("det", "old")]
