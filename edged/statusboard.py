"""What edged reports about itself: the status document, persisted and served on edged.sock.

The reconciler writes each workload's planned status here; the source writes its problems.
``document()`` renders the live view (with replica pids and probe results) for
``GET /v1/status``. The last document is persisted atomically to ``state/status.json``
(debounced, so a burst of changes is one write) so that a person can see what edged last did
even when it is not running.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from edged import __version__
from edged.reconcile.model import Phase, RevisionPhase, WorkloadStatus
from edged.runtime.configreports import replica_config
from edged.runtime.workerpool import WorkerPool
from edged.sources.static import SourceProblem
from edged.state.desired import DesiredState
from edged.workloads import WorkloadName, serving_order
from edgefleet.api.conditions import Condition, ConditionStatus
from edgefleet.artifacts.variants import variants_of
from edgefleet.logs import get_logger
from edgefleet.persisting import write_json_atomic

log = get_logger(__name__)

PERSIST_DELAY_S = 1.0
# a workload whose requests edged answered 503 itself (no ready replica) within this long is
# not shown Running
REFUSED_RECENTLY_S = 30.0


def overlay_serving(
    status: WorkloadStatus,
    *,
    model: str,
    serving: WorkloadName | None,
    refused: int,
    refused_recently: bool,
) -> WorkloadStatus:
    """A workload's planned status as seen by those it serves (pure).

    ``serving``: the workload the model name is served by when it is not this one
    (``serving_order`` in ``edged/workloads.py``): this one stands by. ``refused``: the infer
    requests edged answered 503 itself (no ready replica), ``refused_recently`` whether one was
    within :data:`REFUSED_RECENTLY_S`. Either way a condition says so and a Running workload is
    shown Degraded: never green while requests to it fail or go to another workload."""
    extra: list[Condition] = []
    if serving is not None:
        extra.append(
            Condition(
                "ModelNameConflict",
                ConditionStatus.TRUE,
                "StandingBy",
                f"model {model!r} is also given by workload {serving!r}, which serves it on "
                f"this device; this one answers only while {serving!r} has no ready replica "
                "(a device serves one deployment per model name: delete one of the two)",
            )
        )
    if refused_recently:
        extra.append(
            Condition(
                "Serving",
                ConditionStatus.FALSE,
                "NoReadyReplica",
                f"edged answered inference requests 503 within the last "
                f"{REFUSED_RECENTLY_S:.0f}s: no ready replica ({refused} so far)",
            )
        )
    if not extra:
        return status
    phase = "Degraded" if status.phase == "Running" else status.phase
    return replace(status, phase=phase, conditions=(*status.conditions, *extra))


class StatusBoard:
    def __init__(
        self,
        path: Path,
        *,
        desired: DesiredState,
        pool: WorkerPool,
        limits_mode: str,
        allow_unsigned: bool,
        manifests_dir: Path | None,
        limits_problem: str = "",
    ) -> None:
        self._path = path
        self._desired = desired
        self._pool = pool
        self._limits_mode = limits_mode
        self._limits_problem = limits_problem  # why not cgroup v2 (runtime/delegating.py)
        # whether workers outlive edged, and why not when keepOnExit asked for it
        self.keep_workers: dict[str, Any] = {"inForce": False, "problem": ""}
        self._allow_unsigned = allow_unsigned
        self._manifests_dir = manifests_dir
        self._workloads: dict[WorkloadName, WorkloadStatus] = {}
        # infer requests edged answered 503 itself, by workload: how many, when last (monotonic)
        self._refused: dict[WorkloadName, tuple[int, float]] = {}
        self._problems: tuple[SourceProblem, ...] = ()
        self._files: tuple[str, ...] = ()
        self._started = time.time()
        self._started_monotonic = time.monotonic()  # the uptime: no step of the wall clock
        self._persist_handle: asyncio.TimerHandle | None = None
        self._persisting: asyncio.Future[None] | None = None
        self._persist_again = False
        self._write_lock = threading.Lock()
        self._persist_seq = self._written_seq = 0
        self.draining = False
        self.loaded = False
        self.source_synced = False  # the desired-state source has been read once
        self.trust_status: Callable[[], dict[str, Any]] | None = None  # the trust gate's view
        self.hub_status: Callable[[], dict[str, Any]] | None = None  # the hub link's view
        self.agent_status: Callable[[], dict[str, Any]] | None = None  # edged.agent's view
        # discovery: facts, accelerators, labels, health (None: discovery is off)
        self.device_status: Callable[[], dict[str, Any]] | None = None
        # the name the hub enrolled this device under (None: not enrolled, the hostname)
        self.device_name: str | None = None
        # autoscaling and eviction of a workload (reconcile/sizing.py), the device's memory
        self.sizing_status: Callable[[WorkloadName], dict[str, Any] | None] | None = None
        self.memory_status: Callable[[], dict[str, Any] | None] | None = None
        # who may use the inference API, as in force (SecurityBaseline network.ingress)
        self.ingress: dict[str, Any] | None = None
        # drift: what differs from what edged made (edged/compliance)
        self.compliance: Callable[[], dict[str, Any]] | None = None

    def device_changed(self) -> None:
        """Discovery saw a change (accelerators, health verdict): persist the status soon."""
        self._schedule_persist()

    def set_workload(self, name: WorkloadName, status: WorkloadStatus | None) -> None:
        if status is None:
            self._refused.pop(name, None)
            if self._workloads.pop(name, None) is not None:
                self._schedule_persist()
            return
        previous = self._workloads.get(name)
        if previous != status:
            self._log_failures(name, previous, status)
            self._workloads[name] = status
            self._schedule_persist()

    @staticmethod
    def _log_failures(
        name: WorkloadName, previous: WorkloadStatus | None, status: WorkloadStatus
    ) -> None:
        """A revision that enters Failed is logged once, with the worker's own error."""
        was = {
            (r.revision, r.reason)
            for r in (previous.revisions if previous else ())
            if r.phase is RevisionPhase.FAILED
        }
        for r in status.revisions:
            if r.phase is RevisionPhase.FAILED and (r.revision, r.reason) not in was:
                log.error(
                    "revision failed",
                    workload=name,
                    revision=r.revision,
                    version=r.model_version,
                    reason=r.reason,
                    message=r.message,
                )

    def set_source(self, problems: tuple[SourceProblem, ...], files: tuple[str, ...]) -> None:
        for p in problems:
            if p not in self._problems:
                log.error(
                    "manifest problem",
                    file=p.file,
                    workload=p.workload,
                    reason=p.reason,
                    message=p.message,
                )
        if (problems, files) != (self._problems, self._files):
            self._problems, self._files = problems, files
            self._schedule_persist()

    def workload_status(self, name: WorkloadName) -> WorkloadStatus | None:
        """The planned status with what serving adds (:func:`overlay_serving`)."""
        st = self._workloads.get(name)
        desired = self._desired.get(name)
        if st is None or desired is None:
            return st
        model = desired.deployment.spec.model.name
        order = serving_order(self._desired.workloads).get(model, ())
        count, last = self._refused.get(name, (0, -REFUSED_RECENTLY_S))
        return overlay_serving(
            st,
            model=model,
            serving=order[0] if order and order[0] != name else None,
            refused=count,
            refused_recently=time.monotonic() - last < REFUSED_RECENTLY_S,
        )

    def refused(self, name: WorkloadName) -> None:
        """edged answered an infer request of ``name`` 503 itself (no ready replica)."""
        count, last = self._refused.get(name, (0, 0.0))
        now = time.monotonic()
        self._refused[name] = (count + 1, now)
        if now - last >= REFUSED_RECENTLY_S:  # the status changes: persist it
            self._schedule_persist()

    def ready(self) -> bool:
        """Every desired workload has at least one ready replica (or wants none).

        Not before the persisted state is loaded and the source has been read once, and not
        while draining, so that "ready" never means "ready with nothing to serve yet".
        """
        if self.draining or not self.loaded or not self.source_synced:
            return False
        for name, w in self._desired.workloads.items():
            st = self._workloads.get(name)
            if w.deployment.spec.replicas.count_on_device() == 0 or (
                st is not None and st.desired_replicas == 0  # evicted
            ):
                continue
            if st is None or st.ready_replicas == 0:
                return False
        return True

    def document(self) -> dict[str, Any]:
        workloads = []
        names = sorted(set(self._desired.workloads) | set(self._workloads) | self._pool.workloads())
        for name in names:
            desired = self._desired.get(name)
            st = self.workload_status(name)
            item: dict[str, Any] = {"name": name}
            if desired is not None:
                model = desired.deployment.spec.model
                item["model"] = {
                    "name": model.name,
                    "version": model.version,
                    "sha256": desired.sha256,
                }
                item["source"] = desired.source
                item["precision"] = {
                    "serving": st.precision or None if st is not None else None,
                    "variants": sorted(variants_of(desired.sha256, desired.extras)),
                }
            if st is not None:
                item.update(
                    phase=st.phase,
                    revision=st.revision,
                    readyReplicas=st.ready_replicas,
                    desiredReplicas=st.desired_replicas,
                    conditions=[c.to_json() for c in st.conditions],
                    revisions=[r.to_json() for r in st.revisions],
                    refusedRequests=self._refused.get(name, (0, 0.0))[0],
                    restartCount=st.restarts,
                    lastTermination=(
                        st.last_termination.to_json() if st.last_termination is not None else None
                    ),
                )
            if self.sizing_status is not None:
                item.update(self.sizing_status(name) or {})
            reps = self._pool.replicas(name)
            item["providers"] = {
                "planned": list(st.providers) if st is not None and st.providers else None,
                "actual": sorted(
                    {
                        p
                        for r in reps
                        if r.revision == item.get("revision")
                        for p in r.metadata.get("providers", [])
                    }
                ),
            }
            item["replicas"] = [
                {
                    "id": r.id,
                    "revision": r.revision,
                    "slot": r.slot,
                    "version": r.spec.model_version,
                    "sha256": r.spec.artifact_sha256,
                    "pid": r.pid,
                    "phase": r.phase.value,
                    "ready": r.phase is Phase.READY,
                    "restarts": r.restarts,
                    # it outlives edged (keepOnExit), and this edged adopted it from the last
                    "kept": bool(r.spec.attach_name),
                    "adopted": r.adopted,
                    "batchRows": r.worker_batch_rows,
                    "providers": r.metadata.get("providers", []),
                    "sandbox": r.sandbox_status(),
                    "modelConfig": replica_config(r),  # its processing stage's
                    "limits": {
                        "mode": r.spec.limits.mode,
                        "cpuMillis": r.spec.limits.cpu_millis,
                        "memoryBytes": r.spec.limits.memory_bytes,
                        "cpus": list(r.spec.limits.cpus),
                        # rlimits approximate: say why the kernel's cgroup limits are not used
                        "notEnforcedBecause": (
                            self._limits_problem if r.spec.limits.mode == "rlimit" else ""
                        ),
                    },
                    "lastExit": (
                        {
                            "reason": r.exit_reason,
                            "message": r.exit_message,
                            "exitCode": r.exit_code,  # negative: a signal (None: not run, adopted)
                            "finishedAt": r.finished_at,
                        }
                        if r.exit_reason
                        else None
                    ),
                }
                for r in sorted(self._pool.replicas(name), key=lambda r: (r.revision, r.slot))
            ]
            workloads.append(item)
        return {
            "device": {
                "name": self.device_name or socket.gethostname(),
                "edgedVersion": __version__,
                "pid": os.getpid(),
                "startedAt": self._started,
                "uptimeSeconds": round(time.monotonic() - self._started_monotonic, 3),
                "limitsMode": self._limits_mode,
                "limitsProblem": self._limits_problem,
                "keepWorkers": self.keep_workers,
                "ingress": self.ingress,
                "compliance": self.compliance() if self.compliance is not None else None,
                "trust": (
                    self.trust_status()
                    if self.trust_status is not None
                    else {"allowUnsigned": self._allow_unsigned}
                ),
                **(self.device_status() if self.device_status is not None else {}),
                **(
                    {"memory": memory}
                    if self.memory_status is not None
                    and (memory := self.memory_status()) is not None
                    else {}
                ),
            },
            "ready": self.ready(),
            "generation": self._desired.generation,
            "source": {
                "kind": "static" if self._manifests_dir else "none",
                "directory": str(self._manifests_dir) if self._manifests_dir else None,
                "files": list(self._files),
                "problems": [p.to_json() for p in self._problems],
            },
            "hub": self.hub_status() if self.hub_status is not None else None,
            "agent": self.agent_status() if self.agent_status is not None else None,
            "workloads": workloads,
        }

    def _schedule_persist(self) -> None:
        if self._persist_handle is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._persist_handle = loop.call_later(PERSIST_DELAY_S, self._persist_soon)

    def _persist_soon(self) -> None:
        """The debounced write, made in a thread: the event loop, which answers inference and
        health checks, never waits on the disk (a slow or stuck disk held them all while
        status.json was written). One write at a time; a change meanwhile is written after."""
        self._persist_handle = None
        if self._persisting is not None and not self._persisting.done():
            self._persist_again = True
            return
        self._persist_seq += 1
        write = asyncio.to_thread(self._write, self.document(), self._persist_seq)
        self._persisting = asyncio.ensure_future(write)
        self._persisting.add_done_callback(self._persisted)

    def _persisted(self, _task: asyncio.Future[None]) -> None:
        if self._persist_again:
            self._persist_again = False
            self._schedule_persist()

    def persist(self) -> None:
        """The status written now (edged's stop: the last word), after any write in flight."""
        if self._persist_handle is not None:
            self._persist_handle.cancel()
            self._persist_handle = None
        self._persist_seq += 1
        self._write(self.document(), self._persist_seq)

    def _write(self, doc: dict[str, Any], seq: int) -> None:
        with self._write_lock:  # one writer of the file (its temporary name is per process)
            if seq <= self._written_seq:  # a later document is on disk already
                return
            self._written_seq = seq
            try:
                write_json_atomic(self._path, doc)
            except OSError as exc:
                log.error("cannot persist status", path=str(self._path), error=str(exc))
