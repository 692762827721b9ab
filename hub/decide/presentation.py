"""How the hub shows its objects to operators: Kubernetes-shaped JSON documents. Pure.

* Devices: ``metadata.labels`` are every label the device has (reported and operator's, the
  operator's winning, as placement sees them), ``spec`` what an operator sets (labels,
  cordoned), ``status`` what the device reported and what the hub decided (taints, desired
  generation and deployments).
* Stored objects: the canonical manifest as applied; a ModelDeployment gets a computed
  ``status`` (:func:`hub.decide.status.deployment_status`).
* Models: :meth:`hub.decide.records.ModelRecord.to_json`; bootstrap tokens (kind
  ``BootstrapToken``): :func:`token_object`, never with their secret.

Every object gets ``metadata.uid`` (stable while the object exists: derived from its store key
and creation revision, new when it is deleted and made again), ``metadata.resourceVersion``
(the store revision of its last change) and ``metadata.creationTimestamp``
(:func:`with_store_metadata`). Times are RFC 3339 UTC strings; numbers the device reported
as whole floats (protobuf Struct has only doubles: ``cpuCount: 2.0``) are shown as integers.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from edgefleet.api import API_VERSION, ModelDeployment, parse_manifest
from edgefleet.timestamps import rfc3339
from hub.decide.devices import Device, WorkloadReport
from hub.decide.nodes import Explanation
from hub.decide.placement import SecurityPolicy, taints_for
from hub.decide.records import KIND_DEVICE, DesiredRecord, ModelRecord, TokenRecord
from hub.decide.status import deployment_status

KIND_TOKEN = "BootstrapToken"
KIND_REGION = "Region"  # a regional hub below a root (hub.state.regions.region_object): shown only
REGION_MANAGED = (
    "a Region is made by enrolling its regional hub (hub token create --for-region NAME at the "
    "root, then hub init --parent on the region's machine) and ended with edgectl regions "
    "revoke NAME; edgectl get regions shows them"
)
_UID_NAMESPACE = uuid.UUID("8d0c5e0e-6f1e-4b8e-9a57-3c1f3c0e2a11")


def with_store_metadata(
    doc: Mapping[str, Any],
    *,
    key: str,
    create_revision: int,
    mod_revision: int,
    created: float | None = None,
) -> dict[str, Any]:
    """``doc`` with ``metadata.uid``, ``resourceVersion`` and (when known)
    ``creationTimestamp``; an existing creationTimestamp is kept."""
    metadata = dict(doc.get("metadata", {}))
    metadata["uid"] = str(uuid.uuid5(_UID_NAMESPACE, f"{key}#{create_revision}"))
    metadata["resourceVersion"] = str(mod_revision)
    if "creationTimestamp" not in metadata and created is not None:
        metadata["creationTimestamp"] = rfc3339(created)
    return {**doc, "metadata": metadata}


def _plain(value: Any) -> Any:
    """Whole floats as integers, recursively (what a person expects to read)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def workload_phase(report: WorkloadReport) -> str:
    """What a workload is doing, from the device's report: the phase it sent, else Ready
    (every desired replica ready), Stopped (none desired), or Progressing (the reason of the
    first false condition when there is one)."""
    if report.phase:
        return report.phase
    if report.desired_replicas == 0:
        return "Stopped"
    if report.ready:
        return "Ready"
    for condition in report.conditions:
        if condition.get("status") == "False" and condition.get("reason"):
            return str(condition["reason"])
    return "Progressing"


def _workloads(device: Device) -> dict[str, Any]:
    shown: dict[str, Any] = {}
    for name, report in sorted(device.workloads.items()):
        shown[name] = {**report.to_json(), "phase": workload_phase(report)}
    return shown


def device_object(
    device: Device,
    policy: SecurityPolicy,
    desired: DesiredRecord | None,
    excluded: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A device as operators see it; ``excluded``: why each deployment it does not run is
    not there (the projector's last word: a selector, a taint, the scheduler...)."""
    record = device.to_json()
    attestation = record["attestation"]
    metadata: dict[str, Any] = {
        "name": device.name,
        "labels": dict(sorted(device.all_labels().items())),
    }
    if device.enrolled_at is not None:
        metadata["creationTimestamp"] = rfc3339(device.enrolled_at)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND_DEVICE,
        "metadata": metadata,
        "spec": {"labels": record["labels"], "cordoned": device.cordoned},
        "status": {
            "phase": record["phase"],
            "revoked": device.revoked,
            "health": record["health"],
            "attestation": {
                **attestation,
                "verifiedAt": rfc3339(device.attestation.verified_at),
                "challengedAt": rfc3339(device.attestation.challenged_at),
            },
            "facts": _plain(record["facts"]),
            "reportedLabels": record["reportedLabels"],
            "lastHeartbeat": rfc3339(device.last_heartbeat),
            "enrolledAt": rfc3339(device.enrolled_at),
            "certificateSerial": device.certificate_serial,
            "agentVersion": device.agent_version,
            "agentRefused": device.agent_refused,
            # the device's last agent report: its phase in an upgrade, the versions, the reason
            "agent": device.agent.to_json() if device.agent is not None else None,
            "generationAcked": device.generation_acked,
            "generationDesired": desired.generation if desired else 0,
            "deployments": list(desired.deployments) if desired else [],
            "workloads": _workloads(device),
            "taints": [t.to_json() for t in taints_for(device, policy)],
            "compliance": dict(device.compliance) if device.compliance is not None else None,
            "notRunning": dict(sorted((excluded or {}).items())),
        },
    }


def deployment_object(
    manifest: Mapping[str, Any],
    devices: Iterable[Device],
    assigned: Mapping[str, Iterable[str]],
    dep: ModelDeployment | None = None,
    *,
    model_sha256: str | None = None,
    model_pushed: bool | None = None,
    placeable: int | None = None,
    assigned_models: Mapping[str, tuple[str, str | None]] | None = None,
    scheduled: Explanation | None = None,
    withheld: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The stored manifest with its status computed from device reports."""
    if dep is None:
        parsed = parse_manifest(dict(manifest))
        assert isinstance(parsed, ModelDeployment)
        dep = parsed
    status = deployment_status(
        dep,
        devices,
        assigned,
        model_sha256=model_sha256,
        model_pushed=model_pushed,
        placeable=placeable,
        assigned_models=assigned_models,
        scheduled=scheduled,
        withheld=withheld,
    )
    return {**manifest, "status": status.to_json()}


def object_labels(doc: Mapping[str, Any]) -> Mapping[str, str]:
    labels: Mapping[str, str] = doc.get("metadata", {}).get("labels", {})
    return labels


def model_object(record: ModelRecord) -> dict[str, Any]:
    doc = record.to_json()
    doc["metadata"] = {**doc["metadata"], "creationTimestamp": rfc3339(record.pushed_at)}
    doc["status"] = {**doc["status"], "pushedAt": rfc3339(record.pushed_at)}
    return doc


def token_object(record: TokenRecord) -> dict[str, Any]:
    """A bootstrap token as operators see it: its id as name, never its secret."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND_TOKEN,
        "metadata": {"name": record.id, "creationTimestamp": rfc3339(record.created)},
        "spec": {
            "description": record.description,
            "expires": rfc3339(record.expires),
            "singleUse": record.single_use,
            "deviceLabels": dict(sorted(record.labels.items())),
            "allowOwnLabels": record.device_labels,
            "ownLabelPrefix": record.device_label_prefix,
            **({"forRegion": record.for_region} if record.for_region else {}),
        },
        "status": {"used": rfc3339(record.used)},
    }


def fleet_compliance(devices: Iterable[Device]) -> dict[str, Any]:
    """``status`` of a SecurityBaseline (every baseline applies fleet-wide): the devices by
    what their drift watch last reported: ``compliant``, ``drifted`` (findings, or
    quarantined) or ``unknown`` (not checked yet, or never reported), and the findings by
    kind across the fleet."""
    compliant = drifted = unknown = quarantined = 0
    kinds: dict[str, int] = {}
    for device in devices:
        c = device.compliance
        if c is None or not c.get("checked"):
            unknown += 1
            continue
        if c.get("quarantined"):
            quarantined += 1
        if c.get("compliant"):
            compliant += 1
            continue
        drifted += 1
        for kind in {str(f.get("kind", "")) for f in c.get("findings", [])}:
            kinds[kind] = kinds.get(kind, 0) + 1
    return {
        "devices": {
            "compliant": compliant,
            "drifted": drifted,
            "unknown": unknown,
            "quarantined": quarantined,
        },
        "findingKinds": dict(sorted(kinds.items())),
    }
