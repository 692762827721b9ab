"""How an inference worker (edged/runtime/worker.py) serves edged once its model is loaded:
:class:`WorkerProtocol` reads frames (``framing.py``), decodes INFER requests, owns the batch
queue (adaptive dynamic batching, the policy: ``batching.py``), runs batches inline on the
event loop for fast models or in the runner thread (``overlapping.py``) for slower ones, and
writes RESULT frames whose binary outputs are views of ONNX Runtime's arrays (no copy); PING,
DRAIN and BATCH_LIMIT frames answer or steer it."""

from __future__ import annotations

import asyncio
import collections
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

import orjson

from edged.runtime.answerstats import AnswerTally
from edged.runtime.batching import QueueShape, choose_batch, hold_queue
from edged.runtime.batchstats import BatchCounts
from edged.runtime.direct import answered_frame
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
from edged.runtime.overlapping import OverlapCounts, Runner

if TYPE_CHECKING:
    from edged.runtime.direct import DirectConnections
    from edged.runtime.httpserver import Request, Response
    from edged.runtime.worker import Model

_BINARY = b"application/octet-stream"
ANSWERED_EVERY_S = 0.05  # how often answers on handed connections are reported, at most
MAX_ANSWERS_PER_REPORT = 1024  # entries in one ANSWERED frame (directstats.py's bound)
INLINE_BELOW_S = 0.0002  # run batches on the event loop when one takes less than this
PEAK_WINDOW = 8  # batches over which the recent peak of requests in flight is remembered


class _Pending:
    __slots__ = ("decoded", "enqueued", "req_id", "resp")

    def __init__(
        self, req_id: int, decoded: Any, enqueued: float, resp: Response | None = None
    ) -> None:
        # ``enqueued``: when its frame was read (before decoding): its answer's time counts
        # from there (answerstats.py), and the batching policy's queue delay too
        self.req_id = req_id
        self.decoded = decoded
        self.enqueued = enqueued
        self.resp = resp  # on a connection handed to the worker: its answer's slot (direct.py)


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
            None if model.run_s < INLINE_BELOW_S else Runner(model.session, self._loop, self._ran)
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
        self._answers = AnswerTally()  # answers written and how long each was held, likewise
        # a kept worker outlives its connection to edged: ``lost`` ends each connection
        self._kept = kept
        self.lost: asyncio.Future[None] = self._loop.create_future()
        self.direct: DirectConnections | None = None  # connections edged hands it (direct.py)
        self._direct_inflight = 0  # of ``_inflight``: requests read on those connections
        # their answers not yet reported (ANSWERED, sent every ANSWERED_EVERY_S at most)
        self._unreported: list[tuple[int, float]] = []
        self._report_handle: asyncio.TimerHandle | None = None

    # -- connection ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._reader = FrameReader(self._on_frame, views=True)  # a new edged: a frame's start
        if self.lost.done():
            self.lost = self._loop.create_future()
        meta = self._model.metadata(self._spec)
        meta["direct"] = self.direct is not None and self.direct.alive
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
        if self.direct is not None:
            self.direct.lost()  # its connections close after their answers, as edged's do
        if not self._kept or self._draining:
            self._finish(0)  # edged went away (or closed us): nobody is left to answer
            return
        # kept: what edged asked and is not running yet has nobody to answer it; the batch that
        # runs ends (and is counted) as usual, its answers unsent
        # (those read on handed connections stay: their connections answer them)
        kept_queue = [p for p in self._queue if p.resp is not None]
        self._inflight -= len(self._queue) - len(kept_queue)
        self._queue = collections.deque(kept_queue)
        self._queued_rows = sum(p.decoded.rows for p in kept_queue)
        if self._delay_handle is not None:
            self._delay_handle.cancel()
            self._delay_handle = None
        if not self.lost.done():
            self.lost.set_result(None)

    def _finish(self, code: int) -> None:
        if self._unreported:
            self._report_answers()  # before the worker goes: they count
        if not self._done.done():
            self._done.set_result(code)

    # -- frames ---------------------------------------------------------------------------------
    def _on_frame(self, ftype: int, req_id: int, payload: bytes) -> None:
        """``payload``: a view of the bytes read (see ``FrameReader``), kept alive by what is
        decoded from it."""
        if ftype == FrameType.INFER:
            (hlen,) = U32.unpack_from(payload, 0)
            body = memoryview(payload)[4:]  # no copy of the request body
            self._enqueue(req_id, None, body, hlen)
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
                    "answers": self._answers.to_pong(),
                    "direct_inflight": self._direct_inflight,
                    **({"config": stage.report()} if stage is not None else {}),
                }
            )
            if self._unreported:  # the PONG's totals count them: edged must have them first
                self._report_answers()
            self._write(encode_frame(FrameType.PONG, req_id, pong))
        elif ftype == FrameType.DRAIN:
            self._draining = True
            if self.direct is not None:
                self.direct.drain()
            self._maybe_exit()
        elif ftype == FrameType.BATCH_LIMIT and len(payload) == U32.size:
            self._batch_rows = max(1, min(self._model.max_batch, U32.unpack(payload)[0]))
        elif self.direct is not None:
            if ftype == FrameType.HANDED and len(payload) >= U32.size:
                self.direct.handed(payload)
            elif ftype == FrameType.PROXY_RESULT:
                self.direct.proxy_result(req_id, payload)
            elif ftype == FrameType.ROUTE:
                self.direct.route(orjson.loads(payload))
            elif ftype == FrameType.CLOSE:
                self.direct.close()

    def serve_direct(self, sock: socket.socket) -> None:
        """Serve the connections edged hands over ``sock`` (the hand-off socket)."""
        from edged.runtime.direct import DirectConnections

        self.direct = DirectConnections(
            sock,
            model=self._spec.model_name,
            version=self._spec.model_version,
            infer=self.direct_infer,
            write=self._write,
            done=self._maybe_exit,
        )

    def direct_infer(self, req: Request, resp: Response) -> None:
        """An infer request of this model on a connection handed to the worker."""
        hdr = req.headers.get("inference-header-content-length")
        hlen = NO_HEADER_LENGTH
        if hdr is not None:
            hdr = hdr.strip()
            if not (hdr.isascii() and hdr.isdigit()) or len(hdr) > 12:
                self._direct_error(
                    resp, 400, "Inference-Header-Content-Length must be a non-negative integer"
                )
                return
            hlen = int(hdr)
            if hlen > len(req.body):
                self._direct_error(
                    resp,
                    400,
                    f"Inference-Header-Content-Length ({hlen}) is larger than the request "
                    f"body ({len(req.body)} bytes)",
                )
                return
        self._enqueue(0, resp, memoryview(req.body), hlen)
        self._maybe_run()

    def _direct_error(self, resp: Response, status: int, message: str) -> None:
        self._note_answers([(status, 0.0)])
        resp.send(status, self._tensors.error_body(message))

    def _enqueue(self, req_id: int, resp: Response | None, body: memoryview, hlen: int) -> None:
        received = time.monotonic()
        if self._running:
            self._overlap.decoded += 1
        self._inflight += 1
        if resp is not None:
            self._direct_inflight += 1
        self._peak_now = max(self._peak_now, self._inflight)
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
            self._reply(req_id, resp, 400, self._tensors.error_body(str(exc)), received)
            return
        if decoded.rows > self._model.max_batch and self._model.batchable:
            self._reply(
                req_id,
                resp,
                400,
                self._tensors.error_body(
                    f"batch of {decoded.rows} rows exceeds maxBatchSize {self._model.max_batch}"
                ),
                received,
            )
            return
        self._queue.append(_Pending(req_id, decoded, received, resp))
        self._queued_rows += decoded.rows

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def _reply(
        self, req_id: int, resp: Response | None, status: int, body: bytes, received: float
    ) -> None:
        self._inflight -= 1
        if resp is not None:
            self._direct_inflight -= 1
            self._note_answers([(status, time.monotonic() - received)])
            resp.send(status, body)
            if self._draining:
                self._maybe_exit()
        elif self._send_results(list(_result_frame(req_id, status, body, None))):
            self._answers.record(status, time.monotonic() - received)

    def _send_results(self, parts: list[bytes | memoryview]) -> bool:
        """Answers (each a frame head and a body; no longer counted in flight): one vectored
        write for all of them, with no copy of the bodies. Whether they were written (not
        when edged is gone)."""
        written = self._transport is not None and not self._transport.is_closing()
        if written:
            self._transport.writelines(parts)  # type: ignore[union-attr]
        if self._draining:
            self._maybe_exit()
        return written

    def _note_answers(self, answers: list[tuple[int, float]]) -> None:
        """Answers about to be written on handed connections. Reported at once (before the
        answers themselves go out, so that edged has counted them by the time a client could
        ask it) when nothing else is in flight; under load, together: one frame (and one
        wake-up of edged) per ANSWERED_EVERY_S, not per batch."""
        self._unreported += answers
        if self._inflight == 0 or len(self._unreported) >= MAX_ANSWERS_PER_REPORT:
            self._report_answers()
        elif self._report_handle is None:
            self._report_handle = self._loop.call_later(ANSWERED_EVERY_S, self._report_answers)

    def _report_answers(self) -> None:
        if self._report_handle is not None:
            self._report_handle.cancel()
            self._report_handle = None
        answers, self._unreported = self._unreported, []
        for at in range(0, len(answers), MAX_ANSWERS_PER_REPORT):
            self._write(answered_frame(answers[at : at + MAX_ANSWERS_PER_REPORT]))

    def _maybe_exit(self) -> None:
        if self._draining and self._inflight == 0 and (self.direct is None or not self.direct.busy):
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
        status = 200 if outputs is not None and exc is None else 500
        written = time.monotonic()
        direct = [(status, written - p.enqueued) for p in batch if p.resp is not None]
        if direct:  # reported before the answers go out (below): see _note_answers
            self._direct_inflight -= len(direct)
            self._note_answers(direct)
        framed = self._answer_frames(batch, outputs, exc)
        if self._send_results(framed):
            answers = self._answers
            for p in batch:
                if p.resp is None:
                    answers.record(status, written - p.enqueued)
        if self._runner is None:
            self._maybe_run()

    def _answer_frames(
        self, batch: list[_Pending], results: list[Any] | None, exc: BaseException | None
    ) -> list[bytes | memoryview]:
        """The batch's RESULT frames, as parts for one vectored write: binary outputs are
        views of ONNX Runtime's output arrays (no copy)."""
        tensors = self._tensors
        frames: list[bytes | memoryview] = []
        if exc is not None or results is None:
            body = tensors.error_body(f"inference failed: {exc}")
            for p in batch:
                if p.resp is not None:
                    p.resp.send(500, body)
                else:
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
            if p.resp is None:
                frames += _result_frame_parts(p.req_id, 200, parts, hlen)
            elif hlen is None:
                p.resp.send_parts(200, parts)
            else:
                p.resp.send_parts(
                    200, parts, _BINARY, b"Inference-Header-Content-Length: %d\r\n" % hlen
                )
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
