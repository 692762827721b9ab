"""The worker's side of the connections edged hands it (issue 34, item 1; docs/edged.md, "The
control process and the data path").

edged accepts and admits every connection (peer checks, the connection cap, the first
request's headers under the header timeout) and then hands an infer connection to the worker
that serves its model: the socket on the hand-off socket (``SOCK_SEQPACKET``, ``SCM_RIGHTS``)
and the bytes it read on the frame socket (``HANDED``). :class:`DirectConnections` serves it
with edged's own HTTP code (``httpserver.py``), under the limits edged sends (``ROUTE``):
body limits per model, buffered bytes, header, body and idle timeouts.

What the worker serves itself: ``POST /v2/models/{its model}/infer`` of its version, and with
no version while edged says the unversioned requests are its (``ROUTE``); a request whose
JSON names a shared-memory region is not (edged checks region ownership). Everything else
on a handed connection goes to edged as a ``PROXY`` frame and is answered in order with
edged's answer: another model, another version, metadata, health, shared memory. So routing
stays edged's, whatever the connection.

On DRAIN a worker hands every connection back once it is idle (nothing owed, nothing begun):
bytes a client sends meanwhile wait in the socket, which moves; on CLOSE (edged stopping, or
leaving a kept worker to the next edged) idle connections close and the others after their
answers, as edged's own do when it stops. The worker reports each answer it wrote
(``ANSWERED``) and each connection that closed (``CONN_CLOSED``); edged bounds both.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import orjson

from edged.runtime.framing import ANSWER, CONN_ID, PROXY_STATUS, U32, FrameType, encode_frame
from edged.runtime.httpserver import (
    HttpConnection,
    HttpServerState,
    Request,
    Response,
    ServerLimits,
)

HANDOFF_MESSAGE = CONN_ID.size
KEEP_THERE = b"\x01"  # a connection handed back for edged to keep (it uses shared memory)
MAX_WAITING = 256  # sockets or HANDED frames waiting for their other half
_MARK = b"shared_memory_region"
_MARK_AT = _MARK.index(b"_")
_MAX_UNDERSCORES = 64


def names_region(body: bytes | memoryview, end: int) -> bool:
    """Whether ``body[:end]`` has ``shared_memory_region``: on every infer request, so cheap.
    ``in`` costs ~0.5 ns a byte here (10 us for the medium MLP's 20 KB of JSON); ``_`` is
    found at memchr's speed and a JSON request has few (keys such as ``binary_data_size``;
    numbers have none), so each is checked for the name around it, and past
    :data:`_MAX_UNDERSCORES` of them the rest is searched for the name whole."""
    data = body if isinstance(body, bytes) else bytes(body[:end])
    find = data.find
    i = find(b"_", 0, end)
    seen = 0
    while i >= 0:
        if i >= _MARK_AT and data.startswith(_MARK, i - _MARK_AT):
            return True
        seen += 1
        if seen > _MAX_UNDERSCORES:
            return find(_MARK, i, end) >= 0
        i = find(b"_", i + 1, end)
    return False


class _ProxyWait(Response):
    """A proxied request's answer slot in the worker: filled by edged's PROXY_RESULT."""


class DirectConnections:
    """The connections handed to this worker.

    ``infer(req, resp, hlen)``: serve an infer request of this model (the worker's batch
    queue); ``write(frame)``: a frame to edged; ``done()``: called when no connection and no
    proxied request is left while draining."""

    def __init__(
        self,
        sock: socket.socket,
        *,
        model: str,
        version: str,
        infer: Callable[[Request, Response], None],
        write: Callable[[bytes], None],
        done: Callable[[], None],
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._sock = sock
        sock.setblocking(False)
        self._model = model
        self._version = version
        self._prefix = f"/v2/models/{model}/"
        self._versioned = f"versions/{version}/infer"
        self._infer = infer
        self._write = write
        self._done = done
        self.state = HttpServerState(self._handle, ServerLimits(), self._body_limit)
        self.state.on_idle = self._on_idle
        self.state.on_lost = self._on_lost
        self._ids: dict[HttpConnection, int] = {}
        self._sockets: dict[int, socket.socket] = {}  # handed, waiting for their bytes
        self._bytes: dict[int, bytes] = {}  # HANDED frames waiting for their socket
        self._proxied: dict[int, Response] = {}
        self._next_proxy = 1
        self._starting: set[asyncio.Task[Any]] = set()
        self.unversioned = False
        self._limits: dict[str, tuple[int, str]] = {}
        self._other: tuple[int, str] | None = None
        self.returning = False  # DRAIN: idle connections go back to edged
        # connections that asked for shared memory: back to edged once idle, for good (its
        # requests are edged's to serve; proxying each would cost two more hops)
        self._give_back: set[HttpConnection] = set()
        self.alive = True
        self._loop.add_reader(sock.fileno(), self._on_message)

    # -- from edged -----------------------------------------------------------------------------
    def route(self, doc: dict[str, Any]) -> None:
        self.unversioned = bool(doc.get("unversioned"))
        limits = doc.get("limits")
        if isinstance(limits, dict):
            self._limits = {
                str(k): (int(v[0]), str(v[1]))
                for k, v in limits.items()
                if isinstance(v, list) and len(v) == 2
            }
        other = doc.get("other")
        if isinstance(other, list) and len(other) == 2:
            self._other = (int(other[0]), str(other[1]))
        server = doc.get("server")
        if isinstance(server, dict):
            names = {f.name for f in fields(ServerLimits)}
            chosen = {k: v for k, v in server.items() if k in names}
            try:
                self.state.limits = ServerLimits(**chosen)
            except TypeError:
                pass
            else:
                self.state.max_body = self.state.limits.max_body

    def handed(self, payload: bytes | memoryview) -> None:
        """A HANDED frame: a connection's id and the bytes edged read from it."""
        (conn_id,) = CONN_ID.unpack_from(payload, 0)
        data = bytes(payload[CONN_ID.size :])
        sock = self._sockets.pop(conn_id, None)
        if sock is None:
            if len(self._bytes) < MAX_WAITING:
                self._bytes[conn_id] = data
            return
        self._start(conn_id, sock, data)

    def _on_message(self) -> None:
        while True:
            try:
                msg, fds, _, _ = socket.recv_fds(self._sock, HANDOFF_MESSAGE, 4)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                msg, fds = b"", []
            if not msg:  # edged's end closed: no more connections come
                for fd in fds:
                    os.close(fd)
                self.lost()
                return
            socks = [socket.socket(fileno=fd) for fd in fds]
            if len(msg) != HANDOFF_MESSAGE or len(socks) != 1:
                for s in socks:
                    s.close()
                continue
            (conn_id,) = CONN_ID.unpack(msg)
            data = self._bytes.pop(conn_id, None)
            if data is None:
                if len(self._sockets) < MAX_WAITING:
                    self._sockets[conn_id] = socks[0]
                else:
                    socks[0].close()
                continue
            self._start(conn_id, socks[0], data)

    def _start(self, conn_id: int, sock: socket.socket, data: bytes) -> None:
        sock.setblocking(False)
        state = self.state
        ids = self._ids

        def made() -> HttpConnection:
            conn = HttpConnection(state, data)
            ids[conn] = conn_id
            return conn

        task = self._loop.create_task(self._loop.connect_accepted_socket(made, sock=sock))
        self._starting.add(task)
        task.add_done_callback(self._started)

    def _started(self, task: asyncio.Task[Any]) -> None:
        self._starting.discard(task)
        if not task.cancelled() and task.exception() is not None:
            pass  # the client went before it was served: its CONN_CLOSED follows

    def lost(self) -> None:
        """edged went (or closed the hand-off socket): serve what is owed, then close."""
        if not self.alive:
            return
        self.alive = False
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        for sock in self._sockets.values():
            sock.close()
        self._sockets.clear()
        self._bytes.clear()
        pending, self._proxied = self._proxied, {}
        for resp in pending.values():
            resp.send_error(503, "edged went away while answering this request; retry")
        self.close()

    def close(self) -> None:
        """CLOSE: idle connections close, the others after the answers they are owed."""
        self.state.closing = True
        for conn in list(self.state.connections):
            conn.close_if_idle()
        self._maybe_done()

    def drain(self) -> None:
        """DRAIN: every connection goes back to edged once idle."""
        self.returning = True
        for conn in list(self.state.connections):
            if conn.idle:
                self._on_idle(conn)
        self._maybe_done()

    def proxy_result(self, req_id: int, payload: bytes | memoryview) -> None:
        resp = self._proxied.pop(req_id, None)
        if resp is None:
            return
        data = bytes(payload)
        status, clen = PROXY_STATUS.unpack_from(data, 0)
        at = PROXY_STATUS.size
        ctype = data[at : at + clen]
        at += clen
        (hlen,) = U32.unpack_from(data, at)
        at += U32.size
        headers = data[at : at + hlen]
        resp.send(status, data[at + hlen :], ctype, headers)
        self._maybe_done()

    @property
    def busy(self) -> bool:
        return bool(self.state.connections or self._proxied or self._starting)

    def _maybe_done(self) -> None:
        if (self.returning or not self.alive or self.state.closing) and not self.busy:
            self._done()

    # -- the connections ------------------------------------------------------------------------
    def _on_idle(self, conn: HttpConnection) -> None:
        keep_there = conn in self._give_back
        if not (self.returning or keep_there) or not self.alive:
            return
        self._give_back.discard(conn)
        conn_id = self._ids.pop(conn, None)
        fd = conn.give_away()
        if fd is None or conn_id is None:
            return
        try:
            flag = KEEP_THERE if keep_there else b"\x00"
            socket.send_fds(self._sock, [CONN_ID.pack(conn_id) + flag], [fd])
        except OSError:
            pass  # edged is gone: the connection closes with this descriptor
        finally:
            os.close(fd)
        self._maybe_done()

    def _on_lost(self, conn: HttpConnection) -> None:
        self._give_back.discard(conn)
        conn_id = self._ids.pop(conn, None)
        if conn_id is not None:
            self._write(encode_frame(FrameType.CONN_CLOSED, 0, CONN_ID.pack(conn_id)))
        self._maybe_done()

    def _body_limit(self, req: Request) -> tuple[int, str] | None:
        path = req.path
        if req.method == "POST" and path.startswith("/v2/models/") and path.endswith("/infer"):
            return self._limits.get(path[11:].split("/", 1)[0])
        return self._other

    def _handle(self, req: Request, resp: Response) -> None:
        path = req.path
        if (
            req.method == "POST"
            and not self.returning
            and path.startswith(self._prefix)
            and path.endswith("/infer")
        ):
            tail = path[len(self._prefix) :]
            if (tail == "infer" and self.unversioned) or tail == self._versioned:
                hdr = req.headers.get("inference-header-content-length")
                body = req.body
                end = len(body)
                if hdr is not None and hdr.strip().isdigit():
                    end = min(end, int(hdr.strip()))
                if not names_region(body, end):
                    self._infer(req, resp)
                    return
                if req.conn is not None:  # shared memory: this connection goes back
                    self._give_back.add(req.conn)
        self._proxy(req, resp)

    def _proxy(self, req: Request, resp: Response) -> None:
        if not self.alive:
            resp.send_error(503, "edged is not reachable from this model's worker; retry")
            return
        req_id = self._next_proxy
        self._next_proxy = (req_id + 1) & 0xFFFFFFFF or 1
        head = orjson.dumps(
            {
                "method": req.method,
                "path": req.path,
                "query": req.query,
                "headers": req.headers,
                "keepAlive": resp.keep_alive,
                "conn": self._ids.get(req.conn, 0) if req.conn is not None else 0,
            }
        )
        self._proxied[req_id] = resp
        self._write(encode_frame(FrameType.PROXY, req_id, U32.pack(len(head)) + head + req.body))


def answered_frame(answers: list[tuple[int, float]]) -> bytes:
    """An ANSWERED frame for these (status, seconds)."""
    return encode_frame(FrameType.ANSWERED, 0, b"".join(ANSWER.pack(s, t) for s, t in answers))


def now() -> float:
    return time.monotonic()
