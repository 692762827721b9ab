"""A region's report to its root (docs/federation.md): its root-owned deployments' status and
figures per revision (what the root's waves analyse) and its device inventory, bounded
(:mod:`hub.decide.regionslice`); sent up by the link (:mod:`hub.controllers.parentlink.link`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edgefleet.api import AgentUpgrade, parse_manifest
from edgefleet.v1 import federation_pb2
from hub.controllers.objectstatus import shown_object
from hub.controllers.rollout import RolloutController, targeted
from hub.decide import regionslice
from hub.decide.agentupgrade import takes_up
from hub.decide.rollout import Revision
from hub.decide.status import revisions_of, wanted_revision
from hub.state.cache import Cache


def revision_figures(
    cache: Cache, name: str, revision: Revision
) -> federation_pb2.RegionRevisionFigures:
    """What ``revision`` of deployment ``name`` did on the region's devices where it serves:
    the devices' counters added up, the highest latency p95, the lowest accuracy (what the
    root's waves analyse, :mod:`hub.decide.wave`)."""
    record = cache.models.get(revision.model)
    sha = record.sha256 if record is not None else None
    out = federation_pb2.RegionRevisionFigures(template=revision.template)
    for device_name in targeted(cache, name):
        device = cache.devices.get(device_name)
        report = device.workloads.get(name) if device is not None else None
        got = (
            wanted_revision(revisions_of(report), revision.model[1], sha)
            if report is not None
            else None
        )
        if got is None or not got.serves:
            continue
        out.devices += 1
        out.requests += got.requests
        out.errors += min(got.errors, got.requests)
        p95 = got.latency_p95_s if got.window_requests > 0 else None
        if p95 is not None and (not out.HasField("latency_p95_s") or p95 > out.latency_p95_s):
            out.latency_p95_s = p95
        if got.validation_reason:
            if len(out.validation_problems) < regionslice.MAX_VALIDATION_PROBLEMS:
                why = got.validation_reason + (
                    f": {got.validation_message}" if got.validation_message else ""
                )
                out.validation_problems[device_name[: regionslice.MAX_NAME]] = why[
                    : regionslice.MAX_TEXT
                ]
        elif got.accuracy is not None:
            out.accuracy_devices += 1
            if not out.HasField("accuracy") or got.accuracy < out.accuracy:
                out.accuracy = got.accuracy
    return out


def agent_upgrade_status(
    cache: Cache, manifest: Mapping[str, Any]
) -> federation_pb2.RegionAgentUpgradeStatus:
    """One of the region's AgentUpgrades as its status says now (edgectl's at the region),
    bounded as the root checks it (:func:`hub.state.regionmapping.check_report`).

    The root's revision (the manifest's annotation) is claimed only once the region's rollout
    record is of that manifest (:func:`hub.decide.agentupgrade.takes_up`): between the slice
    putting the root's next revision and the controller's pass that starts it, the record is
    still the previous one's, and its RolledBack (or Complete) claimed for the new revision
    would stop (or pass) the root's waves on what the new one never did."""
    shown = shown_object(cache, "AgentUpgrade", manifest, region="", rollouts=None)
    status = shown.get("status", {})
    failed = status.get("failedDevices", {})
    root_revision = str(
        (shown["metadata"].get("annotations") or {}).get(regionslice.ROOT_REVISION) or ""
    )
    upgrade = parse_manifest(dict(manifest))
    current = isinstance(upgrade, AgentUpgrade) and takes_up(
        upgrade, cache.agent_upgrades.get(upgrade.name)
    )
    return federation_pb2.RegionAgentUpgradeStatus(
        name=str(shown["metadata"]["name"]),
        root_revision=int(root_revision[:9]) if root_revision.isdigit() and current else 0,
        version=str(status.get("version") or shown.get("spec", {}).get("version", ""))[:128],
        phase=str(status.get("phase", "")),
        revision=int(status.get("revision") or 0),
        reason=str(status.get("reason") or "")[:64],
        message=str(status.get("message") or "")[: regionslice.MAX_TEXT],
        pool=int(status.get("poolDevices", 0)),
        done=int(status.get("doneDevices", 0)),
        updating=int(status.get("updatingDevices", 0)),
        # a failed device deleted since stays in the record: never more than the devices
        failed_count=min(len(failed), len(cache.devices)),
        failed={
            d[: regionslice.MAX_NAME]: str(why)[: regionslice.MAX_TEXT]
            for d, why in sorted(failed.items())[
                : min(regionslice.MAX_AGENT_FAILED, len(cache.devices))
            ]
        },
    )


def config_status(shown: Any) -> federation_pb2.RegionConfigStatus | None:
    """A deployment's ``status.config`` at the region (hub.decide.modelconfigs.config_status),
    bounded as the root checks it; None when its devices are sent no config."""
    if not isinstance(shown, Mapping):
        return None
    others = dict(
        sorted(shown.get("notRunningDesired", {}).items())[: regionslice.MAX_CONFIG_SHOWN]
    )
    devices = int(shown.get("devices", 0))
    return federation_pb2.RegionConfigStatus(
        model_config=str(shown.get("modelConfig", ""))[: regionslice.MAX_TEXT],
        devices=devices,
        running_desired=min(int(shown.get("runningDesired", 0)), devices),
        not_running_devices=min(int(shown.get("notRunningDevices", len(others))), devices),
        not_running={
            d[: regionslice.MAX_NAME]: str(why)[: regionslice.MAX_TEXT] for d, why in others.items()
        },
    )


def build_report(
    cache: Cache,
    generation: int,
    *,
    region: str,
    rollouts: RolloutController | None,
    agent_release_refusals: Mapping[str, str] | None = None,
) -> federation_pb2.RegionReport:
    """The region's status: its root-owned deployments' figures and its device inventory;
    ``agent_release_refusals``: the root's releases this region refused (hub.decide.agentrelay)."""
    deployments = []
    for (kind, name), stored in sorted(cache.stored.items()):
        if kind != "ModelDeployment":
            continue
        status = shown_object(  # as edgectl shows it at the region
            cache, kind, stored.manifest, region=region, rollouts=rollouts
        ).get("status", {})
        rollout = cache.rollouts.get(name)
        revisions = cache.revisions.get(name, {})
        current = revisions.get(rollout.revision) if rollout is not None else None
        stable = revisions.get(rollout.stable) if rollout is not None else None
        failing = dict(sorted(status.get("failing", {}).items())[: regionslice.MAX_FAILING])
        deployments.append(
            federation_pb2.RegionDeploymentStatus(
                name=name,
                desired=int(status.get("desiredDevices", 0)),
                updated=int(status.get("updatedDevices", 0)),
                ready=int(status.get("readyDevices", 0)),
                available=int(status.get("availableDevices", 0)),
                failing={k: str(v)[: regionslice.MAX_TEXT] for k, v in failing.items()},
                versions={
                    v: int(c.get("devices", 0))
                    for v, c in list(status.get("versions", {}).items())[: regionslice.MAX_VERSIONS]
                },
                rollout_phase=rollout.phase.value if rollout is not None else "",
                rollout_revision=rollout.revision if rollout is not None else 0,
                rollout_template=current.template if current is not None else "",
                stable_template=stable.template if stable is not None else "",
                rollout_reason=rollout.reason[:64] if rollout is not None else "",
                rollout_message=rollout.message[: regionslice.MAX_TEXT]
                if rollout is not None
                else "",
                revision_figures=[
                    revision_figures(cache, name, rev)
                    for rev in {r.number: r for r in (current, stable) if r is not None}.values()
                ],
                config=config_status(status.get("config")),
            )
        )
    agent_upgrades = [
        agent_upgrade_status(cache, stored.manifest)
        for (kind, _), stored in sorted(cache.stored.items())
        if kind == "AgentUpgrade"
    ][: regionslice.MAX_REPORT_AGENT_UPGRADES]
    releases = sorted({r.version for r in cache.agent_releases.values()})
    by_phase: dict[str, int] = {}
    rows: list[federation_pb2.RegionDevice] = []
    for device in sorted(cache.devices.values(), key=lambda d: d.name):
        by_phase[device.phase.value] = by_phase.get(device.phase.value, 0) + 1
        if len(rows) >= regionslice.MAX_REPORT_DEVICES:
            continue
        desired = cache.desired.get(device.name)
        labels = dict(sorted(device.all_labels().items())[: regionslice.MAX_LABELS])
        rows.append(
            federation_pb2.RegionDevice(
                name=device.name,
                phase=device.phase.value,
                labels=labels,
                deployments=list(desired.deployments) if desired is not None else [],
                cordoned=device.cordoned,
                schedulable=device.health.schedulable,
                attestation=device.attestation.state.value,
                last_heartbeat=device.last_heartbeat or 0.0,
            )
        )
    return federation_pb2.RegionReport(
        generation=generation,
        deployments=deployments[: regionslice.MAX_REPORT_DEPLOYMENTS],
        agent_upgrades=agent_upgrades,
        agent_release_versions=releases[-regionslice.MAX_AGENT_RELEASES :],
        agent_release_refusals=dict(agent_release_refusals or {}),
        inventory=federation_pb2.RegionInventory(
            total=len(cache.devices),
            by_phase=by_phase,
            devices=rows,
            truncated=len(cache.devices) > len(rows),
        ),
    )
