"""Where the hub keeps each kind of object in the Store, and how it encodes them.

Keys (values are JSON unless said otherwise)::

    /tokens/ID                      bootstrap tokens (hub.state.tokens)
    /devices/NAME                   hub.decide.devices.Device
    /objects/KIND/NAME              operator objects (ModelDeployment, DeviceHealthPolicy,
                                    SecurityBaseline): {"manifest": canonical doc, "created":
                                    epoch seconds of the first apply}; status is computed when
                                    read (hub.decide.presentation), never stored
    /models/NAME/VERSION            a pushed artifact: signed metadata envelope (as signed),
                                    sha256, length, pushed time
    /desired/NAME                   what a device is owed: generation, deployment names, digest
    /revoked/SERIAL                 revoked certificate serials (hex) -> device name
    /events/MILLISECONDS-SEQ        events (type, reason, message, object, time), bounded
    /revisions/NAME/NUMBER          a deployment's revisions (hub.decide.rollout.Revision), NUMBER
                                    zero-padded to 10 digits so keys sort by number
    /rollouts/NAME                  a deployment's rollout (hub.decide.rollout.RolloutState)
    /analysis/NAME/SEQ              its canary analysis over time
    (hub.decide.analysis.TimelineSample),
                                    a ring of at most TIMELINE_SAMPLES per deployment: each
                                    sample written with the deletion of the oldest in one txn

Objects are stored canonically (``to_dict()`` of the typed manifest), so applying the same
document twice compares equal and is "unchanged".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from hub.decide.records import KIND_DEVICE, KIND_MODEL, DesiredRecord, ModelRecord, dumps

# the records and their encoding are plain data the deciders read too (hub.decide.records):
# importable from here as before
__all__ = ["KIND_DEVICE", "KIND_MODEL", "DesiredRecord", "ModelRecord", "dumps"]

DEVICES = "/devices/"
OBJECTS = "/objects/"
MODELS = "/models/"
DESIRED = "/desired/"
REVOKED = "/revoked/"
EVENTS = "/events/"
REVISIONS = "/revisions/"
ROLLOUTS = "/rollouts/"
ANALYSIS = "/analysis/"
WAVES = "/waves/"  # by deployment: a root hub's rollout across regions (hub.decide.wave)
PLACEMENTS = "/placements/"  # by deployment: the devices the scheduler put its replicas.total on


def device_key(name: str) -> str:
    return f"{DEVICES}{name}"


def object_prefix(kind: str) -> str:
    return f"{OBJECTS}{kind}/"


def object_key(kind: str, name: str) -> str:
    return f"{OBJECTS}{kind}/{name}"


def model_key(name: str, version: str) -> str:
    return f"{MODELS}{name}/{version}"


def desired_key(device: str) -> str:
    return f"{DESIRED}{device}"


def revision_prefix(deployment: str) -> str:
    return f"{REVISIONS}{deployment}/"


def revision_key(deployment: str, number: int) -> str:
    return f"{REVISIONS}{deployment}/{number:010d}"


def rollout_key(deployment: str) -> str:
    return f"{ROLLOUTS}{deployment}"


def analysis_prefix(deployment: str) -> str:
    return f"{ANALYSIS}{deployment}/"


def wave_key(deployment: str) -> str:
    return f"{WAVES}{deployment}"


def analysis_key(deployment: str, seq: int) -> str:
    return f"{ANALYSIS}{deployment}/{seq:010d}"


def placement_key(deployment: str) -> str:
    return f"{PLACEMENTS}{deployment}"


def revoked_key(serial_hex: str) -> str:
    return f"{REVOKED}{serial_hex}"


def object_value(
    manifest: Mapping[str, Any],
    created: float | None = None,
    secret: Mapping[str, Any] | None = None,
) -> bytes:
    """What is stored under :func:`object_key` for a canonical manifest first applied at
    ``created`` (kept across updates; shown as ``metadata.creationTimestamp``). ``secret``: a
    Secret's sealed values (hub/state/secrets.py), beside its redacted manifest."""
    doc: dict[str, Any] = {"manifest": manifest}
    if created is not None:
        doc["created"] = created
    if secret is not None:
        doc["secret"] = secret
    return dumps(doc)


def federated_object_value(
    manifest: Mapping[str, Any], created: float | None, generation: int
) -> bytes:
    """What a regional hub stores for an object its root owns (hub.controllers.parentlink): the
    manifest
    and ``"federated": {"generation": G}``, the generation of the root's slice it came in."""
    doc: dict[str, Any] = {"manifest": manifest, "federated": {"generation": generation}}
    if created is not None:
        doc["created"] = created
    return dumps(doc)


def federated_generation(value: bytes) -> int | None:
    """The root's generation of an object a root hub owns; None: a local object."""
    federated = loads(value).get("federated")
    return int(federated["generation"]) if isinstance(federated, dict) else None


def created_of(value: bytes) -> float | None:
    """When the object stored as ``value`` was first applied (None: before this was kept)."""
    created = loads(value).get("created")
    return float(created) if isinstance(created, int | float) else None


def manifest_of(value: bytes) -> dict[str, Any]:
    """The canonical manifest stored under an :func:`object_key` (see :func:`object_value`)."""
    manifest: dict[str, Any] = loads(value)["manifest"]
    return manifest


def loads(data: bytes) -> Any:
    return orjson.loads(data)
