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

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

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

KIND_DEVICE = "Device"
KIND_MODEL = "Model"


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


def dumps(doc: Any) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def loads(data: bytes) -> Any:
    return orjson.loads(data)


@dataclass(frozen=True, slots=True)
class ModelRecord:
    """An artifact pushed with ``edgectl models push``; the hub never re-signs it."""

    name: str
    version: str
    sha256: str
    length: int
    envelope: bytes  # the publisher-signed metadata, exactly as signed
    pushed_at: float
    extras: Mapping[str, str] = field(default_factory=dict)  # extra file name -> sha256
    # a signed rollback allowance for this version, exactly as signed (hub.api.allowances); b"":
    # none
    rollback_allowance: bytes = b""

    def digests(self) -> set[str]:
        """Every blob this artifact holds: the model file and its extras."""
        return {self.sha256, *self.extras.values()}

    def to_json(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "sha256": self.sha256,
            "length": self.length,
            "pushedAt": self.pushed_at,
            "signedMetadata": base64.b64encode(self.envelope).decode(),
        }
        if self.extras:
            status["extras"] = dict(sorted(self.extras.items()))
        if self.rollback_allowance:
            status["rollbackAllowance"] = base64.b64encode(self.rollback_allowance).decode()
        return {
            "apiVersion": "edgefleet.io/v1",
            "kind": KIND_MODEL,
            "metadata": {"name": f"{self.name}-{self.version}"},
            "spec": {"name": self.name, "version": self.version},
            "status": status,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ModelRecord:
        status = doc["status"]
        return cls(
            name=doc["spec"]["name"],
            version=doc["spec"]["version"],
            sha256=status["sha256"],
            length=int(status["length"]),
            envelope=base64.b64decode(status["signedMetadata"]),
            pushed_at=float(status["pushedAt"]),
            extras={str(k): str(v) for k, v in status.get("extras", {}).items()},
            rollback_allowance=base64.b64decode(status.get("rollbackAllowance", "")),
        )


@dataclass(frozen=True, slots=True)
class DesiredRecord:
    """What a device is owed. ``generation`` only ever grows; ``digest`` detects changes;
    ``revisions``: (deployment, revision number, the generation that first carried that
    revision to the device), sorted: a rollout trusts the device's reports about the
    revision from that generation on (hub.controllers.rollout.fresh_report)."""

    generation: int
    deployments: tuple[str, ...]
    digest: str
    revisions: tuple[tuple[str, int, int], ...] = ()

    def numbers(self) -> tuple[tuple[str, int], ...]:
        """(deployment, revision number), sorted."""
        return tuple((d, n) for d, n, _ in self.revisions)

    def carried(self, deployment: str, number: int) -> int | None:
        """The generation that first carried revision ``number`` of ``deployment`` (None:
        this record does not carry it)."""
        return next((g for d, n, g in self.revisions if d == deployment and n == number), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "deployments": list(self.deployments),
            "digest": self.digest,
            "revisions": {d: [n, g] for d, n, g in self.revisions},
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> DesiredRecord:
        return cls(
            int(doc["generation"]),
            tuple(doc["deployments"]),
            str(doc["digest"]),
            tuple(
                sorted((str(d), int(v[0]), int(v[1])) for d, v in doc.get("revisions", {}).items())
            ),
        )
