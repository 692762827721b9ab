"""``hub serve``: the hub's gRPC services and controllers, as :mod:`hub.wiring` builds them,
served and supervised.

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
import signal
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from edgefleet.configfiles import parse_host_port
from edgefleet.errors import HubDirError
from edgefleet.logs import get_logger
from edgefleet.notifying import Notifier, WatchdogPinger
from edgefleet.supervising import Component, supervise, wait_for_stop
from edgefleet.v1 import admin_pb2, device_pb2, enrollment_pb2, federation_pb2
from hub import pki
from hub.api.devicesync import DeviceServicer, EvidenceHandler
from hub.api.enrollment import EK_CA_DIR, EnrollmentServicer
from hub.api.federation import FederationServicer
from hub.api.hubenrollment import HubEnrollmentServicer
from hub.api.observability import (
    READY_STORE_TIMEOUT_S,
    MetricsInterceptor,
    ObservabilityServer,
)
from hub.api.registering import add_servicer
from hub.config import HubConfig, load_config
from hub.controllers.fleetautoscaler import FleetAutoscaler
from hub.controllers.lifecycle import Lifecycle
from hub.controllers.parentlink.regionenrollment import ParentFiles
from hub.controllers.replicas import (
    CacheFollower,
    LeaderWrites,
    ReplicaDevices,
    replica_identity,
)
from hub.controllers.wave import WaveObserver
from hub.initializing import HubPaths
from hub.state.migrations import SchemaWatch, StoreSchemaError, migrate
from hub.state.regions import RegionsFollower, replica_name
from hub.state.store import EtcdStore, Store, open_hub_store
from hub.state.store.compacting import Compactor
from hub.state.store.electing import FencedStore, LeaderOnly
from hub.state.store.identity import data_dir_lock
from hub.state.trustroots import HubRoots, RootWatcher
from hub.wiring import (
    HubParts,
    admin_servicer,
    attestation_controller,
    build_context,
    dashboard_server,
    device_servicer,
    parent_link,
    tuf_watcher,
)

if TYPE_CHECKING:
    pass  # aiohttp: an optional extra

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
    ("grpc.http2.ping_timeout_ms", 20_000),  # else 60 s: gRPC times keepalive pings out by it
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
]


CRITICAL = frozenset({"device-writer", "projector", "rollouts", "scheduler"})
"""The components whose persistent failure stops the hub (see :func:`supervise`)."""


def enrollment_address(listen: str) -> str:
    host, port = parse_host_port(listen)
    return f"{host}:{port + 1}"


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
    ctx: HubParts
    server: grpc.aio.Server
    port: int
    enroll_port: int
    devices: DeviceServicer


async def start_server(
    ctx: HubParts,
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
    add_servicer(server, admin_servicer(ctx), admin_pb2.DESCRIPTOR.services_by_name["AdminService"])
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


async def _readiness(ctx: HubParts, stop: asyncio.Event) -> str | None:
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


def dashboard_extra_missing(listen: str) -> None:
    """Raise :class:`HubDirError` in one line when the ``dashboard`` extra (aiohttp) is not
    installed: the dashboard asked for (``listen``) cannot run."""
    try:
        import aiohttp.web  # noqa: F401  (the dashboard's only third-party need)
    except ImportError:
        raise HubDirError(
            f"dashboardListen {listen!r} needs the dashboard extra (aiohttp), which is not "
            "installed: pip install 'edgefleet[dashboard]' (the Debian package edgefleet-hub "
            "has it), or serve without --dashboard-listen / dashboardListen"
        ) from None


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
    if dashboard_listen is None:
        dashboard_listen = config.dashboard_listen
    if dashboard_listen:
        # before anything listens: a hub without the extra says so in one line and exits,
        # never runs without the listener asked for (and never half-started)
        dashboard_extra_missing(dashboard_listen)
    check_replica_names(paths, config.replica_addresses)
    store = await open_hub_store(
        store_url or config.store or None,
        data_dir=paths.data_dir,
        etcd_tls=config.etcd.tls(paths.data_dir, **etcd_flags),
    )
    try:  # a store of an older schema is brought to this hub's (hub.state.migrations)
        await migrate(store, shared=isinstance(store, EtcdStore))
    except BaseException:
        await store.close()
        raise
    ctx = await build_context(data_dir, store=store)
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
    ctx.metrics.last_seen = running.devices.last_seen  # hub_device_last_report_age_seconds
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
    if ctx.agent_upgrades is not None:
        controllers.append(ctx.agent_upgrades)
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
            CacheFollower(
                ctx.store,
                ctx.cache,
                ctx.sessions,
                elector,
                followers=followers,
                region=ctx.region,
                writer=ctx.writer,
            )
        )
        if ctx.waves is not None:  # the analysis across regions on a follower too
            controllers.append(WaveObserver(ctx.waves, elector))
        replica_devices = ReplicaDevices(
            store=ctx.store,
            cache=ctx.cache,
            sessions=ctx.sessions,
            writer=ctx.writer,
            projector=ctx.projector,
            last_seen=running.devices.last_seen,
            grace_s=ctx.config.devices.heartbeat_grace_s,
            replica=f"{socket.gethostname()} port {running.port}",
        )
        running.devices.on_ack = replica_devices.acked  # into its heartbeat record
        controllers.append(replica_devices)
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
    schema_watch = SchemaWatch(ctx.store) if elector is not None else None
    if schema_watch is not None:  # another replica's `hub migrate` may outdate this one
        components.append(schema_watch)
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
    if dashboard_listen:
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
    if schema_watch is not None and schema_watch.refused:
        raise StoreSchemaError(schema_watch.refused)
    return code


def config_of(data_dir: Path) -> HubConfig:
    return load_config(HubPaths.of(data_dir).config)
