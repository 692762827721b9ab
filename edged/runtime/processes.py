"""One worker process of a replica slot (:class:`Replica`): start it, probe it, route to it,
drain and stop it, see it exit (through its pidfd), and attach to one kept by the last edged
(adopting.py). All the slots of the device: :class:`edged.runtime.workerpool.WorkerPool`; the
socket to a worker: :class:`edged.runtime.channel.ReplicaChannel`.

Every state change (ready, unready, exit) only calls the pool's ``notify(workload)``: the
reconciler decides what to do. Probes run per replica on one timer (no task); what a tick or
an answer means is decided by ``probing.py``, what an exit means by ``exiting.py`` (both
pure). This module performs it.
"""

from __future__ import annotations

import asyncio
import math
import os
import secrets
import signal
import socket
import struct
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from edged.reconcile.model import Phase, ReplicaObservation
from edged.runtime import answerstats, directstats, egressfilter, overlapstats
from edged.runtime.adopting import ATTACH_HELLO, WorkerRecord
from edged.runtime.batchstats import BatchCounts, advance, from_pong
from edged.runtime.channel import ReplicaChannel
from edged.runtime.exiting import classify_exit
from edged.runtime.framing import U32, FrameType
from edged.runtime.handoff import HandoffLink
from edged.runtime.httpserver import MAX_PIPELINED
from edged.runtime.identities import NoUidFree, accelerator_groups, slot_key
from edged.runtime.launching import LaunchSpec
from edged.runtime.limiting import prepare_cgroup, read_oom_kills, remove_cgroup
from edged.runtime.output import OutputReader, OutputRing
from edged.runtime.probing import ProbeState, check_probes, record_pong
from edged.workloads import ReplicaId, WorkloadName
from edgefleet.api import Probes
from edgefleet.api.conditions import Condition, ConditionStatus
from edgefleet.logs import get_logger

if TYPE_CHECKING:
    from edged.runtime.httpserver import Request, Response
    from edged.runtime.workerpool import WorkerPool

log = get_logger(__name__)

DRAIN_TIMEOUT_S = 30.0
TERM_TIMEOUT_S = 5.0
ARTIFACT_DIGEST_MISMATCH = "ArtifactDigestMismatch"  # the worker's reason (worker.py)
PEERCRED = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid


class Replica:
    """One replica slot and its current process."""

    def __init__(
        self,
        pool: WorkerPool,
        spec: LaunchSpec,
        workload: WorkloadName,
        revision: str,
        slot: int,
        probes: Probes,
    ) -> None:
        self.pool = pool
        self.id = ReplicaId(spec.replica_id)
        self.workload = workload
        self.revision = revision
        self.slot = slot
        self.spec = spec
        self.probes = probes
        self.phase = Phase.STARTING
        self.pid: int | None = None
        # the current process, when edged started it (its pidfd watches it: asyncio's
        # subprocess transport would kill it when edged's loop closes, and a kept worker must
        # outlive edged)
        self.proc: subprocess.Popen[bytes] | None = None
        # the current process's end: its exit status (None: not known, an adopted worker is
        # not edged's child), set by its waiter (a child's wait, or an adopted one's pidfd)
        self.gone: asyncio.Future[int | None] | None = None
        self.pidfd: int | None = None  # the current process (a child or an adopted worker)
        self.adopted = False
        self.record: WorkerRecord | None = None  # an adopted worker's, as the last edged wrote it
        # an adoption waiting for the worker's READY and PONG (adopt())
        self._adopting: asyncio.Future[dict[str, Any]] | None = None
        self.channel: ReplicaChannel | None = None
        self.started_at = time.monotonic()
        self.ready_since: float | None = None
        self.exited_at: float | None = None
        self.exit_reason = ""
        self.exit_message = ""
        self.restarts = 0
        self.crash_streak = 0
        # the last unasked-for end (kept across restarts, like exit_reason): the exit status
        # (negative: the signal; None: it never started) and its wall-clock time
        self.exit_code: int | None = None
        self.finished_at: float | None = None
        self.live = True
        self.conditions: tuple[Condition, ...] = ()
        self.metadata: dict[str, Any] = {}
        self._failed: tuple[str, str] | None = None
        self._killed: tuple[str, str] | None = None
        self._oom_kills_at_start = 0  # memory.events oom_kill of its cgroup at the last start
        self._probe_timer: asyncio.TimerHandle | None = None
        self._probe_state = ProbeState(last_pong=time.monotonic())
        self.stopping_task: asyncio.Task[None] | None = None
        self.batch_limit: int | None = None  # rows per batch edged allows now (None: declared)
        self.worker_batch_rows: int | None = None  # what the worker said it applies (PONG)
        # the current process's batch totals as last counted, when, and the busy_s they came
        # with (batchstats.py)
        self._batches_seen = (BatchCounts(), time.monotonic(), 0.0)
        self._batches_refused = False  # logged once per process
        # the current process's overlap totals as last counted, and its socket then
        # (overlapstats.py)
        self._overlap_seen = (overlapstats.OverlapTotals(), overlapstats.ChannelCounts())
        self._overlap_refused = False  # logged once per process
        # the current process's answer totals as last counted, and its socket then
        # (answerstats.py)
        self._answers_seen = (answerstats.AnswerTotals(), overlapstats.ChannelCounts())
        self._answers_refused = False  # logged once per process
        self.handoff: HandoffLink | None = None  # client connections handed to it (handoff.py)
        self._route_sent = b""
        # answers on handed connections: 2xx ones counted (held to its batches at each PONG,
        # directstats.py), and whether this process's reports are refused (logged once)
        self._direct_ok = 0
        self._direct_answered = 0  # every answer it reported there (overlapstats' bounds)
        self._direct_refused = False
        # what this slot's processes wrote to stderr (kept across restarts: output.py)
        self.output = OutputRing(self.id, workload)
        self._output_pipe: asyncio.ReadTransport | None = None
        # the model's measurement (WorkerPool's ``measure``), started with the process
        self._measuring: asyncio.Future[None] | None = None

    # -- observation --------------------------------------------------------------------------
    def observation(self) -> ReplicaObservation:
        return ReplicaObservation(
            replica_id=self.id,
            revision=self.revision,
            slot=self.slot,
            phase=self.phase,
            pid=self.pid,
            started_at=self.started_at,
            ready_since=self.ready_since,
            exited_at=self.exited_at,
            exit_reason=self.exit_reason,
            exit_message=self.exit_message,
            restarts=self.restarts,
            exit_code=self.exit_code,
            finished_at=self.finished_at,
            crash_streak=self.crash_streak,
            live=self.live,
            conditions=self.conditions,
            model_version=self.spec.model_version,
            sha256=self.spec.artifact_sha256,
        )

    def limit_batch(self, rows: int) -> None:
        """Memory-aware batching: at most ``rows`` rows per batch from now on."""
        if self.channel is not None and rows != self.batch_limit:
            self.channel.send(FrameType.BATCH_LIMIT, U32.pack(rows))
            self.batch_limit = rows

    def sandbox_status(self) -> dict[str, Any]:
        """What confines this replica's process: as its worker reported once it was in force
        (READY); before that or once it exited, what was asked (``inForce: false``)."""
        reported = self.metadata.get("sandbox")
        running = self.phase in (Phase.READY, Phase.UNREADY, Phase.STOPPING)
        if isinstance(reported, dict) and running:
            return {"inForce": True, **reported}
        return {"inForce": False, "mode": self.spec.sandbox.mode}

    # -- connections handed to the worker (handoff.py, direct.py) -------------------------------
    @property
    def can_hand_off(self) -> bool:
        """Whether client connections may be handed to this worker now."""
        ch = self.channel
        return (
            self.handoff is not None
            and self.handoff.alive
            and self.phase is Phase.READY
            and self.metadata.get("direct") is True
            and ch is not None
            and ch.transport is not None
        )

    def hand_off(self, fd: int, first: bytes, uid: int | None) -> bool:
        """Hand the client connection of ``fd`` (the caller closes ``fd``) and the bytes read
        from it to the worker; False when it cannot take it now (nothing sent)."""
        link, ch = self.handoff, self.channel
        if link is None or ch is None:
            return False
        conn_id = link.hand(fd, uid)
        if conn_id is None:
            return False
        ch.send(FrameType.HANDED, U32.pack(conn_id) + first)
        self.pool.handed(self, 1)
        return True

    def route(self, doc: bytes) -> None:
        """What the worker serves on handed connections (ROUTE), when it changed."""
        if self.channel is not None and doc != self._route_sent:
            self.channel.send(FrameType.ROUTE, doc)
            self._route_sent = doc

    def on_conn_closed(self, conn_id: int) -> None:
        if self.handoff is not None and self.handoff.forget(conn_id):
            self.pool.handed(self, -1)

    def uid_of(self, conn_id: int) -> int | None:
        return None if self.handoff is None else self.handoff.uid_of(conn_id)

    def _returned(self, sock: socket.socket, keep: bool) -> None:
        self.pool.handed(self, -1)
        self.pool.returned(sock, keep)

    def _close_handoff(self) -> None:
        self._route_sent = b""
        if self.handoff is not None:
            held = self.handoff.close()
            if held:
                self.pool.handed(self, -held)
            self.handoff = None

    def on_direct_answers(self, payload: bytes) -> None:
        """ANSWERED: what the worker answered on handed connections, held to bounds
        (``directstats.py``) before it counts as the replica's answers."""
        answers, why = directstats.parse(payload, age_s=self._process_age())
        if answers is not None and self._direct_refused:
            self._direct_answered += len(answers)  # still what bounds its overlap totals
        if answers is None or self._direct_refused:
            if why and not self._direct_refused:
                self._direct_refused = True
                log.warning("worker direct answers not counted", replica=self.id, reason=why)
            return
        self._direct_answered += len(answers)
        tally = answerstats.AnswerTally()  # the worker's held time, as its PONG's answers
        for status, seconds in answers:
            if 200 <= status < 300:
                self._direct_ok += 1
            tally.record(status, seconds)
            self.pool.record_result(self, status, seconds)
        self.pool.record_answers(
            self,
            answerstats.AnswerTotals(
                tally.count, tally.errors, tally.seconds, tuple(tally.buckets)
            ),
        )

    def _process_age(self) -> float:
        return max(0.0, time.monotonic() - self.started_at)

    def on_proxy(self, req_id: int, payload: bytes) -> None:
        self.pool.proxy(self, req_id, payload)

    @property
    def inflight(self) -> int:
        return len(self.channel.pending) if self.channel is not None else 0

    def forward(self, req: Request, resp: Response) -> None:
        assert self.channel is not None
        self.channel.forward(req, resp)

    # -- events from the channel --------------------------------------------------------------
    def on_ready(self, meta: dict[str, Any]) -> None:
        if self._adopting is not None:
            if not self._adopting.done():
                self._adopting.set_result(meta)
            return
        self.metadata = meta
        self.conditions = tuple(
            Condition(c["type"], ConditionStatus.TRUE, c["reason"], c.get("message", ""))
            for c in meta.get("conditions", [])
        )
        for cond in self.conditions:
            log.warning("worker condition", replica=self.id, type=cond.type, message=cond.message)
        measuring = self._measuring
        if self.phase is Phase.STARTING and measuring is not None and not measuring.done():
            # serve once the model is measured (the PCR holds it), within a bound
            self.pool.track(asyncio.ensure_future(self._ready_when_measured(measuring)))
            return
        self._become_ready()

    def _become_ready(self) -> None:
        if self.phase is Phase.STARTING:
            # written again now: the record made as it started may have found its argv empty
            # (/proc/PID/cmdline is filled after exec has closed Popen's pipe)
            self.pool.write_record(self)
            # its READY is its first answer: liveness counts from here, not from the start (a
            # start slower than the liveness bound, under load, failed the first probe)
            self._probe_state = ProbeState(last_pong=time.monotonic())
            self._set_phase(Phase.READY)
            log.info(
                "replica ready",
                replica=self.id,
                pid=self.pid,
                providers=",".join(self.metadata.get("providers", [])),
                startup_s=round(time.monotonic() - self.started_at, 3),
            )
        self._schedule_probe()

    async def _ready_when_measured(self, measuring: asyncio.Future[None]) -> None:
        proc = self.proc
        try:
            await asyncio.wait_for(asyncio.shield(measuring), self.pool.measure_wait_s)
        except TimeoutError:
            log.warning(
                "replica ready before its measurement",
                replica=self.id,
                waited_s=self.pool.measure_wait_s,
            )
        except Exception as exc:  # the measurer logs its own errors; serve regardless
            log.error("model measurement failed", replica=self.id, error=str(exc))
        if self.proc is proc and self.phase is Phase.STARTING:  # the same process, waiting
            self._become_ready()

    def on_failed(self, reason: str, message: str) -> None:
        self._failed = (reason, message)
        log.error("worker failed to start", replica=self.id, reason=reason, message=message)

    def on_result(self, status: int, seconds: float) -> None:
        self.pool.record_result(self, status, seconds)

    def on_pong(self, doc: dict[str, Any]) -> None:
        if self._adopting is not None:
            if not self._adopting.done():
                self._adopting.set_result(doc)
            return
        rows = doc.get("batch_rows")
        self.worker_batch_rows = rows if isinstance(rows, int) else None
        if "config" in doc:  # its model config now (runtime/configstage.py), as READY's was
            self.metadata["config"] = doc["config"]
        busy = float(doc.get("busy_s", 0.0))
        self._count_batches(doc, busy)
        self._count_overlap(doc)
        self._count_answers(doc)
        self._probe_state, not_live = record_pong(
            self._probe_state, busy, self.probes, now=time.monotonic()
        )
        if not_live:
            self._set_live(False, not_live)
            return
        if self.phase is Phase.UNREADY:
            self._set_phase(Phase.READY)

    def _count_batches(self, doc: dict[str, Any], busy_s: float) -> None:
        report = from_pong(doc)
        if report is None:
            return
        why = directstats.more_than_batched(self._direct_ok, report.requests)
        if why and not self._direct_refused:
            self._direct_refused = True
            log.warning("worker direct answers not counted", replica=self.id, reason=why)
        now = time.monotonic()
        seen, seen_at, busy_then = self._batches_seen
        delta, why = advance(
            seen, report, max_batch=self.spec.max_batch_size, wall_s=now - seen_at + busy_then
        )
        # a batch still running at this report may finish with up to busy_s already spent
        self._batches_seen = (report, now, max(0.0, busy_s) if math.isfinite(busy_s) else 0.0)
        if delta is None:
            if not self._batches_refused:
                self._batches_refused = True
                log.warning("worker batch totals not counted", replica=self.id, reason=why)
        elif delta.batches:
            self.pool.record_batches(self, delta)

    def _channel_counts(self, doc: dict[str, Any] | None = None) -> overlapstats.ChannelCounts:
        """What edged saw on the worker's socket; ``doc``: a PONG, whose claim of requests
        held on handed connections counts up to what those connections can hold."""
        ch = self.channel
        if ch is None:
            return overlapstats.ChannelCounts()
        held = 0
        if doc is not None and self.handoff is not None:
            claimed = doc.get("direct_inflight", 0)
            if type(claimed) is int:
                held = max(0, min(claimed, len(self.handoff.open) * MAX_PIPELINED))
        return overlapstats.ChannelCounts(
            ch.sent,
            ch.answered,
            len(ch.pending),
            ch.errors,
            ch.answered_s,
            self._direct_answered,
            held,
        )

    def _count_overlap(self, doc: dict[str, Any]) -> None:
        report, why = overlapstats.from_pong(doc)
        delta: overlapstats.OverlapTotals | None = None
        now = self._channel_counts(doc)
        if report is not None:
            seen, then = self._overlap_seen
            delta, why = overlapstats.advance(seen, report, then=then, now=now)
            self._overlap_seen = (report, now)  # a refused report: counting starts from it
        if delta is None:
            if why and not self._overlap_refused:
                self._overlap_refused = True
                log.warning("worker overlap totals not counted", replica=self.id, reason=why)
        elif delta.decoded or delta.encoded or delta.staged:
            self.pool.record_overlap(self, delta)

    def _count_answers(self, doc: dict[str, Any]) -> None:
        report, why = answerstats.from_pong(doc)
        delta: answerstats.AnswerTotals | None = None
        now = self._channel_counts()
        if report is not None:
            seen, then = self._answers_seen
            delta, why = answerstats.advance(seen, report, then=then, now=now)
            self._answers_seen = (report, now)  # a refused report: counting starts from it
        if delta is None:
            if why and not self._answers_refused:
                self._answers_refused = True
                log.warning("worker answer totals not counted", replica=self.id, reason=why)
        elif delta.count:
            self.pool.record_answers(self, delta)

    def on_channel_lost(self) -> None:
        self._close_handoff()
        self._cancel_probe()
        if self.phase in (Phase.READY, Phase.UNREADY):
            self.pool.serving_changed(self, ready=False)

    # -- probes -------------------------------------------------------------------------------
    def _schedule_probe(self) -> None:
        self._cancel_probe()
        loop = asyncio.get_running_loop()
        self._probe_timer = loop.call_later(self.probes.readiness.period_s, self._probe)

    def _cancel_probe(self) -> None:
        if self._probe_timer is not None:
            self._probe_timer.cancel()
            self._probe_timer = None

    def _probe(self) -> None:
        self._probe_timer = None
        if self.phase not in (Phase.READY, Phase.UNREADY) or self.channel is None:
            return
        check = check_probes(
            self._probe_state, self.probes, ready=self.phase is Phase.READY, now=time.monotonic()
        )
        self._probe_state = check.state
        if check.unready:
            log.warning("replica not ready", replica=self.id, failures=check.state.failures)
            self._set_phase(Phase.UNREADY)
        if check.not_live:
            self._set_live(False, check.not_live)
            return
        if check.ping:
            self.channel.send(FrameType.PING)
        self._schedule_probe()

    def _set_live(self, live: bool, why: str) -> None:
        if self.live != live:
            self.live = live
            if not live:
                log.warning("replica liveness failed", replica=self.id, reason=why)
            self.pool.notify(self.workload)

    def _set_phase(self, phase: Phase) -> None:
        old = self.phase
        self.phase = phase
        if phase is Phase.READY and self.ready_since is None:
            self.ready_since = time.monotonic()
        if (phase is Phase.READY) != (old is Phase.READY):
            self.pool.serving_changed(self, ready=phase is Phase.READY)
        self.pool.notify(self.workload)

    # -- process lifecycle --------------------------------------------------------------------
    async def launch(self, python: str) -> None:
        """Start a process for this slot (first start or restart)."""
        if self.exited_at is not None:
            self.restarts += 1
            self.pool.restarted(self)
        self.phase = Phase.STARTING
        self.started_at = time.monotonic()
        self.ready_since = None
        self.exited_at = None
        self.live = True
        self._failed = self._killed = None
        self._probe_state = ProbeState(last_pong=time.monotonic())
        self.batch_limit = None  # a new process starts with the declared maxBatchSize
        self._batches_seen = (BatchCounts(), time.monotonic(), 0.0)
        self._batches_refused = False
        self._overlap_seen = (overlapstats.OverlapTotals(), overlapstats.ChannelCounts())
        self._overlap_refused = False
        self._answers_seen = (answerstats.AnswerTotals(), overlapstats.ChannelCounts())
        self._answers_refused = False
        self._direct_ok, self._direct_answered, self._direct_refused = 0, 0, False
        self.spec = self._with_uid(self.spec)
        if self.pool.keep:  # it outlives edged, and the next edged adopts it (adopting.py)
            self.spec = replace(
                self.spec,
                attach_name=f"edgefleet-worker/{os.getpid()}/{secrets.token_hex(8)}",
                orphan_timeout_s=self.pool.orphan_timeout_s,
                supervisor_uid=os.geteuid(),
            )
        self._measuring = None
        if self.pool.measure is not None:  # measured as the worker starts loading it
            self._measuring = asyncio.ensure_future(self.pool.measure(self.spec.artifact_sha256))
            self.pool.track(self._measuring)
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # the hand-off socket: client connections handed to the worker (handoff.py)
        hand_parent, hand_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        err_read, err_write = os.pipe2(os.O_CLOEXEC)
        # a kept worker holds its uid's lock itself (the lock is the open file's): systemd
        # gives the uid to no one while the worker lives, whichever edged is there
        lock = self.pool.uids.lock_fd(self.id) if self.pool.keep else None
        try:
            prepare_cgroup(self.spec.limits)
            # a leaf that outlived its last worker keeps its count: OOM kills are counted since
            self._oom_kills_at_start = read_oom_kills(self.spec.limits) or 0
            self.spec = _with_egress_filter(self.spec)
            # Popen, not asyncio's subprocess transport: that kills its child when edged's
            # loop closes, and a kept worker outlives edged; it blocks for the fork and exec
            # only, as create_subprocess_exec does
            self.proc = subprocess.Popen(  # noqa: ASYNC220
                [
                    python,
                    "-m",
                    "edged.runtime.worker",
                    str(child.fileno()),
                    f"--handoff={hand_child.fileno()}",
                    orjson.dumps(self.spec.to_json()).decode(),  # last: adopting.py reads it
                ],
                pass_fds=(child.fileno(), hand_child.fileno()) + (() if lock is None else (lock,)),
                stdin=subprocess.DEVNULL,
                stderr=err_write,  # read into self.output (output.py)
                start_new_session=True,
                env=_worker_env(),
                # a worker of its own uid cannot reach edged's working directory
                cwd="/" if self.spec.uid >= 0 else None,
            )
        except Exception:
            parent.close()
            hand_parent.close()
            os.close(err_read)
            self.pool.uids.release(self.id)
            raise
        finally:
            child.close()
            hand_child.close()
            os.close(err_write)
        self.pid = self.proc.pid
        self.adopted, self.record = False, None
        self.pool.started_pids.append(self.pid)
        loop = asyncio.get_running_loop()
        try:
            pidfd: int | None = os.pidfd_open(self.pid)
        except OSError:  # Linux before 5.3: a thread waits for the child instead
            pidfd = None
        self._watch_pidfd(pidfd, self.proc)
        self.pool.track(asyncio.ensure_future(self._wait()))
        self.pool.write_record(self)
        await self._read_output(err_read)
        parent.setblocking(False)
        self._close_handoff()
        self.handoff = HandoffLink(hand_parent, self._returned)
        _, channel = await loop.connect_accepted_socket(lambda: ReplicaChannel(self), sock=parent)
        self.channel = channel
        log.info("replica starting", replica=self.id, pid=self.pid, restarts=self.restarts)

    async def _read_output(self, err_read: int) -> None:
        ring = self.output
        self._output_pipe, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: OutputReader(ring), os.fdopen(err_read, "rb", buffering=0)
        )

    def _watch_pidfd(self, pidfd: int | None, child: subprocess.Popen[bytes] | None) -> None:
        """Resolve :attr:`gone` when the process behind ``pidfd`` exits: with its status when
        it is edged's ``child`` (reaped here), None when it is not (adopted). Without a pidfd
        (a kernel before 5.3), a thread waits for the child."""
        loop = asyncio.get_running_loop()
        self.pidfd = pidfd
        self.gone = gone = loop.create_future()
        if pidfd is None:
            assert child is not None

            def ended(code: int) -> None:
                if not gone.done():
                    gone.set_result(code)

            def wait() -> None:
                loop.call_soon_threadsafe(ended, child.wait())

            threading.Thread(target=wait, name=f"wait-{child.pid}", daemon=True).start()
            return

        def on_exit() -> None:
            loop.remove_reader(pidfd)
            code: int | None = None
            if child is not None:
                try:
                    _, status = os.waitpid(child.pid, os.WNOHANG)
                    code = os.waitstatus_to_exitcode(status)
                except ChildProcessError:
                    code = child.returncode
                child.returncode = code
            if not gone.done():
                gone.set_result(code)

        loop.add_reader(pidfd, on_exit)

    # -- adoption (adopting.py) ---------------------------------------------------------------
    def watch(self, record: WorkerRecord, pidfd: int) -> None:
        """Supervise the kept worker of ``record`` (proven already; ``pidfd`` open on it): its
        exit is seen through the pidfd (it is not edged's child: edged neither reaps it nor
        learns its exit status)."""
        self.pid, self.proc, self.adopted, self.record = record.pid, None, True, record
        self.pool.started_pids.append(record.pid)  # edged's (drift), though not its child
        self.restarts, self.crash_streak = record.restarts, record.crash_streak
        self._watch_pidfd(pidfd, None)
        self.pool.track(asyncio.ensure_future(self._wait()))

    async def attach(self, record: WorkerRecord, timeout: float) -> str:
        """Connect to the watched kept worker of ``record``, hand it a stderr pipe, and wait
        for its READY (naming its pid) and a PONG to a PING within ``timeout``: "" once it
        serves here, else why not (the caller kills it)."""
        loop = asyncio.get_running_loop()
        gone = self.gone
        assert gone is not None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        err_read, err_write = os.pipe2(os.O_CLOEXEC)
        try:
            sock.setblocking(False)
            await asyncio.wait_for(loop.sock_connect(sock, "\0" + self.spec.attach_name), timeout)
            peer_pid, _, _ = PEERCRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size)
            )
            why = ""
            if peer_pid != record.pid:
                why = f"its socket is held by pid {peer_pid}, not by pid {record.pid}"
            else:
                socket.send_fds(sock, [ATTACH_HELLO], [err_write])
        except (OSError, TimeoutError) as exc:
            why = f"its socket @{self.spec.attach_name} does not answer: {exc!s}"
        finally:
            os.close(err_write)
        if why:
            sock.close()
            os.close(err_read)
            return why
        await self._read_output(err_read)
        self._close_handoff()  # an adopted worker serves through frames only
        self._adopting = loop.create_future()
        _, channel = await loop.connect_accepted_socket(lambda: ReplicaChannel(self), sock=sock)
        self.channel = channel
        try:
            meta = await asyncio.wait_for(asyncio.shield(self._adopting), timeout)
            if meta.get("pid") != record.pid:
                return f"its READY names pid {meta.get('pid')}, not {record.pid}"
            self._adopting = loop.create_future()
            channel.send(FrameType.PING)
            pong = await asyncio.wait_for(asyncio.shield(self._adopting), timeout)
            # what it did for the last edged is not this edged's to count: its totals now are
            # where this edged's counting starts (batches, overlap and answers alike)
            report, _ = overlapstats.from_pong(pong)
            if report is not None:
                self._overlap_seen = (report, self._channel_counts())
            answered, _ = answerstats.from_pong(pong)
            if answered is not None:
                self._answers_seen = (answered, self._channel_counts())
            batches = from_pong(pong)
            if batches is not None:
                busy = pong.get("busy_s", 0.0)
                busy_s = float(busy) if type(busy) in (int, float) else 0.0
                busy_s = busy_s if math.isfinite(busy_s) and busy_s > 0 else 0.0
                self._batches_seen = (batches, time.monotonic(), busy_s)
        except TimeoutError:
            return f"no READY and PONG within {timeout:g}s"
        finally:
            self._adopting = None
        if gone.done():
            return "it exited while being adopted"
        self.started_at = time.monotonic()
        self.on_ready(meta)  # Starting -> Ready, probes from now on
        log.info("replica adopted", replica=self.id, pid=self.pid, restarts=self.restarts)
        return ""

    def _with_uid(self, spec: LaunchSpec) -> LaunchSpec:
        """``spec`` with the uid of its own this replica runs as (held until its process has
        exited: runtime/identities.py), when its sandbox asks for one."""
        if not spec.sandbox.separate_uid:
            return replace(spec, uid=-1, uid_problem="", groups=())
        try:
            uid = self.pool.uids.acquire(self.id, slot_key(self.workload, self.slot))
        except (NoUidFree, OSError) as exc:
            log.error("no worker uid", replica=self.id, error=str(exc))
            return replace(spec, uid=-1, uid_problem=str(exc), groups=())
        groups = accelerator_groups(spec.sandbox.device_paths)
        return replace(spec, uid=uid, uid_problem="", groups=groups)

    async def _wait(self) -> None:
        assert self.gone is not None
        code = await self.gone
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        self.pool.records_remove(self.id)  # it exited under edged's eyes: nothing to adopt
        self.pool.uids.release(self.id)  # the process is gone: its uid may serve another
        now = time.monotonic()
        self._cancel_probe()
        if self.channel is not None and self.channel.transport is not None:
            self.channel.transport.close()
        was_ready = self.phase in (Phase.READY, Phase.UNREADY)
        oom_kills = (read_oom_kills(self.spec.limits) or 0) - self._oom_kills_at_start
        verdict = classify_exit(
            code,
            stopping=self.phase is Phase.STOPPING or self.pool.detached,
            killed=self._killed,
            failed=self._failed,
            ready_since=self.ready_since,
            crash_streak=self.crash_streak,
            now=now,
            oom_kills=max(0, oom_kills),
            memory_max=self.spec.limits.memory_bytes,
        )
        remove_cgroup(self.spec.limits)
        if self.spec.sandbox.egress_cgroup not in ("", self.spec.limits.cgroup_path):
            try:
                egressfilter.remove(self.spec.sandbox.egress_cgroup)
            except OSError as exc:
                log.warning("egress cgroup not removed", replica=self.id, error=str(exc))
        self.pid = None
        self.exited_at = now
        if verdict.stopped:
            log.info("replica stopped", replica=self.id, code=code)
            self.pool.remove(self)
            return
        self.exit_reason, self.exit_message = verdict.reason, verdict.message
        self.exit_code, self.finished_at = code, time.time()
        self.crash_streak = verdict.crash_streak
        self.phase = Phase.EXITED
        if self._failed is not None and self._failed[0] == ARTIFACT_DIGEST_MISMATCH:
            self.pool.artifact_rotten(self.workload, self.spec.artifact_sha256)
        if was_ready:
            self.pool.serving_changed(self, ready=False)
        log.warning(
            "replica exited",
            replica=self.id,
            code=code,
            reason=self.exit_reason,
            message=self.exit_message,
            crash_streak=self.crash_streak,
        )
        self.pool.notify(self.workload)

    def kill(self, reason: str, message: str) -> None:
        self._killed = (reason, message)
        self.signal(signal.SIGKILL)

    @property
    def running(self) -> bool:
        return self.gone is not None and not self.gone.done()

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the current process, through its pidfd (a child edged started or
        a worker it adopted)."""
        if not self.running:
            return
        try:
            if self.pidfd is not None:  # never a bare pid: it may be another's by now
                signal.pidfd_send_signal(self.pidfd, sig)
            elif self.proc is not None:  # no pidfds (Linux < 5.3): the child, not yet reaped
                self.proc.send_signal(sig)
        except ProcessLookupError:
            pass

    async def stop(self) -> None:
        """Out of serving, DRAIN, wait; then SIGTERM, then SIGKILL."""
        if self.phase is Phase.READY:
            self.pool.serving_changed(self, ready=False)
        self.phase = Phase.STOPPING
        self._cancel_probe()
        gone = self.gone
        if gone is None or gone.done():
            self.pool.remove(self)
            return
        if self.channel is not None:
            self.channel.send(FrameType.DRAIN)
        for sig, timeout in ((None, DRAIN_TIMEOUT_S), (signal.SIGTERM, TERM_TIMEOUT_S)):
            if sig is not None:
                self.signal(sig)
            try:
                await asyncio.wait_for(asyncio.shield(gone), timeout)
                return
            except TimeoutError:
                log.warning("replica did not stop in time", replica=self.id, timeout=timeout)
        self.signal(signal.SIGKILL)

    def detach(self) -> None:
        """edged stops and keeps this worker: leave it running, its record written, its
        channel and stderr pipe closed (it waits for the next edged); its uid stays locked by
        the worker itself."""
        self._cancel_probe()
        self.pool.write_record(self)
        for transport in (self.channel.transport if self.channel else None, self._output_pipe):
            if transport is not None:
                transport.close()


def pidfds_supported() -> bool:
    """Whether this kernel has pidfd_open (Linux 5.3): what adopting a worker needs."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (OSError, AttributeError):
        return False
    return True


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    # The worker's own thread pools come from SessionOptions; keep BLAS/OpenMP from
    # spawning one thread per core behind the limits' back.
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")] if p
    )
    return env


def _with_egress_filter(spec: LaunchSpec) -> LaunchSpec:
    """``spec`` with the cgroup its worker joins to have its egress rules that name addresses
    enforced (egressfilter.py), or with why there is none (the worker then does not start)."""
    sandbox = spec.sandbox
    if not sandbox.egress_rules or sandbox.refused:
        return spec
    limits_cgroup = spec.limits.cgroup_path if spec.limits.mode == "cgroup" else ""
    try:
        path = egressfilter.prepare(spec.replica_id, sandbox.egress_rules, limits_cgroup)
    except (egressfilter.EgressFilterError, OSError) as exc:
        return replace(spec, sandbox=replace(sandbox, egress_cgroup="", egress_problem=str(exc)))
    return replace(spec, sandbox=replace(sandbox, egress_cgroup=str(path), egress_problem=""))
