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

from hub.decide.records import (
    KIND_DEVICE,
    KIND_MODEL,
    MODELS,
    OBJECTS,
    DesiredRecord,
    ModelRecord,
    created_of,
    dumps,
    federated_generation,
    federated_object_value,
    loads,
    manifest_of,
    model_key,
    object_key,
    object_value,
)

# the records, the keys of objects and models and their values' encoding are plain data the
# deciders read too (hub.decide.records): importable from here as before
__all__ = [
    "KIND_DEVICE",
    "KIND_MODEL",
    "MODELS",
    "OBJECTS",
    "DesiredRecord",
    "ModelRecord",
    "created_of",
    "dumps",
    "federated_generation",
    "federated_object_value",
    "loads",
    "manifest_of",
    "model_key",
    "object_key",
    "object_value",
]

DEVICES = "/devices/"
DESIRED = "/desired/"
REVOKED = "/revoked/"
EVENTS = "/events/"
REVISIONS = "/revisions/"
ROLLOUTS = "/rollouts/"
ANALYSIS = "/analysis/"
WAVES = "/waves/"  # by deployment: a root hub's rollout across regions (hub.decide.wave)
HEARTBEATS = "/heartbeats/"  # by replica: when its devices last spoke (controllers.replicas)
PLACEMENTS = "/placements/"  # by deployment: the devices the scheduler put its replicas.total on


def device_key(name: str) -> str:
    return f"{DEVICES}{name}"


def object_prefix(kind: str) -> str:
    return f"{OBJECTS}{kind}/"


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
