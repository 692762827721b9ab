"""A small, fast HTTP/1.1 server on asyncio protocols, parsing with httptools.

Both of edged's sockets use it: the inference socket, where every microsecond counts (the
handler answers from a callback, no task per request), and the status socket. It supports
keep-alive and pipelining (responses go out in request order), bounds header and body sizes,
pauses reading when a client has too many requests outstanding, and drains on shutdown.
"""

from __future__ import annotations

import asyncio
import collections
import os
import socket
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

import httptools
import orjson

MAX_PIPELINED = 64
MAX_HEADERS_BYTES = 64 * 1024

_REASONS = {s.value: s.phrase for s in HTTPStatus}
_STATUS_LINES: dict[int, bytes] = {}


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        line = f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n".encode()
        _STATUS_LINES[status] = line
    return line


class Request:
    __slots__ = ("body", "headers", "keep_alive", "method", "path", "query")

    def __init__(self) -> None:
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
        self.data: bytes | None = None

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

    def send_json(self, status: int, doc: Any) -> None:
        self.send(status, orjson.dumps(doc))

    def send_error(self, status: int, message: str) -> None:
        self.send(status, orjson.dumps({"error": message}))

    @property
    def done(self) -> bool:
        return self.data is not None


Handler = Callable[[Request, Response], None]


class HttpServerState:
    """Shared by the connections of one server: handler, limits, live connections."""

    def __init__(self, handler: Handler, *, max_body: int) -> None:
        self.handler = handler
        self.max_body = max_body
        self.connections: set[HttpConnection] = set()
        self.closing = False


class HttpConnection(asyncio.Protocol):
    def __init__(self, state: HttpServerState) -> None:
        self._state = state
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._req = Request()
        self._body: list[bytes] = []
        self._body_len = 0
        self._header_bytes = 0
        self._pending: collections.deque[Response] = collections.deque()
        self._paused = False
        self._close_after = False
        self._header_name = ""

    # -- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._state.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._state.connections.discard(self)
        self._transport = None

    def data_received(self, data: bytes) -> None:
        if self._close_after:
            return  # requests after one that closes the connection are not served
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            cause = exc.__context__  # httptools wraps what a callback raises
            if isinstance(cause, _TooLarge):
                self._fail(cause.status, str(cause))
            else:
                self._fail(400, f"malformed HTTP request: {exc}")

    # -- httptools callbacks ------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._req = Request()
        self._body = []
        self._body_len = 0
        self._header_bytes = 0

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
        req.method = self._parser.get_method().decode()
        req.keep_alive = bool(self._parser.should_keep_alive())
        cl = req.headers.get("content-length")
        if cl is not None and cl.isdigit() and int(cl) > self._state.max_body:
            raise _TooLarge(413, f"request body larger than {self._state.max_body} bytes")
        if (
            req.headers.get("expect", "").lower() == "100-continue"
            and self._transport is not None
            and not self._pending  # else it would go out ahead of an earlier answer
        ):
            # curl sends this for bodies over 1 KiB and would otherwise wait a second.
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        path = req.path
        q = path.find("?")
        if q >= 0:
            req.path, req.query = path[:q], path[q + 1 :]

    def on_body(self, body: bytes) -> None:
        self._body_len += len(body)
        if self._body_len > self._state.max_body:
            raise _TooLarge(413, f"request body larger than {self._state.max_body} bytes")
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._close_after:
            return  # pipelined after a request that closes the connection: not served
        req = self._req
        body = self._body
        req.body = body[0] if len(body) == 1 else b"".join(body)
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
                transport.write(resp.data)  # type: ignore[arg-type]
                if not resp.keep_alive:
                    transport.close()
                    self._transport = transport = None
        if self._paused and len(pending) < MAX_PIPELINED // 2 and transport is not None:
            transport.resume_reading()
            self._paused = False
        if not pending and self._state.closing and transport is not None:
            transport.close()

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
        resp = Response(self, keep_alive=False)
        self._pending.append(resp)
        self._close_after = True
        resp.send_error(status, message)


class _TooLarge(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


class HttpServer:
    """Listens on a Unix socket and optionally a TCP address; drains on close."""

    def __init__(self, handler: Handler, *, max_body: int = 64 << 20) -> None:
        self._state = HttpServerState(handler, max_body=max_body)
        self._servers: list[asyncio.AbstractServer] = []
        self._unix_paths: list[Path] = []

    async def listen_unix(self, path: Path, *, mode: int = 0o660) -> None:
        loop = asyncio.get_running_loop()
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_socket(path)
        server = await loop.create_unix_server(lambda: HttpConnection(self._state), str(path))
        os.chmod(path, mode)
        self._servers.append(server)
        self._unix_paths.append(path)

    async def listen_tcp(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: HttpConnection(self._state), host, port, reuse_address=True
        )
        for sock in server.sockets:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._servers.append(server)

    @property
    def active_connections(self) -> int:
        return len(self._state.connections)

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
        while any(not c.idle for c in self._state.connections):
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
