"""The inference worker: one process per replica, one ONNX Runtime session.

Started by edged as ``python -m edged.runtime.worker FD SPEC_JSON``; FD is its end of a Unix
socket pair to edged (see ``framing.py``). It:

1. dies with edged (PR_SET_PDEATHSIG), unless it is a kept worker (``attach_name``: it
   outlives edged and waits for the next one on that socket, ``adopting.py``), and applies its
   resource limits before anything else;
   with a uid of its own (edged runs as root), it then imports numpy and the standard library
   it needs and opens its artifact, validation set and secrets' directories while still root,
   and its sandbox
   (``sandboxing.py``) switches it to that uid before it reads any of them;
2. reads the artifact from the content-addressed store, checks its sha256 *again* (so a file
   swapped on disk after verification is never loaded) and builds the session from those bytes;
3. picks execution providers: the requested ones that this onnxruntime build offers, falling
   back to CPU with a condition that edged shows in status;
4. runs a warm-up inference (the startup probe passes only after it) and sends READY;
5. serves INFER frames with adaptive dynamic batching (the policy: ``batching.py``): requests
   that arrive while a batch runs are merged (up to ``max_batch_size`` rows) into the next
   one, and the queue is held briefly when the clients of the last batch are about to come
   back. Fast models run inline on the event loop (no thread hop); slower ones run in the
   runner thread (:class:`_Runner`), so the loop reads and decodes the next requests and
   encodes the last batch's answers while ONNX Runtime runs, and a next batch that cannot
   grow any more is handed over before the running one ends. Binary requests and answers
   are not copied: tensors are views of the bytes read, answers views of the output arrays.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import hashlib
import os
import queue
import signal
import socket
import struct
import sys
import threading
import time
from typing import Any

import orjson

from edged.runtime.adopting import ATTACH_HELLO
from edged.runtime.batching import QueueShape, choose_batch, hold_queue
from edged.runtime.batchstats import BatchCounts
from edged.runtime.configstage import attach
from edged.runtime.framing import (
    HEADER,
    NO_HEADER_LENGTH,
    RESULT_PREFIX,
    U32,
    FrameReader,
    FrameType,
    encode_frame,
)
from edged.runtime.launching import LaunchSpec
from edged.runtime.limiting import apply_limits
from edged.runtime.sandboxing import Protections, SandboxUnavailable, apply_sandbox

EXIT_LOAD_FAILED = 3
INLINE_BELOW_S = 0.0002  # run batches on the event loop when one takes less than this
WARMUP_RUNS = 5
BENCH_RUNS = 20  # the self-benchmark after the warm-up: at most this many timed runs...
BENCH_BUDGET_S = 2.0  # ...within this long (at least one run), before READY
PEAK_WINDOW = 8  # batches over which the recent peak of requests in flight is remembered
TEST_PROBE_ENV = "EDGEFLEET_TEST_WORKER_PROBE"
SECRET_DIRS_ENV = "EDGEFLEET_SECRET_DIRS"
CONFIG_ENV = "EDGEFLEET_MODEL_CONFIG"  # edged.state.modelconfigs.ENV_CONFIG
CONFIG_DIR_ENV = "EDGEFLEET_MODEL_CONFIG_DIR"  # edged.state.modelconfigs.ENV_CONFIG_DIR
"""Tests only: a JSON list of ``{"open": PATH}`` / ``{"connect": "HOST:PORT"}`` (``[V6]:PORT``) /
``{"bind": "HOST:PORT"}`` / ``{"udp": ""}`` / ``{"secret": "MOUNTPATH/KEY"}`` (a secret's file
through ``EDGEFLEET_SECRET_DIRS``, as a workload finds it) the worker tries once its sandbox
is in force and its model loaded, reporting each outcome in READY (``testProbe``). Read from
the environment edged was started with, never from edged.toml or a manifest; it only tries
and reports, it grants nothing."""


class LoadError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _outlive_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, 0)  # PR_SET_PDEATHSIG: none
    except (OSError, AttributeError):
        pass


def _read_verified(path: str, sha256: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise LoadError("ArtifactUnreadable", f"cannot read {path}: {exc.strerror}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise LoadError(
            "ArtifactDigestMismatch",
            f"{path} has sha256 {digest}, expected {sha256}: refusing to load it",
        )
    return data


class Model:
    """An ONNX Runtime session plus what the protocol needs to know about it."""

    def __init__(
        self, spec: LaunchSpec, data: bytes, protections: Protections | None = None
    ) -> None:
        self.protections = protections
        try:
            import onnxruntime as ort
        except ImportError as exc:  # pragma: no cover - packaging error
            raise LoadError("RuntimeMissing", f"onnxruntime cannot be imported: {exc}") from None
        from edged.runtime.tensors import spec_from_ort

        available = ort.get_available_providers()
        providers = [p for p in spec.providers if p in available]
        self.conditions: list[dict[str, str]] = []
        missing = [p for p in spec.providers if p not in available]
        if missing:
            self.conditions.append(
                {
                    "type": "ProviderFallback",
                    "reason": "ProviderUnavailable",
                    "message": f"{', '.join(missing)} not available in this onnxruntime build "
                    f"(available: {', '.join(available)}); "
                    + ("using " + ", ".join(providers) if providers else "falling back to CPU"),
                }
            )
        if "CPUExecutionProvider" not in providers:
            providers.append("CPUExecutionProvider")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = spec.intra_op_threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        # No busy-waiting thread pools: edged is a guest on small devices.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        try:
            self.session = ort.InferenceSession(data, sess_options=opts, providers=providers)
        except MemoryError:
            raise LoadError(
                "MemoryLimitTooLow", "the model does not fit in the worker's memory limit"
            ) from None
        except Exception as exc:  # onnxruntime raises its own exception types
            raise LoadError(
                "ModelLoadFailed", f"onnxruntime cannot load the model: {exc}"
            ) from None
        self.providers = self.session.get_providers()
        self.inputs = {n.name: spec_from_ort(n) for n in self.session.get_inputs()}
        self.outputs = tuple(n.name for n in self.session.get_outputs())
        self.output_specs = [spec_from_ort(n) for n in self.session.get_outputs()]
        unsupported = [s.name for s in self.inputs.values() if s.datatype == "BYTES"]
        if unsupported:
            raise LoadError(
                "UnsupportedModel", f"string (BYTES) inputs are not supported: {unsupported}"
            )
        self.batchable = spec.max_batch_size > 1 and all(
            s.shape and s.shape[0] == -1 for s in self.inputs.values()
        )
        self.max_batch = spec.max_batch_size if self.batchable else 1
        self.run_s, self.benchmark = self._warm_up()
        self.validation: dict[str, Any] | None = None  # set by main() on slot 0
        self.stage: Any = None  # its config's processing (runtime/configstage.py), by main()

    def _warm_up(self) -> tuple[float, dict[str, Any]]:
        """The warm-up (its median run) and the self-benchmark that follows it: the p95 of
        up to :data:`BENCH_RUNS` timed runs within :data:`BENCH_BUDGET_S` (the hub keeps a
        deployment with ``placement.maxLatencyP95`` off devices over it)."""
        import numpy as np

        from edged.runtime.tensors import _OIP_TO_NUMPY

        feeds = {
            s.name: np.zeros([1 if d < 0 else d for d in s.shape], dtype=_OIP_TO_NUMPY[s.datatype])
            for s in self.inputs.values()
        }
        times: list[float] = []
        bench: list[float] = []
        started = time.perf_counter()
        for i in range(WARMUP_RUNS + BENCH_RUNS):
            if i >= WARMUP_RUNS and bench and time.perf_counter() - started > BENCH_BUDGET_S:
                break
            if i == WARMUP_RUNS:
                started = time.perf_counter()
            t0 = time.perf_counter()
            try:
                self.session.run(None, feeds)
            except Exception as exc:
                raise LoadError("WarmupFailed", f"warm-up inference failed: {exc}") from None
            (times if i < WARMUP_RUNS else bench).append(time.perf_counter() - t0)
        bench.sort()
        p95 = bench[max(0, -(-len(bench) * 95 // 100) - 1)]
        return sorted(times)[len(times) // 2], {"p95Seconds": p95, "runs": len(bench)}

    def metadata(self, spec: LaunchSpec) -> dict[str, Any]:
        meta = {
            "name": spec.model_name,
            "versions": [spec.model_version],
            "platform": "onnxruntime_onnx",
            "inputs": [s.to_json() for s in self.inputs.values()],
            "outputs": [s.to_json() for s in self.output_specs],
            "providers": self.providers,
            "conditions": self.conditions,
            "batching": {"maxBatchSize": self.max_batch, "batchable": self.batchable},
            "warmupSeconds": self.run_s,
            "pid": os.getpid(),
            "validation": self.validation,
            "benchmark": self.benchmark,
        }
        if self.stage is not None:
            meta["config"] = self.stage.report()
        if self.protections is not None:
            meta["sandbox"] = self.protections.to_json()
        probe = os.environ.get(TEST_PROBE_ENV)
        if probe:
            meta["testProbe"] = _run_test_probe(probe)
            print(f"worker test probe: {orjson.dumps(meta['testProbe']).decode()}", file=sys.stderr)
        return meta


class OverlapCounts:
    """Running totals of the work the event loop did while ONNX Runtime ran a batch in the
    runner thread: requests decoded, answers encoded, and batches handed over before the one
    running ended (they started with no hop through the loop)."""

    __slots__ = ("decoded", "encoded", "staged")

    def __init__(self) -> None:
        self.decoded = 0
        self.encoded = 0
        self.staged = 0

    def to_pong(self) -> dict[str, int]:
        return {"decoded": self.decoded, "encoded": self.encoded, "staged": self.staged}


class _Pending:
    __slots__ = ("decoded", "enqueued", "req_id")

    def __init__(self, req_id: int, decoded: Any, enqueued: float) -> None:
        self.req_id = req_id
        self.decoded = decoded
        self.enqueued = enqueued


class WorkerProtocol(asyncio.Protocol):
    """Serves frames from edged; owns the batch queue."""

    def __init__(
        self, spec: LaunchSpec, model: Model, done: asyncio.Future[int], *, kept: bool = False
    ) -> None:
        from edged.runtime import tensors

        self._tensors = tensors
        self._spec = spec
        self._model = model
        self._done = done
        self._loop = asyncio.get_running_loop()
        self._reader = FrameReader(self._on_frame, views=True)
        self._transport: asyncio.Transport | None = None
        self._queue: collections.deque[_Pending] = collections.deque()
        self._queued_rows = 0
        # the batches handed to ONNX Runtime and not ended yet, oldest first (at most two: the
        # one running and the next, ready); when the oldest began (or was handed over)
        self._running: collections.deque[list[_Pending]] = collections.deque()
        self._running_since: float | None = None
        # fast models run inline on the event loop; slower ones in the runner thread
        self._runner = (
            None if model.run_s < INLINE_BELOW_S else _Runner(model.session, self._loop, self._ran)
        )
        self._overlap = OverlapCounts()  # work done while ONNX Runtime ran, sent in each PONG
        self._delay_handle: asyncio.TimerHandle | None = None
        self._draining = False
        self._inflight = 0
        self._peaks: collections.deque[int] = collections.deque([1], maxlen=PEAK_WINDOW)
        self._peak_now = 0  # most requests in flight at once since the last batch started
        self._last_run_s = model.run_s
        self._idle_since = 0.0
        self._batch_rows = model.max_batch  # lowered by edged when memory is short
        self._plans = tensors.BinaryPlans()  # binary-request headers already checked
        self._counts = BatchCounts()  # batches run to completion, sent in each PONG
        # a kept worker outlives its connection to edged: ``lost`` ends each connection
        self._kept = kept
        self.lost: asyncio.Future[None] = self._loop.create_future()

    # -- connection ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._reader = FrameReader(self._on_frame, views=True)  # a new edged: a frame's start
        if self.lost.done():
            self.lost = self._loop.create_future()
        meta = self._model.metadata(self._spec)
        self._write(encode_frame(FrameType.READY, 0, orjson.dumps(meta)))

    def data_received(self, data: bytes) -> None:
        try:
            self._reader.feed(data)
        except Exception as exc:
            print(f"worker: bad frame from edged: {exc}", file=sys.stderr)
            self._finish(2)
            return
        self._maybe_run()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if not self._kept or self._draining:
            self._finish(0)  # edged went away (or closed us): nobody is left to answer
            return
        # kept: what edged asked and is not running yet has nobody to answer it; the batch that
        # runs ends (and is counted) as usual, its answers unsent
        self._inflight -= len(self._queue)
        self._queue.clear()
        self._queued_rows = 0
        if self._delay_handle is not None:
            self._delay_handle.cancel()
            self._delay_handle = None
        if not self.lost.done():
            self.lost.set_result(None)

    def _finish(self, code: int) -> None:
        if not self._done.done():
            self._done.set_result(code)

    # -- frames ---------------------------------------------------------------------------------
    def _on_frame(self, ftype: int, req_id: int, payload: bytes) -> None:
        """``payload``: a view of the bytes read (see ``FrameReader``), kept alive by what is
        decoded from it."""
        if ftype == FrameType.INFER:
            if self._running:
                self._overlap.decoded += 1
            self._inflight += 1
            self._peak_now = max(self._peak_now, self._inflight)
            (hlen,) = U32.unpack_from(payload, 0)
            body = memoryview(payload)[4:]  # no copy of the request body
            try:
                decoded = self._tensors.decode_request(
                    body,
                    None if hlen == NO_HEADER_LENGTH else hlen,
                    self._model.inputs,
                    self._model.outputs,
                    batchable=self._model.batchable,
                    plans=self._plans,
                )
            except self._tensors.InferenceRequestError as exc:
                self._reply(req_id, 400, self._tensors.error_body(str(exc)), None)
                return
            if decoded.rows > self._model.max_batch and self._model.batchable:
                self._reply(
                    req_id,
                    400,
                    self._tensors.error_body(
                        f"batch of {decoded.rows} rows exceeds maxBatchSize {self._model.max_batch}"
                    ),
                    None,
                )
                return
            self._queue.append(_Pending(req_id, decoded, time.monotonic()))
            self._queued_rows += decoded.rows
        elif ftype == FrameType.PING:
            if (stage := self._model.stage) is not None:
                stage.refresh()  # a config changed while no request came
            busy = 0.0 if self._running_since is None else time.monotonic() - self._running_since
            pong = orjson.dumps(
                {
                    "inflight": self._inflight,
                    "busy_s": busy,
                    "batch_rows": self._batch_rows,
                    **self._counts.to_pong(),
                    "overlap": self._overlap.to_pong(),
                    **({"config": stage.report()} if stage is not None else {}),
                }
            )
            self._write(encode_frame(FrameType.PONG, req_id, pong))
        elif ftype == FrameType.DRAIN:
            self._draining = True
            self._maybe_exit()
        elif ftype == FrameType.BATCH_LIMIT and len(payload) == U32.size:
            self._batch_rows = max(1, min(self._model.max_batch, U32.unpack(payload)[0]))

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def _reply(self, req_id: int, status: int, body: bytes, header_len: int | None) -> None:
        self._inflight -= 1
        self._send_results(list(_result_frame(req_id, status, body, header_len)))

    def _send_results(self, parts: list[bytes | memoryview]) -> None:
        """Answers (each a frame head and a body; no longer counted in flight): one vectored
        write for all of them, with no copy of the bodies."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.writelines(parts)
        if self._draining:
            self._maybe_exit()

    def _maybe_exit(self) -> None:
        if self._draining and self._inflight == 0:
            self._finish(0)

    # -- batching -------------------------------------------------------------------------------
    def _maybe_run(self) -> None:
        if not self._queue:
            return
        if self._running:
            # A batch runs in the runner thread. Hand it the next one now if that one cannot
            # grow any more (full, or as many requests as were recently in flight at once):
            # the runner starts it the moment the running one ends, with no hop through this
            # loop in between. Anything less waits for the running batch to end, as below.
            if self._runner is not None and len(self._running) == 1 and self._next_is_full():
                self._overlap.staged += 1
                self._start_batch()
            return
        if self._model.batchable and not self._draining:
            wait = self._batch_wait()
            if wait > 0:
                if self._delay_handle is None:
                    self._delay_handle = self._loop.call_later(wait, self._on_delay)
                return
        self._start_batch()

    def _next_is_full(self) -> bool:
        if self._queued_rows >= self._batch_rows or not self._model.batchable:
            return True
        return len(self._queue) >= min(max(self._peaks), self._batch_rows)

    def _batch_wait(self) -> float:
        """How much longer to hold the queue for more requests (0 or less: run now)."""
        shape = QueueShape(
            queued=len(self._queue),
            queued_rows=self._queued_rows,
            oldest_enqueued=self._queue[0].enqueued,
            idle_since=self._idle_since,
            recent_peak=max(self._peaks),
            last_run_s=self._last_run_s,
        )
        return hold_queue(
            shape,
            max_rows=self._batch_rows,
            max_queue_delay=self._spec.max_queue_delay_s,
            now=time.monotonic(),
        )

    def _on_delay(self) -> None:
        self._delay_handle = None
        if not self._running and self._queue:
            self._start_batch()

    def _take_batch(self) -> list[_Pending]:
        queue = self._queue
        chosen = choose_batch(
            ((p.decoded.batch_key, p.decoded.rows) for p in queue),
            max_rows=self._batch_rows,
            batchable=self._model.batchable,
        )
        head = [queue.popleft() for _ in range(chosen[-1] + 1)]
        if len(chosen) == len(head):
            batch = head
        else:
            picked = set(chosen)
            batch = [head[i] for i in chosen]
            queue.extendleft(reversed([p for i, p in enumerate(head) if i not in picked]))
        self._queued_rows -= sum(p.decoded.rows for p in batch)
        return batch

    def _start_batch(self) -> None:
        if self._delay_handle is not None:
            self._delay_handle.cancel()
            self._delay_handle = None
        batch = self._take_batch()
        self._peaks.append(self._peak_now)
        self._peak_now = self._inflight
        if not self._running:
            self._running_since = time.monotonic()
        self._running.append(batch)
        first = batch[0].decoded
        try:
            feeds = _batch_feeds(batch)
        except Exception as exc:  # e.g. no memory for the merged inputs
            self._running.pop()
            self._batch_ran(batch, None, exc, 0.0, 0.0)
            return
        if self._runner is None:
            t0 = time.monotonic()
            try:
                outputs = self._model.session.run(list(first.outputs), feeds)
            except Exception as exc:
                self._ran(batch, None, exc, t0, time.monotonic())
            else:
                self._ran(batch, outputs, None, t0, time.monotonic())
            return
        self._runner.submit(batch, feeds, first.outputs)

    def _ran(
        self,
        batch: list[_Pending],
        outputs: list[Any] | None,
        exc: BaseException | None,
        started: float,
        ended: float,
    ) -> None:
        """A batch ended (on this loop; posted by the runner thread when there is one)."""
        self._running.popleft()
        self._batch_ran(batch, outputs, exc, started, ended)

    def _batch_ran(
        self,
        batch: list[_Pending],
        outputs: list[Any] | None,
        exc: BaseException | None,
        started: float,
        ended: float,
    ) -> None:
        now = time.monotonic()
        if self._running_since is not None:
            self._last_run_s = now - self._running_since
        if self._running:
            self._running_since = ended  # the runner started the next one as this one ended
        else:
            self._running_since = None
            self._idle_since = now
        self._inflight -= len(batch)  # answered below
        if self._runner is not None:
            # Start the next batch (requests that came while this one ran) before encoding this
            # one's answers: ONNX Runtime runs in its thread meanwhile instead of waiting.
            self._maybe_run()
            if self._running:
                self._overlap.encoded += len(batch)
        if outputs is not None:
            c = self._counts
            self._counts = BatchCounts(
                c.batches + 1, c.requests + len(batch), c.compute_s + (ended - started)
            )
        self._send_results(self._answers(batch, outputs, exc))
        if self._runner is None:
            self._maybe_run()

    def _answers(
        self, batch: list[_Pending], results: list[Any] | None, exc: BaseException | None
    ) -> list[bytes | memoryview]:
        """The batch's RESULT frames, as parts for one vectored write: binary outputs are
        views of ONNX Runtime's output arrays (no copy)."""
        tensors = self._tensors
        frames: list[bytes | memoryview] = []
        if exc is not None or results is None:
            body = tensors.error_body(f"inference failed: {exc}")
            for p in batch:
                frames += _result_frame(p.req_id, 500, body, None)
            return frames
        name, version = self._spec.model_name, self._spec.model_version
        start = 0
        for p in batch:
            if len(batch) == 1:
                part = results
            else:
                stop = start + p.decoded.rows
                part = [r[start:stop] for r in results]
                start = stop
            parts, hlen = tensors.encode_response_parts(name, version, p.decoded, part)
            frames += _result_frame_parts(p.req_id, 200, parts, hlen)
        return frames

    def close(self) -> None:
        """Stop the runner thread once the batches handed to it have ended."""
        if self._runner is not None:
            self._runner.close()


def _batch_feeds(batch: list[_Pending]) -> dict[str, Any]:
    """The inputs of a batch: its requests' rows, one after the other."""
    first = batch[0].decoded
    if len(batch) == 1:
        return dict(first.feeds)
    import numpy as np

    return {name: np.concatenate([p.decoded.feeds[name] for p in batch]) for name in first.feeds}


class _Runner:
    """The thread ONNX Runtime runs in, for models slower than :data:`INLINE_BELOW_S`.

    Batches are handed over in order (at most two at once: the one running and the next one,
    ready); each result is posted back to the event loop. ONNX Runtime releases the GIL while
    it runs, so meanwhile the loop reads and decodes the next requests and encodes the
    previous batch's answers, and a batch handed over early starts with no hop through the
    loop."""

    def __init__(self, session: Any, loop: asyncio.AbstractEventLoop, on_ran: Any) -> None:
        self._session = session
        self._loop = loop
        self._on_ran = on_ran
        self._jobs: queue.SimpleQueue[tuple[list[_Pending], dict[str, Any], Any] | None]
        self._jobs = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, batch: list[_Pending], feeds: dict[str, Any], outputs: Any) -> None:
        if self._thread is None:  # started with the first batch, inside the sandbox
            # not a daemon: a worker that stops lets the batch in ONNX Runtime end (a thread
            # ended inside it at exit could abort the process); ``close``, always called when
            # serving ends, lets the thread end after the batches handed over
            self._thread = threading.Thread(target=self._serve, name="ort")
            self._thread.start()
        self._jobs.put((batch, feeds, outputs))

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)  # after the batches already handed over

    def _serve(self) -> None:
        session, post = self._session, self._loop.call_soon_threadsafe
        while (job := self._jobs.get()) is not None:
            batch, feeds, outputs = job
            del job
            result: list[Any] | None = None
            error: BaseException | None = None
            started = time.monotonic()
            try:
                result = session.run(list(outputs), feeds)
            except Exception as exc:
                error = exc
            ended = time.monotonic()
            del feeds
            try:
                post(self._on_ran, batch, result, error, started, ended)
            except RuntimeError:  # the loop is closed: nobody is left to answer
                return


def _result_frame(req_id: int, status: int, body: bytes, header_len: int | None) -> list[bytes]:
    """A RESULT frame as two parts: its head (header and prefix) and the body."""
    prefix = RESULT_PREFIX.pack(status, NO_HEADER_LENGTH if header_len is None else header_len)
    return [HEADER.pack(len(prefix) + len(body), FrameType.RESULT, req_id) + prefix, body]


def _result_frame_parts(
    req_id: int, status: int, body: list[bytes | memoryview], header_len: int | None
) -> list[bytes | memoryview]:
    """A RESULT frame whose body is several parts (written as they are, no join)."""
    prefix = RESULT_PREFIX.pack(status, NO_HEADER_LENGTH if header_len is None else header_len)
    size = len(prefix) + sum(len(b) for b in body)
    return [HEADER.pack(size, FrameType.RESULT, req_id) + prefix, *body]


def _run_test_probe(text: str) -> list[dict[str, str]]:
    """Try what :data:`TEST_PROBE_ENV` lists; each outcome ``ok`` or the OS's error."""
    try:
        steps = orjson.loads(text)
    except orjson.JSONDecodeError:
        return [{"error": f"{TEST_PROBE_ENV} is not JSON"}]
    results: list[dict[str, str]] = []
    for step in steps[:16] if isinstance(steps, list) else []:
        if not isinstance(step, dict) or len(step) != 1:
            continue
        ((what, target),) = step.items()
        outcome = "ok"
        try:
            if what == "open":
                with open(str(target), "rb") as f:
                    f.read(1)
            elif what in ("connect", "bind"):
                host, _, port = str(target).rpartition(":")
                family = socket.AF_INET6 if host.startswith("[") else socket.AF_INET
                host = host.strip("[]")
                with socket.socket(family, socket.SOCK_STREAM) as s:
                    s.settimeout(5)
                    if what == "connect":
                        s.connect((host, int(port)))
                    else:
                        s.bind((host, int(port)))
            elif what == "udp":
                socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()
            elif what == "secret":  # MOUNTPATH/KEY, through EDGEFLEET_SECRET_DIRS
                mount, _, key = str(target).rpartition("/")
                dirs = orjson.loads(os.environ.get(SECRET_DIRS_ENV, "{}"))
                if mount not in dirs:
                    outcome = "not mounted"
                else:
                    with open(os.path.join(dirs[mount], key), "rb") as f:
                        f.read(1)
            elif what == "config":  # the model configuration, through EDGEFLEET_MODEL_CONFIG
                path = os.environ.get(CONFIG_ENV)
                if not path:
                    outcome = "no config"
                else:
                    with open(path, "rb") as f:
                        data = orjson.loads(f.read()).get("data")
                    outcome = orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode()[:256]
            else:
                outcome = "unknown step"
        except OSError as exc:
            outcome = f"{type(exc).__name__}: errno {exc.errno}"
        results.append({"step": what, "target": str(target), "outcome": outcome})
    return results


RUNTIME_MODULES = (
    "numpy",
    "edged.runtime.tensors",
    "edged.runtime.validating",
    "encodings.cp437",  # zipfile's names (the validation set), imported when first needed
    "uvloop",
)
"""What a worker with a uid of its own imports while it is still root: the standard library
may live where only root can read (a Python under /root); nothing of the model or its inputs
yet. Not onnxruntime: importing it starts a thread, which must start inside the sandbox (it
imports no more of the standard library than these do; its own package must be readable)."""
FD_PATH = "/proc/self/fd/"


def _open_before_switch(spec: LaunchSpec) -> tuple[str, str]:
    """Still root, before the switch to the worker's own uid: import the runtime, and open
    what the worker reads later that its uid could not reach by path (its artifact and
    validation set in edged's 0700 data directory, its secrets under the 0700 secrets
    directory). Returns the paths to read them by afterwards (``/proc/self/fd/N``: the kernel
    checks the file's own mode there, not its parents'); each secret's is put in
    ``EDGEFLEET_SECRET_DIRS``."""
    import importlib

    for name in RUNTIME_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # uvloop is optional

    def by_fd(path: str, flags: int = os.O_RDONLY) -> str:
        return f"{FD_PATH}{os.open(path, flags | os.O_CLOEXEC)}"

    try:
        artifact = by_fd(spec.artifact_path)
    except OSError as exc:
        raise LoadError(
            "ArtifactUnreadable", f"cannot read {spec.artifact_path}: {exc.strerror}"
        ) from None
    validation = spec.validation_path
    if spec.validate and validation:
        try:
            validation = by_fd(validation)
        except OSError:
            pass  # evaluate() reports it missing
    if spec.secret_dirs:
        dirs: dict[str, str] = {}
        for mount, path in spec.secret_dirs:
            try:
                dirs[mount] = by_fd(path, os.O_RDONLY | os.O_DIRECTORY)
            except OSError as exc:
                raise LoadError(
                    "SecretUnavailable", f"cannot open {path}: {exc.strerror}"
                ) from None
        os.environ[SECRET_DIRS_ENV] = orjson.dumps(dirs).decode()
    if spec.config_dir:  # the directory by descriptor: a config swapped later is seen there
        try:
            config_dir = by_fd(spec.config_dir, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            pass  # none yet: nothing to read, as by its path
        else:
            os.environ[CONFIG_DIR_ENV] = config_dir
            os.environ[CONFIG_ENV] = f"{config_dir}/config.json"
    return artifact, validation


def _send_failure(sock: socket.socket, reason: str, message: str) -> None:
    payload = orjson.dumps({"reason": reason, "message": message})
    try:
        sock.sendall(encode_frame(FrameType.FAILED, 0, payload))
    except OSError:
        pass


async def _serve(
    sock: socket.socket, spec: LaunchSpec, model: Model, kept: tuple[socket.socket, int] | None
) -> int:
    """Serve edged on ``sock``; ``kept`` (a kept worker's listening socket and a descriptor of
    /dev/null): when edged goes, wait for the next one there, up to ``orphan_timeout_s``."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()

    def on_term() -> None:
        if not done.done():
            done.set_result(0)

    loop.add_signal_handler(signal.SIGTERM, on_term)
    proto = WorkerProtocol(spec, model, done, kept=kept is not None)
    try:
        return await _serve_with(proto, sock, spec, kept, done)
    finally:
        proto.close()  # the runner thread ends after the batches handed to it


async def _serve_with(
    proto: WorkerProtocol,
    sock: socket.socket,
    spec: LaunchSpec,
    kept: tuple[socket.socket, int] | None,
    done: asyncio.Future[int],
) -> int:
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(lambda: proto, sock=sock)
    while kept is not None:
        either: list[asyncio.Future[Any]] = [done, proto.lost]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if done.done():
            break
        listener, null = kept
        os.dup2(null, 2)  # edged's end of the stderr pipe is gone: nobody reads it now
        conn = await _next_edged(listener, spec, done)
        if conn is None:
            if not done.done():
                done.set_result(0)  # orphaned: no edged came back within the bound
            break
        transport, _ = await loop.connect_accepted_socket(lambda: proto, sock=conn)
    code = await done
    transport.close()
    return code


ATTACH_HELLO_TIMEOUT_S = 5.0
_PEERCRED = struct.Struct("3i")


async def _next_edged(
    listener: socket.socket, spec: LaunchSpec, done: asyncio.Future[int]
) -> socket.socket | None:
    """The next edged's connection on ``listener``, within ``orphan_timeout_s``: from edged's
    uid only, saying :data:`ATTACH_HELLO`, with its end of a stderr pipe (that becomes this
    worker's stderr). None at the bound, or once the worker is told to stop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + spec.orphan_timeout_s
    while not done.done():
        left = deadline - loop.time()
        if left <= 0:
            return None
        accepting = asyncio.ensure_future(loop.sock_accept(listener))
        waiting: list[asyncio.Future[Any]] = [accepting, done]
        await asyncio.wait(waiting, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        if not accepting.done():
            accepting.cancel()
            continue
        conn, _ = accepting.result()
        _, uid, _ = _PEERCRED.unpack(
            conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        )
        if uid != spec.supervisor_uid:
            conn.close()  # not edged: the worker keeps waiting for edged
            continue
        try:
            conn.settimeout(ATTACH_HELLO_TIMEOUT_S)
            msg, fds, _, _ = socket.recv_fds(conn, len(ATTACH_HELLO), 1)
        except OSError:
            conn.close()
            continue
        for fd in fds:
            if msg == ATTACH_HELLO:
                os.dup2(fd, 2)
            os.close(fd)
        if msg != ATTACH_HELLO:
            conn.close()
            continue
        conn.setblocking(False)
        return conn
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # edged decides when a worker stops
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nor does a terminal that goes
    fd = int(argv[0])
    spec = LaunchSpec.from_json(orjson.loads(argv[1]))
    if not spec.attach_name:
        _die_with_parent()
    if spec.secret_dirs:  # mountPath -> the directory serving it (docs/security.md, Secrets)
        os.environ[SECRET_DIRS_ENV] = orjson.dumps(dict(spec.secret_dirs)).decode()
    if spec.config_dir:  # its model configuration (docs/model-config.md): read it when needed
        os.environ[CONFIG_DIR_ENV] = spec.config_dir
        os.environ[CONFIG_ENV] = os.path.join(spec.config_dir, "config.json")
    sock = socket.socket(fileno=fd)
    kept: tuple[socket.socket, int] | None = None
    try:
        if spec.attach_name:  # before the sandbox: /dev/null is not among what it may open
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                listener.bind("\0" + spec.attach_name)
                listener.listen(4)
            except OSError as exc:
                raise LoadError(
                    "AttachFailed", f"cannot listen on @{spec.attach_name}: {exc.strerror}"
                ) from None
            listener.setblocking(False)
            kept = (listener, os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC))
        apply_limits(spec.limits)
        artifact, validation = spec.artifact_path, spec.validation_path
        if spec.sandbox.separate_uid and spec.uid >= 0:
            artifact, validation = _open_before_switch(spec)
        protections = apply_sandbox(
            spec.sandbox,
            spec.artifact_path,
            (spec.validation_path,) if spec.validate and spec.validation_path else (),
            uid=spec.uid,
            uid_problem=spec.uid_problem,
            groups=spec.groups,
        )
        if spec.attach_name:  # the uid switch set the parent-death signal again: not for it
            _outlive_parent()
        data = _read_verified(artifact, spec.artifact_sha256)
        model = Model(spec, data, protections)
        del data
        try:  # its config's processing in force (runtime/configstage.py), and the revision's
            # accuracy with it, before READY (runtime/validating.py)
            model.validation = attach(model, spec, validation)
        except ValueError as exc:
            raise LoadError("ModelConfigInvalid", f"the model config cannot apply: {exc}") from None
        for path in (artifact,) if spec.validate else (artifact, validation):  # read, not kept
            if path.startswith(FD_PATH):
                os.close(int(path[len(FD_PATH) :]))
    except SandboxUnavailable as exc:
        _send_failure(sock, exc.reason, str(exc))
        return EXIT_LOAD_FAILED
    except LoadError as exc:
        _send_failure(sock, exc.reason, str(exc))
        return EXIT_LOAD_FAILED
    except OSError as exc:
        _send_failure(sock, "LimitsFailed", f"cannot apply resource limits: {exc}")
        return EXIT_LOAD_FAILED
    sock.setblocking(False)
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover - non-Linux
        runner = asyncio.run
    return int(runner(_serve(sock, spec, model, kept)))


if __name__ == "__main__":
    raise SystemExit(main())
