"""The records the hub keeps, as plain data: what the state wing stores (hub.state.storekeys,
hub.state.tokens) and caches (hub.state.cache), and what the deciders read. Frozen dataclasses
with their JSON encodings, and the keys and values of operator objects and pushed models (what
:func:`hub.decide.regionslice.plan_apply` writes); no I/O."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

KIND_DEVICE = "Device"
KIND_MODEL = "Model"


# the store's keys of operator objects and pushed models (the whole layout: hub.state.storekeys)
OBJECTS = "/objects/"
MODELS = "/models/"


def object_key(kind: str, name: str) -> str:
    return f"{OBJECTS}{kind}/{name}"


def model_key(name: str, version: str) -> str:
    return f"{MODELS}{name}/{version}"


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


def dumps(doc: Any) -> bytes:
    """The hub's canonical JSON: keys sorted (equal documents encode equal)."""
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


@dataclass(frozen=True, slots=True)
class StoredObject:
    """An operator object as applied: its canonical manifest and the revision it was written at."""

    kind: str
    name: str
    manifest: Mapping[str, Any]
    revision: int
    encoded: bytes = b""  # the manifest as sent to devices: encoded once, shared by all

    def __post_init__(self) -> None:
        if not self.encoded:
            object.__setattr__(self, "encoded", dumps(self.manifest))


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


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenRecord:
    """What the store keeps about a token (never its secret)."""

    id: str
    secret_sha256: str
    created: float
    expires: float
    single_use: bool = False
    used: float | None = None
    """When a single-use token was consumed."""
    description: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Labels every device enrolled with this token gets; the device cannot override them."""
    device_labels: bool = True
    """Whether a device enrolling with this token may add labels of its own."""
    device_label_prefix: str = ""
    """If set, the only label keys a device may add are those starting with it."""
    for_region: str = ""
    """If set, the token enrolls only the regional hub of that region (federation), never a
    device; if empty, only devices."""
    allow_shared_ek: bool = False
    """Whether a device enrolling with this token may have the TPM (EK) of a device already
    enrolled: refused by default (``hub token create --allow-shared-ek``; hub.api.enrollment)."""

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "id": self.id,
                "secretSha256": self.secret_sha256,
                "created": self.created,
                "expires": self.expires,
                "singleUse": self.single_use,
                "used": self.used,
                "description": self.description,
                "labels": dict(self.labels),
                "deviceLabels": self.device_labels,
                "deviceLabelPrefix": self.device_label_prefix,
                **({"forRegion": self.for_region} if self.for_region else {}),
                **({"allowSharedEk": True} if self.allow_shared_ek else {}),
            },
            option=orjson.OPT_SORT_KEYS,
        )

    @classmethod
    def from_json(cls, data: bytes) -> TokenRecord:
        doc: dict[str, Any] = orjson.loads(data)
        return cls(
            id=doc["id"],
            secret_sha256=doc["secretSha256"],
            created=doc["created"],
            expires=doc["expires"],
            single_use=doc["singleUse"],
            used=doc["used"],
            description=doc["description"],
            labels=doc["labels"],
            device_labels=doc.get("deviceLabels", True),
            device_label_prefix=doc.get("deviceLabelPrefix", ""),
            for_region=doc.get("forRegion", ""),
            allow_shared_ek=bool(doc.get("allowSharedEk", False)),
        )
