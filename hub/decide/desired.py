"""A device's desired state, computed here: what exactly it is sent (pure over a
:class:`hub.decide.fleetview.FleetView`, which the state wing makes from its cache).

:func:`build_desired` places deployments with :func:`hub.decide.placement.project`, sends each the
revision its rollout assigns this device (:meth:`hub.decide.fleetview.FleetView.revision_for`: the
stable one, or the one being rolled out once the device was given it), leaves out those
whose model was not pushed and those mounting a Secret that may not go to this device (a TPM
it lacks; a placement it matches only through labels it chose: :mod:`hub.decide.labeltrust`), each
with the reason, adds the fleet's DeviceHealthPolicies and digests it all.
:class:`hub.state.projector.Projector` calls it and does the writing and sending.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from edgefleet.api import PRIORITY_CLASSES, PriorityClass
from edgefleet.api.modelconfigs import (
    ModelConfig,
    canonical_json,
    config_digest,
    merge_steps,
    ordered_overrides,
)
from hub.decide.agentdesired import desired_agent_of
from hub.decide.agentrevisions import DesiredAgentSpec
from hub.decide.devices import Device, TrustState
from hub.decide.fleetview import FleetView, SecretVersion
from hub.decide.labeltrust import untrusted_match
from hub.decide.modelclaim import one_per_model
from hub.decide.nodes import accelerator_slots
from hub.decide.placement import (
    Projection,
    SecurityPolicy,
    project,
    secret_tpm_mismatch,
    tpm_attested,
)
from hub.decide.priority import classes_of
from hub.decide.revisions import MODEL_CONFIG, Revision, config_of

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
    # what build_desired computed once for many devices with these policies (a projection
    # batch shares one FleetPolicies; the fleet does not change during it): digests by the
    # parts hashed, manifest rewrites by revision
    digests: dict[tuple[object, ...], str] = field(default_factory=dict, compare=False, repr=False)
    rewrites: dict[int, tuple[Revision, tuple[bool, list[str], int | None]]] = field(
        default_factory=dict, compare=False, repr=False
    )
    lives: dict[int, tuple[Revision, bytes]] = field(  # live_of by revision
        default_factory=dict, compare=False, repr=False
    )
    # a revision's ModelConfig parsed, by its JSON; merged configs by that JSON and the
    # overrides applied
    configs: dict[str, ModelConfig] = field(default_factory=dict, compare=False, repr=False)
    merges: dict[tuple[str, tuple[str, ...]], tuple[bytes, str]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def of(cls, view: FleetView) -> FleetPolicies:
        classes = classes_of(o.manifest for o in view.objects_of(PriorityClass.KIND))
        return cls(
            view.security_policy(),
            tuple(o.encoded for o in view.objects_of("DeviceHealthPolicy")),
            view.trust_roots,
            tuple(o.encoded for o in view.objects_of("SecurityBaseline")),
            {name: c.value for name, c in classes.items()},
            view.tpm_secrets(),
        )

    def model_config_for(self, revision: Revision, device: Device) -> tuple[bytes, str] | None:
        """The config ``revision`` carries (:func:`hub.decide.revisions.config_of`: the
        ModelConfig when it was made) merged for ``device`` (canonical JSON) and its digest;
        ``None``: it carries none. Parsed once per config, merged once per set of overrides."""
        text = config_of(revision.manifest)
        if not text:
            return None
        config = self.configs.get(text)
        if config is None:
            config = config_from_text(text)
            self.configs[text] = config
        steps = ordered_overrides(config, device.name, device.all_labels())
        key = (text, tuple(step for step, _ in steps))
        merged = self.merges.get(key)
        if merged is None:
            document = merge_steps(config, steps).document()
            merged = (canonical_json(document), config_digest(document))
            self.merges[key] = merged
        return merged


def config_from_text(text: str) -> ModelConfig:
    """A revision's ModelConfig (:func:`hub.decide.revisions.config_of`)."""
    from edgefleet.api import parse_manifest

    config = parse_manifest(orjson.loads(text))
    assert isinstance(config, ModelConfig)
    return config


def config_bound(revision: Revision) -> int:
    """At least the bytes any device's merged config of ``revision`` takes in a desired state:
    the whole ModelConfig bounds any merge of its sections (0: it carries none)."""
    text = config_of(revision.manifest)
    return len(text) + 128 if text else 0


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
    # to it when sent: hub.state.secrets.seal_for); a new version changes the digest
    secrets: tuple[tuple[str, int], ...] = ()
    # (deployment, revision number) of every deployment sent, sorted
    revisions: tuple[tuple[str, int], ...] = ()
    # the edged release the device is asked to run (an AgentUpgrade's); None: none, it keeps
    # its committed one (hub.decide.agentdesired)
    agent: DesiredAgentSpec | None = None
    # (deployment, merged config as canonical JSON, its digest) of every deployment sent whose
    # model has a ModelConfig (docs/model-config.md)
    model_configs: tuple[tuple[str, bytes, str], ...] = ()


def build_desired(
    device: Device,
    view: FleetView,
    *,
    previous: frozenset[str],
    region: str,
    fleet: FleetPolicies | None = None,
    planned: Mapping[str, Revision] | None = None,
    placements: Mapping[str, Collection[str]] | None = None,
    left_out: Mapping[str, str] | None = None,
) -> DesiredContent:
    """What ``device`` should be sent (pure over ``view``). ``fleet``: what applies to every
    device, read from ``view`` once per batch (read here when not given). ``planned``:
    revisions to send instead of the rollout's choice, by deployment (an apply is checked
    against the worst case: its new revisions on every device they reach). ``placements``:
    the scheduler's, by ``replicas.total`` deployment (default: the devices ``view`` says
    are sent it now, :attr:`hub.decide.fleetview.FleetView.sent_placements`). ``left_out``:
    deployments not sent, with the reason shown for each (:func:`build_within_bound`)."""
    fleet = fleet or FleetPolicies.of(view)
    projection: Projection = project(
        device,
        view.deployments.values(),
        previous=previous,
        policy=fleet.security,
        region=region,
        placed=view.sent_placements if placements is None else placements,
    )
    # one deployment per model name on a device, whatever was stored (hub.decide.modelclaim)
    projection = one_per_model(projection, view.deployments, previous=previous)
    labels = device.all_labels()
    excluded = dict(projection.excluded)
    names: list[str] = []
    numbers: list[tuple[str, int]] = []
    manifests: list[bytes] = []
    metadata: list[bytes] = []
    allowances: list[bytes] = []
    artifacts: set[str] = set()
    mounted: set[str] = set()
    configs: list[tuple[str, bytes, str]] = []
    for name in projection.names:
        if left_out and name in left_out:
            excluded[name] = left_out[name]
            continue
        revision = (planned or {}).get(name) or view.revision_for(name, device.name)
        if revision is None:
            excluded[name] = "no revision made yet (the rollout controller makes one)"
            continue
        model_name, version = revision.model
        model = view.models.get((model_name, version))
        if model is None:
            excluded[name] = f"model {model_name} {version} has not been pushed"
            continue
        mounts = [str(m.get("name")) for m in revision.manifest.get("spec", {}).get("secrets", ())]
        tpm_needed = secret_tpm_mismatch(mounts, fleet.tpm_secrets, device)
        if tpm_needed is not None:  # never sent: a workload without its secret does not run
            excluded[name] = tpm_needed
            continue
        dep = view.deployments.get(name)
        chosen = untrusted_match(dep, device, region, mounted=mounts) if dep else None
        if chosen is not None:  # a Secret follows only labels no device chose
            excluded[name] = chosen
            continue
        names.append(name)
        numbers.append((name, revision.number))
        mounted.update(mounts)
        manifests.append(_manifest_for(revision, labels, fleet, _live_for(fleet, view, revision)))
        merged = fleet.model_config_for(revision, device)
        if merged is not None:
            configs.append((name, *merged))
        metadata.append(model.envelope)
        if model.rollback_allowance:  # hub.api.allowances: lets a device go back to this version
            allowances.append(model.rollback_allowance)
        artifacts |= model.digests()
    manifests.extend(fleet.health_policies)
    manifests.extend(fleet.baselines)
    allowances = sorted(set(allowances))
    secrets = secret_refs(
        mounted,
        view.secrets,
        require_attestation=fleet.security.require_attestation,
        trusted=device.attestation.state is TrustState.TRUSTED,
        tpm_secrets=fleet.tpm_secrets,
        tpm_attested=tpm_attested(device) and bool(device.sealing_key_pem),
    )
    key = (*manifests, b"--", *metadata, b"--", *allowances, b"--", *fleet.trust_roots)
    agent = desired_agent_of(view.agent_upgrades, device.name, device.agent, view.agent_releases)
    if agent is not None:  # only then: digests of states without one stay as they were
        key = (*key, b"--agent", *_agent_parts(agent))
    if configs:  # likewise
        key = (*key, b"--configs", *(n.encode() + b"\0" + d for n, d, _ in configs))
    digest = fleet.digests.get((key, secrets))  # devices given the same: hashed once
    if digest is None:
        digest = _digest(key, secrets, fleet.tpm_secrets)
        fleet.digests[(key, secrets)] = digest
    return DesiredContent(
        tuple(names),
        tuple(manifests),
        tuple(sorted(set(metadata))),
        tuple(allowances),
        digest,
        excluded,
        frozenset(artifacts),
        fleet.trust_roots,
        secrets,
        tuple(sorted(numbers)),
        agent,
        tuple(configs),
    )


def _agent_parts(agent: DesiredAgentSpec) -> tuple[bytes, ...]:
    return (
        agent.version.encode(),
        agent.signed_metadata,
        agent.upgrade.encode(),
        f"{agent.upgrade_revision}:{agent.commit_deadline_s}:{agent.max_tries}".encode(),
    )


def shed_order(
    names: Collection[str], previous: frozenset[str], priority: Mapping[str, int]
) -> list[str]:
    """The deployments of ``names`` in the order a device over the bound goes without them
    (pure): first those it was not sent before (what it runs keeps running), then the lowest
    priority, then the last by name."""
    return sorted(names, key=lambda n: (n in previous, priority.get(n, 0), _desc(n)))


def _desc(name: str) -> tuple[int, ...]:
    return (*(-ord(c) for c in name), 0)  # later names first (a longer name before its prefix)


def build_within_bound(
    device: Device,
    view: FleetView,
    *,
    previous: frozenset[str],
    region: str,
    fleet: FleetPolicies | None = None,
    limit: int = MAX_DESIRED_STATE_BYTES,
) -> DesiredContent:
    """:func:`build_desired`, kept within what a device can receive (pure over ``view``):
    whatever path made the state too large (a wave's slice, a label, a push, a placement the
    scheduler could not foresee), the device still gets a state it can receive, without the
    deployments :func:`shed_order` names first, each left out with the reason. Apply and the
    scheduler refuse what would overfill a device (:mod:`hub.decide.statebound`); this is the net
    under them, so a device never stops receiving updates."""
    fleet = fleet or FleetPolicies.of(view)
    content = build_desired(device, view, previous=previous, region=region, fleet=fleet)
    if wire_size(content) <= limit:
        return content
    priority = {n: _priority_of(view, n, fleet) for n in content.deployments}
    reason = (
        f"not sent: the device's desired state would exceed {limit / 2**20:.2f} MiB, the most "
        "a device can receive (deployments it was not sent before, then the lowest priority, "
        "go without)"
    )
    left_out: dict[str, str] = {}
    for name in shed_order(content.deployments, previous, priority):
        left_out[name] = reason
        content = build_desired(
            device, view, previous=previous, region=region, fleet=fleet, left_out=left_out
        )
        if wire_size(content) <= limit:
            break
    return content


def _priority_of(view: FleetView, name: str, fleet: FleetPolicies) -> int:
    """A deployment's priority as the scheduler ranks it: ``priority``, else its class's (an
    applied PriorityClass's value, else a built-in one's), else 0."""
    dep = view.deployments.get(name)
    if dep is None:
        return 0
    spec = dep.spec
    cls = spec.priority_class_name
    if spec.priority is None and cls is not None and cls not in PRIORITY_CLASSES:
        return fleet.priority_classes.get(cls, 0)
    return spec.effective_priority


def _digest(
    parts: tuple[bytes, ...], secrets: tuple[tuple[str, int], ...], tpm_secrets: frozenset[str]
) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    if secrets:  # only then: digests of states without secrets stay as they were
        h.update(b"--secrets")
        for secret_name, secret_version in secrets:
            h.update(f"{secret_name}\x00{secret_version}\x00".encode())
            if secret_name in tpm_secrets:  # sealed to the TPM key: requireTpm turned on
                h.update(b"requireTpm\x00")  # or off is a new generation (sealed again)
    return h.hexdigest()


SENT_LIVE_FIELDS = ("replicas", "scaling")
"""The fields outside a revision's template (:data:`hub.decide.revisions.LIVE_FIELDS`) that a
device acts on: it is sent the deployment's current ones with its revision's template, so a
change of them alone is no new revision (edged scales without restarting a worker)."""


def live_of(view: FleetView, name: str, revision: Revision) -> bytes:
    """Deployment ``name``'s current :data:`SENT_LIVE_FIELDS`, encoded, where they differ from
    ``revision``'s (b"": the same, or not known), for :func:`manifest_for`."""
    stored = view.stored.get(("ModelDeployment", name))
    if stored is None:
        return b""
    return live_fields(revision, stored.manifest)


def _live_for(fleet: FleetPolicies, view: FleetView, revision: Revision) -> bytes:
    """:func:`live_of`, worked out once per revision for the batch."""
    known = fleet.lives.get(id(revision))
    if known is None or known[0] is not revision:
        known = (revision, live_of(view, revision.deployment, revision))
        fleet.lives[id(revision)] = known
    return known[1]


@functools.lru_cache(maxsize=1024)
def _total_in(live: bytes) -> bool:
    return "total" in orjson.loads(live).get("replicas", {})


def live_fields(revision: Revision, manifest: Mapping[str, Any]) -> bytes:
    """``manifest``'s :data:`SENT_LIVE_FIELDS`, encoded, where they differ from ``revision``'s
    (b"": the same)."""
    spec = manifest.get("spec", {})
    own = revision.manifest.get("spec", {})
    if all(spec.get(k) == own.get(k) for k in SENT_LIVE_FIELDS):
        return b""
    live = {k: spec[k] for k in SENT_LIVE_FIELDS if k in spec}
    return orjson.dumps(live, option=orjson.OPT_SORT_KEYS)


def _manifest_for(
    revision: Revision, labels: Mapping[str, str], fleet: FleetPolicies, live: bytes = b""
) -> bytes:
    """:func:`manifest_for`, what it rewrites worked out once per revision for the batch."""
    known = fleet.rewrites.get(id(revision))
    if known is None or known[0] is not revision:
        known = (revision, _rewrites(revision, fleet.priority_classes))
        fleet.rewrites[id(revision)] = known
    total, choices, priority = known[1]
    if live:  # replicas.total or perDevice now, not as the revision was made
        total = _total_in(live)
    return _rewritten_for(revision, labels, total, choices, priority, live)


def manifest_for(
    revision: Revision,
    labels: Mapping[str, str],
    priority_classes: Mapping[str, int] | None = None,
    live: Mapping[str, Any] | None = None,
) -> bytes:
    """The revision's manifest as one device is sent it: with the deployment's current
    ``replicas`` and ``scaling`` (``live``: its manifest now; None: the revision's own:
    :data:`SENT_LIVE_FIELDS`); a ``replicas.total`` deployment runs
    one replica on each device the scheduler chose (``perDevice: 1`` there), an
    ``accelerator: {anyOf: [...]}`` names the first class this device has (else the first),
    so edged, which knows neither, runs what the hub decided. ``spec.scaling`` of a ``total``
    deployment is the hub's to act on: the device gets it with min = max = 1 (it samples the
    load and reports it, and never scales). A ``priorityClassName`` of an applied
    PriorityClass is sent as its value (``priority``; ``priority_classes``: value by class
    name), as edged knows no classes."""
    fields = live_fields(revision, live) if live is not None else b""
    total, choices, priority = _rewrites(revision, priority_classes)
    if fields:
        total = _total_in(fields)
    return _rewritten_for(revision, labels, total, choices, priority, fields)


def _rewritten_for(
    revision: Revision,
    labels: Mapping[str, str],
    total: bool,
    choices: list[str],
    priority: int | None,
    live: bytes = b"",
) -> bytes:
    if not total and not choices and priority is None and not live:
        return revision.encoded
    accelerator = ""
    if choices:
        slots = accelerator_slots(labels)
        accelerator = next((c for c in choices if slots.get(c, 0) > 0), choices[0])
    return _rewritten(revision.encoded, total, accelerator, priority, live)


def _rewrites(
    revision: Revision, priority_classes: Mapping[str, int] | None
) -> tuple[bool, list[str], int | None]:
    """What :func:`manifest_for` changes in ``revision``'s manifest: ``replicas.total`` (as
    the revision has it), the accelerator classes to choose from, the priority value to send
    instead of a class."""
    spec = revision.manifest.get("spec", {})
    total = "total" in spec.get("replicas", {})
    wanted = spec.get("resources", {}).get("accelerator")
    choices = [str(c) for c in wanted.get("anyOf", ())] if isinstance(wanted, Mapping) else []
    cls = spec.get("priorityClassName")
    priority: int | None = None
    if isinstance(cls, str) and cls not in PRIORITY_CLASSES and "priority" not in spec:
        priority = (priority_classes or {}).get(cls, 0)  # deleted by force: 0
    return total, choices, priority


def _largest_manifest(
    revision: Revision, priority_classes: Mapping[str, int], live: bytes = b""
) -> int:
    """The most bytes :func:`manifest_for` makes of ``revision`` for any device's labels, with
    the deployment's current ``replicas`` and ``scaling`` (``live``: :func:`live_of`)."""
    total, choices, priority = _rewrites(revision, priority_classes)
    if live:
        total = _total_in(live)
    if not total and not choices and priority is None and not live:
        return len(revision.encoded)
    return max(
        len(_rewritten(revision.encoded, total, accelerator, priority, live))
        for accelerator in (choices or [""])
    )


SCHEDULER_ONLY_PLACEMENT = (
    "deploymentAffinity",
    "deploymentAntiAffinity",
    "strategy",
    "maxLatencyP95",
)
"""``spec.placement`` fields of a ``replicas.total`` deployment that only the scheduler acts
on (edgefleet.api.manifests refuses them with ``perDevice``): not sent to a device."""


@functools.lru_cache(maxsize=4096)
def _rewritten(
    encoded: bytes, per_device: bool, accelerator: str, priority: int | None, live: bytes = b""
) -> bytes:
    doc = orjson.loads(encoded)
    annotations = doc.get("metadata", {}).get("annotations")
    if annotations and MODEL_CONFIG in annotations:  # the device gets it merged for it
        del annotations[MODEL_CONFIG]
        if not annotations:
            del doc["metadata"]["annotations"]
    spec = doc.get("spec", {})
    if live:  # the deployment's replicas and scaling now (SENT_LIVE_FIELDS)
        fields = orjson.loads(live)
        for key in SENT_LIVE_FIELDS:
            if key in fields:
                spec[key] = fields[key]
            else:
                spec.pop(key, None)
    if per_device:
        spec["replicas"] = {"perDevice": 1}
        placement = spec.get("placement")
        if isinstance(placement, dict):
            # what the scheduler acted on is the hub's: edged refuses it with perDevice (it
            # would otherwise drop the whole deployment as an invalid manifest)
            for key in SCHEDULER_ONLY_PLACEMENT:
                placement.pop(key, None)
        if isinstance(spec.get("scaling"), dict):
            # the hub scales replicas.total (hub/decide/autoscale.py): the device keeps its one
            # replica and samples the load it reports (min = max = 1: it never scales)
            spec["scaling"] = {**spec["scaling"], "minReplicas": 1, "maxReplicas": 1}
    if accelerator:
        spec.setdefault("resources", {})["accelerator"] = accelerator
    if priority is not None:
        spec.pop("priorityClassName", None)
        spec["priority"] = priority
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def wire_size_bound(
    view: FleetView, fleet: FleetPolicies, *, planned: Mapping[str, Revision] | None = None
) -> int:
    """At least :func:`wire_size` of what :func:`build_desired` makes for any device of
    ``view`` (pure; same ``fleet`` and ``planned``): as if a device were sent every
    deployment, each with the largest of the revisions it may get (``planned``'s, else any
    ``view`` keeps for it) in its largest rewrite, with its model's metadata and rollback
    allowance and every Secret those revisions mount. Costs deployments x revisions, not
    devices: when it fits, no device's state can be over the limit."""
    manifests = [len(m) for m in (*fleet.health_policies, *fleet.baselines)]
    metadata: list[int] = []
    allowances: list[int] = []
    mounted: set[str] = set()
    for name in view.deployments:
        if planned is not None and name in planned:
            revisions = [planned[name]]
        else:
            revisions = list(view.revisions.get(name, {}).values())
        largest = envelope = allowance = 0
        for revision in revisions:
            model = view.models.get(revision.model)
            if model is None:  # never sent (excluded: not pushed)
                continue
            live = _live_for(fleet, view, revision)
            largest = max(
                largest,
                _largest_manifest(revision, fleet.priority_classes, live) + config_bound(revision),
            )
            envelope = max(envelope, len(model.envelope))
            allowance = max(allowance, len(model.rollback_allowance))
            mounted.update(
                str(m.get("name")) for m in revision.manifest.get("spec", {}).get("secrets", ())
            )
        if largest:
            manifests.append(largest)
            metadata.append(envelope)
            if allowance:
                allowances.append(allowance)
    sealed = len(mounted & set(view.secrets)) * SEALED_SECRET_BYTES
    return sum(n + 6 for n in (*manifests, *metadata, *allowances)) + 64 + sealed


def wire_size(content: DesiredContent) -> int:
    """An upper bound of the bytes ``content`` takes as a HubMessage (pure): each document with
    its field tag and length prefix, plus generation and heartbeat interval."""
    parts = (*content.manifests, *content.artifact_metadata, *content.rollback_allowances)
    sealed = len(content.secrets) * SEALED_SECRET_BYTES
    agent = content.agent
    extra = 0 if agent is None else sum(len(p) + 8 for p in _agent_parts(agent)) + 32
    extra += sum(len(n) + len(d) + len(g) + 16 for n, d, g in content.model_configs)
    return sum(len(p) + 6 for p in parts) + 64 + sealed + extra


def replica_wire_size(
    view: FleetView, fleet: FleetPolicies, name: str, *, planned: Revision | None = None
) -> int:
    """At least the bytes deployment ``name`` adds to a device's desired state when sent there
    (pure): its largest revision (of those ``view`` keeps and ``planned``, one not made yet)
    in its largest rewrite, its model's metadata and rollback allowance, every Secret its
    revisions mount (0: none whose model was pushed, so it is never sent). What the scheduler
    counts per placement (:mod:`hub.decide.statebound`)."""
    largest = envelope = allowance = 0
    mounted: set[str] = set()
    revisions = list(view.revisions.get(name, {}).values())
    for revision in [*revisions, planned] if planned is not None else revisions:
        model = view.models.get(revision.model)
        if model is None:  # never sent (excluded: not pushed)
            continue
        live = _live_for(fleet, view, revision)
        largest = max(
            largest,
            _largest_manifest(revision, fleet.priority_classes, live) + config_bound(revision),
        )
        envelope = max(envelope, len(model.envelope))
        allowance = max(allowance, len(model.rollback_allowance))
        mounted.update(
            str(m.get("name")) for m in revision.manifest.get("spec", {}).get("secrets", ())
        )
    if not largest:
        return 0
    parts = [largest, envelope, *([allowance] if allowance else [])]
    sealed: int = len(mounted & set(view.secrets)) * SEALED_SECRET_BYTES
    return sum(n + 6 for n in parts) + sealed


def secret_refs(
    mounted: Iterable[str],
    records: Mapping[str, SecretVersion],
    *,
    require_attestation: bool,
    trusted: bool,
    tpm_secrets: Collection[str] = frozenset(),
    tpm_attested: bool = False,
) -> tuple[tuple[str, int], ...]:
    """Pure: the (name, version) of every secret a device is sent: mounted by a workload it
    runs, existing, and — when attestation is required — only to a trusted device; one of
    ``tpm_secrets`` (``spec.requireTpm``) only to a ``tpm_attested`` device."""
    if require_attestation and not trusted:
        return ()
    return tuple(
        sorted(
            (name, records[name].version)
            for name in set(mounted)
            if name in records and (tpm_attested or name not in tpm_secrets)
        )
    )
