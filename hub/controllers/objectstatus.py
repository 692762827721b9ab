"""An object as ``edgectl get`` shows it at this hub (its computed status), regions' figures
not added: what AdminService's reads show (:mod:`hub.api.admin.showing`, which adds a root's
regions and waves) and what a regional hub reports to its root
(:func:`hub.controllers.parentlink.regionreport.build_report`).

Here, not in api, because both call it; it reads the cache and the rollout controller's last
canary analysis, and writes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from edgefleet.api import AgentUpgrade, ModelDeployment, parse_manifest
from edgefleet.api.modelconfigs import ModelConfig
from edgefleet.versioning import installed_version
from hub.controllers.agentupgrade import device_views, upgrades_of
from hub.controllers.rollout import RolloutController, canary_status, progress_of
from hub.decide import modelconfigs
from hub.decide.agentupgrade import plan_upgrade
from hub.decide.agentupgradestatus import upgrade_status
from hub.decide.desired import config_from_text
from hub.decide.labeltrust import secrets_withheld
from hub.decide.presentation import deployment_object, fleet_compliance
from hub.decide.revisions import config_of
from hub.decide.rolloutstatus import rollout_versions, with_rollout
from hub.decide.status import count_placeable
from hub.state.cache import Cache


def shown_object(
    cache: Cache,
    kind: str,
    manifest: Mapping[str, Any],
    *,
    region: str,
    rollouts: RolloutController | None,
) -> dict[str, Any]:
    """``manifest`` of ``kind`` with the status this hub computes for it now: a deployment's
    devices, revisions and rollout (with its canary analysis), a Secret's keys and version
    (never a value), a SecurityBaseline's fleet compliance; other kinds as applied."""
    if kind == "ModelDeployment":
        return _deployment(cache, manifest, region=region, rollouts=rollouts)
    if kind == "Secret":  # names, keys, version: never a value
        record = cache.secrets.get(str(manifest["metadata"]["name"]))
        shown = dict(manifest)
        if record is not None:
            shown["status"] = {
                "version": record.version,
                "keys": list(record.keys),
                "bytes": record.size,
            }
        return shown
    if kind == "SecurityBaseline":
        return {**manifest, "status": fleet_compliance(cache.devices.values())}
    if kind == "AgentUpgrade":
        return _agent_upgrade(cache, manifest)
    return dict(manifest)


def _agent_upgrade(cache: Cache, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """An AgentUpgrade with its rollout's status, as the planner sees it now (writes nothing).
    One in waves goes to the regions, not this hub's devices: its status is the root's
    (hub.controllers.agentwaves), shown by hub.api.admin.showing."""
    if manifest.get("spec", {}).get("rollout", {}).get("waves"):
        waiting = "rolled out across the regions in waves: no wave started yet"
        return {**manifest, "status": {"phase": "Pending", "message": waiting}}
    upgrade = parse_manifest(dict(manifest))
    assert isinstance(upgrade, AgentUpgrade)
    upgrades = upgrades_of(cache)
    upgrades[upgrade.name] = upgrade
    state = cache.agent_upgrades.get(upgrade.name)
    progress = plan_upgrade(
        upgrade,
        state,
        device_views(cache, upgrade, upgrades),
        cache.agent_releases,
        installed_version(),
        time.time(),
    ).progress
    return {**manifest, "status": upgrade_status(upgrade, state, progress)}


def _deployment(
    cache: Cache,
    manifest: Mapping[str, Any],
    *,
    region: str,
    rollouts: RolloutController | None,
) -> dict[str, Any]:
    dep = cache.deployments.get(str(manifest["metadata"]["name"]))
    if dep is None:
        parsed = parse_manifest(dict(manifest))
        assert isinstance(parsed, ModelDeployment)
        dep = parsed
    name = dep.metadata.name
    model = cache.models.get((dep.spec.model.name, dep.spec.model.version))
    assigned = {device: record.deployments for device, record in cache.desired.items()}
    assigned_models: dict[str, tuple[str, str | None]] = {}
    for device, deployments in assigned.items():
        revision = cache.revision_for(name, device) if name in deployments else None
        if revision is not None:
            sent = cache.models.get(revision.model)
            assigned_models[device] = (revision.model[1], sent.sha256 if sent else None)
    doc = deployment_object(
        manifest,
        cache.devices.values(),
        assigned,
        dep,
        model_sha256=model.sha256 if model is not None else None,
        model_pushed=model is not None,
        placeable=count_placeable(dep, cache.devices.values(), region),
        assigned_models=assigned_models,
        scheduled=cache.explanations.get(name) if dep.spec.replicas.per_device is None else None,
        withheld=secrets_withheld(dep, cache.devices.values(), region),
    )
    seen: dict[str, ModelConfig] = {}

    def config_for(device: str) -> ModelConfig | None:  # the one its revision carries
        revision = cache.revision_for(name, device)
        text = config_of(revision.manifest) if revision is not None else ""
        if text and text not in seen:
            seen[text] = config_from_text(text)
        return seen.get(text)

    shown = modelconfigs.config_status(name, config_for, cache.devices.values(), assigned)
    if shown is not None:  # desired against reported (docs/model-config.md)
        doc["status"]["config"] = shown
    state = cache.rollouts.get(name)
    if state is not None:
        progress = progress_of(cache, name)
        doc["status"] = with_rollout(
            doc["status"],
            state,
            *rollout_versions(cache.revisions.get(name, {}), state),
            progress.to_json() if progress is not None else None,
        )
        canary = dep.spec.rollout.canary
        if canary is not None and progress is not None:
            analysis = rollouts.analysis(name) if rollouts is not None else None
            doc["status"]["rollout"]["canary"] = canary_status(
                canary, state, progress.targeted, analysis
            )
    return doc
