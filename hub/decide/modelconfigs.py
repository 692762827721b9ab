"""ModelConfig at the hub, decided before anything is written (pure): one config per model,
and what an apply of a config says it does (docs/model-config.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from edgefleet.api.modelconfigs import (
    DEFAULTS,
    KIND,
    MergedConfig,
    ModelConfig,
    canonical_json,
    merge_steps,
    merged_size_problem,
    ordered_overrides,
)
from edgefleet.configschemas import ConfigSchema
from edgefleet.modelprocessing import ProcessingInvalid, read_processing
from hub.decide.devices import Device

__all__ = [
    "DELIVERY_WARNING",
    "IN_WAVES",
    "KIND",
    "config_status",
    "config_text",
    "merge_chains",
    "model_conflicts",
    "processing_problems",
    "schema_problems",
    "size_problems",
    "wave_conflicts",
]

DELIVERY_WARNING = (
    "a config change makes a new revision of each deployment of the model, rolled out like "
    "a new version: through the deployment's rollout (its canary steps and analysis, rolled "
    "back on failure); see edgectl rollout status deployment/NAME (docs/model-config.md)"
)
"""Said by every apply that changes a ModelConfig: what the change does."""


IN_WAVES = "rolled out in waves (spec.rollout.waves)"
"""What a deployment says to :func:`wave_conflicts` when it is rolled out in waves."""


def wave_conflicts(
    configs: Iterable[tuple[str, str]], deployments: Iterable[tuple[str, str, str]]
) -> list[str]:
    """Pure: a ModelConfig (where, model) for a model with a deployment (where, model, what:
    rolled out in waves (:data:`IN_WAVES`) or giving a region a model variant; "" neither)
    beside another deployment of the model: not supported yet, each named (one region could
    need the configs of two wave positions, or of the model and its variant, under one
    name). A deployment that is alone carries to each region the config of the revision it
    is sent, naming the variant the region runs (hub.decide.regionslice.configs_for)."""
    deployments = list(deployments)
    models = {model: where for where, model in configs}
    per_model: dict[str, list[str]] = {}
    for where, model, _ in deployments:
        per_model.setdefault(model, []).append(where)
    found = []
    for where, model, why in deployments:
        if not why or model not in models:
            continue
        others = [w for w in per_model[model] if w != where]
        # only what this apply brings (stored pairs were refused or predate a region)
        if not others or not any(
            w.startswith("documents[") for w in [where, models[model], *others]
        ):
            continue
        found.append(
            f"{where}: a ModelDeployment {why} beside another deployment of its model "
            f"({', '.join(others)}), with a ModelConfig for the model ({models[model]}): not "
            "supported yet; apply the ModelConfig at each regional hub, or give the model one "
            "deployment"
        )
    return found


def config_text(manifests: Iterable[Mapping[str, Any]], model: str) -> str:
    """The ModelConfig of ``model`` among stored ModelConfig manifests, as canonical JSON
    (what a revision carries: hub.decide.revisions.with_config); ``""``: none."""
    for doc in manifests:
        if doc.get("spec", {}).get("model") == model:
            return canonical_json(doc).decode()
    return ""


def model_conflicts(
    applied: Sequence[tuple[int, str, Mapping[str, Any]]],
    stored: Iterable[Mapping[str, Any]],
) -> list[str]:
    """Problems of an apply whose ModelConfigs (``(index, name, manifest)``) would leave two
    configs for one model (the stored ones: manifests), each naming its document."""
    owner: dict[str, str] = {}
    names = {name for _, name, _ in applied}
    for doc in stored:
        name = str(doc.get("metadata", {}).get("name", ""))
        if name not in names:  # a config applied now replaces its stored self
            owner[str(doc.get("spec", {}).get("model", ""))] = name
    problems = []
    for i, name, doc in applied:
        model = str(doc.get("spec", {}).get("model", ""))
        other = owner.get(model)
        if other is not None and other != name:
            problems.append(
                f"documents[{i}].spec.model: model {model!r} already has {KIND} {other!r}: "
                "one config per model (put overrides in it, or delete it first)"
            )
        owner.setdefault(model, name)
    return problems


def _step_id(step: str) -> str:
    """``spec.overrides[2] (device cam-1)`` -> ``spec.overrides[2]``; the defaults -> ``spec``."""
    return "spec" if step == DEFAULTS else step.split(" ", 1)[0]


def _manifest_path(merged: MergedConfig, path: str) -> str | None:
    """Where in the ModelConfig the value at ``path`` of a merged config was set (``data.a[1]``
    set whole by override 2 -> ``spec.overrides[2].data.a[1]``); ``None`` when no step set it
    (a key the schema requires and nothing gives)."""
    best = None
    for leaf, step in merged.sources.items():
        under = path == leaf or path.startswith((leaf + ".", leaf + "["))
        if under and (best is None or len(leaf) > len(best[0])):
            best = (leaf, step)
    return None if best is None else f"{_step_id(best[1])}.{path}"


def merge_chains(
    config: ModelConfig, devices: Iterable[tuple[str, Mapping[str, str]]]
) -> list[tuple[str, MergedConfig]]:
    """What an apply checks (pure): the defaults alone, the defaults with each override
    (merged per selector or device list), and the merge of every device given that matches
    more than one override (their combination), each with what it is."""
    chains: list[tuple[str, MergedConfig]] = [("the defaults", merge_steps(config, []))]
    for i, o in enumerate(config.spec.overrides):
        step = f"spec.overrides[{i}]"
        chains.append((f"{step} over the defaults", merge_steps(config, [(step, o)])))
    for name, labels in devices:
        steps = ordered_overrides(config, name, labels)
        if len(steps) > 1:  # one step or none is a chain above
            chains.append((f"merged for device {name}", merge_steps(config, steps)))
    return chains


def size_problems(
    config: ModelConfig, devices: Iterable[tuple[str, Mapping[str, str]]]
) -> list[str]:
    """Pure: the merges (:func:`merge_chains`) too large for a device, at most 10."""
    found = []
    for what, merged in merge_chains(config, devices):
        why = merged_size_problem(merged)
        if why is not None:
            found.append(f"spec: {what}: the config {why}")
    return found[:10]


def schema_problems(
    config: ModelConfig,
    schema: ConfigSchema,
    devices: Iterable[tuple[str, Mapping[str, str]]],
    *,
    limit: int = 20,
) -> list[str]:
    """Pure: every way the config breaks ``schema``, each as ``<field path in the
    ModelConfig>: <what>``, over :func:`merge_chains`. At most ``limit`` problems."""
    chains = merge_chains(config, devices)
    found: list[str] = []
    seen: set[tuple[str, str]] = set()
    for what, merged in chains:
        for p in schema.problems(merged.data):
            where = _manifest_path(merged, p.path)
            key = (where or f"{what}: {p.path}", p.message)
            if key in seen:
                continue
            seen.add(key)
            if where is None:
                found.append(f"spec: {what}: {p.path}: {p.message}")
            else:
                found.append(
                    f"{where}: {p.message}" + ("" if what == "the defaults" else f" ({what})")
                )
            if len(found) >= limit:
                return found
    return found


def processing_problems(
    config: ModelConfig, devices: Iterable[tuple[str, Mapping[str, str]]]
) -> list[str]:
    """Pure: the merges (:func:`merge_chains`) whose ``edgefleet.io/processing`` section is
    malformed (edgefleet.modelprocessing; a device would refuse them), at most 10, each with
    the paths of its problems. Whether it fits the model is the worker's check."""
    found = []
    for what, merged in merge_chains(config, devices):
        try:
            read_processing(merged.data)
        except ProcessingInvalid as exc:
            where = "spec" if what == "the defaults" else f"spec: {what}:"
            found.append(f"{where}.{exc}" if where == "spec" else f"{where} {exc}")
    return found[:10]


MAX_NOT_RUNNING_SHOWN = 32


def config_status(
    deployment: str,
    config_for: Callable[[str], ModelConfig | None],
    devices: Iterable[Device],
    assigned: Mapping[str, Iterable[str]],
) -> dict[str, Any] | None:
    """Pure: a deployment's ``status.config``, desired against reported: of the devices sent
    the deployment (``assigned``), how many report running the config they are sent (the one
    ``config_for(device)`` gives: their revision's, merged for them), and each other one named
    with what it reports (at most :data:`MAX_NOT_RUNNING_SHOWN`; all of them counted).
    ``None`` when no device is sent a config for it."""
    merged: dict[tuple[int, tuple[str, ...]], str] = {}
    total = running = 0
    names: set[str] = set()
    others: dict[str, str] = {}
    for device in devices:
        if deployment not in set(assigned.get(device.name, ())):
            continue
        config = config_for(device.name)
        if config is None:
            continue
        names.add(config.name)
        total += 1
        steps = ordered_overrides(config, device.name, device.all_labels())
        key = (id(config), tuple(step for step, _ in steps))
        if key not in merged:
            merged[key] = merge_steps(config, steps).digest()
        want = merged[key]
        report = device.workloads.get(deployment)
        if report is not None and report.config_digest == want and not report.config_error:
            running += 1
            continue
        if report is None:
            others[device.name] = "no report of the deployment yet"
        elif report.config_error:
            others[device.name] = f"not applied: {report.config_error}"[:300] + (
                f" (runs {report.config_digest[:19]})" if report.config_digest else ""
            )
        elif report.config_digest:
            others[device.name] = f"runs {report.config_digest[:19]}, not {want[:19]}"
        else:
            others[device.name] = "reports no config (an edged that does not apply them?)"
    if not total:
        return None
    shown = dict(sorted(others.items())[:MAX_NOT_RUNNING_SHOWN])
    return {
        "modelConfig": ", ".join(sorted(names)),
        "devices": total,
        "runningDesired": running,
        "notRunningDesired": shown,
        **({"notRunningDevices": len(others)} if len(others) > len(shown) else {}),
    }
