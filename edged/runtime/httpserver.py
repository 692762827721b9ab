"""A small, fast HTTP/1.1 server on asyncio protocols, parsing with httptools.

Both of edged's sockets use it: the inference socket, where every microsecond counts (the
handler answers from a callback, no task per request), and the status socket. It supports
keep-alive and pipelining (responses go out in request order), bounds header and body sizes,
pauses reading when a client has too many requests outstanding, and drains on shutdown.

Everything a client controls is bounded (:class:`ServerLimits`): the body of each request (a
limit chosen per request from its path, checked against ``Content-Length`` before a byte of
the body is read and again as chunks arrive), the request bodies held at once over all
connections, the number of connections (at the cap the longest-idle keep-alive connection
is closed to make room if it has been idle for a second; else the new one gets a 503), and
time: a request's headers must arrive within ``header_timeout_s`` of its first byte, its body within
``body_timeout_s`` of its headers, and a connection with nothing asked is closed after
``idle_timeout_s``. Each connection has one lazy timer (re-armed only when it fires), so a
busy connection costs no timer work per request. A closed connection breaks its reference
cycles (protocol <-> parser, protocol <-> pending answers), so it is freed at once, not by
the cyclic garbage collector.

A connection can leave the process that accepted it (issue 34: the control process hands
infer connections to the worker that serves their model, docs/edged.md, "The control process
and the data path"): with ``HttpServerState.handoff`` set, the bytes read since the
connection was last idle are kept (references to what was read, no copy), and when the first
request among them has its headers, ``handoff(conn, req)`` may send a duplicate of its socket
and those bytes elsewhere; then this process forgets the connection without closing it for
the client (the other process's descriptor keeps it open) and counts it in ``handed`` until
told it closed. ``HttpServer.adopt`` serves a socket handed (back) to this process, its
first bytes given. The worker serves handed connections with the same code
(``runtime/direct.py``); they are bounded there as here.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

import httptools
import orjson

MAX_PIPELINED = 64
MAX_RAW_KEPT = 80 * 1024  # bytes kept for a hand-off beyond that: the connection stays
MAX_HEADERS_BYTES = 64 * 1024
EVICT_IDLE_AFTER_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerLimits:
    """What one server allows its clients. Sizes in bytes, times in seconds."""

    max_body: int = 64 << 20  # the largest body of any request (a per-request limit may be lower)
    max_connections: int = 1024
    max_buffered_bytes: int = 256 << 20  # request bodies being read, all connections together
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    idle_timeout_s: float = 60.0


# Connection phases (what the connection's timer looks at)
_IDLE = 0  # nothing asked and nothing owed: idle timeout
_HEADERS = 1  # a request has begun, its headers are not complete: header timeout
_BODY = 2  # headers complete, body not: body timeout
_BUSY = 3  # answers owed, nothing being read: no timeout (the worker's probes own that)

_REASONS = {s.value: s.phrase for s in HTTPStatus}
_STATUS_LINES: dict[int, bytes] = {}


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        line = f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n".encode()
        _STATUS_LINES[status] = line
    return line


class Request:
    __slots__ = ("body", "conn", "headers", "keep_alive", "method", "path", "query")

    def __init__(self, conn: HttpConnection | None = None) -> None:
        self.conn = conn  # the connection it came on (who sent it: ``peer_uid``)
        self.method = ""
        self.path = ""
        self.query = ""
        self.headers: dict[str, str] = {}
        self.body = b""
        self.keep_alive = True


class Response:
    """A slot for one request's answer; calling :meth:`send` once fills it."""

    __slots__ = ("_conn", "data", "keep_alive")

    def __init__(self, conn: HttpConnection, keep_alive: bool) -> None:
        self._conn = conn
        self.keep_alive = keep_alive
        self.data: bytes | list[bytes | memoryview] | None = None

    def send(
        self,
        status: int,
        body: bytes,
        content_type: bytes = b"application/json",
        headers: bytes = b"",
    ) -> None:
        if self.data is not None:
            return
        if self.keep_alive and self._conn.owes_last_answer(self):
            # The server is shutting down and no other answer is owed on this connection:
            # say so, so that the client sends its next request on a new connection.
            self.keep_alive = False
        parts = [
            _status_line(status),
            b"Content-Type: ",
            content_type,
            b"\r\nContent-Length: ",
            str(len(body)).encode(),
            b"\r\n",
            headers,
        ]
        if not self.keep_alive:
            parts.append(b"Connection: close\r\n")
        parts += [b"\r\n", body]
        self.data = b"".join(parts)
        self._conn.flush()

    def send_parts(
        self,
        status: int,
        body: list[bytes | memoryview],
        content_type: bytes = b"application/json",
        headers: bytes = b"",
    ) -> None:
        """:meth:`send` with a body in parts, written as they are (no join: a worker's binary
        outputs are views of ONNX Runtime's arrays)."""
        if self.data is not None:
            return
        if self.keep_alive and self._conn.owes_last_answer(self):
            self.keep_alive = False
        head = b"%sContent-Type: %s\r\nContent-Length: %d\r\n%s%s\r\n" % (
            _status_line(status),
            content_type,
            sum(len(b) for b in body),
            headers,
            b"" if self.keep_alive else b"Connection: close\r\n",
        )
        self.data = [head, *body]
        self._conn.flush()

    def send_json(self, status: int, doc: Any) -> None:
        self.send(status, orjson.dumps(doc))

    def send_error(self, status: int, message: str) -> None:
        self.send(status, orjson.dumps({"error": message}))

    @property
    def done(self) -> bool:
        return self.data is not None


Handler = Callable[[Request, Response], None]
# The body limit of one request, from its method and path (headers read, body not), and what
# the limit is (said in the 413): ``None`` means the server's ``max_body``.
BodyLimit = Callable[[Request], tuple[int, str] | None]


class HttpServerState:
    """Shared by the connections of one server: handler, limits, live connections."""

    def __init__(
        self, handler: Handler, limits: ServerLimits, body_limit: BodyLimit | None = None
    ) -> None:
        self.handler = handler
        self.limits = limits
        self.max_body = limits.max_body
        self.body_limit = body_limit
        self.connections: set[HttpConnection] = set()
        self.buffered = 0  # bytes of request bodies held by all connections
        self.refused = 0  # connections refused at the cap
        self.evicted = 0  # idle connections closed to make room
        self.timed_out = 0
        self.closing = False
        # who may connect (infer.sock's peer check): None to serve, else why not
        self.admit: Callable[[Any], str | None] | None = None
        self.forbidden = 0
        # hand-off (module docstring): True when the connection went to another process
        self.handoff: Callable[[HttpConnection, Request], bool] | None = None
        self.handed = 0  # connections handed and not known closed: they count in the cap
        self.handed_total = 0
        # a connection that became idle (nothing owed, nothing begun), and one that is gone
        self.on_idle: Callable[[HttpConnection], None] | None = None
        self.on_lost: Callable[[HttpConnection], None] | None = None

    def make_room(self, now: float) -> bool:
        """At the connection cap, close the longest-idle connection if it has been idle for
        ``EVICT_IDLE_AFTER_S`` (a client between two requests is not idle); False if none."""
        idle = [c for c in self.connections if c.phase == _IDLE]
        if not idle:
            return False
        oldest = min(idle, key=_phase_since)
        if now - oldest.phase_since < EVICT_IDLE_AFTER_S:
            return False
        oldest.close_if_idle()
        self.connections.discard(oldest)
        self.evicted += 1
        return True


def _phase_since(conn: HttpConnection) -> float:
    return conn.phase_since


class HttpConnection(asyncio.Protocol):
    def __init__(
        self, state: HttpServerState, initial: bytes = b"", *, keep_here: bool = False
    ) -> None:
        """``initial``: bytes read from the connection elsewhere (a hand-off), fed first;
        ``keep_here``: never hand this connection off."""
        self._state = state
        self._may_hand = not keep_here
        self._initial = initial
        self._raw: list[bytes] | None = None  # what was read since it was last idle
        self._raw_len = 0
        self._raw_msgs = 0  # requests begun in ``_raw``
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self._req = Request()
        self._body: list[bytes] = []
        self._body_len = 0
        self._body_max = state.max_body
        self._body_what = ""
        self._header_bytes = 0
        self._pending: collections.deque[Response] = collections.deque()
        self._paused = False
        self._close_after = False
        self._header_name = ""
        self.phase = _IDLE
        self.phase_since = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._forbidden: str | None = None  # why this peer may not be served
        self.peer_uid: int | None = None  # who connected, once asked (sharedmemory.py)

    # -- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        state = self._state
        if len(state.connections) + state.handed >= state.limits.max_connections and (
            not state.make_room(self.phase_since)
        ):
            state.refused += 1
            limit = state.limits.max_connections
            body = orjson.dumps({"error": f"too many connections (limit {limit}); retry later"})
            transport.write(  # type: ignore[attr-defined]
                b"%sContent-Type: application/json\r\nContent-Length: %d\r\n"
                b"Connection: close\r\nRetry-After: 1\r\n\r\n%s"
                % (_status_line(503), len(body), body)
            )
            transport.close()
            self._parser = None
            return
        self._transport = transport  # type: ignore[assignment]
        state.connections.add(self)
        self._arm(state.limits.idle_timeout_s)
        sock = transport.get_extra_info("socket")
        if state.admit is not None and sock is not None:
            self._forbidden = state.admit(sock)
            if self._forbidden is not None:
                state.forbidden += 1
        if self._initial:
            initial, self._initial = self._initial, b""
            self.data_received(initial)

    def _answer_forbidden(self, why: str) -> None:
        """403 to whatever the refused peer sent first, then end our side: its request was
        read (closing with unread bytes would reset the connection before it reads the
        answer); the idle timeout closes a peer that never ends its side."""
        self._parser = None
        if self._transport is None:
            return
        body = orjson.dumps({"error": why})
        self._transport.write(
            b"%sContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (_status_line(403), len(body), body)
        )
        if self._transport.can_write_eof():
            self._transport.write_eof()
        else:
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        state = self._state
        if self in state.connections:
            state.connections.discard(self)
            if state.on_lost is not None:
                state.on_lost(self)
        self._transport = None
        self._raw = None
        self._release_body()
        # Break the cycles (parser -> self, pending answers -> self, timer -> self) so that
        # the connection and what it buffered are freed now, not by the cyclic GC.
        self._parser = None
        self._pending.clear()
        self._body = []
        self._req = Request()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def data_received(self, data: bytes) -> None:
        if self._forbidden is not None:
            if self._parser is not None:
                self._answer_forbidden(self._forbidden)
            return  # what a refused peer sends is read and dropped
        parser = self._parser
        if self._close_after or parser is None:
            return  # requests after one that closes the connection are not served
        if self._state.handoff is not None and self._may_hand:
            if self.phase == _IDLE and not self._pending:
                self._raw, self._raw_len, self._raw_msgs = [data], len(data), 0
            elif self._raw is not None:
                self._raw.append(data)
                self._raw_len += len(data)
                if self._raw_len > MAX_RAW_KEPT:
                    self._raw = None
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            cause = exc.__context__  # httptools wraps what a callback raises
            if isinstance(cause, _HandedOff):
                self._forget()
            elif isinstance(cause, _TooLarge):
                self._fail(cause.status, str(cause))
            else:
                self._fail(400, f"malformed HTTP request: {exc}")

    # -- time limits --------------------------------------------------------------------------
    def _set_phase(self, phase: int) -> None:
        self.phase = phase
        self.phase_since = self._loop.time()
        if self._timer is None and phase != _BUSY and self._transport is not None:
            self._arm(self._timeout(phase))

    def _timeout(self, phase: int) -> float:
        limits = self._state.limits
        if phase == _HEADERS:
            return limits.header_timeout_s
        if phase == _BODY:
            return limits.body_timeout_s
        return limits.idle_timeout_s

    def _arm(self, delay: float) -> None:
        # Never sleep longer than the shortest timeout: a phase that begins while the timer
        # is armed then still has its deadline checked in time, without moving the timer.
        limits = self._state.limits
        step = min(limits.header_timeout_s, limits.body_timeout_s, limits.idle_timeout_s)
        self._timer = self._loop.call_later(min(delay, step), self._on_timer)

    def _on_timer(self) -> None:
        """Lazy: a phase change does not move the timer; when it fires, it looks again."""
        self._timer = None
        if self._transport is None or self.phase == _BUSY:
            return  # re-armed when the connection leaves _BUSY
        if self._paused:  # not reading because answers are owed: not the client's fault
            self._arm(self._timeout(self.phase))
            return
        left = self.phase_since + self._timeout(self.phase) - self._loop.time()
        if left > 0.001:
            self._arm(left)
            return
        self._state.timed_out += 1
        if self.phase == _IDLE:
            self._transport.close()
        elif self.phase == _HEADERS:
            self._fail(408, f"request headers not complete within {self._timeout(_HEADERS)}s")
        else:
            self._fail(408, f"request body not complete within {self._timeout(_BODY)}s")

    def _release_body(self) -> None:
        self._state.buffered -= self._body_len
        self._body_len = 0

    # -- httptools callbacks ------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._raw_msgs += 1
        self._req = Request(self)
        self._body = []
        self._body_len = 0
        self._header_bytes = 0
        self._body_max = self._state.max_body
        self._body_what = ""
        self._set_phase(_HEADERS)

    def on_url(self, url: bytes) -> None:
        self._header_bytes += len(url)
        if self._header_bytes > MAX_HEADERS_BYTES:
            raise _TooLarge(431, "request line and headers are too large")
        self._req.path += url.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > MAX_HEADERS_BYTES:
            raise _TooLarge(431, "request line and headers are too large")
        self._req.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        req = self._req
        parser = self._parser
        assert parser is not None
        req.method = parser.get_method().decode()
        req.keep_alive = bool(parser.should_keep_alive())
        path = req.path
        q = path.find("?")
        if q >= 0:
            req.path, req.query = path[:q], path[q + 1 :]
        state = self._state
        if state.body_limit is not None:
            chosen = state.body_limit(req)
            if chosen is not None:
                self._body_max, self._body_what = min(chosen[0], state.max_body), chosen[1]
        cl = req.headers.get("content-length")
        if cl is not None and cl.isdigit() and int(cl) > self._body_max:
            raise _TooLarge(413, self._too_large())
        if (
            state.handoff is not None
            and self._raw is not None
            and self._raw_msgs == 1
            and not self._pending
            and not state.closing
            and state.handoff(self, req)
        ):
            raise _HandedOff()
        self._raw = None  # kept only up to a hand-off's headers: not the bodies that follow
        self._set_phase(_BODY)
        if (
            req.headers.get("expect", "").lower() == "100-continue"
            and self._transport is not None
            and not self._pending  # else it would go out ahead of an earlier answer
        ):
            # curl sends this for bodies over 1 KiB and would otherwise wait a second.
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _too_large(self) -> str:
        what = f" ({self._body_what})" if self._body_what else ""
        return f"request body larger than {self._body_max} bytes{what}"

    def on_body(self, body: bytes) -> None:
        n = len(body)
        if self._body_len + n > self._body_max:
            raise _TooLarge(413, self._too_large())
        state = self._state
        if state.buffered + n > state.limits.max_buffered_bytes:
            raise _TooLarge(
                503,
                f"server busy: {state.buffered} bytes of request bodies are being read "
                f"(limit {state.limits.max_buffered_bytes}); retry later",
            )
        self._body_len += n
        state.buffered += n
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._release_body()
        if self._close_after:
            return  # pipelined after a request that closes the connection: not served
        req = self._req
        body = self._body
        self._body = []
        req.body = body[0] if len(body) == 1 else b"".join(body)
        self._set_phase(_BUSY)
        keep = req.keep_alive and not self._state.closing
        resp = Response(self, keep)
        self._pending.append(resp)
        if not keep:
            self._close_after = True
        if len(self._pending) >= MAX_PIPELINED and self._transport is not None:
            self._transport.pause_reading()
            self._paused = True
        try:
            self._state.handler(req, resp)
        except Exception as exc:  # a handler bug must not take the connection down silently
            resp.send_error(500, f"internal error: {type(exc).__name__}")

    # -- responses ----------------------------------------------------------------------------
    def flush(self) -> None:
        pending = self._pending
        transport = self._transport
        while pending and pending[0].data is not None:
            resp = pending.popleft()
            if transport is not None:
                data = resp.data
                if type(data) is list:
                    transport.writelines(data)
                else:
                    transport.write(data)  # type: ignore[arg-type]
                if not resp.keep_alive:
                    transport.close()
                    self._transport = transport = None
        if self._paused and len(pending) < MAX_PIPELINED // 2 and transport is not None:
            transport.resume_reading()
            self._paused = False
        if not pending:
            if self._state.closing and transport is not None:
                transport.close()
            elif self.phase == _BUSY:
                self._set_phase(_IDLE)
                if self._state.on_idle is not None:
                    self._state.on_idle(self)

    def socket(self) -> Any:
        """The connection's socket (None once closed)."""
        t = self._transport
        return None if t is None else t.get_extra_info("socket")

    def raw(self) -> bytes:
        """The bytes read since the connection was last idle (a hand-off's first bytes)."""
        return b"".join(self._raw) if self._raw else b""

    def dup_fd(self) -> int | None:
        """A new descriptor of the connection's socket (the caller closes it); None once
        closed."""
        sock = self.socket()
        return None if sock is None else os.dup(sock.fileno())

    def give_away(self) -> int | None:
        """Leave the connection to whoever gets the returned descriptor (an idle one: nothing
        owed, nothing begun): this process forgets it without closing it for the client."""
        if self._pending or self.phase != _IDLE:
            return None
        fd = self.dup_fd()
        if fd is not None:
            self._forget()
        return fd

    def _forget(self) -> None:
        """Gone to another process: released here, its socket closed here only (the other
        process's descriptor keeps the connection open for the client)."""
        self._state.connections.discard(self)
        self._release_body()
        self._parser = None
        self._raw = None
        self._pending.clear()
        self._body = []
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.abort()

    @property
    def idle(self) -> bool:
        return not self._pending

    def owes_last_answer(self, resp: Response) -> bool:
        """Whether the server is closing and ``resp`` is the last answer owed here; if so, the
        connection takes no more requests."""
        if self._state.closing and self._pending and self._pending[-1] is resp:
            self._close_after = True
            return True
        return False

    def close_if_idle(self) -> None:
        if not self._pending and self._transport is not None:
            self._transport.close()

    def _fail(self, status: int, message: str) -> None:
        self._release_body()
        self._body = []
        self.phase = _BUSY
        resp = Response(self, keep_alive=False)
        self._pending.append(resp)
        self._close_after = True
        resp.send_error(status, message)


class _HandedOff(Exception):
    """The connection went to another process (``HttpServerState.handoff``)."""


class _TooLarge(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


class HttpServer:
    """Listens on a Unix socket and optionally a TCP address; drains on close."""

    def __init__(
        self,
        handler: Handler,
        *,
        max_body: int | None = None,
        limits: ServerLimits | None = None,
        body_limit: BodyLimit | None = None,
    ) -> None:
        limits = limits or ServerLimits()
        if max_body is not None:
            limits = dataclasses.replace(limits, max_body=max_body)
        self._state = HttpServerState(handler, limits, body_limit)
        self._servers: list[asyncio.AbstractServer] = []
        self._unix_paths: list[Path] = []

    async def listen_unix(
        self,
        path: Path,
        *,
        mode: int = 0o660,
        sock: socket.socket | None = None,
        backlog: int = 100,
    ) -> None:
        """Serve ``path``: bound here, or ``sock``, a socket already listening there (the
        previous edged's, from the descriptor store: what waits in its backlog is served)."""
        loop = asyncio.get_running_loop()
        if sock is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            _remove_stale_socket(path)
            server = await loop.create_unix_server(
                lambda: HttpConnection(self._state), str(path), backlog=backlog
            )
        else:
            server = await loop.create_unix_server(
                lambda: HttpConnection(self._state), sock=sock, backlog=backlog
            )
        os.chmod(path, mode)
        self._servers.append(server)
        self._unix_paths.append(path)

    def unlink_at_stop(self, path: Path) -> None:
        """Remove ``path`` again when this server stops accepting (undoes :meth:`hand_on`)."""
        if path not in self._unix_paths:
            self._unix_paths.append(path)

    def hand_on(self, path: Path) -> int | None:
        """The descriptor of the socket listening on ``path``, which from now on outlives this
        server: its file is left in place when it stops accepting (a copy of the descriptor in
        the service's store keeps it listening). None when it does not serve ``path``."""
        for server in self._servers:
            for sock in getattr(server, "sockets", None) or ():
                if sock.family == socket.AF_UNIX and sock.getsockname() == str(path):
                    if path in self._unix_paths:
                        self._unix_paths.remove(path)
                    return int(sock.fileno())
        return None

    async def listen_tcp(
        self, host: str, port: int, *, sock: socket.socket | None = None
    ) -> asyncio.AbstractServer:
        """Listen on ``host:port`` too (or on ``sock``, already listening there: the previous
        edged's); the listener (close it to stop serving there alone)."""
        loop = asyncio.get_running_loop()
        if sock is not None:
            server = await loop.create_server(lambda: HttpConnection(self._state), sock=sock)
        else:
            server = await loop.create_server(
                lambda: HttpConnection(self._state), host, port, reuse_address=True
            )
        for listener in server.sockets:
            listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._servers.append(server)
        return server

    async def adopt(
        self, sock: socket.socket, initial: bytes = b"", *, keep_here: bool = False
    ) -> None:
        """Serve a connection handed (back) to this process; ``initial``: its bytes read
        elsewhere, parsed first; ``keep_here``: never hand it off again."""
        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        state = self._state
        await loop.connect_accepted_socket(
            lambda: HttpConnection(state, initial, keep_here=keep_here), sock=sock
        )

    @property
    def state(self) -> HttpServerState:
        return self._state

    @property
    def active_connections(self) -> int:
        return len(self._state.connections)

    def set_admit(self, admit: Callable[[Any], str | None] | None) -> None:
        """Who may connect from now on (``admit(socket)``: None to serve, else why not)."""
        self._state.admit = admit

    @property
    def limits(self) -> ServerLimits:
        return self._state.limits

    def counters(self) -> dict[str, int]:
        """What the limits did so far (for status and metrics)."""
        st = self._state
        return {
            "connections": len(st.connections),
            "bufferedBytes": st.buffered,
            "refusedConnections": st.refused,
            "evictedIdleConnections": st.evicted,
            "timedOutConnections": st.timed_out,
            "forbiddenConnections": st.forbidden,
            "handedConnections": st.handed,
            "handedConnectionsTotal": st.handed_total,
        }

    def stop_accepting(self) -> None:
        """Close listening sockets; existing connections finish what they asked for."""
        self._state.closing = True
        for server in self._servers:
            server.close()
        for path in self._unix_paths:
            path.unlink(missing_ok=True)
        for conn in list(self._state.connections):
            conn.close_if_idle()

    async def drain(self, timeout: float) -> bool:
        """Wait until every connection has its answers; True if drained in time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        state = self._state
        while state.handed or any(not c.idle for c in state.connections):
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.01)
        for conn in list(self._state.connections):
            conn.close_if_idle()
        return True


def _remove_stale_socket(path: Path) -> None:
    """Remove a socket file left by a previous run, but never a live socket or another file."""
    if not path.exists() and not path.is_symlink():
        return
    import stat

    if not stat.S_ISSOCK(path.lstat().st_mode):
        raise OSError(f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()
    else:
        raise OSError(f"{path} is in use by another process")
    finally:
        probe.close()
