"""Where a deployment's replicas are, as ``edgectl get placements`` and ``describe
deployment`` show it (pure): one *Placement* per (deployment, device) for every device the hub
sends the deployment now (its desired record carries it) and every device that still reports
it (leaving: edged stops it), with the revision it is sent, the replicas asked and ready, and
how far that revision got there, from the device's own report (nothing claimed that it did
not say).

A Placement is shown, never stored nor applied (like a Region): the hub's Get and List serve
it from the cache (:mod:`hub.api.admin.reading`), named ``DEPLOYMENT@DEVICE`` and labelled
``deployment`` and ``device`` so that ``-l deployment=NAME`` selects one deployment's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from edgefleet.api import API_VERSION, ModelDeployment
from hub.decide.devices import Device, DevicePhase
from hub.decide.records import DesiredRecord, ModelRecord
from hub.decide.revisions import Revision
from hub.decide.status import BROKEN, describe_failure, revisions_of, wanted_revision

KIND_PLACEMENT = "Placement"
PLACEMENT_MANAGED = (
    "a Placement is where the hub put a deployment's replicas (its scheduler and placement): "
    "change the deployment's spec.placement or spec.replicas (edgectl apply), or cordon the "
    "device (edgectl devices cordon NAME)"
)
SEPARATOR = "@"
PENDING = "Pending"  # sent, nothing reported of that revision yet
LEAVING = "Leaving"  # no longer sent there, still reported: edged stops it


def placement_name(deployment: str, device: str) -> str:
    return f"{deployment}{SEPARATOR}{device}"


def split_name(name: str) -> tuple[str, str] | None:
    """``DEPLOYMENT@DEVICE`` as (deployment, device); None when it is not one."""
    deployment, at, device = name.partition(SEPARATOR)
    if not at or not deployment or not device or SEPARATOR in device:
        return None
    return deployment, device


@dataclass(frozen=True, slots=True)
class Placed:
    """One device's share of one deployment."""

    deployment: str
    device: str
    placed: bool  # the hub sends it the deployment now
    revision: int = 0  # the revision it was sent (0: none, or leaving)
    version: str = ""  # that revision's model version
    replicas: int = 0  # replicas asked of the device (0: leaving)
    ready: int = 0  # ready replicas of that revision there
    phase: str = PENDING  # of that revision there (RevisionPhase), Pending or Leaving
    reason: str = ""
    serving: tuple[str, ...] = ()  # the versions that serve there now
    device_phase: str = ""

    def to_object(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND_PLACEMENT,
            "metadata": {
                "name": placement_name(self.deployment, self.device),
                "labels": {"deployment": self.deployment, "device": self.device},
            },
            "spec": {"deployment": self.deployment, "device": self.device},
            "status": {
                "placed": self.placed,
                "revision": self.revision,
                "version": self.version,
                "replicas": self.replicas,
                "readyReplicas": self.ready,
                "phase": self.phase,
                "reason": self.reason,
                "serving": list(self.serving),
                "devicePhase": self.device_phase,
            },
        }


def replicas_asked(dep: ModelDeployment | None) -> int:
    """Replicas a device placed for ``dep`` runs: ``perDevice``, or one for a ``total``
    (the scheduler places one per device), as the deployment says now."""
    if dep is None:
        return 0
    per = dep.spec.replicas.per_device
    return per if per is not None else 1


def placement_of(
    deployment: str,
    device: Device,
    *,
    dep: ModelDeployment | None,
    record: DesiredRecord | None,
    revisions: Mapping[int, Revision],
    models: Mapping[tuple[str, str], ModelRecord],
) -> Placed:
    """``device``'s share of ``deployment``: what its desired ``record`` carries (the
    revision sent) and what it reports of it."""
    placed = record is not None and deployment in record.deployments
    number = 0
    if placed and record is not None:
        number = next((n for d, n in record.numbers() if d == deployment), 0)
    revision = revisions.get(number)
    version = revision.model[1] if revision is not None else ""
    report = device.workloads.get(deployment)
    reported = revisions_of(report) if report is not None else ()
    serving = tuple(sorted({r.model_version for r in reported if r.serves}))
    shown = Placed(
        deployment, device.name, placed, number, version, serving=serving,
        device_phase=device.phase.value,
    )  # fmt: skip
    if not placed:
        ready = sum(r.ready_replicas for r in reported if r.serves)
        why = "no longer placed here: edged stops it"
        return replace(shown, ready=ready, phase=LEAVING, reason=why)
    shown = replace(shown, replicas=replicas_asked(dep))
    if revision is None:
        return replace(shown, reason="no revision sent yet")
    model = models.get(revision.model)
    got = wanted_revision(reported, version, model.sha256 if model is not None else None)
    if got is None:
        why = "not reported yet"
        if device.phase is not DevicePhase.READY:
            why = f"device is {device.phase.value}"
        elif serving:
            why = f"{', '.join(serving)} serves meanwhile"
        return replace(shown, reason=why)
    reason = describe_failure(got) if got.phase in BROKEN else got.reason
    return replace(shown, ready=got.ready_replicas, phase=got.phase.value, reason=reason)


def placement_keys(
    deployments: Iterable[str],
    holding: Mapping[str, Iterable[str]],
    devices: Iterable[Device],
) -> list[tuple[str, str]]:
    """Every (deployment, device) shown, sorted: the devices each deployment of
    ``deployments`` is sent (``holding``: deployment -> devices, the desired records' index)
    and those that report it (of any deployment the hub knows)."""
    known = set(deployments)
    pairs = {(d, n) for d in known for n in holding.get(d, ())}
    for device in devices:
        pairs.update((d, device.name) for d in device.workloads if d in known)
    return sorted(pairs)
