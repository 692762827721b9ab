"""A device's desired state, computed here: what exactly it is sent (pure over the cache).

:func:`build_desired` places deployments with :func:`hub.placing.project`, sends each the
revision its rollout assigns this device (:meth:`hub.caching.Cache.revision_for`: the
stable one, or the one being rolled out once the device was given it), leaves out those
whose model was not pushed (with the reason), adds the fleet's DeviceHealthPolicies and
digests it all. :class:`hub.projecting.Projector` calls it and does the writing and sending.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import orjson

from edgefleet.api import PRIORITY_CLASSES, PriorityClass
from hub.caching import Cache
from hub.devices import Device, TrustState
from hub.placing import (
    Projection,
    SecurityPolicy,
    project,
    secret_tpm_mismatch,
    tpm_attested,
)
from hub.prioritizing import classes_of
from hub.rolling import Revision
from hub.scheduling import accelerator_slots
from hub.secrets import secret_refs

SEALED_SECRET_BYTES = 4 * 64 * 1024 // 3 + 512
"""The most one sealed secret takes in a desired state (64 KiB of values, base64 inside)."""
MAX_DESIRED_STATE_BYTES = 4 * 1024 * 1024 - 64 * 1024
"""The most one device's desired state may take on the wire: gRPC's 4 MiB message limit (the
hub's send limit and edged's receive limit), less room for the envelope."""


@dataclass(frozen=True, slots=True)
class FleetPolicies:
    """What every device gets alike: the SecurityBaseline verdict, the DeviceHealthPolicies,
    the fleet's trust roots, the SecurityBaselines themselves (edged enforces their worker
    sandbox and network policy)."""

    security: SecurityPolicy
    health_policies: tuple[bytes, ...]
    trust_roots: tuple[bytes, ...] = ()
    baselines: tuple[bytes, ...] = ()
    priority_classes: Mapping[str, int] = field(default_factory=dict)  # applied, by name
    tpm_secrets: frozenset[str] = frozenset()  # Secrets with spec.requireTpm, by name

    @classmethod
    def of(cls, cache: Cache) -> FleetPolicies:
        classes = classes_of(o.manifest for o in cache.objects_of(PriorityClass.KIND))
        return cls(
            cache.security_policy(),
            tuple(o.encoded for o in cache.objects_of("DeviceHealthPolicy")),
            cache.trust_roots,
            tuple(o.encoded for o in cache.objects_of("SecurityBaseline")),
            {name: c.value for name, c in classes.items()},
            cache.tpm_secrets(),
        )


@dataclass(frozen=True, slots=True)
class DesiredContent:
    """The documents of one device's desired state, and a digest that changes with them."""

    deployments: tuple[str, ...]
    manifests: tuple[bytes, ...]
    artifact_metadata: tuple[bytes, ...]
    rollback_allowances: tuple[bytes, ...]
    digest: str
    excluded: Mapping[str, str]
    artifacts: frozenset[str]  # sha256 of every artifact the device may fetch
    trust_roots: tuple[bytes, ...] = ()  # a rotation changes the digest: a new generation
    # (name, version) of the Secrets this device's workloads mount and it may have (sealed
    # to it when sent: hub.secrets.seal_for); a new version changes the digest
    secrets: tuple[tuple[str, int], ...] = ()


def build_desired(
    device: Device,
    cache: Cache,
    *,
    previous: frozenset[str],
    region: str,
    fleet: FleetPolicies | None = None,
    planned: Mapping[str, Revision] | None = None,
    placements: Mapping[str, Collection[str]] | None = None,
) -> DesiredContent:
    """What ``device`` should be sent (pure over the cache). ``fleet``: what applies to every
    device, read from the cache once per batch (read here when not given). ``planned``:
    revisions to send instead of the rollout's choice, by deployment (an apply is checked
    against the worst case: its new revisions on every device they reach). ``placements``:
    the scheduler's, by ``replicas.total`` deployment (default: the devices the cache says
    are sent it now, :attr:`hub.caching.Cache.sent_placements`)."""
    fleet = fleet or FleetPolicies.of(cache)
    projection: Projection = project(
        device,
        cache.deployments.values(),
        previous=previous,
        policy=fleet.security,
        region=region,
        placed=cache.sent_placements if placements is None else placements,
    )
    labels = device.all_labels()
    excluded = dict(projection.excluded)
    names: list[str] = []
    manifests: list[bytes] = []
    metadata: list[bytes] = []
    allowances: list[bytes] = []
    artifacts: set[str] = set()
    mounted: set[str] = set()
    for name in projection.names:
        revision = (planned or {}).get(name) or cache.revision_for(name, device.name)
        if revision is None:
            excluded[name] = "no revision made yet (the rollout controller makes one)"
            continue
        model_name, version = revision.model
        model = cache.models.get((model_name, version))
        if model is None:
            excluded[name] = f"model {model_name} {version} has not been pushed"
            continue
        mounts = [str(m.get("name")) for m in revision.manifest.get("spec", {}).get("secrets", ())]
        tpm_needed = secret_tpm_mismatch(mounts, fleet.tpm_secrets, device)
        if tpm_needed is not None:  # never sent: a workload without its secret does not run
            excluded[name] = tpm_needed
            continue
        names.append(name)
        mounted.update(mounts)
        manifests.append(manifest_for(revision, labels, fleet.priority_classes))
        metadata.append(model.envelope)
        if model.rollback_allowance:  # hub.allowing: lets a device go back to this version
            allowances.append(model.rollback_allowance)
        artifacts |= model.digests()
    manifests.extend(fleet.health_policies)
    manifests.extend(fleet.baselines)
    allowances = sorted(set(allowances))
    secrets = secret_refs(
        mounted,
        cache.secrets,
        require_attestation=fleet.security.require_attestation,
        trusted=device.attestation.state is TrustState.TRUSTED,
        tpm_secrets=fleet.tpm_secrets,
        tpm_attested=tpm_attested(device) and bool(device.sealing_key_pem),
    )
    h = hashlib.sha256()
    for part in (*manifests, b"--", *metadata, b"--", *allowances, b"--", *fleet.trust_roots):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    if secrets:  # only then: digests of states without secrets stay as they were
        h.update(b"--secrets")
        for secret_name, secret_version in secrets:
            h.update(f"{secret_name}\x00{secret_version}\x00".encode())
            if secret_name in fleet.tpm_secrets:  # sealed to the TPM key: requireTpm turned on
                h.update(b"requireTpm\x00")  # or off is a new generation (sealed again)
    return DesiredContent(
        tuple(names),
        tuple(manifests),
        tuple(sorted(set(metadata))),
        tuple(allowances),
        h.hexdigest(),
        excluded,
        frozenset(artifacts),
        fleet.trust_roots,
        secrets,
    )


def manifest_for(
    revision: Revision,
    labels: Mapping[str, str],
    priority_classes: Mapping[str, int] | None = None,
) -> bytes:
    """The revision's manifest as one device is sent it: a ``replicas.total`` deployment runs
    one replica on each device the scheduler chose (``perDevice: 1`` there), an
    ``accelerator: {anyOf: [...]}`` names the first class this device has (else the first),
    so edged, which knows neither, runs what the hub decided. ``spec.scaling`` of a ``total``
    deployment is the hub's to act on: the device gets it with min = max = 1 (it samples the
    load and reports it, and never scales). A ``priorityClassName`` of an applied
    PriorityClass is sent as its value (``priority``; ``priority_classes``: value by class
    name), as edged knows no classes."""
    spec = revision.manifest.get("spec", {})
    total = "total" in spec.get("replicas", {})
    wanted = spec.get("resources", {}).get("accelerator")
    choices = [str(c) for c in wanted.get("anyOf", ())] if isinstance(wanted, Mapping) else []
    cls = spec.get("priorityClassName")
    priority: int | None = None
    if isinstance(cls, str) and cls not in PRIORITY_CLASSES and "priority" not in spec:
        priority = (priority_classes or {}).get(cls, 0)  # deleted by force: 0
    encoded = revision.encoded
    if not total and not choices and priority is None:
        return encoded
    accelerator = ""
    if choices:
        slots = accelerator_slots(labels)
        accelerator = next((c for c in choices if slots.get(c, 0) > 0), choices[0])
    return _rewritten(encoded, total, accelerator, priority)


SCHEDULER_ONLY_PLACEMENT = (
    "deploymentAffinity",
    "deploymentAntiAffinity",
    "strategy",
    "maxLatencyP95",
)
"""``spec.placement`` fields of a ``replicas.total`` deployment that only the scheduler acts
on (edgefleet.api.manifests refuses them with ``perDevice``): not sent to a device."""


@functools.lru_cache(maxsize=4096)
def _rewritten(encoded: bytes, per_device: bool, accelerator: str, priority: int | None) -> bytes:
    doc = orjson.loads(encoded)
    spec = doc.get("spec", {})
    if per_device:
        spec["replicas"] = {"perDevice": 1}
        placement = spec.get("placement")
        if isinstance(placement, dict):
            # what the scheduler acted on is the hub's: edged refuses it with perDevice (it
            # would otherwise drop the whole deployment as an invalid manifest)
            for key in SCHEDULER_ONLY_PLACEMENT:
                placement.pop(key, None)
        if isinstance(spec.get("scaling"), dict):
            # the hub scales replicas.total (hub/autoscaling.py): the device keeps its one
            # replica and samples the load it reports (min = max = 1: it never scales)
            spec["scaling"] = {**spec["scaling"], "minReplicas": 1, "maxReplicas": 1}
    if accelerator:
        spec.setdefault("resources", {})["accelerator"] = accelerator
    if priority is not None:
        spec.pop("priorityClassName", None)
        spec["priority"] = priority
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def wire_size(content: DesiredContent) -> int:
    """An upper bound of the bytes ``content`` takes as a HubMessage (pure): each document with
    its field tag and length prefix, plus generation and heartbeat interval."""
    parts = (*content.manifests, *content.artifact_metadata, *content.rollback_allowances)
    sealed = len(content.secrets) * SEALED_SECRET_BYTES
    return sum(len(p) + 6 for p in parts) + 64 + sealed
