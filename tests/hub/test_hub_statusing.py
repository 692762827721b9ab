"""Deployment status from device reports, as tables."""

from __future__ import annotations

from edgefleet.api import ModelDeployment, parse_manifest
from hub.devices import Device, DevicePhase, WorkloadReport
from hub.statusing import deployment_status


def dep(version: str) -> ModelDeployment:
    d = parse_manifest(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "ModelDeployment",
            "metadata": {"name": "m"},
            "spec": {"model": {"name": "m", "version": version}},
        }
    )
    assert isinstance(d, ModelDeployment)
    return d


def device(name: str, version: str | None, ready: int = 1, phase: str = "Ready") -> Device:
    reports = {} if version is None else {"m": WorkloadReport(version, "r", 1, ready)}
    return Device(name, phase=DevicePhase(phase), workloads=reports)


def test_rollout_in_progress() -> None:
    devices = [
        device("a", "2.0.0"),
        device("b", "2.0.0", ready=0),
        device("c", "1.0.0"),
        device("d", None),
        device("e", "2.0.0", phase="NotReady"),
        device("unassigned", "1.0.0"),
    ]
    assigned = {d.name: ["m"] for d in devices if d.name != "unassigned"}
    s = deployment_status(dep("2.0.0"), devices, assigned)
    assert (s.desired, s.updated, s.ready, s.available) == (5, 3, 2, 1)
    assert {v: (c.devices, c.ready) for v, c in s.versions.items()} == {
        "2.0.0": (3, 2),
        "1.0.0": (1, 1),
    }
    available, progressing = s.conditions
    assert not available.status and available.message == "1 of 5 devices available"
    assert progressing.status and progressing.reason == "RollingOut"


def test_complete() -> None:
    devices = [device("a", "2.0.0"), device("b", "2.0.0")]
    s = deployment_status(dep("2.0.0"), devices, {"a": ["m"], "b": ["m"]})
    assert (s.desired, s.updated, s.ready, s.available) == (2, 2, 2, 2)
    assert [bool(c.status) for c in s.conditions] == [True, False]
    assert s.to_json()["conditions"][1]["reason"] == "RolloutComplete"


def test_failing_devices_carry_reason() -> None:
    bad = Device(
        "x",
        phase=DevicePhase.READY,
        workloads={
            "m": WorkloadReport(
                "2.0.0",
                conditions=({"type": "Ready", "status": "False", "reason": "ModelLoadFailed"},),
            )
        },
    )
    s = deployment_status(dep("2.0.0"), [bad], {"x": ["m"]})
    assert s.failing == {"x": "ModelLoadFailed"}
