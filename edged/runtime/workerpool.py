"""All the workers of this device (:class:`WorkerPool`, the runtime's applier side): one
:class:`edged.runtime.processes.Replica` record per replica slot, started, stopped, killed and
forgotten as the reconciler asks; the replicas' events handed on (serving, results, batches,
restarts, a rotten artifact); edged's stop (drain, or keep the workers for the next edged);
and at edged's start the adoption of the workers the last edged kept (adopting.py). Records
outlive the processes they run, so restarts and crash streaks are counted per slot."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from edged.reconcile.model import Phase, ReplicaObservation
from edged.runtime.adopting import (
    WorkerRecord,
    WorkerRecords,
    check_desired,
    check_identity,
    identify,
    record_for,
)
from edged.runtime.adopting import boot_id as current_boot_id
from edged.runtime.answerstats import AnswerTotals
from edged.runtime.batchstats import BatchCounts
from edged.runtime.exiting import classify_launch_failure
from edged.runtime.identities import WorkerUids
from edged.runtime.launching import LaunchSpec
from edged.runtime.limiting import LimitsError, prepare_cgroup
from edged.runtime.output import OutputRing
from edged.runtime.overlapstats import OverlapTotals
from edged.runtime.processes import DRAIN_TIMEOUT_S, TERM_TIMEOUT_S, Replica, pidfds_supported
from edged.workloads import ReplicaId, WorkloadName
from edgefleet.api import Probes
from edgefleet.logs import get_logger

log = get_logger(__name__)

# how long a replica whose worker is ready waits for its model's measurement (a TPM extend,
# WorkerPool's ``measure``) before it serves anyway: a slow TPM does not hold serving up
MEASURE_WAIT_S = 5.0
GONE_OUTPUTS_KEPT = 16  # stderr rings of replicas that left the pool, kept for edgectl logs
STARTED_PIDS_KEPT = 256
ADOPT_TIMEOUT_S = 5.0
NOT_ADOPTED = "NotAdopted"  # the exit reason of a kept worker the next edged would not adopt


class WorkerPool:
    """All replicas of all workloads on this device."""

    def __init__(
        self,
        *,
        notify: Callable[[WorkloadName], None],
        on_serving_change: Callable[[Replica, bool], None],
        on_result: Callable[[Replica, int, float], None],
        on_artifact_rotten: Callable[[WorkloadName, str], None] | None = None,
        on_restart: Callable[[Replica], None] | None = None,
        on_batches: Callable[[Replica, BatchCounts], None] | None = None,
        on_overlap: Callable[[Replica, OverlapTotals], None] | None = None,
        on_answers: Callable[[Replica, AnswerTotals], None] | None = None,
        python: str = "",
        uids: WorkerUids | None = None,
        measure: Callable[[str], Awaitable[None]] | None = None,
        measure_wait_s: float = MEASURE_WAIT_S,
        records: WorkerRecords | None = None,
        keep: bool = False,
        orphan_timeout_s: float = 300.0,
    ) -> None:
        """``on_artifact_rotten(workload, sha256)``: a worker found that blob's bytes no longer
        match its digest (the store should check it and quarantine it). ``uids``: where
        workers whose sandbox asks for a uid of their own get it (default: the default
        range). ``measure(sha256)``: started as each replica's process starts (the model's
        measurement into a TPM PCR, :class:`edged.trust.attesting.LoadMeasurer`); a worker
        that is ready before it ends serves once it ends, or after ``measure_wait_s`` at most.
        It must not raise. ``on_batches(replica, increment)``: batches a worker ran since its
        last liveness probe (``batchstats.py``); ``on_overlap(replica, increment)``: the
        work its event loop did while ONNX Runtime ran, likewise (``overlapstats.py``);
        ``on_answers(replica, increment)``: the answers it wrote, likewise (``answerstats.py``).
        ``records``: where kept workers' records are
        (adopting.py); ``keep``: workers started from now on outlive edged (and each gets a
        record there), waiting ``orphan_timeout_s`` at most for the next edged."""
        self.records = records
        self.keep = keep and records is not None and pidfds_supported()
        if keep and not self.keep:
            log.warning("workers stop with edged: keepOnExit needs pidfds (Linux 5.3)")
        self.orphan_timeout_s = orphan_timeout_s
        self.detached = False  # edged stopped and left its workers running
        self.uids = uids if uids is not None else WorkerUids()
        self.notify = notify
        self.measure = measure
        self.measure_wait_s = measure_wait_s
        self._on_artifact_rotten = on_artifact_rotten
        self._on_serving_change = on_serving_change
        self._on_result = on_result
        self._on_restart = on_restart
        self._on_batches = on_batches
        self._on_overlap = on_overlap
        self._on_answers = on_answers
        self.direct: Any = None  # the router, once it serves (handed(), returned(), proxy())
        self._python = python or sys.executable
        self._replicas: dict[ReplicaId, Replica] = {}
        self._tasks: set[asyncio.Future[Any]] = set()
        # the stderr lines of replicas no longer in the pool (stopped, forgotten), newest kept
        self._gone_outputs: collections.deque[OutputRing] = collections.deque(
            maxlen=GONE_OUTPUTS_KEPT
        )
        # the pids of the latest worker processes started (the drift watch tells a worker
        # that opened its model and exited at once from a process edged did not start)
        self.started_pids: collections.deque[int] = collections.deque(maxlen=STARTED_PIDS_KEPT)

    def track(self, task: asyncio.Future[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def get(self, replica_id: ReplicaId) -> Replica | None:
        return self._replicas.get(replica_id)

    def replicas(self, workload: WorkloadName | None = None) -> list[Replica]:
        return [r for r in self._replicas.values() if workload is None or r.workload == workload]

    def workloads(self) -> set[WorkloadName]:
        return {r.workload for r in self._replicas.values()}

    def observe(self, workload: WorkloadName) -> tuple[ReplicaObservation, ...]:
        return tuple(r.observation() for r in self.replicas(workload))

    async def start(
        self,
        spec: LaunchSpec,
        workload: WorkloadName,
        revision: str,
        slot: int,
        probes: Probes,
    ) -> None:
        rep = self._replicas.get(ReplicaId(spec.replica_id))
        if rep is None:
            rep = Replica(self, spec, workload, revision, slot, probes)
            self._replicas[rep.id] = rep
        elif rep.phase is not Phase.EXITED:
            return  # already running: starting twice is a no-op
        else:
            rep.spec, rep.probes = spec, probes
        try:
            await rep.launch(self._python)
        except OSError as exc:
            verdict = classify_launch_failure(
                str(exc), crash_streak=rep.crash_streak, limits=isinstance(exc, LimitsError)
            )
            rep.phase = Phase.EXITED
            rep.exited_at = time.monotonic()
            rep.exit_reason, rep.exit_message = verdict.reason, verdict.message
            rep.exit_code, rep.finished_at = None, time.time()
            rep.crash_streak = verdict.crash_streak
            raise

    def stop(self, replica_id: ReplicaId) -> None:
        rep = self._replicas.get(replica_id)
        if rep is not None and rep.phase is not Phase.STOPPING:
            rep.stopping_task = asyncio.ensure_future(rep.stop())
            self.track(rep.stopping_task)

    def kill(self, replica_id: ReplicaId, reason: str, message: str) -> None:
        rep = self._replicas.get(replica_id)
        if rep is not None:
            log.warning("killing replica", replica=replica_id, reason=reason, message=message)
            rep.kill(reason, message)

    def forget(self, replica_id: ReplicaId) -> None:
        rep = self._replicas.get(replica_id)
        if rep is not None and rep.phase is Phase.EXITED:
            del self._replicas[replica_id]
            self._keep_output(rep)

    def remove(self, rep: Replica) -> None:
        if self._replicas.get(rep.id) is rep:
            del self._replicas[rep.id]
            self._keep_output(rep)
        self.notify(rep.workload)

    def _keep_output(self, rep: Replica) -> None:
        if rep.output.lines:
            self._gone_outputs.append(rep.output)

    def output_records(self, workload: str = "") -> list[list[tuple[float, str]]]:
        """What the workers wrote to stderr, per replica slot (those in the pool, then the last
        few that left it), each oldest first as ``(time, JSON record)``; only ``workload``'s
        when given."""
        rings = [r.output for r in self._replicas.values()] + list(self._gone_outputs)
        return [ring.records() for ring in rings if not workload or ring.workload == workload]

    def serving_changed(self, rep: Replica, *, ready: bool) -> None:
        self._on_serving_change(rep, ready)

    def artifact_rotten(self, workload: WorkloadName, sha256: str) -> None:
        if self._on_artifact_rotten is not None:
            self._on_artifact_rotten(workload, sha256)

    def restarted(self, rep: Replica) -> None:
        if self._on_restart is not None:
            self._on_restart(rep)

    def record_result(self, rep: Replica, status: int, seconds: float) -> None:
        self._on_result(rep, status, seconds)

    def record_batches(self, rep: Replica, delta: BatchCounts) -> None:
        if self._on_batches is not None:
            self._on_batches(rep, delta)

    def record_overlap(self, rep: Replica, delta: OverlapTotals) -> None:
        if self._on_overlap is not None:
            self._on_overlap(rep, delta)

    # -- client connections handed to workers (handoff.py): told to ``direct``, set by edged's
    # server side (serving/inference.py's router); none set, nothing is handed
    def handed(self, rep: Replica, delta: int) -> None:
        if self.direct is not None:
            self.direct.handed(rep, delta)

    def returned(self, sock: socket.socket, keep: bool = False) -> None:
        if self.direct is not None:
            self.direct.returned(sock, keep)
        else:
            sock.close()

    def proxy(self, rep: Replica, req_id: int, payload: bytes) -> None:
        if self.direct is not None:
            self.direct.proxy(rep, req_id, payload)

    def record_answers(self, rep: Replica, delta: AnswerTotals) -> None:
        if self._on_answers is not None:
            self._on_answers(rep, delta)

    async def shutdown(self, timeout: float = DRAIN_TIMEOUT_S, *, keep: bool = False) -> None:
        """edged is stopping: drain and stop every replica, or with ``keep`` leave every kept
        worker running for the next edged (those being stopped still stop)."""
        if keep:
            self.detached = True
            for rep in list(self._replicas.values()):
                if rep.running and rep.phase is not Phase.STOPPING and rep.spec.attach_name:
                    rep.detach()
                elif rep.phase is not Phase.EXITED:
                    self.stop(rep.id)
            stopping = [r.stopping_task for r in self._replicas.values() if r.stopping_task]
            if stopping:
                await asyncio.wait(stopping, timeout=timeout + TERM_TIMEOUT_S + 1)
            await self.flush_records()  # the next edged adopts from them
            return
        for rep in list(self._replicas.values()):
            if rep.phase is Phase.EXITED:
                continue
            self.stop(rep.id)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout + TERM_TIMEOUT_S + 1)
        for rep in list(self._replicas.values()):
            rep.signal(signal.SIGKILL)
        await self.flush_records()

    async def flush_records(self) -> None:
        """Every queued record write and removal made (in a thread: the disk may be slow)."""
        if self.records is not None:
            await asyncio.to_thread(self.records.flush)

    # -- kept workers (adopting.py) -----------------------------------------------------------
    def write_record(self, rep: Replica) -> None:
        if self.records is None or not rep.spec.attach_name or rep.pid is None:
            return
        try:
            if rep.record is not None:  # adopted: what the kernel said of it then still holds
                record = replace(rep.record, restarts=rep.restarts, crash_streak=rep.crash_streak)
            else:
                record = record_for(
                    rep.spec,
                    workload=rep.workload,
                    revision=rep.revision,
                    slot=rep.slot,
                    pid=rep.pid,
                    restarts=rep.restarts,
                    crash_streak=rep.crash_streak,
                )
            self.records.write(record)
        except (OSError, ValueError) as exc:
            log.error("worker record not written", replica=rep.id, error=str(exc))

    def records_remove(self, replica_id: str) -> None:
        if self.records is not None:
            self.records.remove(replica_id)

    async def adopt(
        self,
        digests: dict[str, frozenset[str]],
        probes: Callable[[str], Probes],
        *,
        timeout: float = ADOPT_TIMEOUT_S,
    ) -> dict[str, str]:
        """Adopt every kept worker the records name that proves to be what its record says
        and runs what ``digests`` (per desired workload, the model digests it may run) want;
        ``probes(workload)``: its probes. Returns, per replica not adopted, why (each
        logged as an event): a process that is not the recorded worker is left alone, a
        worker that is but cannot be adopted is killed; either way its record goes."""
        refused: dict[str, str] = {}
        if self.records is None:
            return refused
        boot = current_boot_id()
        records = list(self.records.load())
        # all at once: a worker that does not answer costs ``timeout`` once, not per worker
        outcomes = await asyncio.gather(
            *(self._adopt_one(r, digests, probes, boot, timeout) for r in records)
        )
        for record, why in zip(records, outcomes, strict=True):
            if why:
                refused[record.replica_id] = why
        return refused

    async def _adopt_one(
        self,
        record: WorkerRecord,
        digests: dict[str, frozenset[str]],
        probes: Callable[[str], Probes],
        boot: str,
        timeout: float,
    ) -> str:
        assert self.records is not None
        rid = ReplicaId(record.replica_id)
        if rid in self._replicas:
            return "a replica of that id runs already"
        try:
            pidfd = os.pidfd_open(record.pid)  # first: the pid stays this process's from now
        except OSError:
            self.records.remove(rid)
            log.info("kept worker gone: record dropped", replica=rid, pid=record.pid)
            return f"pid {record.pid} is gone"
        try:
            seen = identify(record.pid)
        except OSError:
            seen = None
        why = check_identity(record, seen, boot=boot)
        if why:  # not our worker: never signal it
            os.close(pidfd)
            self.records.remove(rid)
            log.warning("kept worker not adopted", replica=rid, pid=record.pid, reason=why)
            return why
        spec = record.spec
        workload = WorkloadName(record.workload)
        rep = Replica(self, spec, workload, record.revision, record.slot, probes(workload))
        self._replicas[rep.id] = rep
        if spec.uid >= 0:
            self.uids.adopt(rid, spec.uid)  # its own lock holds it; freed once it exits
        rep.watch(record, pidfd)
        why = (
            check_desired(record, digests)
            or _limits_again(spec)
            or await rep.attach(record, timeout)
        )
        if why:
            # the worker it proved to be, killed through its pidfd; it shows as this slot's
            # last exit (NotAdopted), and the reconciler starts what is desired
            log.warning("kept worker not adopted: killed", replica=rid, pid=record.pid, reason=why)
            rep.kill(NOT_ADOPTED, why)
            self.records.remove(rid)
            return why
        self.notify(workload)
        return ""


def _limits_again(spec: LaunchSpec) -> str:
    """Write a kept worker's cgroup limits again ("" once done, else why not): the unit's
    ExecStopPost= (edged.launcher.cleanup.cleanup_cgroup) disables the controllers below edged's
    cgroup for systemd to start the unit again, and enabling them again leaves each leaf's
    cpu.max and memory.max at "max"."""
    try:
        prepare_cgroup(spec.limits)
    except LimitsError as exc:
        return f"its limits cannot be written again: {exc}"
    return ""
