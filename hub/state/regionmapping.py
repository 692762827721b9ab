"""Federation's protobuf mapping (docs/federation.md): a region's slice
(:class:`hub.decide.regionslice.Slice`) as the ``RegionSlice`` message it is streamed in, a
region's ``RegionReport`` checked against the bounds of :mod:`hub.decide.regionslice` before
anything of it is kept, and what the root shows of a region's deployments and devices. The
deciders read and return plain data; the messages are mapped here, at the servicer's side."""

from __future__ import annotations

import functools
from typing import Any

from edgefleet.api.meta import label_key, label_value
from edgefleet.timestamps import rfc3339
from edgefleet.v1 import federation_pb2
from hub.decide import agentrelay
from hub.decide.records import KIND_DEVICE, dumps
from hub.decide.regionslice import (
    MAX_AGENT_FAILED,
    MAX_AGENT_RELEASES,
    MAX_CONFIG_SHOWN,
    MAX_FAILING,
    MAX_LABELS,
    MAX_NAME,
    MAX_PHASES,
    MAX_REPORT_AGENT_UPGRADES,
    MAX_REPORT_DEPLOYMENTS,
    MAX_REPORT_DEVICES,
    MAX_REVISION_FIGURES,
    MAX_TEXT,
    MAX_VALIDATION_PROBLEMS,
    MAX_VERSIONS,
    Slice,
)


def slice_message(s: Slice, generation: int) -> federation_pb2.RegionSlice:
    return federation_pb2.RegionSlice(
        generation=generation,
        objects=[dumps(o) for o in s.objects],
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
        agent_release_versions=list(s.agent_versions),
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
        if d.HasField("config"):
            _check_config(problems, f"{path}.config", d.config)
    _check_agent_upgrades(problems, report)
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


AGENT_UPGRADE_PHASES = ("Pending", "Progressing", "Paused", "Complete", "RolledBack")


def _check_agent_upgrades(problems: list[str], report: federation_pb2.RegionReport) -> None:
    """A region's AgentUpgrades: bounded in count and text, counts within the region's own
    inventory and each upgrade's pool (a region speaks only of its own devices)."""
    if len(report.agent_upgrades) > MAX_REPORT_AGENT_UPGRADES:
        problems.append(
            f"report.agent_upgrades: at most {MAX_REPORT_AGENT_UPGRADES}, "
            f"got {len(report.agent_upgrades)}"
        )
    seen: set[str] = set()
    total = report.inventory.total
    for i, u in enumerate(report.agent_upgrades[:MAX_REPORT_AGENT_UPGRADES]):
        path = f"report.agent_upgrades[{i}]"
        _text(problems, f"{path}.name", u.name)
        if u.name in seen:
            problems.append(f"{path}.name: {u.name!r} twice")
        seen.add(u.name)
        _text(problems, f"{path}.version", u.version, 128)
        if u.phase not in AGENT_UPGRADE_PHASES:
            problems.append(
                f"{path}.phase: must be one of {', '.join(AGENT_UPGRADE_PHASES)}, "
                f"got {u.phase[:64]!r}"
            )
        _text(problems, f"{path}.reason", u.reason, 64)
        _text(problems, f"{path}.message", u.message, MAX_TEXT)
        if u.pool > total:
            problems.append(f"{path}.pool: more than the region's devices ({total})")
        if u.done + u.updating > u.pool:
            problems.append(f"{path}: done and updating must not exceed pool ({u.pool})")
        if u.failed_count > total:
            problems.append(f"{path}.failed_count: more than the region's devices ({total})")
        if len(u.failed) > min(MAX_AGENT_FAILED, u.failed_count):
            problems.append(
                f"{path}.failed: at most {MAX_AGENT_FAILED} and failed_count "
                f"({u.failed_count}), got {len(u.failed)}"
            )
        for device, reason in list(u.failed.items())[:MAX_AGENT_FAILED]:
            _text(problems, f"{path}.failed", device)
            _text(problems, f"{path}.failed[{device[:64]!r}]", reason, MAX_TEXT)
    if len(report.agent_release_versions) > MAX_AGENT_RELEASES:
        problems.append(
            f"report.agent_release_versions: at most {MAX_AGENT_RELEASES}, "
            f"got {len(report.agent_release_versions)}"
        )
    for version in report.agent_release_versions[:MAX_AGENT_RELEASES]:
        _text(problems, "report.agent_release_versions", version, 128)
    refusals = report.agent_release_refusals
    if len(refusals) > agentrelay.MAX_REFUSALS:
        problems.append(
            f"report.agent_release_refusals: at most {agentrelay.MAX_REFUSALS}, got {len(refusals)}"
        )
    for version, why in list(refusals.items())[: agentrelay.MAX_REFUSALS]:
        _text(problems, "report.agent_release_refusals", version, 128)
        _text(
            problems,
            f"report.agent_release_refusals[{version[:64]!r}]",
            why,
            agentrelay.MAX_REFUSAL_TEXT,
        )


def _check_config(problems: list[str], path: str, c: federation_pb2.RegionConfigStatus) -> None:
    _text(problems, f"{path}.model_config", c.model_config, MAX_TEXT)
    if c.running_desired > c.devices or c.not_running_devices > c.devices:
        problems.append(f"{path}: running_desired and not_running_devices must not exceed "
                        f"devices ({c.devices})")  # fmt: skip
    if len(c.not_running) > min(MAX_CONFIG_SHOWN, c.not_running_devices):
        problems.append(f"{path}.not_running: at most {MAX_CONFIG_SHOWN} and not_running_devices "
                        f"({c.not_running_devices}), got {len(c.not_running)}")  # fmt: skip
    for device, why in list(c.not_running.items())[:MAX_CONFIG_SHOWN]:
        _text(problems, f"{path}.not_running", device)
        _text(problems, f"{path}.not_running[{device[:64]!r}]", why, MAX_TEXT)


def region_config_json(c: federation_pb2.RegionConfigStatus) -> dict[str, Any]:
    """A region's ``status.config`` of a deployment as the root shows it."""
    out: dict[str, Any] = {
        "modelConfig": c.model_config,
        "devices": c.devices,
        "runningDesired": c.running_desired,
        "notRunningDesired": dict(sorted(c.not_running.items())),
    }
    if c.not_running_devices > len(c.not_running):
        out["notRunningDevices"] = c.not_running_devices
    return out


def region_agent_upgrade_json(u: federation_pb2.RegionAgentUpgradeStatus) -> dict[str, Any]:
    """A region's AgentUpgrade as the root shows it (what the region's report says)."""
    return {
        "version": u.version,
        "phase": u.phase,
        "revision": u.revision,
        **({"reason": u.reason} if u.reason else {}),
        **({"message": u.message} if u.message else {}),
        "poolDevices": u.pool,
        "doneDevices": u.done,
        "updatingDevices": u.updating,
        "failedCount": u.failed_count,
        "failedDevices": dict(sorted(u.failed.items())),
        **({"rootRevision": u.root_revision} if u.root_revision else {}),
    }


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
        **({"config": region_config_json(d.config)} if d.HasField("config") else {}),
    }


def region_device_json(region: str, dev: federation_pb2.RegionDevice) -> dict[str, Any]:
    """A device of a region as the root shows it (what the region's summary says of it)."""
    return {
        "apiVersion": "edgefleet.io/v1",
        "kind": KIND_DEVICE,
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
