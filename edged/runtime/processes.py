"""Worker processes: start, probe, route to, drain and stop them (the runtime's applier side).

:class:`WorkerPool` owns one :class:`Replica` record per replica slot. Records outlive the
processes they run, so restarts and crash streaks are counted per slot. Every state change
(ready, unready, exit) only calls ``notify(workload)``: the reconciler decides what to do.

Probes run per replica on one timer (no task); what a tick or an answer means is decided by
``probing.py``, what an exit means by ``exiting.py`` (both pure). This module performs it.
"""

from __future__ import annotations

import asyncio
import collections
import math
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from edged.reconcile.model import Phase, ReplicaObservation
from edged.runtime import egressfilter
from edged.runtime.adopting import (
    ATTACH_HELLO,
    WorkerRecord,
    WorkerRecords,
    check_desired,
    check_identity,
    identify,
    record_for,
)
from edged.runtime.adopting import boot_id as current_boot_id
from edged.runtime.batchstats import BatchCounts, advance, from_pong
from edged.runtime.exiting import classify_exit, classify_launch_failure
from edged.runtime.framing import (
    HEADER,
    NO_HEADER_LENGTH,
    RESULT_PREFIX,
    U32,
    FrameReader,
    FrameType,
    encode_frame,
)
from edged.runtime.identities import NoUidFree, WorkerUids, accelerator_groups, slot_key
from edged.runtime.launching import LaunchSpec
from edged.runtime.limiting import LimitsError, prepare_cgroup, read_oom_kills, remove_cgroup
from edged.runtime.output import OutputReader, OutputRing
from edged.runtime.probing import ProbeState, check_probes, record_pong
from edged.workloads import ReplicaId, WorkloadName
from edgefleet.api import Probes
from edgefleet.api.conditions import Condition, ConditionStatus
from edgefleet.logs import get_logger

if TYPE_CHECKING:
    from edged.serving.http import Request, Response

log = get_logger(__name__)

DRAIN_TIMEOUT_S = 30.0
# how long a replica whose worker is ready waits for its model's measurement (a TPM extend,
# WorkerPool's ``measure``) before it serves anyway: a slow TPM does not hold serving up
MEASURE_WAIT_S = 5.0
GONE_OUTPUTS_KEPT = 16  # stderr rings of replicas that left the pool, kept for edgectl logs
TERM_TIMEOUT_S = 5.0
ARTIFACT_DIGEST_MISMATCH = "ArtifactDigestMismatch"  # the worker's reason (worker.py)

_JSON = b"application/json"
_BINARY = b"application/octet-stream"


class ReplicaChannel(asyncio.Protocol):
    """edged's end of the socket pair to one worker."""

    def __init__(self, replica: Replica) -> None:
        self._replica = replica
        self._reader = FrameReader(self._on_frame)
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, tuple[Response, float]] = {}
        self._next_id = 1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self._reader.feed(data)
        except Exception as exc:
            log.error("bad frame from worker", replica=self._replica.id, error=str(exc))
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        pending, self.pending = self.pending, {}
        now = time.perf_counter()
        for resp, t0 in pending.values():
            resp.send_error(503, "the model replica exited while serving this request")
            self._replica.on_result(503, now - t0)  # edged's own 503s are errors too
        self._replica.on_channel_lost()

    def send(self, ftype: int, payload: bytes = b"") -> int:
        req_id = self._next_id
        self._next_id = (req_id + 1) & 0xFFFFFFFF or 1
        if self.transport is not None:
            self.transport.write(encode_frame(ftype, req_id, payload))
        return req_id

    def forward(self, req: Request, resp: Response) -> None:
        hdr = req.headers.get("inference-header-content-length")
        hlen = NO_HEADER_LENGTH
        if hdr is not None:
            hdr = hdr.strip()
            if not (hdr.isascii() and hdr.isdigit()) or len(hdr) > 12:
                resp.send_error(
                    400, "Inference-Header-Content-Length must be a non-negative integer"
                )
                return
            hlen = int(hdr)
            if hlen > len(req.body):
                resp.send_error(
                    400,
                    f"Inference-Header-Content-Length ({hlen}) is larger than the request "
                    f"body ({len(req.body)} bytes)",
                )
                return
        req_id = self._next_id
        self._next_id = (req_id + 1) & 0xFFFFFFFF or 1
        transport = self.transport
        if transport is None:
            resp.send_error(503, "the model replica is not connected")
            self._replica.on_result(503, 0.0)
            return
        body = req.body
        transport.write(
            b"".join((HEADER.pack(len(body) + 4, FrameType.INFER, req_id), U32.pack(hlen), body))
        )
        self.pending[req_id] = (resp, time.perf_counter())

    def _on_frame(self, ftype: int, req_id: int, payload: bytes) -> None:
        if ftype == FrameType.RESULT:
            item = self.pending.pop(req_id, None)
            if item is None:
                return
            resp, t0 = item
            status, hlen = RESULT_PREFIX.unpack_from(payload, 0)
            body = payload[RESULT_PREFIX.size :]
            if hlen == NO_HEADER_LENGTH:
                resp.send(status, body, _JSON)
            else:
                resp.send(status, body, _BINARY, b"Inference-Header-Content-Length: %d\r\n" % hlen)
            self._replica.on_result(status, time.perf_counter() - t0)
        elif ftype == FrameType.PONG:
            self._replica.on_pong(orjson.loads(payload))
        elif ftype == FrameType.READY:
            self._replica.on_ready(orjson.loads(payload))
        elif ftype == FrameType.FAILED:
            doc = orjson.loads(payload)
            self._replica.on_failed(str(doc.get("reason", "")), str(doc.get("message", "")))


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
        busy = float(doc.get("busy_s", 0.0))
        self._count_batches(doc, busy)
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

    def on_channel_lost(self) -> None:
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
                    orjson.dumps(self.spec.to_json()).decode(),
                ],
                pass_fds=(child.fileno(),) if lock is None else (child.fileno(), lock),
                stdin=subprocess.DEVNULL,
                stderr=err_write,  # read into self.output (output.py)
                start_new_session=True,
                env=_worker_env(),
                # a worker of its own uid cannot reach edged's working directory
                cwd="/" if self.spec.uid >= 0 else None,
            )
        except Exception:
            parent.close()
            os.close(err_read)
            self.pool.uids.release(self.id)
            raise
        finally:
            child.close()
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
        self._adopting = loop.create_future()
        _, channel = await loop.connect_accepted_socket(lambda: ReplicaChannel(self), sock=sock)
        self.channel = channel
        try:
            meta = await asyncio.wait_for(asyncio.shield(self._adopting), timeout)
            if meta.get("pid") != record.pid:
                return f"its READY names pid {meta.get('pid')}, not {record.pid}"
            self._adopting = loop.create_future()
            channel.send(FrameType.PING)
            await asyncio.wait_for(asyncio.shield(self._adopting), timeout)
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


STARTED_PIDS_KEPT = 256
PEERCRED = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid
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
        last liveness probe (``batchstats.py``). ``records``: where kept workers' records are
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
            return
        for rep in list(self._replicas.values()):
            if rep.phase is Phase.EXITED:
                continue
            self.stop(rep.id)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout + TERM_TIMEOUT_S + 1)
        for rep in list(self._replicas.values()):
            rep.signal(signal.SIGKILL)

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
    ExecStopPost= (edged.launcher.cleanup_cgroup) disables the controllers below edged's
    cgroup for systemd to start the unit again, and enabling them again leaves each leaf's
    cpu.max and memory.max at "max"."""
    try:
        prepare_cgroup(spec.limits)
    except LimitsError as exc:
        return f"its limits cannot be written again: {exc}"
    return ""


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
