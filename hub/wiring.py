"""The hub's wiring: :func:`build_context` loads a data directory into the hub's parts
(:class:`HubParts`: config, CA, store, cache, writer, projector, sessions, the controllers),
and one function per service or controller constructs it from them with exactly what it uses
(:func:`device_servicer`, :func:`attestation_controller`, :func:`parent_link`...).

:mod:`hub.server` runs what is wired here (the gRPC server, the supervised components).
Nothing below this module sees :class:`HubParts`: services, controllers and state take their
dependencies in their constructors (issue 30), and callbacks are constructor arguments too.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from edgefleet.artifacts.storing import ArtifactStore
from edgefleet.errors import HubDirError
from edgefleet.logs import get_logger
from hub import pki
from hub.api.admin import AdminAuth, AdminServicer
from hub.api.admin.applying import Applies
from hub.api.admin.artifacts import Artifacts
from hub.api.admin.deleting import Deletes
from hub.api.admin.devices import Devices as AdminDevices
from hub.api.admin.reading import Reads
from hub.api.admin.rollouts import Rollouts as AdminRollouts
from hub.api.admin.showing import Showing
from hub.api.admin.tokens import Tokens
from hub.api.admin.watching import Watches
from hub.api.agentpush import AgentReleaseReceiver
from hub.api.allowances import AllowanceReceiver
from hub.api.dashboard.access import DashboardAccess
from hub.api.devicesync import DeviceServicer, EvidenceHandler
from hub.api.observability import InstrumentedStore
from hub.api.push import ArtifactReceiver
from hub.config import HubConfig, TufConfig, load_config, tuf_lifetimes
from hub.controllers.agentupgrade import AgentUpgradeController
from hub.controllers.attestation import AttestationController
from hub.controllers.parentlink.link import ParentLink
from hub.controllers.parentlink.regionenrollment import PARENT_FILE, ParentFiles, fleet_root_of
from hub.controllers.placement import Scheduler
from hub.controllers.replicas import reload_cache, replica_identity
from hub.controllers.rollout import RolloutController
from hub.controllers.tufwatch import TufWatcher
from hub.controllers.wave import WaveController
from hub.decide.staleness import ObservedSince
from hub.initializing import HubPaths
from hub.pki import CertifiedKey
from hub.state.agentreleases import holds_agent_release
from hub.state.cache import Cache
from hub.state.configschemas import ConfigSchemas
from hub.state.heldtuf import HeldTuf
from hub.state.metrics import HubMetrics
from hub.state.projector import Projector
from hub.state.regions import Regions, replica_name
from hub.state.secrets import SecretKeys
from hub.state.sessions import Sessions
from hub.state.sharedblobs import SharedBlobs
from hub.state.sharedtuf import SharedRelay, SharedTuf
from hub.state.store import EtcdStore, Store, open_hub_store
from hub.state.store.electing import Elector, FencedStore
from hub.state.trustroots import install_roots, load_roots
from hub.state.tufrelay import RelayedTuf
from hub.state.tufrepo import TufRepository
from hub.state.writer import DeviceWriter

if TYPE_CHECKING:
    from hub.api.dashboard.serving import DashboardServer  # aiohttp: an optional extra

log = get_logger(__name__)


@dataclass(slots=True)
class HubParts:
    """The parts ``hub serve`` builds (:func:`build_context`) and wires: what each service and
    controller is constructed with. Held by :mod:`hub.server` (and tests); no service,
    controller or state module takes it: each gets what it uses in its constructor."""

    paths: HubPaths
    config: HubConfig
    ca: CertifiedKey
    store: Store
    cache: Cache
    writer: DeviceWriter
    projector: Projector
    sessions: Sessions
    blobs: ArtifactStore
    # D/tuf/: the TUF repository, when the hub keeps one; at a regional hub, its root's
    # (D/tuf-relay/, hub.state.tufrelay); replaced while the hub runs (hub.state.heldtuf)
    held_tuf: HeldTuf
    # what the admin API writes through (applies, deletes, cordons and revocations, rollout
    # actions, tokens, pushes of models and edged releases, rollback allowances): with
    # replicas, the store fenced by the leader's term (hub.state.store.electing.FencedStore),
    # so that a leader paused past its lease that resumes in the middle of one has it refused
    # (UNAVAILABLE: edgectl goes on to the leader) instead of written where the new leader's
    # cache never looks; None: ``store``
    admin_store: Store | None = None
    rollouts: RolloutController | None = (
        None  # hub.controllers.rollout; None: no rollout controller
    )
    scheduler: Scheduler | None = (
        None  # hub.controllers.placement; None: replicas.total never placed
    )
    clock: Callable[[], float] = field(default=time.time)
    metrics: HubMetrics = field(default_factory=HubMetrics)  # served by hub.api.observability
    elector: Elector | None = (
        None  # hub replicas on etcd (hub.controllers.replicas); None: the only hub
    )
    dashboard: DashboardAccess = field(default_factory=DashboardAccess)  # hub.api.dashboard
    tuf_shared: SharedTuf | None = None  # hub replicas: the repository's versions in the store
    tuf_relay_shared: SharedRelay | None = None  # a region's replicas: the root's set in it
    # D/secrets.key (and a rotation's other key files): seal Secrets at rest (hub.state.secrets)
    secret_keys: SecretKeys = field(default_factory=SecretKeys)
    shared_blobs: SharedBlobs | None = None  # replicas: artifacts' bytes in etcd (blobsharing)
    regions: Regions | None = None  # hub.state.regions: the regional hubs below this one (a root)
    waves: WaveController | None = (
        None  # hub.controllers.wave: rollouts across regions (not at a region)
    )
    # hub.controllers.agentupgrade: AgentUpgrade rollouts (issue 32)
    agent_upgrades: AgentUpgradeController | None = None
    # when this hub began to observe devices: its start, its election (hub.decide.staleness)
    observed_since: ObservedSince = field(default_factory=ObservedSince.now)

    @property
    def tuf(self) -> TufRepository | RelayedTuf | None:
        """The TUF metadata served now (:attr:`held_tuf`'s)."""
        return self.held_tuf.current

    @property
    def trust_root(self) -> bytes:
        """The fleet trust root as signed (D/trust-root.json), if any: the cache's newest."""
        return self.cache.trust_root

    @trust_root.setter
    def trust_root(self, value: bytes) -> None:
        self.cache.set_trust_roots((value,) if value else ())

    @property
    def region(self) -> str:
        return self.config.region

    @property
    def blob_dir(self) -> Path:
        return self.paths.data_dir / "blobs"


async def build_context(data_dir: Path, *, store: Store | None = None) -> HubParts:
    """Load a hub data directory (made by ``hub init``) into a context; opens the store."""
    paths = HubPaths.of(data_dir)
    if not paths.config.exists():
        raise HubDirError(f"{data_dir} is not a hub data directory (no hub.toml): run hub init")
    config = load_config(paths.config)
    ca = pki.load_certified_key(paths.ca_certificate, paths.ca_key)
    metrics = HubMetrics()
    if store is None:
        store = await open_hub_store(
            config.store or None, data_dir=paths.data_dir, etcd_tls=config.etcd.tls(paths.data_dir)
        )
    replicated = isinstance(store, EtcdStore)
    store = InstrumentedStore(store, metrics)
    cache = await Cache.load(store)
    sessions = Sessions()
    metrics.watch(cache, sessions)
    roots = load_roots(paths.data_dir)
    # Replicas: two replicas may write one device's record; each write is conditional.
    writer = DeviceWriter(store, cache, on_event=metrics.count_event, conditional=replicated)
    observed = ObservedSince.now()  # restarted when it serves, and each time it is elected

    async def elected() -> None:
        observed.restart(ctx.clock())  # devices' silence counts from this term (staleness)
        await reload_cache(cache, store, sessions, writer)
        if waves is not None:
            await waves.load()
        install_roots(cache, roots)
        projector.mark_all()
        rollouts.wake()  # every deployment again: the cache was reloaded
        agent_upgrades.wake()

    # Replicas on etcd: the controllers write only while this replica leads
    # (hub.controllers.replicas).
    elector = (
        Elector(
            store,
            identity=replica_identity(),
            ttl=config.etcd.leader_lease_s,
            on_elected=elected,
        )
        if replicated
        else None
    )
    controller_store: Store = store if elector is None else FencedStore(store, elector)
    # federation: the regional hubs below this one, and their last reports
    # (hub.state.sharedreports)
    regions = await Regions.load(store, replicated=replicated)
    metrics.regions = regions  # hub_region_* (a root's regions)
    projector = Projector(
        controller_store,
        cache,
        sessions,
        region=config.region,
        on_placed=metrics.count_placements,
        on_change=regions.changed,  # their streams look at their slices again
    )
    waves: WaveController | None = None
    if not (paths.data_dir / PARENT_FILE).exists():  # a regional hub never rolls out in waves
        waves = WaveController(controller_store, cache, regions, writer)
        await waves.load()
    rollouts = RolloutController(
        controller_store,
        cache,
        projector,
        writer,
        revision_hook=waves.revision_ops if waves is not None else None,
    )
    agent_upgrades = AgentUpgradeController(controller_store, cache, projector, writer)
    ctx = HubParts(
        paths=paths,
        config=config,
        ca=ca,
        store=store,
        cache=cache,
        writer=writer,
        projector=projector,
        sessions=sessions,
        blobs=ArtifactStore(paths.data_dir / "blobs"),
        rollouts=rollouts,
        agent_upgrades=agent_upgrades,
        scheduler=Scheduler(
            controller_store,
            cache,
            projector,
            writer,
            region=config.region,
            reschedule_after_s=config.devices.reschedule_after_s,
            observed_since=observed,
        ),
        observed_since=observed,
        metrics=metrics,
        elector=elector,
        held_tuf=HeldTuf(cache, _tuf_of(paths.data_dir, signing=not replicated, config=config)),
        secret_keys=SecretKeys.load(paths.data_dir),
        admin_store=controller_store,
    )
    if replicated:  # a push lands on the leader; every replica serves its bytes
        ctx.shared_blobs = SharedBlobs(
            store, ctx.blobs, max_bytes=config.etcd.max_shared_artifact_bytes
        )
    held = ctx.held_tuf
    if elector is not None and isinstance(held.current, TufRepository):
        # replicas: one repository, its versions in the store (hub.state.sharedtuf)
        ctx.tuf_shared = SharedTuf(held, store, controller_store, elector)
        await ctx.tuf_shared.follow()
    install_roots(cache, roots)
    if elector is not None and (paths.data_dir / PARENT_FILE).exists():
        # a region's replicas: the root's TUF set in the store, each verifies it (tufsharing)
        ctx.tuf_relay_shared = SharedRelay(
            paths.data_dir,
            store,
            controller_store,
            held=held,
            fleet_root=lambda: fleet_root_of(cache.trust_root),
            adopted=held.adopt,
        )
        await ctx.tuf_relay_shared.follow()
    ctx.regions = regions
    ctx.waves = waves
    return ctx


def _admin_rollouts(ctx: HubParts, auth: AdminAuth) -> AdminRollouts:
    """The admin API's rollout calls (RolloutAction, ListRevisions); the dashboard's actions
    run the same handlers."""
    return AdminRollouts(
        auth,
        ctx.admin_store or ctx.store,
        ctx.cache,
        ctx.writer,
        tuf=ctx.held_tuf,  # replaced when the repository changes (tufwatch, a region's relay)
        clock=ctx.clock,
        rollouts=ctx.rollouts,
        waves=ctx.waves,
        agent_upgrades=ctx.agent_upgrades,
    )


def admin_servicer(ctx: HubParts) -> AdminServicer:
    """AdminService: a handler per group of calls, each with what it uses (hub.api.admin)."""
    auth = AdminAuth(ctx.cache, region=ctx.region)
    show = Showing(
        ctx.cache,
        ctx.projector,
        region=ctx.region,
        regions=ctx.regions,
        waves=ctx.waves,
        rollouts=ctx.rollouts,
    )

    tuf = ctx.held_tuf  # replaced when the repository changes (tufwatch, a region's relay)

    return AdminServicer(
        applies=Applies(
            auth,
            ctx.admin_store or ctx.store,
            ctx.cache,
            ctx.writer,
            ctx.secret_keys,
            region=ctx.region,
            regions=ctx.regions,
            waves=ctx.waves,
            tuf=tuf,
            clock=ctx.clock,
            schemas=ConfigSchemas(ctx.cache, ctx.blobs, ctx.shared_blobs),
        ),
        reads=Reads(
            auth,
            ctx.store,
            ctx.cache,
            show,
            regions=ctx.regions,
            replica=replica_name(ctx.elector),
        ),
        watches=Watches(auth, ctx.store, ctx.cache, show),
        deletes=Deletes(
            auth,
            ctx.admin_store or ctx.store,
            ctx.cache,
            ctx.writer,
            ctx.sessions,
            shared_blobs=ctx.shared_blobs,
            projector=ctx.projector,
        ),
        devices=AdminDevices(
            auth,
            ctx.admin_store or ctx.store,
            ctx.cache,
            ctx.writer,
            ctx.sessions,
            regions=ctx.regions,
            clock=ctx.clock,
            projector=ctx.projector,
        ),
        rollouts=_admin_rollouts(ctx, auth),
        tokens=Tokens(
            auth,
            ctx.admin_store or ctx.store,
            ctx.cache,
            ctx.writer,
            ctx.ca,
            region=ctx.region,
            config=ctx.config.tokens,
            dashboard=ctx.dashboard,
            clock=ctx.clock,
        ),
        artifacts=Artifacts(
            auth,
            artifact_receiver(ctx),
            AllowanceReceiver(ctx.admin_store or ctx.store, ctx.cache, ctx.writer, tuf=tuf),
            agent_release_receiver(ctx),
            tuf=tuf,
            clock=ctx.clock,
        ),
    )


def artifact_receiver(ctx: HubParts) -> ArtifactReceiver:
    """PushArtifact's receiver (hub.api.push), with what it uses."""
    return ArtifactReceiver(
        ctx.admin_store or ctx.store,  # fenced by the leader's term, as applies are
        ctx.cache,
        ctx.writer,
        ctx.blobs,
        tuf=ctx.held_tuf,  # replaced when the repository changes (tufwatch, a region's relay)
        tuf_shared=ctx.tuf_shared,
        shared_blobs=ctx.shared_blobs,
    )


def agent_release_receiver(ctx: HubParts) -> AgentReleaseReceiver:
    """PushAgentRelease's receiver (hub.api.agentpush), with what it uses."""
    return AgentReleaseReceiver(
        ctx.admin_store or ctx.store,  # fenced by the leader's term, as applies are
        ctx.blobs,
        tuf=ctx.held_tuf,
        tuf_shared=ctx.tuf_shared,
        shared_blobs=ctx.shared_blobs,
        writer=ctx.writer,
    )


def device_servicer(ctx: HubParts, *, on_evidence: EvidenceHandler | None = None) -> DeviceServicer:
    """DeviceService (hub.api.devicesync), with what it uses; ``on_evidence``: the
    attestation controller's."""
    return DeviceServicer(
        ctx.cache,
        ctx.writer,
        ctx.projector,
        ctx.sessions,
        ctx.ca,
        ctx.blobs,
        ctx.secret_keys,
        region=ctx.region,
        limits=ctx.config.devices,
        reserved_labels=ctx.config.enrollment.reserved_labels,
        pcrs=ctx.config.attestation.pcrs,
        device_lifetime_s=ctx.config.certificates.device_lifetime_s,
        sync_seconds=ctx.metrics.sync_seconds,
        tuf=ctx.held_tuf,  # replaced when the repository changes (tufwatch, a region's relay)
        shared_blobs=ctx.shared_blobs,
        clock=ctx.clock,
        on_evidence=on_evidence,
        agent_release=functools.partial(
            holds_agent_release, ctx.store, cached=ctx.cache.agent_releases
        ),
    )


def dashboard_server(ctx: HubParts, listen: str) -> DashboardServer:
    """The web dashboard (hub.api.dashboard; needs aiohttp), with what it uses."""
    from hub.api.dashboard.actions import RolloutActions
    from hub.api.dashboard.serving import Dashboard, DashboardServer

    show = Showing(
        ctx.cache,
        ctx.projector,
        region=ctx.region,
        regions=ctx.regions,
        waves=ctx.waves,
        rollouts=ctx.rollouts,
    )
    # an admin's actions go through the admin API's own rollout handlers (pause, resume, ...)
    actions = RolloutActions(
        _admin_rollouts(ctx, AdminAuth(ctx.cache, region=ctx.region)), ctx.writer
    )
    dashboard = Dashboard(
        ctx.cache, show, ctx.dashboard, region=ctx.region, clock=ctx.clock, actions=actions
    )
    return DashboardServer(dashboard, ctx.paths, listen)


def attestation_controller(ctx: HubParts) -> AttestationController:
    """The attestation controller (:mod:`hub.controllers.attestation`), wired."""
    return AttestationController(
        ctx.cache,
        ctx.writer,
        ctx.projector,
        ctx.sessions,
        config=ctx.config.attestation,
        clock=ctx.clock,
    )


def tuf_watcher(ctx: HubParts) -> TufWatcher:
    """The watcher of ``D/tuf/`` (:mod:`hub.controllers.tufwatch`), wired."""
    return TufWatcher(
        ctx.paths.data_dir,
        ctx.held_tuf,
        ctx.writer,
        signing=ctx.tuf_shared is None,
        lifetimes=tuf_lifetimes(ctx.config),
    )


def parent_link(ctx: HubParts, files: ParentFiles) -> ParentLink:
    """A regional hub's link to its root (:mod:`hub.controllers.parentlink.link`), wired."""
    return ParentLink(
        files,
        data_dir=ctx.paths.data_dir,
        store=ctx.store,
        cache=ctx.cache,
        writer=ctx.writer,
        blobs=ctx.blobs,
        tuf=ctx.held_tuf,
        region=ctx.region,
        rollouts=ctx.rollouts,
        tuf_relay_shared=ctx.tuf_relay_shared,
        shared_blobs=ctx.shared_blobs,
        clock=ctx.clock,
        on_agent_release=functools.partial(upgrades.refresh_releases, force=True)
        if (upgrades := ctx.agent_upgrades) is not None
        else None,
    )


def _tuf_of(
    data_dir: Path, *, signing: bool, config: HubConfig | None = None
) -> TufRepository | RelayedTuf | None:
    """The hub's TUF repository (``D/tuf/``); at a regional hub, the root's metadata it last
    adopted (``D/tuf-relay/``), which it may not mix with a repository of its own."""
    if not (data_dir / PARENT_FILE).exists():
        return TufRepository.load(data_dir, signing=signing, **tuf_lifetimes(config or HubConfig()))
    if config is not None and config.tuf != TufConfig():
        raise HubDirError(
            f"{data_dir / 'hub.toml'}: tuf: a regional hub serves its root hub's TUF timestamp "
            "and snapshot unchanged, so their lifetimes are the root's: set [tuf] at the root "
            "(here it would have no effect)"
        )
    if TufRepository.exists(data_dir):
        raise HubDirError(
            f"{data_dir / 'tuf'}: a regional hub serves its root hub's TUF metadata "
            "(D/tuf-relay/) and keeps no repository of its own: not supported here"
        )
    return RelayedTuf.load(data_dir)
