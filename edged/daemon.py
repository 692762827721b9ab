"""edged run: builds the parts, connects them, and owns start-up and shutdown order.

Wiring only: each job is in its part's module, and each part gets what it needs from the
others as explicit arguments (functions, mostly); an event several parts hear of is fanned
out by an ``_on_*`` method here.

Start-up: validate config -> load the persisted desired state -> open the status and
inference sockets -> tell systemd READY=1 (and ping its watchdog from the main loop, see
edgefleet/notifying.py) -> start replicas for the persisted workloads (no manifest read, no hub
needed) -> then read the manifests directory. Shutdown (SIGTERM/SIGINT): STOPPING=1 to
systemd -> become unready -> stop accepting inference connections -> drain in-flight requests
-> stop the controllers -> drain and stop workers -> persist status -> exit 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edged import __version__
from edged.agent.controller import KEY as AGENT_KEY
from edged.agent.controller import AgentController
from edged.agent.planning import Health
from edged.compliance.checking import DriftAction, hold_reason
from edged.compliance.drift import DriftWatch, IngressRules
from edged.compliance.remediating import Remediator
from edged.config import EdgedConfig, ServiceDirs
from edged.discovery.discovering import Discovery
from edged.discovery.power import PowerReader
from edged.hublink.attaching import hub_link, hub_source
from edged.hublink.files import LinkFiles
from edged.hublink.gathering import ReportGatherer
from edged.reconcile.applying import Applier
from edged.reconcile.evicting import EvictionPolicy
from edged.reconcile.reconciling import (
    STATIC_KEY,
    Resync,
    StaticSourceReconciler,
    WorkloadReconciler,
)
from edged.reconcile.running import Runner
from edged.reconcile.sizing import Sizer
from edged.runtime.adopting import WorkerRecords
from edged.runtime.baselining import SecurityInForce
from edged.runtime.delegating import (
    delegate,
    keep_blocker,
    read_delegate_subgroup,
    read_launcher_cleanup,
    unit_of,
)
from edged.runtime.identities import configured_uids
from edged.runtime.privileges import warn_missing_capabilities
from edged.runtime.processes import Replica
from edged.runtime.sandboxing import accelerator_nodes
from edged.runtime.securing import DeviceSecurity
from edged.runtime.workerpool import WorkerPool
from edged.serving.counting import Counters
from edged.serving.inference import InferenceRouter
from edged.serving.measuring import RevisionMeters
from edged.serving.sharedmemory import SharedMemory
from edged.serving.sockets import Sockets
from edged.sources.inotify import DirectoryWatcher
from edged.sources.static import StaticManifests, SyncResult
from edged.state.accepting import Acceptor
from edged.state.collecting import ArtifactCollector, artifacts_in_use
from edged.state.desired import DesiredState
from edged.state.locking import lock_data_dir
from edged.state.merging import MergedState, SourceState, static_workloads
from edged.state.modelconfigs import config_root, config_volumes, static_device_name
from edged.state.quarantining import BlobQuarantine
from edged.statusboard import StatusBoard
from edged.trust.admitting import ArtifactGate
from edged.trust.attesting import LoadMeasurer, MeasurementLog
from edged.trust.secrets import default_root as default_secrets_root
from edged.workloads import WorkloadName
from edgefleet.artifacts.storing import ArtifactStore
from edgefleet.errors import StateError
from edgefleet.logs import get_logger
from edgefleet.metrics import Registry
from edgefleet.notifying import Notifier, WatchdogPinger, take_listen_fds
from edgefleet.supervising import supervise
from edgefleet.workqueue import WorkQueue

if TYPE_CHECKING:
    from edged.hublink.agentreleases import FetchRelease
    from edged.hublink.linking import HubLink

log = get_logger(__name__)

DRAIN_TIMEOUT_S = 20.0


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
        # workers outlive this edged (runtime/adopting.py): decided before NOTIFY_SOCKET goes
        self.keep_workers = config.workers.keeps_workers(os.environ)
        # the sockets the previous edged stored (LISTEN_FDS: systemd's or the launcher's store)
        inherited = take_listen_fds(os.environ)
        # Only edged talks to systemd: worker processes must not inherit the socket.
        os.environ.pop("NOTIFY_SOCKET", None)
        self.config = config
        data = Path(config.paths.data_dir)
        self.data_dir = data
        data.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock = lock_data_dir(data)
        self.registry = Registry()
        self.meters = RevisionMeters(
            period=config.inference.metrics_period_s,
            latency_window=config.inference.latency_window_s,
        )
        self.store = ArtifactStore(data / "artifacts")
        self.desired = DesiredState(data / "state" / "desired.json")
        # edged into its supervisor leaf, workers below <delegated>/workloads (delegating.py)
        self.cgroups = delegate(str(config.workers.cgroup_root))
        self.keep_problem = ""  # why workers do not outlive this edged although asked to
        if self.keep_workers:
            unit = unit_of(self.cgroups.delegated) if self.cgroups.usable else ""
            self.keep_problem = keep_blocker(
                self.cgroups,
                delegate_subgroup=read_delegate_subgroup(unit) if unit else None,
                launcher_cleanup=read_launcher_cleanup(unit, dict(os.environ)),
            )
            if self.keep_problem:
                log.error(
                    "workers stop with edged: keepOnExit not in force", reason=self.keep_problem
                )
                self.keep_workers = False
        warn_missing_capabilities()  # the unit's CapabilityBoundingSet= (packaging/systemd)
        self.limits_mode = self.cgroups.limits_mode
        reconcile = config.reconcile
        self.workload_queue: WorkQueue[WorkloadName] = WorkQueue(
            "workloads", base_delay=reconcile.backoff_base_s, max_delay=reconcile.backoff_max_s
        )
        self.source_queue: WorkQueue[str] = WorkQueue(
            "source", base_delay=reconcile.backoff_base_s, max_delay=reconcile.backoff_max_s
        )
        # edged's measurements in a PCR (docs/trust.md): one event log, extended when a worker
        # starts loading a model and before each attestation quote
        trust = config.trust
        self.measurement_log = (
            None
            if trust.measurement_pcr is None
            else MeasurementLog(trust.measurement_log, trust.measurement_pcr)
        )
        self.pool = WorkerPool(
            measure=(
                None
                if self.measurement_log is None
                else LoadMeasurer(data, tpm=trust.tpm, measurement=self.measurement_log)
            ),
            notify=self.workload_queue.add,
            on_serving_change=self._on_serving_change,
            on_result=self._on_result,
            on_artifact_rotten=self._on_artifact_rotten,
            # late-bound: the counters read the board, which reads the pool
            on_restart=lambda rep: self.counters.restarted(rep),  # noqa: PLW0108
            on_batches=lambda rep, delta: self.counters.batched(rep, delta),  # noqa: PLW0108
            on_overlap=lambda rep, delta: self.counters.overlapped(rep, delta),  # noqa: PLW0108
            on_answers=lambda rep, delta: self.counters.worker_answered(rep, delta),  # noqa: PLW0108
            python=str(config.workers.python_executable),
            uids=configured_uids(
                config.workers, edged_root=os.geteuid() == 0, edged_python=Path(sys.executable)
            ),
            records=WorkerRecords(data / "state" / "workers"),
            keep=self.keep_workers,
            orphan_timeout_s=config.workers.orphan_timeout_s,
        )
        self.blobs = BlobQuarantine(self.store, enqueue=self.workload_queue.add)
        # -- worker sandboxes (docs/security.md): edged.toml, then the accepted baselines --
        self.security = SecurityInForce(
            DeviceSecurity.from_config(config.workers, edged_root=os.geteuid() == 0),
            data / "state" / "baselines.json",
            on_change=self._on_security_changed,
        )
        # -- secrets (docs/security.md): the values hub Secrets give workloads, on a tmpfs --
        self.secrets_root = config.secrets.dir or default_secrets_root(
            data, ServiceDirs.from_environ(os.environ).runtime
        )
        self.applier = Applier(
            self.pool,
            secret_root=self.secrets_root,
            config_root=config_root(data),
            artifact_path=self.store.path_for,
            request_refetch=self._request_refetch,
            cgroup_root=self.cgroups.workloads,
            log_level=config.log_level,
            security=self.security,
            device_paths=accelerator_nodes(),
            hold=self._held_reason,
        )
        self.board = StatusBoard(
            data / "state" / "status.json",
            desired=self.desired,
            pool=self.pool,
            limits_mode=self.limits_mode,
            limits_problem=self.cgroups.problem,
            allow_unsigned=config.trust.allow_unsigned,
            manifests_dir=manifests,
        )
        self.counters = Counters(
            self.registry,
            meters=self.meters,
            board=self.board,
            desired=self.desired,
            replicas=self.pool.replicas,
        )
        shm = None
        if config.inference.shared_memory_regions:  # the OIP system shared-memory extension
            shm = SharedMemory(
                max_regions=config.inference.shared_memory_regions,
                max_bytes=config.inference.shared_memory_bytes,
            )
            shm.export(self.registry)
        self.router = InferenceRouter(
            ready=self.board.ready,
            max_request_bytes=config.inference.max_request_bytes,
            refused=self.counters.refused,
            shared_memory=shm,
        )
        self.pool.direct = self.router  # connections handed to workers, and back
        self.sockets = Sockets(
            config.paths,
            config.inference,
            board=self.board,
            registry=self.registry,
            router=self.router,
            counters=self.counters,
            security=self.security,
            inherited=inherited,
            store=self.notifier.store_fd if self.notifier.enabled else None,
            unstore=self.notifier.remove_fd if self.notifier.enabled else None,
        )
        # -- drift (docs/security.md): what differs from what edged made ---------------------
        self.drift: DriftWatch
        self.remediator = Remediator(
            data / "state" / "quarantine.json",
            self.store,
            self.pool,
            workloads=lambda: self.desired.workloads,
            findings=lambda: self.drift.findings,
            rotten=self._on_artifact_rotten,
            device_changed=self.board.device_changed,
            enqueue_workloads=self._enqueue_workloads,
        )
        self.drift = DriftWatch(
            blobs=self.store.root / "sha256",
            config_path=config_path,
            action=lambda: DriftAction(self.security.current.drift_action),
            period=lambda: self.security.current.drift_period_s,
            act=self.remediator.remediate,
            on_change=self.remediator.drift_changed,
            ingress=lambda: IngressRules(
                self.security.current.tcp_ports,
                (str(config.paths.inference_socket), str(config.paths.status_socket)),
            ),
            started=lambda: self.pool.started_pids,
        )
        self.sizer = Sizer(
            workloads=lambda: self.desired.workloads,
            replicas=self.pool.replicas,
            enqueue=self.workload_queue.add,
            period_s=config.scaling.sample_period_s,
            eviction=EvictionPolicy.from_config(config.eviction),
            cpu_count=len(os.sched_getaffinity(0)),
        )
        self.board.source_synced = manifests is None
        self.board.keep_workers = {"inForce": self.keep_workers, "problem": self.keep_problem}
        self.board.sizing_status = self.sizer.status
        self.board.memory_status = self.sizer.device_status
        self.board.compliance = self._compliance
        self.stop_event = asyncio.Event()
        # -- trust (docs/trust.md): every artifact passes the gate before the store ----------
        self.gate = ArtifactGate.from_config(data, config.trust, self.registry)
        self.board.trust_status = self.gate.status
        # -- the sources of desired state, and what accepts their merge ----------------------
        self.source = (
            StaticManifests(
                manifests,
                self.store,
                max_artifact_bytes=4 << 30,
                gate=self.gate,
                configs=config_volumes(data),
                device_name=static_device_name(data),
                labels=config.device.labels,
            )
            if manifests is not None
            else None
        )
        self.link_files = LinkFiles(data)
        self.hub_source = hub_source(
            self.link_files, self.store, self.gate, config=config, secrets_root=self.secrets_root
        )
        self.collector = ArtifactCollector(self.store, in_use=self._artifacts_in_use)
        hub = self.hub_source
        self.acceptor = Acceptor(
            self.desired,
            static_read=manifests is None,
            hub=(lambda: SourceState(hub.workloads, hub.policies)) if hub is not None else None,
            on_accepted=self._on_accepted,
        )
        # -- discovery (accelerators, health, labels) --
        self.discovery: Discovery | None = None
        if config.discovery.enabled:
            self.discovery = Discovery(
                data_dir=data,
                python=str(config.workers.python_executable),
                health_period_s=config.discovery.health_period_s,
                configured_providers=config.discovery.execution_providers,
                config_labels=config.device.labels,
                on_accelerators_changed=self._enqueue_workloads,
                on_status_changed=self.board.device_changed,
            )
            self.board.device_status = self.discovery.status
        # -- edged updating itself (docs/agent-updates.md, "On the device") --
        self.agent_queue: WorkQueue[str] = WorkQueue(
            "agent", base_delay=reconcile.backoff_base_s, max_delay=reconcile.backoff_max_s
        )
        self.components_running = False  # set once the supervisor runs the components
        self.agent = AgentController(
            data,
            version=__version__,
            config_path=config_path,
            notify=self.notifier.send,
            fetch=None,  # made once the hub link exists (below)
            health=self._agent_health,
            serving=self._serving_workloads,
            request_stop=self._agent_stop,
            enqueue=lambda: self.agent_queue.add(AGENT_KEY),
        )
        self.board.agent_status = self.agent.status
        # -- the hub link (docs/edged.md, "The hub link"), once enrolled --
        self.hub_link: HubLink | None = None
        if self.hub_source is not None:
            discovery = self.discovery
            self.hub_link = hub_link(
                self.link_files,
                self.hub_source,
                config=config,
                config_path=config_path,
                on_accepted=self.acceptor.accept_in_thread,
                syncing=self.collector.syncing,
                report=ReportGatherer(
                    device=discovery.status if discovery is not None else dict,
                    desired=self.desired,
                    board=self.board,
                    source=self.hub_source,
                    meters=self.meters,
                    pool=self.pool,
                    sizer=self.sizer,
                    compliance=self._compliance,
                    agent=self.agent.status,
                ).report,
                trust_root_path=self.gate.root_path,
                model_digests=lambda: [w.sha256 for w in self.desired.workloads.values()],
                measurement=self.measurement_log,
                worker_records=self.pool.output_records,
                on_agent=self.agent.desired_changed,
            )
            self.agent.set_fetch(self._agent_fetch())
            self.board.hub_status = self.hub_link.status
            self.board.device_name = self.hub_link.link.device_name  # the hub's name for it

    # -- connections between the parts ----------------------------------------------------
    def _on_result(self, rep: Replica, status: int, seconds: float) -> None:
        self.counters.answered(rep, status, seconds)
        self.sizer.meter.answered(rep.workload, seconds)

    def _on_serving_change(self, rep: Replica, ready: bool) -> None:
        self.router.replica_ready(rep, ready)
        self.counters.serving_changed(rep)
        if self.agent.running.trial:  # a release on trial may commit now
            self.agent_queue.add(AGENT_KEY)

    def _on_artifact_rotten(self, workload: WorkloadName, sha256: str) -> None:
        """A worker refused a blob whose bytes no longer match its digest: check it among
        the pool's tasks (its shutdown waits for them)."""
        self.pool.track(asyncio.ensure_future(self.blobs.check(workload, sha256)))

    async def _on_static_read(self, result: SyncResult) -> None:
        self.board.set_source(result.problems, result.files)
        await self.acceptor.static_read_in_thread(
            result.workloads, result.policies, result.baselines
        )
        # synced once what it read is accepted: edged is not ready before its workloads are
        self.board.source_synced = True

    def _on_accepted(self, merged: MergedState, changed: set[WorkloadName]) -> None:
        """A merge of the sources was accepted: health policies, baselines, routes, changed
        keys, GC."""
        if self.discovery is not None:
            self.discovery.set_policies(merged.policies)
        self.sizer.desired_changed()
        self.security.accept(merged.baselines)
        if changed:
            self.router.route(self.desired.workloads)
            for name in changed:
                self.workload_queue.add(name)
            self.notifier.status(self._status_line())
        self.collector.collect()

    def _on_security_changed(self, security: DeviceSecurity) -> None:
        """Workers whose sandbox changed restart; the ingress follows the baselines."""
        self.applier.restart_outdated_sandboxes(self.desired.get, security)
        self.sockets.baselines_changed()

    def _enqueue_workloads(self) -> None:
        """Every workload looks again (accelerators changed; events only enqueue keys)."""
        for name in set(self.desired.workloads) | self.pool.workloads():
            self.workload_queue.add(name)

    def _enqueue_all(self) -> None:
        self._enqueue_workloads()
        if self.source is not None:
            self.source_queue.add(STATIC_KEY)

    def _request_refetch(self) -> None:
        """An artifact of the desired state is missing from the store: ask its source again."""
        if self.source is not None:
            self.source_queue.add(STATIC_KEY)
        if self.hub_link is not None:
            self.hub_link.refetch()

    def _artifacts_in_use(self) -> set[str]:
        return artifacts_in_use(
            self.desired.workloads,
            held=self.hub_source.held if self.hub_source is not None else (),
            running=(r.spec.artifact_sha256 for r in self.pool.replicas()),
        )

    def _held_reason(self) -> str | None:
        security = self.security.current
        return hold_reason(
            quarantined=self.remediator.quarantined_reason(),
            open_watch_reason=self.drift.open_watch_reason,
            require_open_watch=security.require_open_watch,
            baselines=security.baselines,
        )

    def _agent_health(self) -> Health:
        """What a release on trial needs before it commits (edged.agent.planning)."""
        link = self.hub_link
        return Health(
            connected=link is None or link.connected,  # a device with no hub: none to reach
            state_loaded=self.board.loaded,
            reconcile_running=self.components_running,
            serving=frozenset(self._serving_workloads()),
        )

    def _serving_workloads(self) -> set[str]:
        """The workloads with a ready replica now."""
        out = set()
        for name in self.desired.workloads:
            status = self.board.workload_status(name)
            if status is not None and status.ready_replicas > 0:
                out.add(str(name))
        return out

    def _agent_fetch(self) -> FetchRelease | None:
        link, source = self.hub_link, self.hub_source
        if link is None or source is None or source.tuf is None:
            return None
        from edged.hublink.agentreleases import make_fetch

        return make_fetch(
            self.data_dir,
            link=lambda: link.fetcher,
            tuf=source.tuf,
            gate=self.gate,
            progress=self.agent.progress,
        )

    def _agent_stop(self, why: str) -> None:
        """The agent controller asked the launcher for a switch: edged stops (exit 0) and the
        launcher starts the slot asked for."""
        if not self.stop_event.is_set():
            log.info("stopping for the launcher", why=why)
            self.stop_event.set()

    def _compliance(self) -> dict[str, Any]:
        return self.drift.status(quarantined=self.remediator.quarantined_reason())

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
        self.router.route(self.desired.workloads)
        await self._adopt_workers()  # those the last edged left running, before any start
        cfg = self.config
        # built before the sockets open, so that status shows every part (the hub link's
        # section included) from its first answer
        self.drift.start_open_watch()  # before any worker opens its model
        components = self._components()
        if not await self.sockets.open():
            return 1  # typically another edged on the same data dir: it keeps its sockets
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
        watcher = None
        if self.source is not None:
            self.source_queue.add(STATIC_KEY)
            watcher = DirectoryWatcher(
                self.source.directory, lambda: self.source_queue.add_after(STATIC_KEY, 0.2)
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
        self.components_running = True
        self.agent_queue.add(AGENT_KEY)
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
        await self.sockets.drain_inference(DRAIN_TIMEOUT_S)
        if watcher is not None:
            watcher.stop()
        components_stop.set()
        if not supervisor.done():
            await supervisor
        stop_wait.cancel()
        await self.pool.shutdown(keep=self.keep_workers)
        self.board.persist()
        await self.sockets.close_status()
        watchdog_stop.set()
        await watchdog
        log.info("edged stopped")
        return code

    async def _adopt_workers(self) -> None:
        """Adopt the workers a previous edged left running that prove to be what their
        records say and run what is desired (runtime/adopting.py)."""
        workloads = self.desired.workloads
        refused = await self.pool.adopt(
            {n: frozenset({w.sha256, *w.extras.values()}) for n, w in workloads.items()},
            lambda name: workloads[WorkloadName(name)].deployment.spec.probes,
        )
        adopted = len(self.pool.replicas())
        if adopted or refused:
            log.info("kept workers", adopted=adopted, refused=len(refused))

    def _components(self) -> list[object]:
        """The supervised components, each given what it needs."""
        cfg = self.config
        components: list[object] = [
            Runner(
                "workloads",
                WorkloadReconciler(
                    desired=self.desired.get,
                    observe=self.pool.observe,
                    has_artifact=self.store.has,
                    quarantined=self.blobs.holds,
                    select_providers=self.discovery.select if self.discovery else None,
                    record_status=self.board.set_workload,
                    apply=self.applier.apply,
                    size=self.sizer.size,
                    power=PowerReader(cfg.power.time_zone).read,
                ),
                self.workload_queue,
                workers=cfg.reconcile.workers,
                metrics=self.registry,
            ),
            Resync(self._enqueue_all, cfg.reconcile.resync_period_s),
            self.sizer,
            # edged's own release: one key, one worker; a download may take a while
            Runner(
                "agent",
                self.agent,
                self.agent_queue,
                workers=1,
                metrics=self.registry,
                timeout=3600.0,
            ),
        ]
        if self.discovery is not None:
            components.append(self.discovery)
        components.append(self.drift)
        if self.hub_link is not None:
            self.acceptor.accept()  # hub.json may be newer than desired.json after a crash
            components.append(self.hub_link)
        if self.source is not None:
            components.append(
                Runner(
                    "source",
                    StaticSourceReconciler(
                        self.source,
                        current=lambda: static_workloads(self.desired.workloads),
                        syncing=self.collector.syncing,
                        accept=self._on_static_read,
                    ),
                    self.source_queue,
                    workers=1,
                    metrics=self.registry,
                )
            )
        return components

    def _status_line(self) -> str:
        """The one line ``systemctl status`` shows (sd_notify ``STATUS=``)."""
        return f"generation {self.desired.generation}, {len(self.desired.workloads)} workloads"

    def _request_stop(self, sig: signal.Signals) -> None:
        if not self.stop_event.is_set():
            log.info("signal received", signal=sig.name)
            self.stop_event.set()
