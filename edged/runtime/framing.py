"""The frame codec between edged and its inference workers (a Unix socket pair).

A frame is a 9-byte header, ``!IBI`` = payload length, frame type, request id, then the
payload. The same codec runs on both ends; it is deliberately tiny because every inference
request crosses it twice.

edged -> worker
    INFER  payload = ``!I`` inference-header length (``NO_HEADER_LENGTH`` when the body is all
           JSON) + the HTTP request body, forwarded untouched (the worker parses it).
    PING   liveness/readiness probe; answered with PONG.
    DRAIN  stop taking requests, finish those in flight, exit 0.
    BATCH_LIMIT payload = ``!I`` rows: the most rows one batch may merge from now on (memory-
           aware batching; never above the declared maxBatchSize, at least 1).
    ROUTE  payload = JSON: what the worker serves on the connections handed to it
           (``direct.py``): ``{"unversioned": whether requests naming no version are its,
           "limits": {model: [body limit, why]}, "other": [body limit, why], "server": its
           connections' limits (``ServerLimits`` fields)}``.
    HANDED payload = ``!I`` connection id + the bytes edged read from it (its first request,
           whole or begun); the socket itself comes on the hand-off socket with that id.
    CLOSE  stop serving handed connections: idle ones close, the others after the answers
           they are owed (edged is stopping or leaving this worker to the next edged).
    PROXY_RESULT edged's answer to a PROXY: payload = ``!HH`` status, content-type length,
           content type, ``!I`` extra headers' length, extra headers, body.
worker -> edged
    RESULT payload = ``!HI`` HTTP status, inference-header length (``NO_HEADER_LENGTH`` for a
           plain JSON body) + the response body.
    PONG   payload = JSON ``{"inflight": n, "busy_s": seconds the current batch has run,
           "batch_rows": the most rows a batch merges now, "batches", "requests", "compute_s":
           running totals of the batches run, the requests in them and ONNX Runtime's seconds
           in them (``batchstats.py``), "overlap": running totals of the work the worker did
           while ONNX Runtime ran a batch, ``{"decoded", "encoded", "staged"}`` (``worker.py``),
           "answers": running totals of the answers written, ``{"count", "errors", "seconds",
           "buckets"}`` (``answerstats.py``)}``.
    READY  payload = JSON model metadata (see ``worker.py``), sent once after warm-up.
    FAILED payload = JSON ``{"reason": ..., "message": ...}``, sent before exiting on a load error.
    PROXY  a request on a handed connection that the worker does not serve itself (another
           model or version, metadata, health, shared memory): payload = ``!I`` head length,
           JSON ``{"method", "path", "query", "headers", "keepAlive", "conn"}`` (``conn``:
           the connection's id), the body. edged routes it
           as its own and answers with PROXY_RESULT of the same id.
    ANSWERED the answers the worker wrote on handed connections: payload = ``!Hf`` (status,
           seconds from reading the request to writing its answer) for each; sent every
           50 ms at most, up to 1,024 answers a frame.
    CONN_CLOSED a handed connection closed: payload = ``!I`` its id.

On the hand-off socket (a ``SOCK_SEQPACKET`` pair beside the frames), each message is ``!I`` a
connection id with its socket as ``SCM_RIGHTS``: edged -> worker, a connection handed to it;
worker -> edged, one handed back idle (on DRAIN), which edged serves again.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from enum import IntEnum

HEADER = struct.Struct("!IBI")
HEADER_SIZE = HEADER.size
RESULT_PREFIX = struct.Struct("!HI")
NO_HEADER_LENGTH = 0xFFFFFFFF
MAX_FRAME = 1 << 30


class FrameType(IntEnum):
    INFER = 1
    PING = 2
    DRAIN = 3
    BATCH_LIMIT = 4
    ROUTE = 5
    HANDED = 6
    CLOSE = 7
    PROXY_RESULT = 8
    RESULT = 10
    PONG = 11
    READY = 12
    FAILED = 13
    PROXY = 14
    ANSWERED = 15
    CONN_CLOSED = 16


ANSWER = struct.Struct("!Hf")
CONN_ID = U32 = struct.Struct("!I")
PROXY_STATUS = struct.Struct("!HH")


def encode_frame(ftype: int, req_id: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload), ftype, req_id) + payload


class FrameError(Exception):
    """The peer sent a frame that cannot be valid; the channel must be closed."""


class FrameReader:
    """Incremental decoder: feed bytes, get ``(type, req_id, payload)`` callbacks."""

    __slots__ = ("_buf", "_filling", "_head", "_on_frame", "_views")

    def __init__(self, on_frame: Callable[[int, int, bytes], None], *, views: bool = False) -> None:
        """``views``: hand each payload over with no copy where it can (a read-only
        ``memoryview`` of the bytes read, which it keeps alive; a payload split over reads is
        copied once, into a ``bytearray`` of its own size, as its reads come) instead of as
        ``bytes``. The worker reads requests this way: a binary request's tensors are then
        arrays over the bytes the kernel gave, or over that one copy (a camera frame)."""
        self._buf = bytearray()
        self._on_frame = on_frame
        self._views = views
        self._filling: memoryview | None = None  # views: the payload being gathered...
        self._head = (0, 0, 0)  # ...its type, request id and bytes gathered so far

    def feed(self, data: bytes) -> None:
        if self._views:
            self._feed_views(data)
            return
        buf = self._buf
        if not buf:
            # Fast path: whole frames (one, or a batch's answers) usually arrive in one read;
            # take them straight from ``data`` and buffer only an unfinished tail.
            start = 0
            n = len(data)
            while n - start >= HEADER_SIZE:
                length, ftype, req_id = HEADER.unpack_from(data, start)
                if length > MAX_FRAME:
                    raise FrameError(f"frame of {length} bytes exceeds the limit")
                end = start + HEADER_SIZE + length
                if end > n:
                    break
                self._on_frame(ftype, req_id, data[start + HEADER_SIZE : end])
                start = end
            if start == n:
                return
            data = data[start:]
        buf += data
        offset = 0
        n = len(buf)
        while n - offset >= HEADER_SIZE:
            length, ftype, req_id = HEADER.unpack_from(buf, offset)
            if length > MAX_FRAME:
                raise FrameError(f"frame of {length} bytes exceeds the limit")
            end = offset + HEADER_SIZE + length
            if end > n:
                break
            payload = bytes(buf[offset + HEADER_SIZE : end])
            offset = end
            self._on_frame(ftype, req_id, payload)
        if offset:
            del buf[:offset]

    def _feed_views(self, data: bytes) -> None:
        view = memoryview(data)
        pos, n = 0, len(data)
        while pos < n:
            filling = self._filling
            if filling is not None:  # a payload split over reads: into its own buffer
                ftype, req_id, got = self._head
                take = min(len(filling) - got, n - pos)
                filling[got : got + take] = view[pos : pos + take]
                pos += take
                if got + take < len(filling):
                    self._head = (ftype, req_id, got + take)
                    return
                self._filling = None
                self._on_frame(ftype, req_id, filling.obj)  # type: ignore[arg-type]
                continue
            buf = self._buf
            if buf or n - pos < HEADER_SIZE:  # a header split over reads
                take = min(HEADER_SIZE - len(buf), n - pos)
                buf += view[pos : pos + take]
                pos += take
                if len(buf) < HEADER_SIZE:
                    return
                length, ftype, req_id = HEADER.unpack(buf)
                buf.clear()
                self._gather(length, ftype, req_id)
                continue
            length, ftype, req_id = HEADER.unpack_from(data, pos)
            end = pos + HEADER_SIZE + length
            if end <= n:
                if length > MAX_FRAME:
                    raise FrameError(f"frame of {length} bytes exceeds the limit")
                self._on_frame(ftype, req_id, view[pos + HEADER_SIZE : end])  # type: ignore[arg-type]
                pos = end
                continue
            pos += HEADER_SIZE
            self._gather(length, ftype, req_id)

    def _gather(self, length: int, ftype: int, req_id: int) -> None:
        if length > MAX_FRAME:
            raise FrameError(f"frame of {length} bytes exceeds the limit")
        if length == 0:
            self._on_frame(ftype, req_id, b"")
            return
        self._filling = memoryview(bytearray(length))
        self._head = (ftype, req_id, 0)
