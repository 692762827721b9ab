"""Federation's pure decisions (docs/federation.md): which objects and artifacts a region is
owed (its *slice*), the bounds on what a regional hub reports, and how the root adds the
regions' reports into what ``edgectl`` shows. No I/O, no clock: tested as tables in
``tests/hub/test_hub_slicing.py``.

A ModelDeployment goes to the regions its ``spec.placement.regions`` lists, or to every region
when it lists none; DeviceHealthPolicy and SecurityBaseline objects go to every region. A region
also gets the artifacts its deployments use, and those of the revisions the root holds for
them (so a rollout or a rollback inside the region finds the older version), each with its
signed metadata exactly as the publisher signed it. Per-region overrides, annotations on a
ModelDeployment at the root, change what one region gets (:func:`with_overrides`): its
replica count, its model variant (another model at the same versions) or its precision
variant (``runtime.precision``); any other ``federation.edgefleet.io/`` annotation is refused
at apply (:func:`override_problems`).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgefleet.api import Precision
from edgefleet.api.meta import dns_label, label_key, label_value
from edgefleet.api.validating import one_of
from edgefleet.timestamps import rfc3339
from edgefleet.v1 import federation_pb2
from hub.decide.rollout import MAX_WEIGHT
from hub.state import storekeys

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

FEDERATED_KINDS = ("ModelDeployment", "DeviceHealthPolicy", "SecurityBaseline")


@dataclass(frozen=True, slots=True)
class Slice:
    """What a region is owed: canonical manifests, model records, trust roots, a digest."""

    objects: tuple[Mapping[str, Any], ...]
    models: tuple[storekeys.ModelRecord, ...]
    trust_roots: tuple[bytes, ...]
    digest: str


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
        if key == MAX_WEIGHT:
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
    if kind != "ModelDeployment":
        return True
    regions = manifest.get("spec", {}).get("placement", {}).get("regions") or []
    return not regions or region in regions


def models_of(
    manifest: Mapping[str, Any], revision_models: Iterable[tuple[str, str]]
) -> set[tuple[str, str]]:
    """The (name, version) artifacts a deployment needs in a region: its own and its revisions'."""
    model = manifest.get("spec", {}).get("model", {})
    wanted = {(str(model.get("name")), str(model.get("version")))}
    wanted.update(revision_models)
    return wanted


def plan_slice(
    region: str,
    objects: Iterable[Mapping[str, Any]],
    models: Mapping[tuple[str, str], storekeys.ModelRecord],
    revision_models: Mapping[str, Iterable[tuple[str, str]]],
    trust_roots: Sequence[bytes],
) -> Slice:
    """``region``'s slice of the root's ``objects`` (canonical manifests); a model not pushed
    at the root is left out (the region's deployment then says ModelNotPushed, as the root's)."""
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
    records = tuple(models[m] for m in sorted(wanted) if m in models)
    h = hashlib.sha256()
    for o in chosen:
        h.update(storekeys.dumps(o))
    for r in records:
        h.update(storekeys.dumps(r.to_json()))
    for root in trust_roots:
        h.update(hashlib.sha256(root).digest())
    return Slice(tuple(chosen), records, tuple(trust_roots), h.hexdigest())


def slice_message(s: Slice, generation: int) -> federation_pb2.RegionSlice:
    return federation_pb2.RegionSlice(
        generation=generation,
        objects=[storekeys.dumps(o) for o in s.objects],
        models=[
            federation_pb2.FederatedModel(
                name=m.name,
                version=m.version,
                sha256=m.sha256,
                length=m.length,
                envelope=m.envelope,
                extras=dict(m.extras),
                rollback_allowance=m.rollback_allowance,
                pushed_at=m.pushed_at,
            )
            for m in s.models
        ],
        trust_roots=list(s.trust_roots),
        digest=s.digest,
    )


# -- what a region sends -------------------------------------------------------------------


def _text(problems: list[str], path: str, value: str, limit: int = MAX_NAME) -> None:
    if len(value) > limit:
        problems.append(f"{path}: at most {limit} characters, got {len(value)}")


@functools.lru_cache(maxsize=4096)
def _label_problem(key: str, value: str) -> str | None:
    """What is wrong with one label (None: valid); remembered, as a region's devices mostly
    share their labels and every report lists them all."""
    try:
        label_key(key)
        label_value(value)
    except ValueError as exc:
        return str(exc)
    return None


def check_report(report: federation_pb2.RegionReport) -> list[str]:
    """Every problem of a region's report (empty: within bounds); each names its field."""
    problems: list[str] = []
    if len(report.deployments) > MAX_REPORT_DEPLOYMENTS:
        problems.append(
            f"report.deployments: at most {MAX_REPORT_DEPLOYMENTS}, got {len(report.deployments)}"
        )
    seen: set[str] = set()
    for i, d in enumerate(report.deployments[:MAX_REPORT_DEPLOYMENTS]):
        path = f"report.deployments[{i}]"
        _text(problems, f"{path}.name", d.name)
        if d.name in seen:
            problems.append(f"{path}.name: {d.name!r} twice")
        seen.add(d.name)
        if not d.updated <= d.desired or not d.ready <= d.desired:
            problems.append(f"{path}: updated and ready must not exceed desired ({d.desired})")
        if len(d.failing) > MAX_FAILING:
            problems.append(f"{path}.failing: at most {MAX_FAILING}, got {len(d.failing)}")
        for device, reason in list(d.failing.items())[:MAX_FAILING]:
            _text(problems, f"{path}.failing[{device[:64]!r}]", device)
            _text(problems, f"{path}.failing[{device[:64]!r}]", reason, MAX_TEXT)
        if len(d.versions) > MAX_VERSIONS:
            problems.append(f"{path}.versions: at most {MAX_VERSIONS}, got {len(d.versions)}")
        for version in list(d.versions)[:MAX_VERSIONS]:
            _text(problems, f"{path}.versions", version, 128)
        _text(problems, f"{path}.rollout_phase", d.rollout_phase, 64)
        _text(problems, f"{path}.rollout_template", d.rollout_template, 64)
        _text(problems, f"{path}.stable_template", d.stable_template, 64)
        _text(problems, f"{path}.rollout_reason", d.rollout_reason, 64)
        _text(problems, f"{path}.rollout_message", d.rollout_message, MAX_TEXT)
        if len(d.revision_figures) > MAX_REVISION_FIGURES:
            problems.append(
                f"{path}.revision_figures: at most {MAX_REVISION_FIGURES}, "
                f"got {len(d.revision_figures)}"
            )
        for j, f in enumerate(d.revision_figures[:MAX_REVISION_FIGURES]):
            fpath = f"{path}.revision_figures[{j}]"
            _text(problems, f"{fpath}.template", f.template, 64)
            if f.errors > f.requests:
                problems.append(f"{fpath}.errors: more than its requests ({f.requests})")
            if f.accuracy_devices > f.devices:
                problems.append(f"{fpath}.accuracy_devices: more than its devices ({f.devices})")
            for name, value in (("latency_p95_s", f.latency_p95_s), ("accuracy", f.accuracy)):
                if f.HasField(name) and not 0.0 <= value <= 1e6:
                    problems.append(f"{fpath}.{name}: must be from 0 to 1e6, got {value}")
            if len(f.validation_problems) > MAX_VALIDATION_PROBLEMS:
                problems.append(
                    f"{fpath}.validation_problems: at most {MAX_VALIDATION_PROBLEMS}, "
                    f"got {len(f.validation_problems)}"
                )
            for device, why in list(f.validation_problems.items())[:MAX_VALIDATION_PROBLEMS]:
                _text(problems, f"{fpath}.validation_problems", device)
                _text(problems, f"{fpath}.validation_problems[{device[:64]!r}]", why, MAX_TEXT)
    inv = report.inventory
    if len(inv.devices) > MAX_REPORT_DEVICES:
        problems.append(
            f"report.inventory.devices: at most {MAX_REPORT_DEVICES}, got {len(inv.devices)}"
        )
    if len(inv.by_phase) > MAX_PHASES:
        problems.append(f"report.inventory.by_phase: at most {MAX_PHASES}, got {len(inv.by_phase)}")
    if len(inv.devices) > inv.total:
        problems.append(f"report.inventory.total: {inv.total} is less than the devices listed")
    for i, dev in enumerate(inv.devices[:MAX_REPORT_DEVICES]):
        path = f"report.inventory.devices[{i}]"
        _text(problems, f"{path}.name", dev.name)
        _text(problems, f"{path}.phase", dev.phase, 32)
        _text(problems, f"{path}.attestation", dev.attestation, 32)
        if len(dev.labels) > MAX_LABELS:
            problems.append(f"{path}.labels: at most {MAX_LABELS}, got {len(dev.labels)}")
        for k, v in list(dev.labels.items())[:MAX_LABELS]:
            problem = _label_problem(k, v)
            if problem is not None:
                problems.append(f"{path}.labels[{k[:64]!r}]: {problem}")
        if len(dev.deployments) > MAX_REPORT_DEPLOYMENTS:
            problems.append(f"{path}.deployments: at most {MAX_REPORT_DEPLOYMENTS}")
        if len(problems) > 50:
            break
    return problems


# -- what the root shows --------------------------------------------------------------------


def region_deployment_json(d: federation_pb2.RegionDeploymentStatus) -> dict[str, Any]:
    return {
        "desiredDevices": d.desired,
        "updatedDevices": d.updated,
        "readyDevices": d.ready,
        "availableDevices": d.available,
        "failing": dict(sorted(d.failing.items())),
        "versions": dict(sorted(d.versions.items())),
        **(
            {
                "rollout": {
                    "phase": d.rollout_phase,
                    "revision": d.rollout_revision,
                    **({"reason": d.rollout_reason} if d.rollout_reason else {}),
                    **({"message": d.rollout_message} if d.rollout_message else {}),
                }
            }
            if d.rollout_phase
            else {}
        ),
    }


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
    out["regions"] = {name: r for name, r in sorted(regions.items())}
    return out


def region_device_json(region: str, dev: federation_pb2.RegionDevice) -> dict[str, Any]:
    """A device of a region as the root shows it (what the region's summary says of it)."""
    return {
        "apiVersion": "edgefleet.io/v1",
        "kind": storekeys.KIND_DEVICE,
        "metadata": {"name": dev.name, "labels": dict(sorted(dev.labels.items()))},
        "spec": {"cordoned": dev.cordoned},
        "status": {
            "region": region,
            "phase": dev.phase,
            "health": {"schedulable": dev.schedulable, "reasons": []},
            "attestation": {"state": dev.attestation or "Unknown"},
            "deployments": list(dev.deployments),
            "lastHeartbeat": rfc3339(dev.last_heartbeat or None),
            "federated": True,
        },
    }
