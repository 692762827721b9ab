"""Federation's pure decisions (docs/federation.md): which objects and artifacts a region is
owed (its *slice*), the bounds on what a regional hub reports, and how the root adds the
regions' reports into what ``edgectl`` shows; at a region, what applying a slice writes
(:func:`plan_apply`). No I/O, no clock, no protobuf (the messages are
mapped, and a region's report checked against these bounds, in :mod:`hub.state.regionmapping`):
tested as tables in ``tests/hub/test_hub_federation_slices.py`` and
``tests/hub/test_hub_waving.py``.

A ModelDeployment goes to the regions its ``spec.placement.regions`` lists, or to every region
when it lists none; DeviceHealthPolicy and SecurityBaseline objects go to every region, a
ModelConfig to every region a deployment of its model goes to (:func:`configs_for`). A region
also gets the artifacts its deployments use, and those of the revisions the root holds for
them (so a rollout or a rollback inside the region finds the older version), each with its
signed metadata exactly as the publisher signed it. Per-region overrides, annotations on a
ModelDeployment at the root, change what one region gets (:func:`with_overrides`): its
replica count, its model variant (another model at the same versions) or its precision
variant (``runtime.precision``); any other ``federation.edgefleet.io/`` annotation is refused
at apply (:func:`override_problems`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgefleet.api import Precision
from edgefleet.api.meta import dns_label
from edgefleet.api.validating import one_of
from hub.decide.agentrelay import wanted_versions
from hub.decide.records import (
    ModelRecord,
    created_of,
    dumps,
    federated_generation,
    federated_object_value,
    loads,
    manifest_of,
    model_key,
    object_key,
)
from hub.decide.rollout import MAX_WEIGHT

MAX_SLICE_OBJECTS = 2000
MAX_SLICE_BYTES = 4 * 1024 * 1024 - 64 * 1024  # gRPC's message limit on both ends, less framing
MAX_REPORT_DEPLOYMENTS = 2000
MAX_REPORT_DEVICES = 20_000
MAX_FAILING = 100  # failing devices listed per deployment
MAX_NAME = 253
MAX_TEXT = 1024
MAX_LABELS = 64
MAX_VERSIONS = 64
MAX_PHASES = 16
MAX_REVISION_FIGURES = 4  # a region reports its rollout's revision and its stable one
MAX_VALIDATION_PROBLEMS = 8
MAX_CONFIG_SHOWN = 32  # devices not running the desired config named per deployment
MAX_REPORT_AGENT_UPGRADES = 64  # a region's AgentUpgrades in its report
MAX_AGENT_FAILED = 20  # failed devices named per AgentUpgrade in a region's report
MAX_AGENT_RELEASES = 64  # edged release versions a region's report lists

FEDERATED_KINDS = (
    "ModelDeployment",
    "DeviceHealthPolicy",
    "SecurityBaseline",
    "AgentUpgrade",
    "ModelConfig",
)
MODEL_CONFIG = "ModelConfig"

ROOT_REVISION = "federation.edgefleet.io/agent-revision"
"""On an AgentUpgrade a root hub sends a region (its waves, hub.decide.agentwaves): the root's
revision of it, which the region's report names back."""
ROOT_STOP = "federation.edgefleet.io/agent-stop"
"""On an AgentUpgrade a root hub sends a region: its waves stopped (why); the region rolls
its rollout of it back (StoppedByRoot), even a Complete one."""


@dataclass(frozen=True, slots=True)
class Slice:
    """What a region is owed: canonical manifests, model records, trust roots, a digest."""

    objects: tuple[Mapping[str, Any], ...]
    models: tuple[ModelRecord, ...]
    trust_roots: tuple[bytes, ...]
    digest: str
    # the edged versions the root's AgentUpgrades in waves roll out (hub.decide.agentrelay)
    agent_versions: tuple[str, ...] = ()


FEDERATION_ANNOTATIONS = "federation.edgefleet.io/"
"""The annotations of federation; only those below are known (any other is refused)."""
REPLICAS_OVERRIDE = "federation.edgefleet.io/replicas."
"""An annotation ``federation.edgefleet.io/replicas.<region>: "N"`` on a ModelDeployment at the
root: that region gets the deployment with N replicas (``total`` or ``perDevice``, whichever
the deployment uses)."""
MODEL_OVERRIDE = "federation.edgefleet.io/model."
"""An annotation ``federation.edgefleet.io/model.<region>: "NAME"`` on a ModelDeployment at the
root: that region gets the deployment with the model NAME (a variant, e.g. an int8 build for
a region of NPUs) at the deployment's own ``spec.model.version``, so every revision, and
every wave of a rollout in waves, moves the variant with the deployment's version."""
PRECISION_OVERRIDE = "federation.edgefleet.io/precision."
"""An annotation ``federation.edgefleet.io/precision.<region>: "int8"`` on a ModelDeployment at
the root: that region gets ``spec.runtime.precision`` set to it, so its devices serve that
precision variant of the same signed artifact (an extra ``<stem>.<precision>.onnx``,
docs/trust.md)."""
MAX_OVERRIDE_REPLICAS = 100_000
OVERRIDES = (REPLICAS_OVERRIDE, MODEL_OVERRIDE, PRECISION_OVERRIDE)


def _overrides(manifest: Mapping[str, Any], prefix: str = REPLICAS_OVERRIDE) -> dict[str, str]:
    annotations = manifest.get("metadata", {}).get("annotations") or {}
    return {
        str(k)[len(prefix) :]: str(v) for k, v in annotations.items() if str(k).startswith(prefix)
    }


def override_problems(manifest: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field path, reason) of every per-region override that cannot be applied, and of every
    federation annotation that is not one (none is accepted and ignored)."""
    problems: list[tuple[str, str]] = []
    annotations = manifest.get("metadata", {}).get("annotations") or {}
    for key in sorted(str(k) for k in annotations):
        if not key.startswith(FEDERATION_ANNOTATIONS):
            continue
        path = f'metadata.annotations["{key}"]'
        if key in (ROOT_REVISION, ROOT_STOP):
            problems.append(
                (
                    path,
                    "is set by a root hub on an AgentUpgrade it sends a region "
                    "(spec.rollout.waves), not applied by hand",
                )
            )
        elif key == MAX_WEIGHT:
            problems.append(
                (
                    path,
                    "is set by a root hub on what it sends a region during a wave of a "
                    "percentage (spec.rollout.waves), not applied by hand",
                )
            )
        elif not key.startswith(OVERRIDES):
            problems.append(
                (
                    path,
                    "not supported: the per-region overrides are "
                    f"{REPLICAS_OVERRIDE}<region> (a replica count), {MODEL_OVERRIDE}<region> "
                    f"(a model variant) and {PRECISION_OVERRIDE}<region> (a precision variant)",
                )
            )
    kinds = (
        (REPLICAS_OVERRIDE, "a replica"),
        (MODEL_OVERRIDE, "a model"),
        (PRECISION_OVERRIDE, "a precision"),
    )
    for prefix, what in kinds:
        for region, value in sorted(_overrides(manifest, prefix).items()):
            path = f'metadata.annotations["{prefix}{region}"]'
            if manifest.get("kind") != "ModelDeployment":
                problems.append((path, f"{what} override applies to a ModelDeployment only"))
                continue
            try:
                dns_label(region)
            except ValueError as exc:
                problems.append((path, f"the region: {exc}"))
            if prefix == REPLICAS_OVERRIDE:
                if not (value.isdigit() and 1 <= int(value) <= MAX_OVERRIDE_REPLICAS):
                    problems.append(
                        (
                            path,
                            f"must be a whole number from 1 to {MAX_OVERRIDE_REPLICAS}, "
                            f"got {value!r}",
                        )
                    )
                continue
            if prefix == PRECISION_OVERRIDE:
                try:
                    _precision(value)
                except ValueError as exc:
                    problems.append((path, str(exc)))
                continue
            problems += [(path, p) for p in _model_override_problems(manifest, value)]
    return problems


_precision = one_of(Precision)


def _model_override_problems(manifest: Mapping[str, Any], value: str) -> list[str]:
    try:
        dns_label(value)
    except ValueError as exc:
        return [f"the model name: {exc}"]
    model = manifest.get("spec", {}).get("model", {})
    pinned = sorted(k for k in ("path", "sha256", "metadata", "rollbackAllowance") if k in model)
    if pinned:
        return [
            "a model variant names a model pushed at the root (the deployment's version of "
            f"it), so spec.model may not pin the artifact itself (it sets {', '.join(pinned)})"
        ]
    return []


def override_regions(manifest: Mapping[str, Any]) -> dict[str, str]:
    """Annotation key -> the region it overrides, of every per-region override."""
    return {
        f"{prefix}{region}": region
        for prefix in OVERRIDES
        for region in _overrides(manifest, prefix)
    }


def with_overrides(manifest: Mapping[str, Any], region: str) -> Mapping[str, Any]:
    """The deployment as ``region`` gets it: its replica override and its model variant
    applied, if it has them."""
    replicas = _overrides(manifest).get(region)
    variant = _overrides(manifest, MODEL_OVERRIDE).get(region)
    precision = _overrides(manifest, PRECISION_OVERRIDE).get(region)
    if (replicas is None or not replicas.isdigit()) and not variant and not precision:
        return manifest
    spec = dict(manifest["spec"])
    if replicas is not None and replicas.isdigit():
        current = dict(spec.get("replicas") or {})
        key = "total" if current.get("total") is not None else "perDevice"
        spec["replicas"] = {key: int(replicas)}
    if variant:
        spec["model"] = {**(spec.get("model") or {}), "name": variant}
    if precision:
        spec["runtime"] = {**(spec.get("runtime") or {}), "precision": precision}
    return {**manifest, "spec": spec}


def with_model_variant(manifest: Mapping[str, Any], regions: Iterable[str]) -> list[str]:
    """The regions of ``regions`` that ``manifest`` (a ModelDeployment) goes to with a model
    variant (:data:`MODEL_OVERRIDE`), sorted."""
    variants = _overrides(manifest, MODEL_OVERRIDE)
    return sorted(r for r in regions if variants.get(r) and goes_to(manifest, r))


def variant_models(
    manifest: Mapping[str, Any], region: str, models: Iterable[tuple[str, str]]
) -> set[tuple[str, str]]:
    """``models`` (a deployment's revisions' artifacts) as ``region`` needs them: each version
    of its model variant instead, when the deployment gives the region one."""
    variant = _overrides(manifest, MODEL_OVERRIDE).get(region)
    name = str(manifest.get("spec", {}).get("model", {}).get("name", ""))
    if not variant:
        return set(models)
    return {(variant, v) if n == name else (n, v) for n, v in models}


def goes_to(manifest: Mapping[str, Any], region: str) -> bool:
    """Whether the object ``manifest`` belongs in ``region``'s slice."""
    kind = manifest.get("kind")
    if kind not in FEDERATED_KINDS:
        return False
    if kind == "AgentUpgrade":  # as a root's waves send it once released (agentwaves)
        return bool((manifest.get("metadata", {}).get("annotations") or {}).get(ROOT_REVISION))
    if kind == MODEL_CONFIG:  # with a deployment of its model (plan_slice: configs_for)
        return False
    if kind != "ModelDeployment":
        return True
    regions = manifest.get("spec", {}).get("placement", {}).get("regions") or []
    return not regions or region in regions


def models_of(
    manifest: Mapping[str, Any], revision_models: Iterable[tuple[str, str]]
) -> set[tuple[str, str]]:
    """The (name, version) artifacts a deployment needs in a region: its own and its revisions'."""
    model = manifest.get("spec", {}).get("model", {})
    if not isinstance(model, Mapping):  # a ModelConfig names a model, no artifact
        return set(revision_models)
    wanted = {(str(model.get("name")), str(model.get("version")))}
    wanted.update(revision_models)
    return wanted


def plan_slice(
    region: str,
    objects: Iterable[Mapping[str, Any]],
    models: Mapping[tuple[str, str], ModelRecord],
    revision_models: Mapping[str, Iterable[tuple[str, str]]],
    trust_roots: Sequence[bytes],
    configs: Mapping[str, str] | None = None,
    root_objects: Iterable[Mapping[str, Any]] = (),
) -> Slice:
    """``region``'s slice of the root's ``objects`` (canonical manifests); a model not pushed
    at the root is left out (the region's deployment then says ModelNotPushed, as the root's).
    ``configs``: by deployment, the ModelConfig (canonical JSON; "": none) of the revision the
    region is sent, where it is not the current one (a rollout in waves: the stable revision's
    until the region's wave, :meth:`hub.controllers.wave.WaveController.config_for`).
    ``root_objects``: the same objects as applied at the root, where ``objects`` are what the
    region is sent of them: the slice names the versions of the AgentUpgrades in waves as
    applied, so a region fetches the version its wave waits for even while it is sent an
    earlier one (bench/agentwaves.py found a second version never fetched by a region done
    with the first, which is sent that first version until its wave: the wave waited,
    ReleaseMissing, until its deadline)."""
    objects = tuple(objects)
    upgrades_applied = tuple(root_objects)
    placed = sorted(
        (o for o in objects if goes_to(o, region)),
        key=lambda o: (str(o["kind"]), str(o["metadata"]["name"])),
    )
    chosen = [with_overrides(o, region) for o in placed]
    wanted: set[tuple[str, str]] = set()
    for o, as_applied in zip(chosen, placed, strict=True):
        if o["kind"] == "ModelDeployment":
            name = str(o["metadata"]["name"])
            kept = variant_models(as_applied, region, revision_models.get(name, ()))
            wanted |= models_of(o, kept)
    applied = {
        str(o["metadata"]["name"]): str(o.get("spec", {}).get("model", {}).get("name"))
        for o in placed
        if o["kind"] == "ModelDeployment"
    }
    sent_configs = configs_for(chosen, objects, configs or {}, applied)
    if sent_configs:  # (a slice without any has the digest it had before they travelled)
        chosen = sorted(
            [*chosen, *sent_configs], key=lambda o: (str(o["kind"]), str(o["metadata"]["name"]))
        )
    records = tuple(models[m] for m in sorted(wanted) if m in models)
    h = hashlib.sha256()
    for o in chosen:
        h.update(dumps(o))
    for r in records:
        h.update(dumps(r.to_json()))
    for root in trust_roots:
        h.update(hashlib.sha256(root).digest())
    agent_versions = wanted_versions([*objects, *upgrades_applied])
    if agent_versions:  # (a slice without any has the digest it had before they travelled)
        h.update(dumps({"agentReleaseVersions": list(agent_versions)}))
    return Slice(tuple(chosen), records, tuple(trust_roots), h.hexdigest(), agent_versions)


def configs_for(
    chosen: Iterable[Mapping[str, Any]],
    objects: Iterable[Mapping[str, Any]],
    configs: Mapping[str, str] | None = None,
    applied: Mapping[str, str] | None = None,
) -> list[Mapping[str, Any]]:
    """The ModelConfigs a region's deployments (``chosen``, as the region gets them) need, one
    per model they run (docs/model-config.md, "Federation"): their model's current one among
    ``objects``, or, for a deployment in ``configs``, the one of the revision the region is
    sent (canonical JSON; "": none). ``applied``: by deployment, its model as applied at the
    root, where the region runs a variant of it (``federation.edgefleet.io/model.<region>``):
    the config then names the variant, which is the deployment's model there. Two deployments
    of one model wanting different configs cannot be (refused at apply); the first by name
    wins."""
    current = {
        str(o.get("spec", {}).get("model")): o for o in objects if o.get("kind") == MODEL_CONFIG
    }
    configs, applied = configs or {}, applied or {}
    out: dict[str, Mapping[str, Any] | None] = {}
    deployments = sorted(
        (o for o in chosen if o.get("kind") == "ModelDeployment"),
        key=lambda o: str(o["metadata"]["name"]),
    )
    for o in deployments:
        model = str(o.get("spec", {}).get("model", {}).get("name"))
        if model in out:
            continue
        name = str(o["metadata"]["name"])
        own = applied.get(name, model)
        found: Mapping[str, Any] | None
        if name in configs:
            text = configs[name]
            found = loads(text.encode()) if text else None
        else:
            found = current.get(own)
        if found is not None and model != own:  # the variant the region runs
            found = {**found, "spec": {**found["spec"], "model": model}}
        out[model] = found
    return [c for _, c in sorted(out.items()) if c is not None]


def model_variants(manifest: Mapping[str, Any]) -> list[str]:
    """The model variants a ModelDeployment gives regions (``federation.edgefleet.io/
    model.<region>``), sorted, each once."""
    return sorted({v for v in _overrides(manifest, MODEL_OVERRIDE).values() if v})


def same_model_configs(
    objects: Sequence[Mapping[str, Any]], stored_objects: Mapping[str, StoredValue]
) -> list[tuple[str, StoredValue]]:
    """The region's own ModelConfigs (key, stored) for a model the slice brings a ModelConfig
    for under another name: the root's wins (one config per model), as an object of the same
    name does."""
    sent = {
        str(o["spec"]["model"]): str(o["metadata"]["name"])
        for o in objects
        if o.get("kind") == MODEL_CONFIG
    }
    found = []
    for key, had in sorted(stored_objects.items()):
        if federated_generation(had.value) is not None:
            continue
        manifest = manifest_of(had.value)
        model = str(manifest.get("spec", {}).get("model", ""))
        name = str(manifest["metadata"]["name"])
        if manifest.get("kind") == MODEL_CONFIG and model in sent and sent[model] != name:
            found.append((key, had))
    return found


# -- applying a slice at a region ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredValue:
    """A key as the region's store holds it."""

    key: str
    value: bytes
    mod_revision: int


@dataclass(frozen=True, slots=True)
class Write:
    """One key of a slice's apply: written (``value``) or deleted (None), only while its mod
    revision is still ``expected`` (0: the key does not exist)."""

    key: str
    value: bytes | None
    expected: int


@dataclass(frozen=True, slots=True)
class SliceApply:
    """What makes the region's store hold the slice, as one transaction (the caller maps it to
    the store's operations): ``writes`` in order, then ``state`` (the slice's generation and
    digest) at the federation's state key."""

    writes: tuple[Write, ...]
    state: bytes
    put_objects: tuple[Mapping[str, Any], ...]
    dropped_objects: tuple[tuple[str, str], ...]
    put_models: tuple[ModelRecord, ...]
    dropped_models: tuple[tuple[str, str], ...] = ()  # root-owned models no longer used


def plan_apply(
    generation: int,
    digest: str,
    objects: Sequence[Mapping[str, Any]],
    models: Sequence[ModelRecord],
    stored_objects: Mapping[str, StoredValue],
    stored_models: Mapping[str, StoredValue],
    now: float,
    kept: Collection[tuple[str, str]] = frozenset(),
) -> SliceApply:
    """What to write so that the store holds ``objects`` and ``models`` as the root's (pure).
    ``stored_*``: what the store holds now, by key. A local object of the same name is
    replaced (the root wins); root-owned objects the slice no longer has are deleted; the
    region's own objects are left alone. A root-owned model (stored from a slice) that the
    slice no longer has is deleted once nothing refers to it: no deployment of the slice, no
    object of the region's own, nothing in ``kept`` (the (name, version) of the region's
    revisions, which a rollback may go back to). The region's own pushes are never deleted."""
    writes: list[Write] = []
    put_objects: list[Mapping[str, Any]] = []
    wanted: set[str] = set()
    for manifest in objects:
        kind, name = str(manifest["kind"]), str(manifest["metadata"]["name"])
        key = object_key(kind, name)
        wanted.add(key)
        had = stored_objects.get(key)
        owned = had is not None and federated_generation(had.value) is not None
        if owned and had is not None and manifest_of(had.value) == manifest:
            continue
        created = created_of(had.value) if had is not None else now
        value = federated_object_value(manifest, created, generation)
        writes.append(Write(key, value, had.mod_revision if had is not None else 0))
        put_objects.append(manifest)
    dropped: list[tuple[str, str]] = []
    for key, had in same_model_configs(objects, stored_objects):
        manifest = manifest_of(had.value)
        writes.append(Write(key, None, had.mod_revision))
        dropped.append((str(manifest["kind"]), str(manifest["metadata"]["name"])))
    for key, had in sorted(stored_objects.items()):
        if key in wanted or federated_generation(had.value) is None:
            continue
        manifest = manifest_of(had.value)
        writes.append(Write(key, None, had.mod_revision))
        dropped.append((str(manifest["kind"]), str(manifest["metadata"]["name"])))
    put_models: list[ModelRecord] = []
    for record in models:
        key = model_key(record.name, record.version)
        had = stored_models.get(key)
        doc = {**record.to_json(), "federated": {"generation": generation}}
        if had is not None:
            old = ModelRecord.from_json(loads(had.value))
            if (old.sha256, old.envelope, old.rollback_allowance, dict(old.extras)) == (
                record.sha256,
                record.envelope,
                record.rollback_allowance,
                dict(record.extras),
            ):
                continue
        writes.append(Write(key, dumps(doc), had.mod_revision if had is not None else 0))
        put_models.append(record)
    sent = {model_key(r.name, r.version) for r in models}
    used = set(kept)
    for manifest in objects:
        used |= models_of(manifest, ())
    for key, had in stored_objects.items():
        if key not in wanted and federated_generation(had.value) is None:
            used |= models_of(manifest_of(had.value), ())  # the region's own
    dropped_models: list[tuple[str, str]] = []
    for key, had in sorted(stored_models.items()):
        if key in sent:
            continue
        doc = loads(had.value)
        if not isinstance(doc.get("federated"), Mapping):
            continue  # pushed at the region: the region's to delete
        name, version = str(doc["spec"]["name"]), str(doc["spec"]["version"])
        if (name, version) in used:
            continue
        writes.append(Write(key, None, had.mod_revision))
        dropped_models.append((name, version))
    return SliceApply(
        tuple(writes),
        dumps({"generation": generation, "digest": digest}),
        tuple(put_objects),
        tuple(dropped),
        tuple(put_models),
        tuple(dropped_models),
    )


# -- what the root shows --------------------------------------------------------------------


def add_regions(
    status: Mapping[str, Any], regions: Mapping[str, dict[str, Any] | None]
) -> dict[str, Any]:
    """A deployment's status at the root: its own devices' counts plus every region's, and
    ``regions`` with each region's figures (None: the region has not reported it yet).
    Failing devices are named ``region/device``."""
    out = dict(status)
    for key in ("desiredDevices", "updatedDevices", "readyDevices", "availableDevices"):
        out[key] = int(status.get(key, 0)) + sum(
            int((r or {}).get(key, 0)) for r in regions.values()
        )
    failing = dict(status.get("failing", {}))
    for region, r in sorted(regions.items()):
        for device, reason in (r or {}).get("failing", {}).items():
            failing[f"{region}/{device}"] = reason
    out["failing"] = dict(sorted(failing.items()))
    versions: dict[str, dict[str, int]] = {
        v: dict(c) for v, c in status.get("versions", {}).items()
    }
    for r in regions.values():
        for version, devices in (r or {}).get("versions", {}).items():
            counts = versions.setdefault(version, {"devices": 0, "ready": 0})
            counts["devices"] = counts.get("devices", 0) + int(devices)
    out["versions"] = dict(sorted(versions.items()))
    config = add_configs(status.get("config"), regions)
    if config is not None:
        out["config"] = config
    out["regions"] = {name: r for name, r in sorted(regions.items())}
    return out


def add_configs(
    own: Mapping[str, Any] | None, regions: Mapping[str, dict[str, Any] | None]
) -> dict[str, Any] | None:
    """A deployment's ``status.config`` at the root: its own devices' and every region's
    added up (devices named ``region/device``, at most :data:`MAX_CONFIG_SHOWN`); None when
    no device anywhere is sent a config."""
    parts = [("", own)] + [(name, (r or {}).get("config")) for name, r in sorted(regions.items())]
    names: set[str] = set()
    devices = running = not_running = 0
    shown: dict[str, str] = {}
    for region, c in parts:
        if not c:
            continue
        names.update(n for n in str(c.get("modelConfig", "")).split(", ") if n)
        devices += int(c.get("devices", 0))
        running += int(c.get("runningDesired", 0))
        listed = c.get("notRunningDesired", {})
        not_running += int(c.get("notRunningDevices", len(listed)))
        for device, why in sorted(listed.items()):
            shown[f"{region}/{device}" if region else device] = why
    if not devices:
        return None
    listed = dict(sorted(shown.items())[:MAX_CONFIG_SHOWN])
    out: dict[str, Any] = {
        "modelConfig": ", ".join(sorted(names)),
        "devices": devices,
        "runningDesired": running,
        "notRunningDesired": listed,
    }
    if not_running > len(listed):
        out["notRunningDevices"] = not_running
    return out
