"""edged run: builds the parts, connects them, and owns start-up and shutdown order.

Each part gets what it needs from the others as explicit arguments (functions, mostly);
the connections that take more than one line are the ``_on_*`` methods here.

Start-up: validate config -> load the persisted desired state -> open the status and
inference sockets -> tell systemd READY=1 (and ping its watchdog from the main loop, see
edgefleet/notifying.py) -> start replicas for the persisted workloads (no manifest read, no hub
needed) -> then read the manifests directory. Shutdown (SIGTERM/SIGINT): STOPPING=1 to
systemd -> become unready -> stop accepting inference connections -> drain in-flight requests
-> stop the controllers -> drain and stop workers -> persist status -> exit 0.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edged.compliance.checking import DriftAction, Remediation
from edged.compliance.watching import DriftWatch, IngressRules
from edged.config import EdgedConfig, ServiceDirs
from edged.discovery.discovering import Discovery
from edged.discovery.power import PowerReader
from edged.hublink.files import LinkFiles
from edged.hublink.reporting import DeviceReport, SandboxReport, build_device_report
from edged.reconcile.applying import Applier
from edged.reconcile.evicting import EvictionPolicy
from edged.reconcile.queueing import WorkQueue
from edged.reconcile.reconciling import (
    STATIC_KEY,
    Resync,
    StaticSourceReconciler,
    WorkloadReconciler,
)
from edged.reconcile.running import Runner
from edged.reconcile.sizing import Sizer
from edged.reporting import StatusBoard
from edged.runtime.delegating import delegate
from edged.runtime.identities import UidRange, WorkerUids, runtime_blocker
from edged.runtime.limiting import raise_open_files_limit
from edged.runtime.privileges import warn_missing_capabilities
from edged.runtime.processes import Replica, WorkerPool
from edged.runtime.sandboxing import accelerator_nodes
from edged.runtime.securing import (
    DeviceSecurity,
    choose_sandbox,
    outdated_sandboxes,
    plan_ingress,
    resolve_peers,
)
from edged.serving.bounding import connection_caps
from edged.serving.http import HttpServer, ServerLimits
from edged.serving.inference import InferenceMetrics, InferenceRouter
from edged.serving.measuring import BenchmarkResult, RevisionMeters, ValidationResult
from edged.serving.peers import PeerGate
from edged.serving.status import StatusHandler
from edged.sources.hub import HubSource
from edged.sources.static import StaticManifests, SyncResult
from edged.sources.watching import DirectoryWatcher
from edged.state.accepting import Acceptor
from edged.state.baselines import load_baselines, save_baselines
from edged.state.collecting import ArtifactCollector
from edged.state.desired import DesiredState
from edged.state.merging import MergedState, SourceState, static_workloads
from edged.trust.admitting import ArtifactGate
from edged.trust.attesting import ChallengeAnswerer, LoadMeasurer, MeasurementLog
from edged.trust.secrets import SecretVolumes
from edged.trust.secrets import default_root as default_secrets_root
from edged.workloads import ReplicaId, WorkloadName, serving_order
from edgefleet.artifacts.storing import ArtifactStore
from edgefleet.errors import EdgefleetError, StateError
from edgefleet.logs import get_logger
from edgefleet.metrics import Registry
from edgefleet.notifying import Notifier, WatchdogPinger
from edgefleet.persisting import read_json, write_json_atomic
from edgefleet.supervising import supervise

if TYPE_CHECKING:
    from edged.hublink.linking import HubLink

log = get_logger(__name__)

DRAIN_TIMEOUT_S = 20.0


class AlreadyRunning(EdgefleetError):
    """Another edged holds the data directory."""


def _counter_reader(server: HttpServer, key: str) -> Callable[[], float]:
    return lambda: float(server.counters()[key])


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
        self.meters = RevisionMeters(
            period=config.inference.metrics_period_s,
            latency_window=config.inference.latency_window_s,
        )
        self.store = ArtifactStore(data / "artifacts")
        self.desired = DesiredState(data / "state" / "desired.json")
        self.router = InferenceRouter(
            ready=self._ready,
            max_request_bytes=config.inference.max_request_bytes,
            refused=self._on_refused,
        )
        # edged into its supervisor leaf, workers below <delegated>/workloads (delegating.py)
        self.cgroups = delegate(str(config.workers.cgroup_root))
        warn_missing_capabilities()  # the unit's CapabilityBoundingSet= (packaging/systemd)
        self.cgroup_root = self.cgroups.workloads
        self.limits_mode = self.cgroups.limits_mode
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
            on_restart=self._on_restart,
            on_batches=lambda rep, delta: self._inference_metrics.batched(rep.workload, delta),
            python=str(config.workers.python_executable),
            uids=WorkerUids(
                UidRange(config.workers.uid_base, config.workers.uid_count),
                # the workers' onnxruntime must be readable to their uids (edged's Python)
                blocker=runtime_blocker()
                if os.geteuid() == 0 and config.workers.python_executable == Path(sys.executable)
                else "",
            ),
        )
        # -- worker sandboxes (docs/security.md): edged.toml, then the accepted baselines --
        self.baselines_path = data / "state" / "baselines.json"
        self.security = DeviceSecurity(
            sandbox=config.workers.sandbox,
            seccomp=config.workers.seccomp,
            separate_uids=config.workers.separate_uids,
            edged_root=os.geteuid() == 0,
        ).with_baselines(load_baselines(self.baselines_path))
        self.infer_server: HttpServer | None = None
        self._tcp_listener: asyncio.AbstractServer | None = None
        self._peer_gate: PeerGate | None = None  # infer.sock's per-connection user check
        self._ingress_tasks: set[asyncio.Future[None]] = set()
        # -- secrets (docs/security.md): the values hub Secrets give workloads, on a tmpfs --
        self.secrets_root = config.secrets.dir or default_secrets_root(
            data, ServiceDirs.from_environ(os.environ).runtime
        )
        self.applier = Applier(
            self.pool,
            secret_root=self.secrets_root,
            artifact_path=self.store.path_for,
            request_refetch=self._request_refetch,
            cgroup_root=self.cgroup_root,
            log_level=config.log_level,
            security=lambda: self.security,
            device_paths=accelerator_nodes(),
            hold=self._held_reason,
        )
        # -- drift (docs/security.md): what differs from what edged made ---------------------
        self.quarantine_path = data / "state" / "quarantine.json"
        self._was_quarantined = self.quarantine_path.exists()
        self.drift = DriftWatch(
            blobs=self.store.root / "sha256",
            config_path=config_path,
            action=lambda: DriftAction(self.security.drift_action),
            period=lambda: self.security.drift_period_s,
            act=self._remediate,
            on_change=self._on_drift_changed,
            ingress=lambda: IngressRules(
                self.security.tcp_ports,
                (str(config.paths.inference_socket), str(config.paths.status_socket)),
            ),
            started=lambda: self.pool.started_pids,
        )
        ev = config.eviction
        self.sizer = Sizer(
            workloads=lambda: self.desired.workloads,
            replicas=self.pool.replicas,
            enqueue=self.workload_queue.add,
            period_s=config.scaling.sample_period_s,
            eviction=EvictionPolicy(
                floor_bytes=ev.memory_available_floor,
                hysteresis_bytes=ev.memory_available_floor * ev.hysteresis_percent // 100,
                settle_s=ev.interval_s,
            )
            if ev.memory_available_floor > 0
            else None,
            cpu_count=len(os.sched_getaffinity(0)),
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
        self.board.source_synced = manifests is None
        self.board.sizing_status = self.sizer.status
        self.board.memory_status = self.sizer.device_status
        self.board.compliance = lambda: self.drift.status(quarantined=self._quarantined_reason())
        self.stop_event = asyncio.Event()
        self._init_metrics()
        # -- trust (docs/trust.md): every artifact passes the gate before the store ----------
        verifications = self.registry.counter(
            "edged_artifact_verifications_total",
            "Artifact verifications by result (accepted, unsigned, refused) and reason",
            ("result", "reason"),
        )
        from edged.trust.identity import resolve_tcti
        from edged.trust.tpmcounter import TpmCounter

        tcti = resolve_tcti(config.trust.tpm)
        self.gate = ArtifactGate(
            data,
            root_file=config.trust.root_file,
            allow_unsigned=config.trust.allow_unsigned,
            on_result=lambda result, reason: verifications.labels(
                result=result, reason=reason
            ).inc(),
            counter=TpmCounter(tcti) if tcti is not None else None,
        )
        self.board.trust_status = self.gate.status
        # -- the sources of desired state, and what accepts their merge ----------------------
        self.source = (
            StaticManifests(manifests, self.store, max_artifact_bytes=4 << 30, gate=self.gate)
            if manifests is not None
            else None
        )
        self.link_files = LinkFiles(data)
        self.hub_source: HubSource | None = None
        self.hub_link: HubLink | None = None
        if self.link_files.enrolled():
            from edged.trust.tufclient import TufClient

            self.hub_source = HubSource(
                data,
                self.store,
                self.gate,
                tuf=TufClient(data, required=config.trust.require_tuf),
                secrets=SecretVolumes(
                    self.secrets_root,
                    data_dir=data,
                    device_name=self.link_files.load().device_name,
                    allow_non_tmpfs=config.secrets.allow_non_tmpfs,
                    tpm=config.trust.tpm,
                    # workers of their own uid read them through a descriptor (security.md)
                    worker_uids=os.geteuid() == 0,
                ),
            )
        self.collector = ArtifactCollector(self.store, in_use=self._artifacts_in_use)
        hub_source = self.hub_source
        self.acceptor = Acceptor(
            self.desired,
            static_read=manifests is None,
            hub=(
                (lambda: SourceState(hub_source.workloads, hub_source.policies))
                if hub_source is not None
                else None
            ),
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

    def _init_metrics(self) -> None:
        r = self.registry
        self._inference_metrics = InferenceMetrics(r)
        self._m_restarts = r.counter(
            "edged_replica_restarts_total",
            "Worker processes started again in a replica slot (after an exit or a kill)",
            ("workload",),
        )
        self._m_ready = r.gauge("edged_replicas_ready", "Ready replicas", ("workload",))
        r.gauge(
            "edged_desired_generation", "Generation of the accepted desired state"
        ).set_function(lambda: float(self.desired.generation))
        r.gauge("edged_workloads", "Workloads in the desired state").set_function(
            lambda: float(len(self.desired.workloads))
        )

    def _server_metrics(self, servers: dict[str, HttpServer]) -> None:
        """What each socket's limits did (serving/http.py ServerLimits), read when scraped."""
        for key, name, help_text in (
            ("connections", "edged_http_connections", "Open connections"),
            ("bufferedBytes", "edged_http_buffered_request_bytes", "Request body bytes being read"),
            (
                "refusedConnections",
                "edged_http_refused_connections",
                "Connections refused at the cap",
            ),
            (
                "evictedIdleConnections",
                "edged_http_evicted_idle_connections",
                "Idle connections closed at the cap to make room",
            ),
            (
                "timedOutConnections",
                "edged_http_timed_out_connections",
                "Connections closed by a header, body or idle timeout",
            ),
            (
                "forbiddenConnections",
                "edged_http_forbidden_connections",
                "Connections refused (403) by the baselines' ingress users and groups",
            ),
        ):
            gauge = self.registry.gauge(name, help_text, ("socket",))
            for socket_name, server in servers.items():
                gauge.labels(socket=socket_name).set_function(_counter_reader(server, key))

    # -- connections between the parts ----------------------------------------------------
    def _on_result(self, rep: Replica, status: int, seconds: float) -> None:
        self._inference_metrics.answered(rep.workload, status, seconds)
        self.sizer.meter.answered(rep.workload, seconds)
        self.meters.answered(rep.workload, rep.revision, status, seconds)

    def _on_refused(self, workload: str, version: str | None) -> None:
        """The router answered a request of ``workload`` 503 itself: an error of the revision
        it would have served (of ``version``, when asked for; else the wanted one)."""
        self._inference_metrics.refused(workload)
        self.board.refused(WorkloadName(workload))
        st = self.board.workload_status(WorkloadName(workload))
        revision = st.revision if st is not None else ""
        if st is not None and version is not None:
            revision = next(
                (r.revision for r in st.revisions if r.model_version == version), revision
            )
        self.meters.refused(workload, revision)

    def _validation_of(self, workload: WorkloadName, revision: str) -> ValidationResult | None:
        """What a replica of that revision found on the validation set (slot 0's)."""
        for rep in self.pool.replicas(workload):
            if rep.revision == revision:
                found = ValidationResult.from_worker(rep.metadata.get("validation"))
                if found is not None:
                    return found
        return None

    def _benchmark_of(self, workload: WorkloadName, revision: str) -> BenchmarkResult | None:
        """The self-benchmark of a replica of that revision (the slowest one's p95)."""
        found = [
            b
            for rep in self.pool.replicas(workload)
            if rep.revision == revision
            and (b := BenchmarkResult.from_worker(rep.metadata.get("benchmark"))) is not None
        ]
        return max(found, key=lambda b: b.p95_s) if found else None

    def _on_serving_change(self, rep: Replica, ready: bool) -> None:
        self.router.replica_ready(rep, ready)
        self._m_ready.labels(workload=rep.workload).set(
            sum(1 for r in self.pool.replicas(rep.workload) if r.phase.value == "Ready")
        )

    def _on_restart(self, rep: Replica) -> None:
        self._m_restarts.labels(workload=rep.workload).inc()

    def _on_static_read(self, result: SyncResult) -> None:
        self.board.set_source(result.problems, result.files)
        self.board.source_synced = True
        self.acceptor.static_read(result.workloads, result.policies, result.baselines)

    def _on_accepted(self, merged: MergedState, changed: set[WorkloadName]) -> None:
        """A merge of the sources was accepted: health policies, routes, changed keys, GC."""
        if self.discovery is not None:
            self.discovery.set_policies(merged.policies)
        self.sizer.desired_changed()
        security = self.security.with_baselines(merged.baselines)
        if security != self.security:
            self.security = security
            save_baselines(self.baselines_path, merged.baselines)
            log.info(
                "security baselines accepted",
                baselines=",".join(security.baselines),
                require_sandbox=security.require_sandbox,
            )
            self._restart_outdated_sandboxes()
            if self.infer_server is not None:
                task = asyncio.ensure_future(self._apply_ingress())
                self._ingress_tasks.add(task)
                task.add_done_callback(self._ingress_tasks.discard)
        if changed:
            self._refresh_routes()
            for name in changed:
                self.workload_queue.add(name)
            self.notifier.status(self._status_line())
        self.collector.collect()

    def _refresh_routes(self) -> None:
        workloads = self.desired.workloads
        self.router.set_models(
            {
                model: tuple((w, workloads[w].deployment.spec.model.version) for w in names)
                for model, names in serving_order(workloads).items()
            }
        )

    def _enqueue_workloads(self) -> None:
        """Every workload looks again (accelerators changed; events only enqueue keys)."""
        for name in set(self.desired.workloads) | self.pool.workloads():
            self.workload_queue.add(name)

    def _enqueue_all(self) -> None:
        self._enqueue_workloads()
        if self.source is not None:
            self.source_queue.add(STATIC_KEY)

    def _artifacts_in_use(self) -> set[str]:
        keep = {w.sha256 for w in self.desired.workloads.values()}
        keep |= {sha for w in self.desired.workloads.values() for sha in w.extras.values()}
        if self.hub_source is not None:
            keep |= self.hub_source.held  # the previous version: going back needs no download
        return keep | {r.spec.artifact_sha256 for r in self.pool.replicas()}

    def _on_artifact_rotten(self, workload: WorkloadName, sha256: str) -> None:
        """A worker refused a blob whose bytes no longer match its digest: check it here
        (hashing off the loop) and quarantine it; the next plan of the workload then finds
        it missing, says so in a condition and asks its source for it again. Replicas of it
        already running keep serving: their model is in memory."""

        async def check() -> None:
            moved = await asyncio.to_thread(
                self.store.quarantine_if_rotten, sha256, now=time.time()
            )
            if moved is not None:
                log.error("rotten artifact quarantined", workload=workload, sha256=sha256)
            self.workload_queue.add(workload)

        self.pool.track(asyncio.ensure_future(check()))

    def _quarantined(self, sha256: str) -> bool:
        return sha256 in self.store.quarantined()

    def _restart_outdated_sandboxes(self) -> None:
        """The baselines changed: a worker whose sandbox would now differ is killed (and
        started again by its reconciler, under the new one)."""
        running = []
        for rep in self.pool.replicas():
            desired = self.desired.get(rep.workload)
            if desired is None or rep.pid is None:
                continue
            want = choose_sandbox(
                desired.deployment,
                rep.spec.providers,
                self.security,
                device_paths=self.applier.device_paths,
            )
            running.append((rep.id, rep.spec.sandbox, want))
        for replica_id in outdated_sandboxes(running):
            self.pool.kill(
                ReplicaId(replica_id),
                "SandboxChanged",
                "a SecurityBaseline changed: started again under the new sandbox",
            )

    def _held_reason(self) -> str | None:
        """Why no replica may start now: quarantine, or a baseline's
        ``drift.requireOpenWatch`` on a device where the open watch is not in force."""
        quarantined = self._quarantined_reason()
        if quarantined is not None:
            return quarantined
        why = self.drift.open_watch_reason
        if self.security.require_open_watch and why is not None:
            return (
                f"the SecurityBaseline {', '.join(self.security.baselines)} requires the open "
                f"watch (drift.requireOpenWatch) and it is not in force: {why}"
            )
        return None

    def _quarantined_reason(self) -> str | None:
        """Why this device is quarantined (drift under ``drift.action: quarantine``), until an
        operator removes ``D/state/quarantine.json``."""
        try:
            doc = read_json(self.quarantine_path)
        except (OSError, ValueError):
            return f"quarantined ({self.quarantine_path} is unreadable)"
        if doc is None:
            return None
        reason = doc.get("reason", "?")
        return f"quarantined after drift: {reason} (clear: remove {self.quarantine_path})"

    def _on_drift_changed(self) -> None:
        self.board.device_changed()
        quarantined = self.quarantine_path.exists()
        if self._was_quarantined and not quarantined:
            log.info("quarantine cleared")
            self._enqueue_workloads()
        self._was_quarantined = quarantined

    def _remediate(self, plan: Remediation) -> None:
        """Perform what the baselines' drift action asks (``plan_remediation`` decided)."""
        now = time.time()
        for name in plan.remove_files:
            target = self.store.root / "quarantine" / f"{name}.{int(now)}"
            try:
                os.replace(self.store.root / "sha256" / name, target)
                log.warning("drift remediated", action="moved to quarantine", path=str(target))
            except OSError as exc:
                log.error("drift not remediated", path=name, error=str(exc))
        for sha in plan.requarantine_blobs:
            try:
                os.chmod(self.store.path_for(sha), 0o444)
            except OSError:
                pass
            users = {w.name for w in self.desired.workloads.values() if w.sha256 == sha}
            users |= {r.workload for r in self.pool.replicas() if r.spec.artifact_sha256 == sha}
            for workload in sorted(users):
                self._on_artifact_rotten(workload, sha)
            for rep in self.pool.replicas():
                if rep.spec.artifact_sha256 == sha and rep.pid is not None:
                    self.pool.kill(rep.id, "ArtifactChanged", f"blob {sha} changed on disk")
        for pid in plan.kill_pids:
            try:
                os.kill(pid, signal.SIGKILL)
                log.warning("drift remediated", action="killed process", pid=pid)
            except ProcessLookupError:
                log.info("drift not remediated", pid=pid, reason="the process is gone")
            except OSError as exc:
                log.error("drift not remediated", pid=pid, error=str(exc))
        if plan.quarantine and not self.quarantine_path.exists():
            reason = "; ".join(f.message for f in self.drift.findings[:4])
            write_json_atomic(self.quarantine_path, {"at": now, "reason": reason})
            self._was_quarantined = True
            log.error("device quarantined", reason=reason)
            for rep in self.pool.replicas():
                self.pool.stop(rep.id)
            self.board.device_changed()

    async def _apply_ingress(self) -> None:
        """Give infer.sock the group and mode the baselines say, and serve the configured
        loopback TCP port only if they allow it (``plan_ingress``); status shows the result.
        OSError when the TCP port cannot be opened (at start: edged exits)."""
        tcp = self.config.inference.listen_tcp
        plan = plan_ingress(
            self.security, tcp_port=tcp.port if tcp else None, group_exists=_group_exists
        )
        problems = list(plan.problems)
        path = self.config.paths.inference_socket
        mode = plan.mode
        if plan.group is not None:
            try:
                os.chown(path, -1, _group_id(plan.group))
            except OSError as exc:
                problems.append(f"cannot give infer.sock to group {plan.group}: {exc.strerror}")
                mode &= 0o600
        os.chmod(path, mode)
        rules, unknown = resolve_peers(self.security, user_id=_user_id, group_id=_group_id_or_none)
        problems += [f"{p}: it lets no one in" for p in unknown]
        assert self.infer_server is not None
        if rules != (self._peer_gate.rules if self._peer_gate is not None else ()):
            self._peer_gate = PeerGate(rules, os.geteuid()) if rules else None
            self.infer_server.set_admit(self._peer_gate.admit if self._peer_gate else None)
        if plan.serve_tcp and tcp is not None and self._tcp_listener is None:
            assert self.infer_server is not None
            self._tcp_listener = await self.infer_server.listen_tcp(tcp.host, tcp.port)
        elif not plan.serve_tcp and self._tcp_listener is not None:
            self._tcp_listener.close()
            self._tcp_listener = None
        ingress = {
            "users": sorted({u for users, _ in self.security.socket_peers for u in users}),
            "groups": sorted({g for _, groups in self.security.socket_peers for g in groups}),
            "peersChecked": self._peer_gate is not None,
            "socketGroup": plan.group,
            "socketMode": f"{mode:04o}",
            "tcp": str(tcp) if tcp is not None and self._tcp_listener is not None else None,
            "problems": problems,
        }
        if ingress != self.board.ingress:
            for p in problems:
                log.warning("ingress policy not followed as configured", problem=p)
            self.board.ingress = ingress

    def _request_refetch(self) -> None:
        """An artifact of the desired state is missing from the store: ask its source again."""
        if self.source is not None:
            self.source_queue.add(STATIC_KEY)
        if self.hub_link is not None:
            self.hub_link.refetch()

    def _hub_report(self) -> DeviceReport:
        return build_device_report(
            self.discovery.status() if self.discovery is not None else {},
            self.desired.workloads,
            self.board.workload_status,
            self.hub_source.problems if self.hub_source is not None else (),
            self.hub_source.incoming if self.hub_source is not None else None,
            measures_of=self.meters.of,
            validation_of=self._validation_of,
            benchmark_of=self._benchmark_of,
            sizing_of=self.sizer.status,
            sandboxes_of=self._sandboxes_of,
            compliance=self._compliance_report(),
        )

    def _compliance_report(self) -> dict[str, Any]:
        """``device.compliance`` without the time of the check: the hub hears of a change,
        not of every check."""
        doc = self.drift.status(quarantined=self._quarantined_reason())
        doc["checked"] = doc.pop("checkedAt") is not None
        doc["opensWatchReason"] = doc.pop("opensWatch")["reason"]  # not its counters
        return doc

    def _sandboxes_of(self, workload: WorkloadName) -> tuple[SandboxReport, ...]:
        out = []
        for rep in sorted(self.pool.replicas(workload), key=lambda r: (r.revision, r.slot)):
            doc = rep.sandbox_status()
            if doc.get("inForce"):
                out.append(SandboxReport.of(rep.id, rep.revision, doc))
        return tuple(out)

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
        self._refresh_routes()
        cfg = self.config
        # built before the sockets open, so that status shows every part (the hub link's
        # section included) from its first answer
        self.drift.start_open_watch()  # before any worker opens its model
        components = self._components()
        open_files = raise_open_files_limit()
        infer_cap, status_cap, lowered = connection_caps(open_files, cfg.inference.max_connections)
        if lowered:
            log.warning("connection cap lowered", reason=lowered, open_files=open_files)
        status_server = HttpServer(
            StatusHandler(self.board, self.registry, alive=lambda: True).handle,
            limits=ServerLimits(max_body=1 << 16, max_connections=status_cap),
        )
        inf = cfg.inference
        infer_server = HttpServer(
            self.router.handle,
            limits=ServerLimits(
                max_body=inf.max_request_bytes,
                max_connections=infer_cap,
                max_buffered_bytes=inf.max_buffered_bytes,
                header_timeout_s=inf.header_timeout_s,
                body_timeout_s=inf.body_timeout_s,
                idle_timeout_s=inf.idle_timeout_s,
            ),
            body_limit=self.router.body_limit,
        )
        self._server_metrics({"status": status_server, "inference": infer_server})
        self.infer_server = infer_server
        try:
            await status_server.listen_unix(cfg.paths.status_socket)
            await infer_server.listen_unix(cfg.paths.inference_socket)
            await self._apply_ingress()
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
                    quarantined=self._quarantined,
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
        ]
        if self.discovery is not None:
            components.append(self.discovery)
        components.append(self.drift)
        if self.hub_source is not None:
            from edged.hublink.linking import HubLink

            self.acceptor.accept()  # hub.json may be newer than desired.json after a crash
            from edged.runtime.output import WORKER_OUTPUT_EVENT, merge_records
            from edgefleet.logs import keep_recent_lines

            # what edgectl logs reads, through the hub: edged's own records, and what its
            # workers wrote to stderr (kept per replica, so a chatty worker cannot push
            # edged's records out)
            recent = keep_recent_lines(skip_events=frozenset({WORKER_OUTPUT_EVENT}))
            pool = self.pool

            def recent_logs(tail: int, workload: str) -> list[str]:
                return merge_records(
                    [recent.records(workload), *pool.output_records(workload)], tail
                )

            link = HubLink(
                self.link_files,
                source=self.hub_source,
                on_accepted=self.acceptor.accept,
                syncing=self.collector.syncing,
                report=self._hub_report,
                answer_challenge=ChallengeAnswerer(
                    self.data_dir,
                    config_path=self.config_path,
                    trust_root_path=self.gate.root_path,
                    model_digests=lambda: [w.sha256 for w in self.desired.workloads.values()],
                    tpm=cfg.trust.tpm,
                    measurement=self.measurement_log,
                ),
                recent_logs=recent_logs,
                addresses=cfg.hub.addresses,
            )
            self.hub_link = link
            self.board.hub_status = link.status
            self.board.device_name = link.link.device_name  # the hub's name for this device
            components.append(link)
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

    def _ready(self) -> bool:
        return self.board.ready()

    def _request_stop(self, sig: signal.Signals) -> None:
        if not self.stop_event.is_set():
            log.info("signal received", signal=sig.name)
            self.stop_event.set()


def _group_id(group: str) -> int:
    import grp

    return int(group) if group.isdigit() else grp.getgrnam(group).gr_gid


def _group_id_or_none(group: str) -> int | None:
    try:
        return _group_id(group)
    except KeyError:
        return None


def _user_id(user: str) -> int | None:
    import pwd

    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def _group_exists(group: str) -> bool:
    try:
        _group_id(group)
    except KeyError:
        return False
    return True
