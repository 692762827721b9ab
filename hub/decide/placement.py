"""Which deployments a device should run: pure functions of device records and manifests.

No I/O, no clock (``now`` is passed in): tested as tables in ``tests/hub/test_hub_placing.py``.
Kubernetes' taints and tolerations are the model. The hub derives taints from what it knows
about a device (:func:`taints_for`); a deployment runs on a device when its ``nodeSelector``
matches the device's labels, its ``regions`` include the hub's region, and it tolerates every
taint. ``NoSchedule`` taints (cordoned, not ready) keep *new* deployments off but let those
already assigned stay; ``NoExecute`` taints (unhealthy, untrusted under a baseline that
requires attestation, revoked) take everything off.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from edgefleet.api import ModelDeployment, TaintEffect, Toleration, TolerationOperator
from hub.decide.devices import Device, DevicePhase, Taint, TrustState
from hub.decide.staleness import silent_for

TAINT_UNSCHEDULABLE = "node.edgefleet.io/unschedulable"
TAINT_NOT_READY = "node.edgefleet.io/not-ready"
TAINT_UNHEALTHY = "node.edgefleet.io/unhealthy"
TAINT_UNTRUSTED = "node.edgefleet.io/untrusted"
TAINT_REVOKED = "node.edgefleet.io/revoked"
TPM_LABEL = "attestation.edgefleet.io/tpm"  # set by the hub on the scheduler's view only
REGION_LABEL = "topology.edgefleet.io/region"  # a device's region: the hub's unless labelled
ZONE_LABEL = "topology.edgefleet.io/zone"


@dataclass(frozen=True, slots=True)
class SecurityPolicy:
    """The fleet's ``SecurityBaseline`` as far as placement is concerned."""

    require_attestation: bool = False


def taints_for(device: Device, policy: SecurityPolicy) -> tuple[Taint, ...]:
    """The taints the hub puts on ``device`` from its state (pure)."""
    out: list[Taint] = []
    if device.revoked:
        out.append(Taint(TAINT_REVOKED, TaintEffect.NO_EXECUTE, reason="certificate revoked"))
    if device.cordoned:
        out.append(Taint(TAINT_UNSCHEDULABLE, TaintEffect.NO_SCHEDULE, reason="cordoned"))
    if device.phase is not DevicePhase.READY:
        out.append(
            Taint(TAINT_NOT_READY, TaintEffect.NO_SCHEDULE, reason=f"device is {device.phase}")
        )
    if not device.health.schedulable:
        why = "; ".join(device.health.reasons) or "device health policy not met"
        out.append(Taint(TAINT_UNHEALTHY, TaintEffect.NO_EXECUTE, reason=why))
    if policy.require_attestation and device.attestation.state is not TrustState.TRUSTED:
        why = "; ".join(device.attestation.reasons) or f"attestation {device.attestation.state}"
        out.append(Taint(TAINT_UNTRUSTED, TaintEffect.NO_EXECUTE, reason=why))
    return tuple(out)


def tpm_attested(device: Device) -> bool:
    """Whether ``device`` is TPM-attested: its attestation key is bound to its TPM's EK and
    its last evidence (a quote by that key) was trusted."""
    return bool(device.attestation_key_pem) and device.attestation.state is TrustState.TRUSTED


def tpm_mismatch(dep: ModelDeployment, device: Device) -> str | None:
    """``None`` unless ``placement.requireTpm`` keeps ``dep`` off ``device``; then why."""
    if not dep.spec.placement.require_tpm or tpm_attested(device):
        return None
    if not device.attestation_key_pem:
        return (
            "placement.requireTpm: the device is software-attested (no TPM attestation key "
            "bound to its endorsement key)"
        )
    why = "; ".join(device.attestation.reasons) or f"attestation {device.attestation.state}"
    return f"placement.requireTpm: the device's TPM attestation is not trusted ({why})"


def secret_tpm_mismatch(
    mounted: Iterable[str], tpm_secrets: Collection[str], device: Device
) -> str | None:
    """``None`` unless a Secret that ``mounted`` names requires a TPM (``spec.requireTpm``) and
    ``device`` is not TPM-attested; then why (the first such Secret by name)."""
    needing = sorted(set(mounted) & set(tpm_secrets))
    if not needing or (tpm_attested(device) and device.sealing_key_pem):
        return None
    what = f"secret {needing[0]} requires a TPM (spec.requireTpm)"
    if not device.attestation_key_pem:
        return (
            f"{what}: the device is software-attested (no TPM attestation key bound to its "
            "endorsement key), so the secret is never sent to it"
        )
    if not device.sealing_key_pem:
        return (
            f"{what}: the hub holds no TPM sealing key of this device (enrolled before "
            "sealing keys, or its key was refused: enroll it again)"
        )
    why = "; ".join(device.attestation.reasons) or f"attestation {device.attestation.state}"
    return f"{what}: the device's TPM attestation is not trusted ({why})"


def with_secret_tpm(dep: ModelDeployment, tpm_secrets: Collection[str]) -> ModelDeployment:
    """``dep`` as the scheduler should place it: a deployment mounting a Secret that requires
    a TPM is placed as one with ``placement.requireTpm`` (only on TPM-attested devices)."""
    if dep.spec.placement.require_tpm or not any(m.name in tpm_secrets for m in dep.spec.secrets):
        return dep
    placement = replace(dep.spec.placement, require_tpm=True)
    return replace(dep, spec=replace(dep.spec, placement=placement))


def tolerates(tolerations: Iterable[Toleration], taint: Taint) -> bool:
    """Kubernetes semantics: an empty key with Exists tolerates everything; no effect = any."""
    for t in tolerations:
        if t.effect is not None and t.effect.value != taint.effect.value:
            continue
        if t.operator is TolerationOperator.EXISTS:
            if t.key in ("", taint.key):
                return True
        elif t.key == taint.key and t.value == taint.value:
            return True
    return False


def selector_mismatch(selector: Mapping[str, str], labels: Mapping[str, str]) -> str | None:
    """``None`` when every selector label matches; otherwise the first mismatch, for a reason."""
    for key, want in sorted(selector.items()):
        have = labels.get(key)
        if have != want:
            got = "missing" if have is None else f"{have!r}"
            return f"nodeSelector {key}={want!r} does not match (device label {got})"
    return None


@dataclass(frozen=True, slots=True)
class Projection:
    """The deployments a device should run, and why each of the others does not."""

    names: tuple[str, ...]
    excluded: Mapping[str, str] = field(default_factory=dict)


def labels_mismatch(dep: ModelDeployment, labels: Mapping[str, str], region: str) -> str | None:
    """``None`` when ``labels`` satisfy the placement's regions, zones, ``nodeSelector`` and
    ``matchExpressions``; otherwise the first mismatch, for a reason. ``region``: the hub's,
    a device's unless it carries ``topology.edgefleet.io/region``."""
    placement = dep.spec.placement
    device_region = labels.get(REGION_LABEL, region)
    if placement.regions and device_region not in placement.regions:
        if REGION_LABEL in labels:
            return f"placement.regions does not include the device's region {device_region!r}"
        return f"placement.regions does not include this hub's region {region!r}"
    if placement.zones and labels.get(ZONE_LABEL) not in placement.zones:
        return f"placement.zones does not include the device's zone {labels.get(ZONE_LABEL)!r}"
    mismatch = selector_mismatch(placement.node_selector, labels)
    if mismatch is not None:
        return mismatch
    for req in placement.match_expressions:
        if not req.matches(labels):
            return f"matchExpressions {req.describe()} does not match"
    return None


def project(
    device: Device,
    deployments: Iterable[ModelDeployment],
    *,
    previous: frozenset[str],
    policy: SecurityPolicy,
    region: str = "",
    placed: Mapping[str, Collection[str]] | None = None,
) -> Projection:
    """Which of ``deployments`` ``device`` should run (pure).

    ``previous`` is what the device was last given: a deployment it already has survives
    NoSchedule taints (cordon, not ready), as a Kubernetes pod survives a cordon.
    ``placed``: the scheduler's placements of ``replicas.total`` deployments (by deployment,
    the devices), which decide those alone (:mod:`hub.decide.schedule`).
    """
    taints = taints_for(device, policy)
    labels = device.all_labels()
    names: list[str] = []
    excluded: dict[str, str] = {}
    for dep in sorted(deployments, key=lambda d: d.metadata.name):
        name = dep.metadata.name
        placement = dep.spec.placement
        if dep.spec.replicas.per_device is None:
            if device.name in (placed or {}).get(name, ()):
                names.append(name)
            else:
                excluded[name] = "replicas.total: the scheduler placed no replica here"
            continue
        if dep.spec.replicas.per_device == 0:
            excluded[name] = "replicas.perDevice is 0"
            continue
        mismatch = labels_mismatch(dep, labels, region) or tpm_mismatch(dep, device)
        if mismatch is not None:
            excluded[name] = mismatch
            continue
        blocking = [
            t
            for t in taints
            if not tolerates(placement.tolerations, t)
            and (t.effect is TaintEffect.NO_EXECUTE or name not in previous)
        ]
        if blocking:
            excluded[name] = "; ".join(f"taint {t.key} ({t.reason})" for t in blocking)
            continue
        names.append(name)
    return Projection(tuple(names), excluded)


def lifecycle_phase(
    device: Device, *, now: float, grace_s: float, observed_since: float | None = None
) -> tuple[DevicePhase, float]:
    """The phase ``device`` should be in at ``now``, and seconds until it could next change.

    ``observed_since``: when this hub began to observe devices (its start or election,
    :mod:`hub.decide.staleness`). A device Ready when the hub started stays Ready until it has been
    silent for ``grace_s`` since then: the hub's own downtime is not the device's silence. It
    never makes a NotReady device Ready (only a message does)."""
    if device.last_heartbeat is None:
        return DevicePhase.PENDING, grace_s
    silent = now - device.last_heartbeat
    if silent <= grace_s:
        return DevicePhase.READY, max(grace_s - silent, 0.0) + 0.001
    if device.phase is DevicePhase.READY:
        observed = silent_for(device.last_heartbeat, now, observed_since)
        if observed <= grace_s:  # not heard from since this hub's start, within the grace
            return DevicePhase.READY, max(grace_s - observed, 0.0) + 0.001
    return DevicePhase.NOT_READY, grace_s
