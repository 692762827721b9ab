"""A deployment's status from what devices report: pure, tested as tables.

Per model version, like ``kubectl rollout status``: how many devices should run the
deployment (*desired*), how many run the version the deployment asks for (*updated*), how many
of those have every replica ready (*ready*), and how many of those are also connected
(*available*: a device that stopped sending heartbeats may be serving, but nobody knows).
Devices still on other versions are counted per version, so a rollout's progress is visible.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edgefleet.api import ModelDeployment
from edgefleet.api.conditions import Condition, ConditionStatus
from hub.devices import Device, DevicePhase


@dataclass(frozen=True, slots=True)
class VersionCounts:
    devices: int = 0
    ready: int = 0

    def to_json(self) -> dict[str, int]:
        return {"devices": self.devices, "ready": self.ready}


@dataclass(frozen=True, slots=True)
class DeploymentStatus:
    desired: int
    updated: int
    ready: int
    available: int
    versions: Mapping[str, VersionCounts] = field(default_factory=dict)
    conditions: tuple[Condition, ...] = ()
    failing: Mapping[str, str] = field(default_factory=dict)  # device -> reason

    def to_json(self) -> dict[str, Any]:
        return {
            "desiredDevices": self.desired,
            "updatedDevices": self.updated,
            "readyDevices": self.ready,
            "availableDevices": self.available,
            "versions": {v: c.to_json() for v, c in sorted(self.versions.items())},
            "conditions": [c.to_json() for c in self.conditions],
            "failing": dict(sorted(self.failing.items())),
        }


def deployment_status(
    dep: ModelDeployment, devices: Iterable[Device], assigned: Mapping[str, Iterable[str]]
) -> DeploymentStatus:
    """Status of ``dep`` from device reports; ``assigned`` maps device name -> deployments."""
    name = dep.metadata.name
    want = dep.spec.model.version
    desired = updated = ready = available = 0
    versions: dict[str, list[int]] = {}
    failing: dict[str, str] = {}
    for device in devices:
        if name not in set(assigned.get(device.name, ())):
            continue
        desired += 1
        report = device.workloads.get(name)
        if report is None:
            continue
        counts = versions.setdefault(report.model_version, [0, 0])
        counts[0] += 1
        counts[1] += int(report.ready)
        for cond in report.conditions:
            if cond.get("status") == "False" and cond.get("type") in ("Ready", "Available"):
                failing[device.name] = cond.get("reason", "") + (
                    f": {cond['message']}" if cond.get("message") else ""
                )
        if report.model_version != want:
            continue
        updated += 1
        if report.ready:
            ready += 1
            if device.phase is DevicePhase.READY:
                available += 1
    conditions = (
        Condition(
            "Available",
            ConditionStatus.of(desired > 0 and available == desired),
            "AllDevicesAvailable" if available == desired else "DevicesUnavailable",
            f"{available} of {desired} devices available",
        ),
        Condition(
            "Progressing",
            ConditionStatus.of(updated < desired),
            "RolloutComplete" if updated == desired else "RollingOut",
            f"{updated} of {desired} devices run version {want}",
        ),
    )
    return DeploymentStatus(
        desired,
        updated,
        ready,
        available,
        {v: VersionCounts(c[0], c[1]) for v, c in versions.items()},
        conditions,
        failing,
    )
