"""``hub serve``: the hub's gRPC services and controllers, wired together.

One grpc.aio server, two ports:

* ``listen`` (default ``0.0.0.0:7443``): mutual TLS. DeviceService for device certificates,
  AdminService for admin certificates (authorization in :mod:`hub.api.auth`).
* the enrollment port, ``listen``'s port + 1 unless configured: server-authenticated TLS only,
  because a device that enrolls has no certificate yet (it pins the CA by hash). grpc's
  Python API cannot ask for a client certificate without requiring one, hence two ports.
  Every service is registered on both ports, but without a client certificate only
  EnrollmentService answers (the others refuse: UNAUTHENTICATED).

Components (each ``name`` + ``async run(stop)``, supervised with restart backoff like edged's):
the device writer, the projector, the lifecycle controller, the attestation controller (when
the trust package provides a verifier), lease expiry, the store's compactor, the rollout
controller and the scheduler (:mod:`hub.controllers.placement`). The writer, the projector, the
rollout
controller and the scheduler are critical: when their store keeps failing
(:mod:`hub.state.batchloop`),
``serve`` raises :class:`~edgefleet.supervising.CriticalComponentError` and ``hub serve``
exits 1, for systemd to restart it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from edgefleet.artifacts.storing import ArtifactStore
from edgefleet.configfiles import parse_host_port
from edgefleet.errors import HubDirError
from edgefleet.logs import get_logger
from edgefleet.notifying import Notifier, WatchdogPinger
from edgefleet.supervising import Component, supervise, wait_for_stop
from edgefleet.v1 import admin_pb2, device_pb2, enrollment_pb2, federation_pb2
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
from hub.api.allowances import AllowanceReceiver
from hub.api.devicesync import DeviceServicer, EvidenceHandler
from hub.api.enrollment import EK_CA_DIR, EnrollmentServicer
from hub.api.federation import FederationServicer
from hub.api.hubenrollment import HubEnrollmentServicer
from hub.api.observability import (
    READY_STORE_TIMEOUT_S,
    InstrumentedStore,
    MetricsInterceptor,
    ObservabilityServer,
)
from hub.api.push import ArtifactReceiver
from hub.api.registering import add_servicer
from hub.config import HubConfig, TufConfig, load_config, tuf_lifetimes
from hub.context import HubContext
from hub.controllers.attestation import AttestationController
from hub.controllers.autoscaler import FleetAutoscaler
from hub.controllers.lifecycle import Lifecycle
from hub.controllers.parentlink import PARENT_FILE, ParentFiles, ParentLink, fleet_root_of
from hub.controllers.placement import Scheduler
from hub.controllers.replicas import (
    CacheFollower,
    LeaderWrites,
    ReplicaDevices,
    reload_cache,
    replica_identity,
)
from hub.controllers.rollout import RolloutController
from hub.controllers.tufwatch import TufWatcher
from hub.controllers.wave import WaveController, WaveObserver
from hub.decide.staleness import ObservedSince
from hub.initializing import HubPaths
from hub.state.cache import Cache
from hub.state.heldtuf import HeldTuf
from hub.state.metrics import HubMetrics
from hub.state.projector import Projector
from hub.state.regions import Regions, RegionsFollower, replica_name
from hub.state.secrets import SecretKeys
from hub.state.sessions import Sessions
from hub.state.sharedblobs import SharedBlobs
from hub.state.sharedtuf import SharedRelay, SharedTuf
from hub.state.store import EtcdStore, Store, open_hub_store
from hub.state.store.compacting import Compactor
from hub.state.store.electing import Elector, FencedStore, LeaderOnly
from hub.state.store.identity import data_dir_lock
from hub.state.trustroots import HubRoots, RootWatcher, install_roots, load_roots
from hub.state.tufrelay import RelayedTuf
from hub.state.tufrepo import TufRepository
from hub.state.writer import DeviceWriter

if TYPE_CHECKING:
    from hub.api.dashboard.serving import DashboardServer  # aiohttp: an optional extra

log = get_logger(__name__)

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
TRUST_ROOT_FILE = "trust-root.json"

SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_concurrent_streams", 100_000),
    # Find dead devices (power cut, network gone) without application traffic.
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
]


CRITICAL = frozenset({"device-writer", "projector", "rollouts", "scheduler"})
"""The components whose persistent failure stops the hub (see :func:`supervise`)."""


def enrollment_address(listen: str) -> str:
    host, port = parse_host_port(listen)
    return f"{host}:{port + 1}"


async def build_context(data_dir: Path, *, store: Store | None = None) -> HubContext:
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
        await reload_cache(cache, store, sessions)
        if waves is not None:
            await waves.load()
        install_roots(cache, roots)
        projector.mark_all()
        rollouts.wake()  # every deployment again: the cache was reloaded

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
    ctx = HubContext(
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


def _admin_servicer(ctx: HubContext) -> AdminServicer:
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
            ctx.store,
            ctx.cache,
            ctx.writer,
            ctx.secret_keys,
            region=ctx.region,
            regions=ctx.regions,
            waves=ctx.waves,
            tuf=tuf,
            clock=ctx.clock,
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
            ctx.store,
            ctx.cache,
            ctx.writer,
            ctx.sessions,
            shared_blobs=ctx.shared_blobs,
            projector=ctx.projector,
        ),
        devices=AdminDevices(
            auth,
            ctx.store,
            ctx.cache,
            ctx.writer,
            ctx.sessions,
            regions=ctx.regions,
            clock=ctx.clock,
            projector=ctx.projector,
        ),
        rollouts=AdminRollouts(
            auth,
            ctx.store,
            ctx.cache,
            ctx.writer,
            tuf=tuf,
            clock=ctx.clock,
            rollouts=ctx.rollouts,
            waves=ctx.waves,
        ),
        tokens=Tokens(
            auth,
            ctx.store,
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
            AllowanceReceiver(ctx.store, ctx.cache, ctx.writer, tuf=tuf),
            tuf=tuf,
            clock=ctx.clock,
        ),
    )


def artifact_receiver(ctx: HubContext) -> ArtifactReceiver:
    """PushArtifact's receiver (hub.api.push), with what it uses."""
    return ArtifactReceiver(
        ctx.store,
        ctx.cache,
        ctx.writer,
        ctx.blobs,
        tuf=ctx.held_tuf,  # replaced when the repository changes (tufwatch, a region's relay)
        tuf_shared=ctx.tuf_shared,
        shared_blobs=ctx.shared_blobs,
    )


def device_servicer(
    ctx: HubContext, *, on_evidence: EvidenceHandler | None = None
) -> DeviceServicer:
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
    )


def dashboard_server(ctx: HubContext, listen: str) -> DashboardServer:
    """The web dashboard (hub.api.dashboard; needs aiohttp), with what it uses."""
    from hub.api.dashboard.serving import Dashboard, DashboardServer

    show = Showing(
        ctx.cache,
        ctx.projector,
        region=ctx.region,
        regions=ctx.regions,
        waves=ctx.waves,
        rollouts=ctx.rollouts,
    )
    dashboard = Dashboard(ctx.cache, show, ctx.dashboard, region=ctx.region, clock=ctx.clock)
    return DashboardServer(dashboard, ctx.paths, listen)


def attestation_controller(ctx: HubContext) -> AttestationController:
    """The attestation controller (:mod:`hub.controllers.attestation`), wired."""
    return AttestationController(
        ctx.cache,
        ctx.writer,
        ctx.projector,
        ctx.sessions,
        config=ctx.config.attestation,
        clock=ctx.clock,
    )


def tuf_watcher(ctx: HubContext) -> TufWatcher:
    """The watcher of ``D/tuf/`` (:mod:`hub.controllers.tufwatch`), wired."""
    return TufWatcher(
        ctx.paths.data_dir,
        ctx.held_tuf,
        ctx.writer,
        signing=ctx.tuf_shared is None,
        lifetimes=tuf_lifetimes(ctx.config),
    )


def parent_link(ctx: HubContext, files: ParentFiles) -> ParentLink:
    """A regional hub's link to its root (:mod:`hub.controllers.parentlink`), wired."""
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
    )


def check_replica_names(paths: HubPaths, addresses: Sequence[str]) -> None:
    """Refuse to serve when a replica address (hub.toml ``replicaAddresses``) is not in the
    serving certificate's names: devices failing over to that replica would refuse it."""
    from cryptography import x509

    from edgefleet.configfiles import parse_host_port

    if not addresses:
        return
    certificate = x509.load_pem_x509_certificate(paths.hub_certificate.read_bytes())
    hosts = list(dict.fromkeys(parse_host_port(a)[0].strip("[]") for a in addresses))
    missing = pki.uncovered_hosts(certificate, hosts)
    if missing:
        raise HubDirError(
            f"{paths.config}: replicaAddresses: {', '.join(missing)} not in the serving "
            f"certificate's names ({paths.hub_certificate}): devices would refuse that replica; "
            "make the hub with hub init --replica-address for each replica"
        )


def _server_credentials(paths: HubPaths, *, mutual: bool) -> grpc.ServerCredentials:
    # The chain includes the CA: a device that enrolls reads it from the handshake and accepts
    # it only if it matches the pin printed with the token.
    chain = paths.hub_certificate.read_bytes() + paths.ca_certificate.read_bytes()
    return grpc.ssl_server_credentials(
        [(paths.hub_key.read_bytes(), chain)],
        root_certificates=paths.ca_certificate.read_bytes() if mutual else None,
        require_client_auth=mutual,
    )


@dataclass
class RunningHub:
    ctx: HubContext
    server: grpc.aio.Server
    port: int
    enroll_port: int
    devices: DeviceServicer


async def start_server(
    ctx: HubContext,
    *,
    listen: str | None = None,
    enroll_listen: str | None = None,
    on_evidence: EvidenceHandler | None = None,
) -> RunningHub:
    """Start the gRPC server (not the controllers); ports 0 pick free ones."""
    listen = listen or ctx.config.listen
    enroll_listen = enroll_listen or enrollment_address(listen)
    interceptors: list[grpc.aio.ServerInterceptor] = [MetricsInterceptor(ctx.metrics)]
    if ctx.elector is not None:
        interceptors.append(LeaderWrites(ctx.elector))
    server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=interceptors)
    devices = device_servicer(ctx, on_evidence=on_evidence)
    # Not the generated add_*_to_server: malformed messages must get INVALID_ARGUMENT.
    add_servicer(server, devices, device_pb2.DESCRIPTOR.services_by_name["DeviceService"])
    add_servicer(
        server,
        EnrollmentServicer(
            ctx.store,
            ctx.cache,
            ctx.writer,
            ctx.projector,
            ctx.ca,
            region=ctx.region,
            limits=ctx.config.enrollment,
            device_lifetime_s=ctx.config.certificates.device_lifetime_s,
            replica_addresses=ctx.config.replica_addresses,
            ek_cas=ctx.paths.data_dir / EK_CA_DIR,
            clock=ctx.clock,
        ),
        enrollment_pb2.DESCRIPTOR.services_by_name["EnrollmentService"],
    )
    add_servicer(
        server, _admin_servicer(ctx), admin_pb2.DESCRIPTOR.services_by_name["AdminService"]
    )
    if ctx.regions is not None:  # federation (hub.api.federation): regional hubs enroll, stream in
        services = federation_pb2.DESCRIPTOR.services_by_name
        hub_enrollment = HubEnrollmentServicer(
            ctx.store,
            ctx.cache,
            ctx.writer,
            ctx.ca,
            ctx.regions,
            region=ctx.region,
            limits=ctx.config.enrollment,
            region_lifetime_s=ctx.config.certificates.region_lifetime_s,
            replica_addresses=ctx.config.replica_addresses,
            clock=ctx.clock,
        )
        add_servicer(server, hub_enrollment, services["HubEnrollmentService"])
        federation = FederationServicer(
            ctx.store,
            ctx.cache,
            ctx.writer,
            ctx.blobs,
            ctx.ca,
            ctx.regions,
            region=ctx.region,
            replica=replica_name(ctx.elector),
            region_lifetime_s=ctx.config.certificates.region_lifetime_s,
            tuf=ctx.held_tuf,
            waves=ctx.waves,
            shared_blobs=ctx.shared_blobs,
            clock=ctx.clock,
        )
        add_servicer(server, federation, services["FederationService"])
    port = server.add_secure_port(listen, _server_credentials(ctx.paths, mutual=True))
    enroll_port = server.add_secure_port(
        enroll_listen, _server_credentials(ctx.paths, mutual=False)
    )
    await server.start()
    log.info("hub serving", listen=listen, port=port, enroll_port=enroll_port, region=ctx.region)
    return RunningHub(ctx, server, port, enroll_port, devices)


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


async def _readiness(ctx: HubContext, stop: asyncio.Event) -> str | None:
    """Why the hub is not ready to serve (None: it is): stopping, or a store that does not
    answer within 2 s."""
    if stop.is_set():
        return "stopping"
    try:
        await asyncio.wait_for(ctx.store.get("/readyz"), READY_STORE_TIMEOUT_S)
    except Exception as exc:
        return f"the store does not answer: {type(exc).__name__}: {exc}"
    return None


class LeaseExpiry:
    name = "lease-expiry"

    def __init__(self, store: Store, period: float = 1.0) -> None:
        self.store = store
        self.period = period

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if not await wait_for_stop(stop, self.period):
                await self.store.expire_leases()


async def serve(
    data_dir: Path,
    *,
    listen: str | None = None,
    enroll_listen: str | None = None,
    store_url: str | None = None,
    ready: asyncio.Event | None = None,
    metrics_listen: str | None = None,
    etcd_flags: Mapping[str, Path | None] | None = None,
    dashboard_listen: str | None = None,
) -> int:
    """Run the hub until SIGTERM/SIGINT, holding the data directory's lock (one hub per data
    directory; ``hub restore`` waits for none). ``metrics_listen`` (default: hub.toml's
    ``metricsListen``; ``""``: none) serves /metrics, /healthz, /readyz
    (:mod:`hub.api.observability`);
    ``dashboard_listen`` (default: ``dashboardListen``) the web dashboard
    (:mod:`hub.api.dashboard`)."""
    with data_dir_lock(HubPaths.of(data_dir).data_dir, purpose="hub serve"):
        return await _serve(
            data_dir,
            listen=listen,
            enroll_listen=enroll_listen,
            store_url=store_url,
            ready=ready,
            metrics_listen=metrics_listen,
            etcd_flags=etcd_flags or {},
            dashboard_listen=dashboard_listen,
        )


async def _serve(
    data_dir: Path,
    *,
    listen: str | None,
    enroll_listen: str | None,
    store_url: str | None,
    ready: asyncio.Event | None,
    metrics_listen: str | None,
    etcd_flags: Mapping[str, Path | None],
    dashboard_listen: str | None = None,
) -> int:
    paths = HubPaths.of(data_dir)
    if not paths.config.exists():
        raise HubDirError(f"{data_dir} is not a hub data directory (no hub.toml): run hub init")
    config = load_config(paths.config)
    check_replica_names(paths, config.replica_addresses)
    ctx = await build_context(
        data_dir,
        store=await open_hub_store(
            store_url or config.store or None,
            data_dir=paths.data_dir,
            etcd_tls=config.etcd.tls(paths.data_dir, **etcd_flags),
        ),
    )
    # SIGTERM is handled before anything says the hub serves (a supervisor may stop it at once).
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    attestation = attestation_controller(ctx)
    running = await start_server(
        ctx, listen=listen, enroll_listen=enroll_listen, on_evidence=attestation.on_evidence
    )
    ctx.observed_since.restart(ctx.clock())  # devices can reach it from now (hub.decide.staleness)
    print(
        f"hub serving region {ctx.region} on port {running.port} "
        f"(enrollment on port {running.enroll_port}); {len(ctx.cache.devices)} devices known",
        flush=True,
    )
    ctx.projector.mark_all()
    elector = ctx.elector
    controller_store: Store = ctx.store if elector is None else FencedStore(ctx.store, elector)
    controllers: list[Component] = [
        ctx.projector,
        Lifecycle(
            ctx.cache,
            ctx.writer,
            ctx.projector,
            running.devices.last_seen,
            grace_s=ctx.config.devices.heartbeat_grace_s,
            observed_since=ctx.observed_since,
            clock=ctx.clock,
        ),
        LeaseExpiry(controller_store),
        Compactor(
            controller_store,
            period=ctx.config.history.compaction_period_s,
            retention=ctx.config.history.retention_s,
        ),
    ]
    if ctx.rollouts is not None:
        controllers.append(ctx.rollouts)
    if ctx.waves is not None:
        controllers.append(ctx.waves)
    if ctx.scheduler is not None:
        controllers.append(ctx.scheduler)
        # its totals reach the scheduler through the cache and its change feed
        controllers.append(FleetAutoscaler(ctx.cache, ctx.writer))
    if elector is not None:
        elector.identity = replica_identity(f"port {running.port}")
        controllers = [elector, *(LeaderOnly(c, elector) for c in controllers)]
        followers = [ctx.waves] if ctx.waves is not None else []
        controllers.append(
            CacheFollower(ctx.store, ctx.cache, ctx.sessions, elector, followers=followers)
        )
        if ctx.waves is not None:  # the analysis across regions on a follower too
            controllers.append(WaveObserver(ctx.waves, elector))
        controllers.append(
            ReplicaDevices(
                store=ctx.store,
                cache=ctx.cache,
                sessions=ctx.sessions,
                writer=ctx.writer,
                projector=ctx.projector,
                last_seen=running.devices.last_seen,
                grace_s=ctx.config.devices.heartbeat_grace_s,
            )
        )
    parent = ParentFiles.load(ctx.paths.data_dir)
    if (
        parent is not None
    ):  # a regional hub: its root's slice in, its status up (hub.controllers.parentlink)
        link = parent_link(ctx, parent)
        controllers.append(link if elector is None else LeaderOnly(link, elector))
    components: list[Component] = [
        ctx.writer,
        *controllers,
        *([RegionsFollower(ctx.store, ctx.regions)] if ctx.regions is not None else []),
        attestation,
        RootWatcher(
            ctx.paths.data_dir,
            ctx.cache,
            ctx.writer,
            HubRoots(ctx.cache.trust_roots),
            clock=ctx.clock,
        ),
    ]
    if parent is None:  # a regional hub's TUF metadata is its root's (hub.state.tufrelay)
        components.append(tuf_watcher(ctx))
    if ctx.tuf_shared is not None:
        components.append(ctx.tuf_shared)
    if ctx.tuf_relay_shared is not None:
        components.append(ctx.tuf_relay_shared)
    if metrics_listen is None:
        metrics_listen = ctx.config.metrics_listen
    if metrics_listen:

        async def readiness() -> str | None:
            return await _readiness(ctx, stop)

        components.append(ObservabilityServer(metrics_listen, ctx.metrics, readiness))
    if dashboard_listen is None:
        dashboard_listen = ctx.config.dashboard_listen
    if dashboard_listen:
        if importlib.util.find_spec("aiohttp") is None:
            # a hub installed without the extra: say so, never run without the asked listener
            raise HubDirError(
                f"dashboardListen {dashboard_listen!r} needs the aiohttp package, which is not "
                "installed: pip install 'edgefleet[dashboard]'"
            )
        components.append(dashboard_server(ctx, dashboard_listen))
    if ready is not None:
        ready.set()
    # systemd (Type=notify): ready once the gRPC server listens; watchdog pings from this loop
    notifier = Notifier.from_environ()
    notifier.ready(f"serving region {ctx.region} on port {running.port}")
    watchdog_stop = asyncio.Event()
    watchdog = asyncio.ensure_future(WatchdogPinger(notifier).run(watchdog_stop))
    code = 0
    try:
        await supervise(components, stop, critical=CRITICAL)
    finally:
        notifier.stopping()
        await running.server.stop(grace=2.0)
        try:
            await ctx.writer.flush()  # updates by calls answered while stopping
        except Exception as exc:
            log.error("hub final flush failed", error=str(exc))
            code = 1
        await ctx.store.close()
        watchdog_stop.set()
        await watchdog
        log.info("hub stopped")
    return code


def config_of(data_dir: Path) -> HubConfig:
    return load_config(HubPaths.of(data_dir).config)
