"""edged's end of the socket pair to one worker (:class:`ReplicaChannel`): requests framed to
it (framing.py), its answers routed back to their responses and to its replica
(:class:`edged.runtime.processes.Replica`)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import orjson

from edged.runtime.framing import (
    HEADER,
    NO_HEADER_LENGTH,
    RESULT_PREFIX,
    U32,
    FrameReader,
    FrameType,
    encode_frame,
)
from edgefleet.logs import get_logger

if TYPE_CHECKING:
    from edged.runtime.httpserver import Request, Response
    from edged.runtime.processes import Replica

log = get_logger(__name__)

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
        # INFER frames written to the worker, and answers read for them: the bounds of what
        # its PONGs may say it did (overlapstats.py)
        self.sent = 0
        self.answered = 0
        # of those answers, the errors (5xx) and edged's seconds for them: the bounds of what
        # its PONGs may say it answered (answerstats.py)
        self.errors = 0
        self.answered_s = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self._reader.feed(data)
        except Exception as exc:  # any bad frame (not only FrameError): logged, and the
            # connection closed, so connection_lost answers every pending request with 503
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
        self.sent += 1

    def _on_frame(self, ftype: int, req_id: int, payload: bytes) -> None:
        if ftype == FrameType.RESULT:
            item = self.pending.pop(req_id, None)
            if item is None:
                return
            resp, t0 = item
            self.answered += 1
            status, hlen = RESULT_PREFIX.unpack_from(payload, 0)
            if status >= 500:
                self.errors += 1
            body = payload[RESULT_PREFIX.size :]
            if hlen == NO_HEADER_LENGTH:
                resp.send(status, body, _JSON)
            else:
                resp.send(status, body, _BINARY, b"Inference-Header-Content-Length: %d\r\n" % hlen)
            seconds = time.perf_counter() - t0
            self.answered_s += seconds
            self._replica.on_result(status, seconds)
        elif ftype == FrameType.PONG:
            self._replica.on_pong(orjson.loads(payload))
        elif ftype == FrameType.READY:
            self._replica.on_ready(orjson.loads(payload))
        elif ftype == FrameType.ANSWERED:
            self._replica.on_direct_answers(payload)
        elif ftype == FrameType.PROXY:
            self._replica.on_proxy(req_id, payload)
        elif ftype == FrameType.CONN_CLOSED and len(payload) == U32.size:
            self._replica.on_conn_closed(U32.unpack(payload)[0])
        elif ftype == FrameType.FAILED:
            doc = orjson.loads(payload)
            self._replica.on_failed(str(doc.get("reason", "")), str(doc.get("message", "")))
