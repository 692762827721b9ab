"""How the hub shows its objects to operators: Kubernetes-shaped JSON documents. Pure.

* Devices: ``metadata.labels`` are every label the device has (reported and operator's, the
  operator's winning, as placement sees them), ``spec`` what an operator sets (labels,
  cordoned), ``status`` what the device reported and what the hub decided (taints, desired
  generation and deployments).
* Stored objects: the canonical manifest as applied; a ModelDeployment gets a computed
  ``status`` (:func:`hub.statusing.deployment_status`).
* Models: :meth:`hub.storekeys.ModelRecord.to_json`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from edgefleet.api import API_VERSION, ModelDeployment, parse_manifest
from hub import storekeys
from hub.devices import Device
from hub.placing import SecurityPolicy, taints_for
from hub.statusing import deployment_status


def device_object(
    device: Device, policy: SecurityPolicy, desired: storekeys.DesiredRecord | None
) -> dict[str, Any]:
    record = device.to_json()
    return {
        "apiVersion": API_VERSION,
        "kind": storekeys.KIND_DEVICE,
        "metadata": {"name": device.name, "labels": dict(sorted(device.all_labels().items()))},
        "spec": {"labels": record["labels"], "cordoned": device.cordoned},
        "status": {
            "phase": record["phase"],
            "revoked": device.revoked,
            "health": record["health"],
            "attestation": record["attestation"],
            "facts": record["facts"],
            "reportedLabels": record["reportedLabels"],
            "lastHeartbeat": device.last_heartbeat,
            "enrolledAt": device.enrolled_at,
            "certificateSerial": device.certificate_serial,
            "generationAcked": device.generation_acked,
            "generationDesired": desired.generation if desired else 0,
            "deployments": list(desired.deployments) if desired else [],
            "workloads": record["workloads"],
            "taints": [t.to_json() for t in taints_for(device, policy)],
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
    )
    return {**manifest, "status": status.to_json()}


def object_labels(doc: Mapping[str, Any]) -> Mapping[str, str]:
    labels: Mapping[str, str] = doc.get("metadata", {}).get("labels", {})
    return labels
