"""edged run: wires the parts together and owns start-up and shutdown order.

Start-up: validate config -> load the persisted desired state -> open the status and
inference sockets -> tell systemd READY=1 (and ping its watchdog from the main loop, see
edged/notifying.py) -> start replicas for the persisted workloads (no manifest read, no hub
needed) -> then read the manifests directory. Shutdown (SIGTERM/SIGINT): STOPPING=1 to
systemd -> become unready -> stop accepting inference connections -> drain in-flight requests
-> stop the controllers -> drain and stop workers -> persist status -> exit 0.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import time
from pathlib import Path
from typing import Any

import orjson

from edged.config import EdgedConfig
from edged.discovery.discovering import Discovery
from edged.hublink.files import LinkFiles
from edged.reconcile.applying import Applier
from edged.reconcile.model import DesiredWorkload, ObservedWorkload, ProviderChoice, WorkloadName
from edged.reconcile.planning import plan
from edged.reconcile.queueing import WorkQueue
from edged.reconcile.running import Result, Runner
from edged.reporting import StatusBoard
from edged.runtime.limiting import detect_cgroup_root
from edged.runtime.processes import Replica, WorkerPool
from edged.serving.http import HttpServer
from edged.serving.inference import InferenceRouter
from edged.serving.status import StatusHandler
from edged.sources.hub import HUB_SOURCE, HubSource
from edged.sources.static import StaticManifests
from edged.sources.watching import DirectoryWatcher
from edged.state.desired import DesiredState
from edged.trust.admitting import ArtifactGate
from edgefleet.api import DeviceHealthPolicy
from edgefleet.artifacts.storing import ArtifactStore
from edgefleet.errors import EdgefleetError, StateError, TemporaryError
from edgefleet.logs import get_logger
from edgefleet.metrics import CounterChild, HistogramChild, Registry
from edgefleet.notifying import Notifier, WatchdogPinger
from edgefleet.supervising import supervise, wait_for_stop

log = get_logger(__name__)

SOURCE_KEY = "static"
DRAIN_TIMEOUT_S = 20.0
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)


class WorkloadReconciler:
    """Reconciles one workload: observe, plan (pure), apply, record status."""

    def __init__(self, daemon: Daemon) -> None:
        self._d = daemon

    async def reconcile(self, key: WorkloadName) -> Result:
        d = self._d
        desired = d.desired.get(key)
        observed = ObservedWorkload(
            replicas=d.pool.observe(key),
            artifact_present=d.store.has(desired.sha256) if desired is not None else True,
            providers=d.choose_providers(desired),
        )
        p = plan(key, desired, observed, time.monotonic())
        d.board.set_workload(key, p.status)
        await d.applier.apply(desired, p.actions)
        return Result(requeue_after=p.requeue_after)


class SourceReconciler:
    """Reads the manifests directory into the accepted desired state."""

    def __init__(self, daemon: Daemon, source: StaticManifests) -> None:
        self._d = daemon
        self._source = source

    async def reconcile(self, key: str) -> Result:
        d = self._d
        current = {n: w for n, w in d.desired.workloads.items() if w.source != HUB_SOURCE}
        d.syncing += 1
        try:
            result = await asyncio.to_thread(self._source.sync, current)
        finally:
            d.syncing -= 1
        d.static_workloads = result.workloads
        d.static_policies = result.policies
        d.board.set_source(result.problems, result.files)
        d.board.source_synced = True
        d.accept_desired()
        if result.retryable:
            raise TemporaryError("some manifests refer to model files that cannot be read yet")
        return Result()


class Resync:
    """The safety net of level-triggered control: every key is looked at periodically."""

    name = "resync"

    def __init__(self, daemon: Daemon, period: float) -> None:
        self._d = daemon
        self._period = period

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if not await wait_for_stop(stop, self._period):
                self._d.enqueue_all()


class AlreadyRunning(EdgefleetError):
    """Another edged holds the data directory."""


def _lock_data_dir(data: Path) -> int:
    """One edged per data directory: an exclusive flock held for the process's lifetime."""
    fd = os.open(data / "edged.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AlreadyRunning(f"another edged is running on {data}") from None
    return fd


class Daemon:
    def __init__(
        self,
        config: EdgedConfig,
        *,
        manifests: Path | None,
        config_path: Path | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.config_path = config_path
        self.notifier = notifier if notifier is not None else Notifier.from_environ()
        # Only edged talks to systemd: worker processes must not inherit the socket.
        os.environ.pop("NOTIFY_SOCKET", None)
        self.config = config
        data = Path(config.paths.data_dir)
        self.data_dir = data
        data.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock = _lock_data_dir(data)
        self.registry = Registry()
        self.store = ArtifactStore(data / "artifacts")
        self.desired = DesiredState(data / "state" / "desired.json")
        self.router = InferenceRouter(ready=self._ready)
        self.cgroup_root = detect_cgroup_root(str(config.workers.cgroup_root))
        self.limits_mode = "cgroup" if self.cgroup_root is not None else "rlimit"
        self.workload_queue: WorkQueue[WorkloadName] = WorkQueue(
            "workloads",
            base_delay=config.reconcile.backoff_base_s,
            max_delay=config.reconcile.backoff_max_s,
        )
        self.source_queue: WorkQueue[str] = WorkQueue(
            "source",
            base_delay=config.reconcile.backoff_base_s,
            max_delay=config.reconcile.backoff_max_s,
        )
        self.pool = WorkerPool(
            notify=self.workload_queue.add,
            on_serving_change=self._on_serving_change,
            on_result=self._on_result,
            python=str(config.workers.python_executable),
        )
        self.applier = Applier(
            self.pool,
            artifact_path=self.store.path_for,
            request_refetch=self.request_refetch,
            cgroup_root=self.cgroup_root,
            log_level=config.log_level,
        )
        self.manifests = manifests
        self.board = StatusBoard(
            data / "state" / "status.json",
            desired=self.desired,
            pool=self.pool,
            limits_mode=self.limits_mode,
            allow_unsigned=config.trust.allow_unsigned,
            manifests_dir=manifests,
        )
        self.board.source_synced = manifests is None
        self.stop_event = asyncio.Event()
        self._init_metrics()
        # -- trust (docs/trust.md): every artifact passes the gate before the store ----------
        verifications = self.registry.counter(
            "edged_artifact_verifications_total",
            "Artifact verifications by result (accepted, unsigned, refused) and reason",
            ("result", "reason"),
        )
        self.gate = ArtifactGate(
            data,
            root_file=config.trust.root_file,
            allow_unsigned=config.trust.allow_unsigned,
            on_result=lambda result, reason: verifications.labels(
                result=result, reason=reason
            ).inc(),
        )
        self.board.trust_status = self.gate.status
        self.source = (
            StaticManifests(manifests, self.store, max_artifact_bytes=4 << 30, gate=self.gate)
            if manifests is not None
            else None
        )
        # -- the hub (enrolled devices: D/hub/link.json) --
        self.static_workloads: dict[WorkloadName, DesiredWorkload] | None = (
            None if manifests is not None else {}
        )
        self.static_policies: tuple[DeviceHealthPolicy, ...] = ()
        self.link_files = LinkFiles(data)
        self.hub_source: HubSource | None = None
        self.hub_link: Any = None
        self._attester: Any = None
        self.syncing = 0  # sources in the middle of a sync: no garbage collection meanwhile
        if self.link_files.enrolled():
            self.hub_source = HubSource(data, self.store, self.gate)
        # -- discovery (accelerators, health, labels) --
        self.discovery: Discovery | None = None
        if config.discovery.enabled:
            self.discovery = Discovery(
                data_dir=data,
                python=str(config.workers.python_executable),
                health_period_s=config.discovery.health_period_s,
                configured_providers=config.discovery.execution_providers,
                config_labels=config.device.labels,
                on_accelerators_changed=self.enqueue_workloads,
                on_status_changed=self.board.device_changed,
            )
            self.board.device_status = self.discovery.status
        # -- end discovery --

    # -- metrics --------------------------------------------------------------------------
    def _init_metrics(self) -> None:
        r = self.registry
        self._m_requests = r.counter(
            "edged_inference_requests_total",
            "Inference requests answered by workers",
            ("model", "code"),
        )
        self._m_latency = r.histogram(
            "edged_inference_request_duration_seconds",
            "Time from forwarding a request to a worker to its answer",
            ("model",),
            buckets=LATENCY_BUCKETS,
        )
        self._req_children: dict[tuple[str, int], CounterChild] = {}
        self._lat_children: dict[str, HistogramChild] = {}
        restarts = r.gauge("edged_replica_restarts", "Restarts of replica slots", ("workload",))
        ready = r.gauge("edged_replicas_ready", "Ready replicas", ("workload",))
        self._m_restarts, self._m_ready = restarts, ready
        r.gauge(
            "edged_desired_generation", "Generation of the accepted desired state"
        ).set_function(lambda: float(self.desired.generation))
        r.gauge("edged_workloads", "Workloads in the desired state").set_function(
            lambda: float(len(self.desired.workloads))
        )

    def _on_result(self, rep: Replica, status: int, seconds: float) -> None:
        model = rep.spec.model_name
        key = (model, status)
        c = self._req_children.get(key)
        if c is None:
            c = self._req_children[key] = self._m_requests.labels(model=model, code=str(status))
        c.inc()
        h = self._lat_children.get(model)
        if h is None:
            h = self._lat_children[model] = self._m_latency.labels(model=model)
        h.observe(seconds)

    def _on_serving_change(self, rep: Replica, ready: bool) -> None:
        self.router.replica_ready(rep, ready)
        self._m_ready.labels(workload=rep.workload).set(
            sum(1 for r in self.pool.replicas(rep.workload) if r.phase.value == "Ready")
        )
        self._m_restarts.labels(workload=rep.workload).set(
            sum(r.restarts for r in self.pool.replicas(rep.workload))
        )

    # -- helpers used by reconcilers ------------------------------------------------------
    def refresh_routes(self) -> None:
        self.router.set_models(
            {
                w.deployment.spec.model.name: (w.name, w.deployment.spec.model.version)
                for w in self.desired.workloads.values()
            }
        )

    def choose_providers(self, desired: DesiredWorkload | None) -> ProviderChoice | None:
        """The execution providers discovery allows for ``desired`` (``None``: discovery off)."""
        if self.discovery is None or desired is None:
            return None
        spec = desired.deployment.spec
        sel = self.discovery.select(spec.runtime.execution_providers, spec.resources.accelerator)
        return ProviderChoice(sel.providers, sel.fell_back, sel.message)

    def accept_desired(self) -> None:
        """Merge the sources into the desired state and enqueue what changed.

        Static manifests (local, like kubelet's static pods) win a name conflict with the
        hub. Until the static source has read its directory once, the static workloads of the
        persisted state stand in for it, so a restart drops nothing."""
        static = self.static_workloads
        if static is None:
            static = {n: w for n, w in self.desired.workloads.items() if w.source != HUB_SOURCE}
        merged = dict(self.hub_source.workloads) if self.hub_source is not None else {}
        merged.update(static)
        changed = self.desired.replace(merged)
        if self.discovery is not None:
            hub_policies = self.hub_source.policies if self.hub_source is not None else ()
            self.discovery.set_policies([*self.static_policies, *hub_policies])
        if changed:
            log.info(
                "desired state accepted",
                generation=self.desired.generation,
                changed=",".join(sorted(changed)),
            )
            self.refresh_routes()
            for name in changed:
                self.workload_queue.add(name)
            self.notifier.status(self._status_line())
        self.collect_garbage()

    async def apply_hub_state(self, state: Any, fetch: Any) -> Any:
        """Apply a DesiredState from the hub (the hub link calls this); see sources/hub.py."""
        from edged.hublink.linking import Applied

        assert self.hub_source is not None
        self.syncing += 1
        try:
            result = await self.hub_source.apply(
                state.generation,
                list(state.manifests),
                list(state.artifact_metadata),
                list(state.rollback_allowances),
                fetch,
            )
        finally:
            self.syncing -= 1
        if not result.stale and not result.retry:
            self.accept_desired()
        return Applied(self.hub_source.generation, retry=result.retry)

    def hub_report(self) -> Any:
        """What the hub link tells the hub about this device (Hello and Status)."""
        from edged.hublink.linking import DeviceReport
        from edgefleet.v1 import common_pb2, device_pb2

        dev = self.discovery.status() if self.discovery is not None else {}
        health = dev.get("health") or {}
        workloads = []
        for name, w in sorted(self.desired.workloads.items()):
            if w.source != HUB_SOURCE:
                continue
            st = self.board.workload_status(name)
            workloads.append(
                device_pb2.WorkloadStatus(
                    name=name,
                    revision=st.revision if st else "",
                    ready_replicas=st.ready_replicas if st else 0,
                    desired_replicas=st.desired_replicas if st else 0,
                    model_version=w.deployment.spec.model.version,
                    conditions=[
                        common_pb2.Condition(
                            type=c.type, status=c.status.value, reason=c.reason, message=c.message
                        )
                        for c in (st.conditions if st else ())
                    ],
                )
            )
        for p in self.hub_source.problems if self.hub_source is not None else ():
            if p.workload and not any(x.name == p.workload for x in workloads):
                workloads.append(
                    device_pb2.WorkloadStatus(
                        name=p.workload,
                        conditions=[
                            common_pb2.Condition(
                                type="Ready", status="False", reason=p.reason, message=p.message
                            )
                        ],
                    )
                )
        return DeviceReport(
            inventory={
                "facts": dev.get("facts"),
                "accelerators": dev.get("accelerators", []),
                "executionProviders": dev.get("executionProviders"),
            },
            labels=dict(dev.get("labels") or {}),
            schedulable=bool(health.get("schedulable", True)),
            reasons=tuple(health.get("reasons", ())),
            workloads=tuple(workloads),
        )

    async def answer_challenge(self, nonce: bytes) -> bytes:
        """Signed evidence of what this device runs, for the hub's attestation controller."""
        from edged.trust.attesting import Attester
        from edged.trust.identity import load_or_create_identity

        def answer() -> bytes:
            if self._attester is None:
                self._attester = Attester(load_or_create_identity(self.data_dir, tpm="off"))
            evidence = self._attester.answer(
                nonce,
                now=time.time(),
                config_path=self.config_path,
                trust_root_path=self.gate.root_path if self.gate.root_path.exists() else None,
                model_digests=sorted({w.sha256 for w in self.desired.workloads.values()}),
            )
            return orjson.dumps(evidence)

        return await asyncio.to_thread(answer)

    def enqueue_workloads(self) -> None:
        """Accelerators changed: every workload looks again (events only enqueue keys)."""
        for name in set(self.desired.workloads) | self.pool.workloads():
            self.workload_queue.add(name)

    def enqueue_all(self) -> None:
        for name in set(self.desired.workloads) | self.pool.workloads():
            self.workload_queue.add(name)
        if self.source is not None:
            self.source_queue.add(SOURCE_KEY)

    def collect_garbage(self) -> None:
        if self.syncing:  # a source may have stored an artifact it has not handed over yet
            return
        keep = {w.sha256 for w in self.desired.workloads.values()}
        keep |= {r.spec.artifact_sha256 for r in self.pool.replicas()}
        self.store.collect_garbage(keep)

    def request_refetch(self) -> None:
        """An artifact of the desired state is missing from the store: ask its source again."""
        if self.source is not None:
            self.source_queue.add(SOURCE_KEY)
        if self.hub_source is not None and self.hub_link is not None:
            self.hub_source.refetch_requested = True
            self.hub_link.reapply()

    # -- lifecycle ------------------------------------------------------------------------
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._request_stop, sig)
        try:
            self.desired.load()
        except StateError as exc:
            # Atomic writes make this unexpected (disk corruption, hand edits): say so loudly
            # and start empty rather than not at all; the source will provide state again.
            log.error("persisted desired state unreadable, starting empty", error=str(exc))
        self.board.loaded = True
        self.refresh_routes()
        cfg = self.config
        status_server = HttpServer(
            StatusHandler(self.board, self.registry, alive=lambda: True).handle, max_body=1 << 16
        )
        infer_server = HttpServer(self.router.handle, max_body=cfg.inference.max_request_bytes)
        try:
            await status_server.listen_unix(cfg.paths.status_socket)
            await infer_server.listen_unix(cfg.paths.inference_socket)
            if cfg.inference.listen_tcp is not None:
                tcp = cfg.inference.listen_tcp
                await infer_server.listen_tcp(tcp.host, tcp.port)
        except OSError as exc:
            # Typically another edged on the same data dir: say so, leave its sockets, exit.
            log.error("cannot open sockets", error=str(exc))
            status_server.stop_accepting()
            infer_server.stop_accepting()
            return 1
        log.info(
            "edged started",
            data_dir=str(self.data_dir),
            generation=self.desired.generation,
            workloads=len(self.desired.workloads),
            limits=self.limits_mode,
            status_socket=str(cfg.paths.status_socket),
            inference_socket=str(cfg.paths.inference_socket),
        )
        # systemd (Type=notify): ready once persisted state is loaded and the status socket is
        # up; the watchdog pings come from this loop, so a stuck loop gets the service restarted
        self.notifier.ready(self._status_line())
        watchdog_stop = asyncio.Event()
        watchdog = asyncio.ensure_future(WatchdogPinger(self.notifier).run(watchdog_stop))
        if cfg.trust.allow_unsigned:
            log.warning(
                "trust.allowUnsigned is set: unsigned artifacts are accepted (development only)"
            )
        if self.discovery is not None:
            await self.discovery.prepare()  # before the first plan: providers are in revisions
        for name in self.desired.workloads:
            self.workload_queue.add(name)

        components_stop = asyncio.Event()
        components: list[object] = [
            Runner(
                "workloads",
                WorkloadReconciler(self),
                self.workload_queue,
                workers=cfg.reconcile.workers,
                metrics=self.registry,
            ),
            Resync(self, cfg.reconcile.resync_period_s),
        ]
        if self.discovery is not None:
            components.append(self.discovery)
        if self.hub_source is not None:
            from edged.hublink.linking import HubLink

            hub_source = self.hub_source
            self.accept_desired()  # hub.json may be newer than desired.json after a crash
            link = HubLink(
                self.link_files,
                apply_state=self.apply_hub_state,
                report=self.hub_report,
                generation=lambda: hub_source.generation,
                answer_challenge=self.answer_challenge,
            )
            self.hub_link = link
            self.board.hub_status = lambda: {**link.status(), **hub_source.status()}
            components.append(link)
        watcher = None
        if self.source is not None:
            components.append(
                Runner(
                    "source",
                    SourceReconciler(self, self.source),
                    self.source_queue,
                    workers=1,
                    metrics=self.registry,
                )
            )
            self.source_queue.add(SOURCE_KEY)
            watcher = DirectoryWatcher(
                self.source.directory, lambda: self.source_queue.add_after(SOURCE_KEY, 0.2)
            )
            if not watcher.start():
                log.warning(
                    "no inotify: manifest changes are seen at the next resync",
                    period=cfg.reconcile.resync_period_s,
                )
        supervisor = asyncio.ensure_future(
            supervise(
                components,  # type: ignore[arg-type]
                components_stop,
                critical={"workloads", "source"} & {c.name for c in components},  # type: ignore[attr-defined]
            )
        )
        stop_wait = asyncio.ensure_future(self.stop_event.wait())
        await asyncio.wait([supervisor, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        code = 0
        if supervisor.done() and supervisor.exception() is not None:
            log.error("a critical component failed", error=str(supervisor.exception()))
            code = 1

        # -- shutdown, in order --------------------------------------------------------------
        log.info("edged stopping")
        self.notifier.stopping("stopping: draining inference requests")
        self.board.draining = True
        infer_server.stop_accepting()
        drained = await infer_server.drain(DRAIN_TIMEOUT_S)
        if not drained:
            log.warning("in-flight requests did not finish in time", timeout=DRAIN_TIMEOUT_S)
        if watcher is not None:
            watcher.stop()
        components_stop.set()
        if not supervisor.done():
            await supervisor
        stop_wait.cancel()
        await self.pool.shutdown()
        self.board.persist()
        status_server.stop_accepting()
        await status_server.drain(1.0)
        watchdog_stop.set()
        await watchdog
        log.info("edged stopped")
        return code

    def _status_line(self) -> str:
        """The one line ``systemctl status`` shows (sd_notify ``STATUS=``)."""
        return f"generation {self.desired.generation}, {len(self.desired.workloads)} workloads"

    def _ready(self) -> bool:
        return self.board.ready()

    def _request_stop(self, sig: signal.Signals) -> None:
        if not self.stop_event.is_set():
            log.info("signal received", signal=sig.name)
            self.stop_event.set()
