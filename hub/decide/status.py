"""A deployment's status from what devices report: pure, tested as tables.

Per device the hub reads the *revisions* the device holds for the workload (version, digest,
phase, ready replicas, reason), never the version it was asked for, so that nothing is claimed
that did not happen:

* *desired*: devices placement gives the deployment;
* *updated*: devices where the wanted revision (the deployment's version, and the pushed
  artifact's digest when the device reports one) **serves** (phase Ready, a replica ready);
* *ready*: updated devices where every replica of the wanted revision is ready;
* *available*: connected devices that serve the deployment with the wanted revision, or that
  are switching to it (it is not reported yet, or Pending, Downloading, Verifying or Loading)
  while an older revision keeps serving: edged switches without downtime, so a switch never
  makes a device unavailable and the count never drops during one. A device whose wanted
  revision was Refused or Failed is *not* available (it serves what the deployment no longer
  asks for) and is listed as failing with its reason.

``versions`` counts, per version, the devices where that version serves. Conditions:
``Available``, ``Progressing`` (``RevisionFailed`` when the wanted version failed or was
refused somewhere), and the guard rails of an apply: ``ModelPushed`` (the version was never
pushed) and ``Placed`` (the placement matches no device); ``SecretsDelivered`` False names the
devices a Secret-mounting deployment's placement matches only through labels they chose
(:mod:`hub.decide.labeltrust`: not sent there).

``terminations`` holds, per device, the last time a replica's worker ended there without edged
asking (``OOMKilled``, ``Error``...; Kubernetes' ``lastState.terminated``) and the replicas'
restarts: a device that was OOM-killed once and serves again is not failing, but an operator
still reads why it restarted. :func:`new_terminations` gives one event per new termination.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from edgefleet.api import ModelDeployment
from edgefleet.api.conditions import Condition, ConditionStatus
from hub.decide.devices import (
    Device,
    DevicePhase,
    RevisionPhase,
    RevisionReport,
    Termination,
    WorkloadReport,
)
from hub.decide.labeltrust import secrets_withheld, withheld_message
from hub.decide.nodes import Explanation
from hub.decide.placement import labels_mismatch

SWITCHING = frozenset(
    {
        RevisionPhase.PENDING,
        RevisionPhase.DOWNLOADING,
        RevisionPhase.VERIFYING,
        RevisionPhase.LOADING,
    }
)
BROKEN = frozenset({RevisionPhase.REFUSED, RevisionPhase.FAILED})
# devices whose last termination a deployment's status lists (the newest): a fleet-wide OOM
# must not make one deployment's status megabytes; ``terminatedDevices`` counts them all
MAX_TERMINATIONS_SHOWN = 32


@dataclass(frozen=True, slots=True)
class VersionCounts:
    devices: int = 0
    ready: int = 0

    def to_json(self) -> dict[str, int]:
        return {"devices": self.devices, "ready": self.ready}


@dataclass(frozen=True, slots=True)
class DeploymentStatus:
    desired: int
    updated: int
    ready: int
    available: int
    versions: Mapping[str, VersionCounts] = field(default_factory=dict)
    conditions: tuple[Condition, ...] = ()
    failing: Mapping[str, str] = field(default_factory=dict)  # device -> reason
    # device -> its last termination of the deployment's workload, with restartCount (the
    # newest MAX_TERMINATIONS_SHOWN), and how many devices have one
    terminations: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    terminated: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "desiredDevices": self.desired,
            "updatedDevices": self.updated,
            "readyDevices": self.ready,
            "availableDevices": self.available,
            "versions": {v: c.to_json() for v, c in sorted(self.versions.items())},
            "conditions": [c.to_json() for c in self.conditions],
            "failing": dict(sorted(self.failing.items())),
            **(
                {
                    "terminations": dict(sorted(self.terminations.items())),
                    "terminatedDevices": self.terminated,
                }
                if self.terminations
                else {}
            ),
        }


def revisions_of(report: WorkloadReport) -> tuple[RevisionReport, ...]:
    """The revisions a report holds; a device too old to list them gets one from its summary
    (its ready count may include the old revision: the best such a device can say)."""
    if report.revisions:
        return report.revisions
    if not report.model_version:
        return ()
    phase = RevisionPhase.READY if report.ready_replicas > 0 else RevisionPhase.LOADING
    return (
        RevisionReport(
            report.model_version, "", phase, report.ready_replicas, report.revision, wanted=True
        ),
    )


def wanted_revision(
    revisions: Iterable[RevisionReport], version: str, sha256: str | None
) -> RevisionReport | None:
    """The revision of ``version`` (and ``sha256`` when known on both sides), the one the
    device calls wanted first."""
    matches = [
        r
        for r in revisions
        if r.model_version == version and (not sha256 or not r.sha256 or r.sha256 == sha256)
    ]
    matches.sort(key=lambda r: not r.wanted)
    return matches[0] if matches else None


def describe_failure(rev: RevisionReport) -> str:
    detail = rev.reason or rev.phase.value
    if rev.message:
        detail += f": {rev.message}"
    return f"{rev.model_version} {rev.phase.value}: {detail}"


def deployment_status(
    dep: ModelDeployment,
    devices: Iterable[Device],
    assigned: Mapping[str, Iterable[str]],
    *,
    model_sha256: str | None = None,
    model_pushed: bool | None = None,
    placeable: int | None = None,
    assigned_models: Mapping[str, tuple[str, str | None]] | None = None,
    scheduled: Explanation | None = None,
    withheld: Mapping[str, str] | None = None,
) -> DeploymentStatus:
    """Status of ``dep`` from device reports; ``assigned`` maps device name -> deployments.

    ``model_sha256``: the pushed artifact's digest (None: unknown); ``model_pushed``: whether
    the version was pushed (None: not checked); ``placeable``: how many devices the placement
    matches (:func:`count_placeable`; None: not checked), for the ``Placed`` condition;
    ``assigned_models``: per device, the (version, sha256) of the revision its rollout sends
    it (the stable one until the device is given the new one; default: the deployment's).
    ``scheduled``: the scheduler's explanation of a ``replicas.total`` deployment, shown as
    the ``Scheduled`` condition. ``withheld``: per device, why the deployment's Secret is not
    sent there (:func:`hub.decide.labeltrust.secrets_withheld`), the ``SecretsDelivered`` condition.
    *updated* counts the deployment's own version; *available* and *failing* what each
    device is sent.
    """
    name = dep.metadata.name
    want = dep.spec.model.version
    desired = updated = ready = available = 0
    versions: dict[str, list[int]] = {}
    failing: dict[str, str] = {}
    ended: list[tuple[str, WorkloadReport]] = []
    for device in devices:
        if name not in set(assigned.get(device.name, ())):
            continue
        desired += 1
        report = device.workloads.get(name)
        if report is None:
            continue
        if report.last_termination is not None:
            ended.append((device.name, report))
        revisions = revisions_of(report)
        per_device = report.desired_replicas
        for r in revisions:
            if r.serves:
                counts = versions.setdefault(r.model_version, [0, 0])
                counts[0] += 1
                counts[1] += int(per_device > 0 and r.ready_replicas >= per_device)
        current = wanted_revision(revisions, want, model_sha256)
        if current is not None and current.serves:
            updated += 1
            if per_device > 0 and current.ready_replicas >= per_device:
                ready += 1
        version, sha = (assigned_models or {}).get(device.name, (want, model_sha256))
        rev = wanted_revision(revisions, version, sha)
        connected = device.phase is DevicePhase.READY
        if rev is not None and rev.serves:
            available += int(connected)
        elif rev is not None and rev.phase in BROKEN:
            failing[device.name] = describe_failure(rev)
        elif rev is None or rev.phase in SWITCHING:
            # not started on the wanted revision yet, or on the way: what serves meanwhile
            others = any(r.serves for r in revisions if r is not rev)
            available += int(connected and others)
        if device.name not in failing and not report.revisions:
            for cond in report.conditions:  # a device too old to list revisions
                if cond.get("status") == "False" and cond.get("type") in ("Ready", "Available"):
                    failing[device.name] = cond.get("reason", "") + (
                        f": {cond['message']}" if cond.get("message") else ""
                    )
    return DeploymentStatus(
        desired,
        updated,
        ready,
        available,
        {v: VersionCounts(c[0], c[1]) for v, c in versions.items()},
        (
            *_conditions(want, desired, updated, available, failing, model_pushed, placeable, dep),
            *_scheduled(scheduled),
            *_withheld(withheld),
        ),
        failing,
        _newest_terminations(ended),
        len(ended),
    )


def _newest_terminations(
    ended: list[tuple[str, WorkloadReport]],
) -> dict[str, Mapping[str, Any]]:
    def newest(item: tuple[str, WorkloadReport]) -> tuple[float, str]:
        last = item[1].last_termination
        return (-(last.finished_at or 0.0) if last is not None else 0.0, item[0])

    return {
        device: {
            "lastTermination": report.last_termination.to_json(),
            "restartCount": report.restart_count,
        }
        for device, report in sorted(ended, key=newest)[:MAX_TERMINATIONS_SHOWN]
        if report.last_termination is not None
    }


def _scheduled(explanation: Explanation | None) -> tuple[Condition, ...]:
    if explanation is None:
        return ()
    complete = explanation.complete
    return (
        Condition(
            "Scheduled",
            ConditionStatus.of(complete),
            "AllReplicasPlaced" if complete else "Unschedulable",
            explanation.message(),
        ),
    )


def _withheld(withheld: Mapping[str, str] | None) -> tuple[Condition, ...]:
    if not withheld:
        return ()
    message = withheld_message(withheld)
    return (Condition("SecretsDelivered", ConditionStatus.FALSE, "DeviceChosenLabels", message),)


def _conditions(
    want: str,
    desired: int,
    updated: int,
    available: int,
    failing: Mapping[str, str],
    model_pushed: bool | None,
    placeable: int | None,
    dep: ModelDeployment,
) -> tuple[Condition, ...]:
    if desired == 0:
        avail = Condition("Available", ConditionStatus.FALSE, "NoDevices", "no device is placed")
    else:
        avail = Condition(
            "Available",
            ConditionStatus.of(available == desired),
            "AllDevicesAvailable" if available == desired else "DevicesUnavailable",
            f"{available} of {desired} devices available",
        )
    if failing:
        first = ", ".join(f"{d} ({r})" for d, r in sorted(failing.items())[:3])
        more = f" and {len(failing) - 3} more" if len(failing) > 3 else ""
        progressing = Condition(
            "Progressing",
            ConditionStatus.FALSE,
            "RevisionFailed",
            f"version {want} failed or was refused on {len(failing)} of {desired} devices: "
            f"{first}{more}",
        )
    elif desired == 0:
        progressing = Condition("Progressing", ConditionStatus.FALSE, "NoDevices", "nothing to do")
    elif updated == desired:
        progressing = Condition(
            "Progressing",
            ConditionStatus.FALSE,
            "RolloutComplete",
            f"{updated} of {desired} devices serve version {want}",
        )
    else:
        progressing = Condition(
            "Progressing",
            ConditionStatus.TRUE,
            "RollingOut",
            f"{updated} of {desired} devices serve version {want}",
        )
    out = [avail, progressing]
    model = dep.spec.model
    if model_pushed is False:
        out.append(
            Condition(
                "ModelPushed",
                ConditionStatus.FALSE,
                "ModelNotPushed",
                f"model {model.name} version {model.version} has not been pushed "
                "(edgectl models push); no device can run it",
            )
        )
    if placeable == 0:
        out.append(Condition("Placed", ConditionStatus.FALSE, "NoMatchingDevices", _no_match(dep)))
    return tuple(out)


def count_placeable(dep: ModelDeployment, devices: Iterable[Device], region: str) -> int:
    """Devices whose labels and region the placement matches, whatever their taints (a
    cordoned or unhealthy device may come back; a selector that matches nobody will not)."""
    return sum(1 for d in devices if labels_mismatch(dep, d.all_labels(), region) is None)


def placement_warnings(
    dep: ModelDeployment, devices: Iterable[Device], region: str, pushed: bool
) -> list[str]:
    """What an apply of ``dep`` says at once when it is accepted but cannot run anywhere."""
    out = []
    model = dep.spec.model
    if not pushed:
        out.append(
            f"model {model.name} version {model.version} has not been pushed: no device runs "
            "this deployment until it is (edgectl models push)"
        )
    devices = list(devices)
    if count_placeable(dep, devices, region) == 0:
        out.append(_no_match(dep))
    withheld = secrets_withheld(dep, devices, region)
    if withheld:
        out.append(withheld_message(withheld))
    return out


def _no_match(dep: ModelDeployment) -> str:
    placement = dep.spec.placement
    parts = []
    if placement.node_selector:
        sel = ",".join(f"{k}={v}" for k, v in sorted(placement.node_selector.items()))
        parts.append(f"nodeSelector {sel}")
    if placement.regions:
        parts.append(f"regions {','.join(placement.regions)}")
    what = " and ".join(parts) or "the placement"
    return f"{what} matches no device of this hub: the deployment runs nowhere"


def broken_revisions(
    before: Mapping[str, WorkloadReport], after: Mapping[str, WorkloadReport]
) -> list[tuple[str, RevisionReport]]:
    """(workload, revision) for each revision a device newly reports Refused or Failed: one
    event each, not one per status message."""
    out = []
    for name, report in sorted(after.items()):
        old = before.get(name)
        seen = {
            (r.model_version, r.sha256, r.phase, r.reason)
            for r in (old.revisions if old is not None else ())
        }
        for r in report.revisions:
            if r.phase in BROKEN and (r.model_version, r.sha256, r.phase, r.reason) not in seen:
                out.append((name, r))
    return out


def bound_termination_times(
    before: Mapping[str, WorkloadReport], after: Mapping[str, WorkloadReport], now: float
) -> dict[str, WorkloadReport]:
    """``after`` (a device's new reports) with each termination it says ended later than
    ``now`` (the hub's clock when the report came) held at ``now``, the device's time kept as
    ``reported_finished_at``: a device's clock is its own (stepped, or lying), and its times
    must not order the fleet's (a deployment's status lists the newest terminations first, a
    few of them: one in the future would hide the others for good). The same end reported
    again keeps the time the hub first gave it, so it is not a new termination. Pure."""
    out = dict(after)
    for name, report in after.items():
        ended = report.last_termination
        if ended is None or ended.finished_at is None or ended.finished_at <= now:
            continue
        old = before.get(name)
        kept = old.last_termination if old is not None else None
        if kept is None or not kept.same_end(ended):
            kept = replace(ended, finished_at=now, reported_finished_at=ended.finished_at)
        out[name] = replace(report, last_termination=kept)
    return out


def new_terminations(
    before: Mapping[str, WorkloadReport], after: Mapping[str, WorkloadReport]
) -> list[tuple[str, Termination]]:
    """(workload, termination) for each termination a device reports that its previous report
    did not hold: one event each, not one per status message (the same replica ending at the
    same time is the same termination)."""
    out = []
    for name, report in sorted(after.items()):
        ended = report.last_termination
        old = before.get(name)
        if ended is not None and (old is None or old.last_termination != ended):
            out.append((name, ended))
    return out


def termination_message(ended: Termination) -> str:
    """``replica mlp-0 OOMKilled (signal 9): worker killed by ...``, an event's message."""
    how = f"signal {ended.signal}" if ended.signal else f"exit code {ended.exit_code}"
    text = f"replica {ended.replica} {ended.reason} ({how})"
    return text + (f": {ended.message}" if ended.message else "")
