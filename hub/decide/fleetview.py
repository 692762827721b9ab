"""What the deciders read of the fleet: :class:`FleetView`, plain data (no store, no cache).

The state wing makes one from its cache (:func:`hub.state.snapshots.snapshot_of`) and passes
it to a decision: :mod:`hub.decide.desired` (a device's desired state),
:mod:`hub.decide.statebound` (the desired-state bound) and :mod:`hub.decide.undo` (the
devices' anti-rollback floor). A view holds the tables it was made from, not copies (a copy
per decision would cost as much as the fleet): it is valid for one decision, during which the
caller changes nothing; the deciders never change it.

The helpers below (:func:`objects_of`, :func:`tpm_secrets_of`, :func:`security_policy_of`,
:func:`revision_of`, :func:`placed_on`) are pure; the cache answers the same questions with
them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from edgefleet.api import ModelDeployment
from edgefleet.api.secrets import requires_tpm
from hub.decide.agentreleases import AgentReleaseRecord
from hub.decide.agentrevisions import AgentUpgradeState
from hub.decide.devices import Device
from hub.decide.placement import SecurityPolicy
from hub.decide.records import DesiredRecord, ModelRecord, StoredObject
from hub.decide.revisions import Revision, RolloutState


class SecretVersion(Protocol):
    """What the deciders read of a Secret the hub keeps: its version (never its values)."""

    @property
    def version(self) -> int: ...


@dataclass(frozen=True, slots=True)
class FleetView:
    """The fleet as one decision reads it: devices, operator objects, pushed models, desired
    records, revisions and rollouts, placements, Secrets' versions, trust roots."""

    devices: Mapping[str, Device] = field(default_factory=dict)
    stored: Mapping[tuple[str, str], StoredObject] = field(default_factory=dict)  # (kind, name)
    deployments: Mapping[str, ModelDeployment] = field(default_factory=dict)
    models: Mapping[tuple[str, str], ModelRecord] = field(default_factory=dict)
    desired: Mapping[str, DesiredRecord] = field(default_factory=dict)  # by device
    trust_roots: tuple[bytes, ...] = ()
    revisions: Mapping[str, Mapping[int, Revision]] = field(default_factory=dict)
    rollouts: Mapping[str, RolloutState] = field(default_factory=dict)  # by deployment
    # replicas.total deployment -> the devices sent it now (hub.decide.moves)
    sent_placements: Mapping[str, frozenset[str]] = field(default_factory=dict)
    secrets: Mapping[str, SecretVersion] = field(default_factory=dict)  # by name
    # AgentUpgrade rollouts by upgrade, and the edged releases held by key (issue 32)
    agent_upgrades: Mapping[str, AgentUpgradeState] = field(default_factory=dict)
    agent_releases: Mapping[str, AgentReleaseRecord] = field(default_factory=dict)

    def revision_for(self, deployment: str, device: str) -> Revision | None:
        """The revision of ``deployment`` that ``device`` is sent (None: none made yet)."""
        return revision_of(self.rollouts, self.revisions, deployment, device)

    def objects_of(self, kind: str) -> list[StoredObject]:
        return objects_of(self.stored, kind)

    def tpm_secrets(self) -> frozenset[str]:
        return tpm_secrets_of(self.stored)

    def security_policy(self) -> SecurityPolicy:
        return security_policy_of(self.stored)

    def placed_on(self, deployment: str) -> list[str]:
        return placed_on(self.desired, deployment)


def revision_of(
    rollouts: Mapping[str, RolloutState],
    revisions: Mapping[str, Mapping[int, Revision]],
    deployment: str,
    device: str,
) -> Revision | None:
    """The revision of ``deployment`` that its rollout sends ``device`` (None: none made yet)."""
    state = rollouts.get(deployment)
    if state is None:
        return None
    return revisions.get(deployment, {}).get(state.revision_for(device))


def objects_of(stored: Mapping[tuple[str, str], StoredObject], kind: str) -> list[StoredObject]:
    """The stored objects of ``kind``, by name."""
    return sorted((o for (k, _), o in stored.items() if k == kind), key=lambda o: o.name)


def tpm_secrets_of(stored: Mapping[tuple[str, str], StoredObject]) -> frozenset[str]:
    """The names of the Secrets with ``spec.requireTpm`` (sent only to TPM-attested
    devices: :func:`hub.decide.desired.secret_refs`)."""
    return frozenset(o.name for o in objects_of(stored, "Secret") if requires_tpm(o.manifest))


def security_policy_of(stored: Mapping[tuple[str, str], StoredObject]) -> SecurityPolicy:
    """Every SecurityBaseline applies fleet-wide; any one requiring attestation wins."""
    spec = [o.manifest.get("spec", {}) for o in objects_of(stored, "SecurityBaseline")]
    tpm = any(bool(s.get("requireTpm") or s.get("requireMeasurementPcr")) for s in spec)
    require = tpm or any(bool(s.get("requireAttestation")) for s in spec)
    return SecurityPolicy(require_attestation=require)


def placed_on(desired: Mapping[str, DesiredRecord], deployment: str) -> list[str]:
    """The devices the projector placed ``deployment`` on (their desired records name it),
    by name."""
    return sorted(n for n, rec in desired.items() if deployment in rec.deployments)
