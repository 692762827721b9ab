"""The hub's in-memory cache of its store: everything it knows, loaded at start, written through.

The hub is its store's only writer, so it never reads the store on a hot path (the design:
docs/hub.md). Every write-through goes by a method here that tells the
change feed (:attr:`Cache.feed`, :mod:`hub.state.feed`) the key it changed: the controllers
that watch it queue that key.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edgefleet.api import ModelDeployment, parse_manifest
from hub.decide import fleetview
from hub.decide.agentreleases import AGENT_RELEASES, AgentReleaseRecord
from hub.decide.agentrevisions import AGENT_UPGRADES, AgentUpgradeState
from hub.decide.analysis import TimelineSample
from hub.decide.devices import Device
from hub.decide.placement import SecurityPolicy
from hub.decide.records import StoredObject
from hub.decide.rollout import Revision, RolloutState
from hub.decide.schedule import Explanation
from hub.state import feed as kinds
from hub.state import storekeys
from hub.state.desiredrecords import DesiredRecords
from hub.state.feed import ChangeFeed
from hub.state.secrets import SecretRecord, record_of
from hub.state.store import Store

__all__ = ["StoredObject"]  # plain data the deciders read too (hub.decide.records)

MAX_EVENTS = 1000


class EventLog(deque[dict[str, Any]]):
    """The newest events, oldest first, that tells listeners of each one appended (the
    dashboard's live stream: the hub's own events as they happen, not the store polled).
    ``appended`` counts every event ever appended: a listener's position."""

    def __init__(self, maxlen: int = MAX_EVENTS) -> None:
        super().__init__(maxlen=maxlen)
        self.appended = 0
        self.listeners: set[Callable[[], None]] = set()

    def append(self, event: dict[str, Any]) -> None:
        super().append(event)
        self.appended += 1
        for listener in list(self.listeners):
            listener()

    def since(self, position: int) -> list[dict[str, Any]]:
        """The events appended after ``position`` (of :attr:`appended`) still held."""
        missed = min(self.appended - position, len(self))
        return list(self)[len(self) - missed :] if missed > 0 else []


@dataclass(slots=True)
class Cache:
    """Everything the hub knows, as last written to the store."""

    devices: dict[str, Device] = field(default_factory=dict)
    stored: dict[tuple[str, str], StoredObject] = field(default_factory=dict)
    deployments: dict[str, ModelDeployment] = field(default_factory=dict)
    models: dict[tuple[str, str], storekeys.ModelRecord] = field(default_factory=dict)
    # device -> its desired record, indexed by deployment (DesiredRecords.holding)
    desired: DesiredRecords = field(default_factory=DesiredRecords)
    revoked: dict[str, str] = field(default_factory=dict)  # serial hex -> device name
    # The fleet's trust roots the hub carries, oldest first, as signed (hub.state.trustroots).
    trust_roots: tuple[bytes, ...] = ()

    revisions: dict[str, dict[int, Revision]] = field(default_factory=dict)  # by deployment
    rollouts: dict[str, RolloutState] = field(default_factory=dict)  # by deployment
    rollout_revisions: dict[str, int] = field(default_factory=dict)  # their store mod revisions
    # each deployment's canary analysis over time: sequence number -> sample, oldest first
    analysis: dict[str, dict[int, TimelineSample]] = field(default_factory=dict)
    events: EventLog = field(default_factory=EventLog)
    # replicas.total deployment -> the devices the scheduler placed it on
    # (hub.controllers.placement)
    placements: dict[str, frozenset[str]] = field(default_factory=dict)
    # and the devices sent it now (hub.decide.moves): placements started, and those it is moving
    # off that serve until their replacements are ready; by deployment
    sent_placements: dict[str, frozenset[str]] = field(default_factory=dict)
    draining: dict[str, frozenset[str]] = field(default_factory=dict)  # only while moving
    waiting: dict[str, frozenset[str]] = field(default_factory=dict)  # held back by maxSurge
    # and why, from the scheduler's last pass (not stored: computed again after a restart)
    explanations: dict[str, Explanation] = field(default_factory=dict)
    # replicas.total deployment -> the total the fleet autoscaler placed instead of the
    # spec's (hub.controllers.fleetautoscaler; in memory: a restart starts from the spec's)
    scaled_totals: dict[str, int] = field(default_factory=dict)
    # Secret name -> its values sealed with the hub's key (hub.state.secrets), never in the clear
    secrets: dict[str, SecretRecord] = field(default_factory=dict)
    # AgentUpgrade rollouts (hub.controllers.agentupgrade) by upgrade, their store mod
    # revisions, and the edged releases the hub holds by key (hub.decide.agentreleases)
    agent_upgrades: dict[str, AgentUpgradeState] = field(default_factory=dict)
    agent_upgrade_revisions: dict[str, int] = field(default_factory=dict)
    agent_releases: dict[str, AgentReleaseRecord] = field(default_factory=dict)
    # told of every key written through (hub.state.feed): the controllers' watches
    feed: ChangeFeed = field(default_factory=ChangeFeed)
    # the store revision the devices were loaded at (hub.controllers.replicas.reload_cache)
    devices_revision: int = 0
    # hub replicas: each device's last message at any replica, from their heartbeat records
    # (hub.controllers.replicas.ReplicaDevices; not in the device records, kept by a reload)
    heard: dict[str, float] = field(default_factory=dict)
    # hub replicas: the newest generation each device acknowledged at any replica, from the
    # same records (acknowledgements do not rewrite the device records there either)
    acked: dict[str, int] = field(default_factory=dict)

    @classmethod
    async def load(cls, store: Store) -> Cache:
        cache = cls()
        listed = await store.range(storekeys.DEVICES)
        cache.devices_revision = listed.revision
        for kv in listed.kvs:
            device = Device.from_json(storekeys.loads(kv.value))
            cache.devices[device.name] = device
        for kv in (await store.range(storekeys.OBJECTS)).kvs:
            manifest = storekeys.manifest_of(kv.value)
            secret = record_of(storekeys.loads(kv.value), manifest["metadata"]["name"])
            cache.put_object(manifest, kv.mod_revision, secret=secret)
        for kv in (await store.range(storekeys.MODELS)).kvs:
            model = storekeys.ModelRecord.from_json(storekeys.loads(kv.value))
            cache.models[(model.name, model.version)] = model
        for kv in (await store.range(storekeys.DESIRED)).kvs:
            name = kv.key[len(storekeys.DESIRED) :]
            cache.desired[name] = storekeys.DesiredRecord.from_json(storekeys.loads(kv.value))
        for kv in (await store.range(storekeys.REVISIONS)).kvs:
            rev = Revision.from_json(storekeys.loads(kv.value))
            cache.revisions.setdefault(rev.deployment, {})[rev.number] = rev
        for kv in (await store.range(storekeys.ROLLOUTS)).kvs:
            state = RolloutState.from_json(storekeys.loads(kv.value))
            cache.rollouts[state.deployment] = state
            cache.rollout_revisions[state.deployment] = kv.mod_revision
        for kv in (await store.range(storekeys.ANALYSIS)).kvs:
            cache.put_analysis(kv.key, storekeys.loads(kv.value))
        for kv in (await store.range(storekeys.PLACEMENTS)).kvs:
            doc = storekeys.loads(kv.value)
            cache.set_placement(
                kv.key[len(storekeys.PLACEMENTS) :],
                frozenset(doc["devices"]),
                draining=frozenset(doc.get("draining", ())),
                waiting=frozenset(doc.get("waiting", ())),
            )
        for kv in (await store.range(AGENT_UPGRADES)).kvs:
            upgrade = AgentUpgradeState.from_json(storekeys.loads(kv.value))
            cache.agent_upgrades[upgrade.upgrade] = upgrade
            cache.agent_upgrade_revisions[upgrade.upgrade] = kv.mod_revision
        for kv in (await store.range(AGENT_RELEASES)).kvs:
            release = AgentReleaseRecord.from_json(storekeys.loads(kv.value))
            cache.agent_releases[release.key] = release
        for kv in (await store.range(storekeys.REVOKED)).kvs:
            cache.revoked[kv.key[len(storekeys.REVOKED) :]] = kv.value.decode()
        for kv in (await store.range(storekeys.EVENTS)).kvs[-MAX_EVENTS:]:
            cache.events.append(storekeys.loads(kv.value))
        return cache

    def put_object(
        self, manifest: Mapping[str, Any], revision: int, *, secret: SecretRecord | None = None
    ) -> None:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        self.stored[(kind, name)] = StoredObject(kind, name, manifest, revision)
        if kind == "Secret" and secret is not None:
            self.secrets[name] = secret
        if kind == "ModelDeployment":
            dep = parse_manifest(dict(manifest))
            assert isinstance(dep, ModelDeployment)
            self.deployments[name] = dep
        self.feed.changed(kind, name)
        self.feed.changed(kinds.OBJECTS, f"{kind}/{name}")

    def set_placement(
        self,
        name: str,
        devices: frozenset[str],
        *,
        draining: frozenset[str] = frozenset(),
        waiting: frozenset[str] = frozenset(),
    ) -> None:
        """A ``replicas.total`` deployment's placements and its move (:mod:`hub.decide.moves`)."""
        self.placements[name] = devices
        self.sent_placements[name] = (devices - waiting) | draining
        for table, value in ((self.draining, draining), (self.waiting, waiting)):
            if value:
                table[name] = value
            else:
                table.pop(name, None)
        self.feed.changed(kinds.PLACEMENT, name)

    def set_scaled_totals(self, totals: Mapping[str, int]) -> None:
        """The fleet autoscaler's totals now; the feed is told each deployment whose total
        changed, came or went (:data:`kinds.SCALED`: the scheduler places it again)."""
        before, self.scaled_totals = self.scaled_totals, dict(totals)
        for name in sorted(set(before) | set(totals)):
            if before.get(name) != totals.get(name):
                self.feed.changed(kinds.SCALED, name)

    def drop_placement(self, name: str) -> None:
        for table in (self.placements, self.sent_placements, self.draining, self.waiting):
            table.pop(name, None)
        self.feed.changed(kinds.PLACEMENT, name)

    def put_analysis(self, key: str, doc: Mapping[str, Any]) -> None:
        """A sample of ``/analysis/NAME/SEQ`` (keys come in order: a ring, oldest first)."""
        deployment, _, seq = key[len(storekeys.ANALYSIS) :].rpartition("/")
        if seq.isdigit():
            samples = self.analysis.setdefault(deployment, {})
            samples[int(seq)] = TimelineSample.from_json(doc)

    def drop_analysis(self, key: str) -> None:
        deployment, _, seq = key[len(storekeys.ANALYSIS) :].rpartition("/")
        samples = self.analysis.get(deployment)
        if samples is not None and seq.isdigit():
            samples.pop(int(seq), None)
            if not samples:
                del self.analysis[deployment]

    def drop_object(self, kind: str, name: str) -> None:
        self.stored.pop((kind, name), None)
        if kind == "Secret":
            self.secrets.pop(name, None)
        if kind == "ModelDeployment":
            self.deployments.pop(name, None)
        self.feed.changed(kind, name)
        self.feed.changed(kinds.OBJECTS, f"{kind}/{name}")

    # -- device records, desired records, models, rollouts: written through, told -----------
    def put_device(self, device: Device) -> None:
        self.devices[device.name] = device
        self.feed.changed(kinds.DEVICE, device.name)

    def drop_device(self, name: str) -> None:
        """A device deleted: its record and its desired record."""
        self.devices.pop(name, None)
        self.desired.pop(name, None)
        self.feed.changed(kinds.DEVICE, name)

    def put_desired(self, records: Mapping[str, storekeys.DesiredRecord]) -> None:
        """Desired records written (the projector); the feed is told each device's, and
        :attr:`kinds.ROLLOUT` of each deployment that a device gained, lost or got again (its
        rollout counts what its targeted devices report)."""
        touched: set[str] = set()
        for name, record in records.items():
            before = self.desired.get(name)
            self.desired[name] = record
            touched.update(record.deployments)
            if before is not None:
                touched.update(before.deployments)
            self.feed.changed(kinds.DESIRED, name)
        for deployment in sorted(touched):
            self.feed.changed(kinds.DESIRED_OF, deployment)

    def put_model(self, record: storekeys.ModelRecord) -> None:
        self.models[(record.name, record.version)] = record
        self.feed.changed(kinds.MODEL, record.name)

    def drop_model(self, name: str, version: str) -> storekeys.ModelRecord | None:
        gone = self.models.pop((name, version), None)
        self.feed.changed(kinds.MODEL, name)
        return gone

    def put_rollout(
        self,
        name: str,
        state: RolloutState | None,
        mod_revision: int = 0,
        *,
        revisions: Mapping[int, Revision] | None = None,
    ) -> None:
        """``name``'s rollout state as written at ``mod_revision`` (None: none) and, when
        given, its revisions."""
        if state is None:
            self.rollouts.pop(name, None)
            self.rollout_revisions.pop(name, None)
        else:
            self.rollouts[name] = state
            self.rollout_revisions[name] = mod_revision
        if revisions is not None:
            if revisions:
                self.revisions[name] = dict(revisions)
            else:
                self.revisions.pop(name, None)
        self.feed.changed(kinds.ROLLOUT, name)

    @property
    def trust_root(self) -> bytes:
        """The fleet trust root as signed (D/trust-root.json), if any: the newest held."""
        return self.trust_roots[-1] if self.trust_roots else b""

    def set_trust_roots(self, roots: tuple[bytes, ...]) -> None:
        self.trust_roots = roots
        self.trust_changed()

    def trust_changed(self) -> None:
        """The fleet's trust roots or TUF metadata changed (held beside the cache: D/tuf/)."""
        self.feed.changed(kinds.TRUST, "")

    def targeted(self, deployment: str) -> list[str]:
        """The devices the projector placed ``deployment`` on (their desired records hold
        it), by name; from the index, in proportion to those devices."""
        return sorted(self.desired.holding(deployment))

    def revision_for(self, deployment: str, device: str) -> Revision | None:
        """The revision of ``deployment`` that ``device`` is sent (None: none made yet)."""
        return fleetview.revision_of(self.rollouts, self.revisions, deployment, device)

    def objects_of(self, kind: str) -> list[StoredObject]:
        return fleetview.objects_of(self.stored, kind)

    def tpm_secrets(self) -> frozenset[str]:
        """The names of the Secrets with ``spec.requireTpm`` (sent only to TPM-attested
        devices: hub.decide.desired.secret_refs)."""
        return fleetview.tpm_secrets_of(self.stored)

    def security_policy(self) -> SecurityPolicy:
        """Every SecurityBaseline applies fleet-wide; any one requiring attestation wins."""
        return fleetview.security_policy_of(self.stored)
