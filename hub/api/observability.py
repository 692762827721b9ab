"""The hub's observability: Prometheus ``/metrics`` and ``/healthz``, ``/readyz`` on a plain-HTTP
listener of its own (``metricsListen`` in hub.toml, loopback by default: it has no
authentication, so expose it only where scrapers are trusted).

* :class:`HubMetrics` (:mod:`hub.state.metrics`, where controllers and state count without
  importing api): every metric of the hub, in one registry (``edgefleet.metrics``). Values
  that live elsewhere (devices by phase, streams) are read when scraped.
* :class:`MetricsInterceptor`: a grpc.aio server interceptor that counts every call by method
  and status code, times unary calls and counts enrollments by outcome. Sync is not wrapped
  (see there); its latency (a desired state sent until the device acknowledges it) is
  measured by the Sync handler (:mod:`hub.api.devicesync`) into ``HubMetrics.sync_seconds``.
* :class:`InstrumentedStore`: the store, with every operation counted and timed.
* :class:`ObservabilityServer`: the HTTP listener, a component (``name`` + ``run(stop)``).

Metrics (``docs/observability.md`` has the table).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc

from edgefleet.configfiles import parse_host_port
from edgefleet.logs import get_logger
from edgefleet.metrics import CONTENT_TYPE
from hub.state.metrics import (
    ROLLOUT_STEP_REASONS,
    STORE_BUCKETS,
    SYNC_BUCKETS,
    HubMetrics,
)
from hub.state.store import Store
from hub.state.store.protocol import Compare, Event, KeyValue, LeaseId, Op, RangeResult

log = get_logger(__name__)

__all__ = [  # re-exported: their home is hub.state.metrics
    "ROLLOUT_STEP_REASONS",
    "STORE_BUCKETS",
    "SYNC_BUCKETS",
    "HubMetrics",
]

T = TypeVar("T")

ENROLL_METHOD = "/edgefleet.v1.EnrollmentService/Enroll"
SYNC_METHOD = "/edgefleet.v1.DeviceService/Sync"
MAX_REQUEST_BYTES = 8192
READ_TIMEOUT_S = 5.0
READY_STORE_TIMEOUT_S = 2.0


# -- gRPC ----------------------------------------------------------------------------------------
def _code(context: Any, failed: BaseException | None) -> str:
    code = context.code() if hasattr(context, "code") else None
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    if failed is None:
        return "OK"
    if isinstance(failed, asyncio.CancelledError):
        return "CANCELLED"
    return "UNKNOWN"


class MetricsInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Counts and times calls; see the module doc."""

    def __init__(self, metrics: HubMetrics, clock: Callable[[], float] = time.monotonic) -> None:
        self.metrics = metrics
        self.clock = clock

    def _done(
        self, method: str, context: Any, started: float | None, failed: BaseException | None
    ) -> None:
        code = _code(context, failed)
        self.metrics.requests.labels(method=method, code=code).inc()
        if started is not None:
            self.metrics.request_seconds.labels(method=method).observe(self.clock() - started)
        if method == ENROLL_METHOD:
            self.metrics.enrollments.labels(code=code).inc()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        method = str(details.method)
        kwargs = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary), **kwargs
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(method, handler.stream_unary), **kwargs
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(method, handler.unary_stream), **kwargs
            )
        if method == SYNC_METHOD:
            # Not wrapped: a wrapped Sync that refuses a device before reading its Hello ends
            # with INTERNAL instead of its status (grpc aio). Its streams are counted by the
            # sessions (hub_device_streams) and its latency by the handler itself.
            return handler
        return grpc.stream_stream_rpc_method_handler(
            self._stream(method, handler.stream_stream), **kwargs
        )

    def _unary(
        self, method: str, behavior: Callable[..., Awaitable[Any]]
    ) -> Callable[..., Awaitable[Any]]:
        async def call(request: Any, context: Any) -> Any:
            started = self.clock()
            try:
                response = await behavior(request, context)
            except BaseException as exc:
                self._done(method, context, started, exc)
                raise
            self._done(method, context, started, None)
            return response

        return call

    def _stream(
        self, method: str, behavior: Callable[..., AsyncIterator[Any]]
    ) -> Callable[..., AsyncIterator[Any]]:
        async def call(request: Any, context: Any) -> AsyncIterator[Any]:
            failed: BaseException | None = None
            try:
                async for out in behavior(request, context):
                    yield out
            except BaseException as exc:
                failed = exc
                raise
            finally:
                self._done(method, context, None, failed)

        return call


# -- the store -----------------------------------------------------------------------------------
class InstrumentedStore:
    """A :class:`~hub.state.store.Store` whose operations are counted (ok, or the error's class) and
    timed; watches are passed through."""

    def __init__(
        self, store: Store, metrics: HubMetrics, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.inner = store
        self._metrics = metrics
        self._clock = clock

    async def _timed(self, operation: str, call: Awaitable[T]) -> T:
        started = self._clock()
        result = "ok"
        try:
            return await call
        except Exception as exc:
            result = type(exc).__name__
            raise
        finally:
            m = self._metrics
            m.store_operations.labels(operation=operation, result=result).inc()
            m.store_seconds.labels(operation=operation).observe(self._clock() - started)

    async def get(self, key: str) -> KeyValue | None:
        return await self._timed("get", self.inner.get(key))

    async def range(self, prefix: str) -> RangeResult:
        return await self._timed("range", self.inner.range(prefix))

    async def range_at(self, prefix: str, revision: int) -> RangeResult:
        return await self._timed("range_at", self.inner.range_at(prefix, revision))

    async def put(self, key: str, value: bytes, *, expect_mod_revision: int | None = None,
                  lease: LeaseId | None = None) -> int:  # fmt: skip
        kwargs: dict[str, Any] = {"expect_mod_revision": expect_mod_revision}
        if lease is not None:
            kwargs["lease"] = lease
        return await self._timed("put", self.inner.put(key, value, **kwargs))

    async def delete(self, key: str, *, expect_mod_revision: int | None = None) -> int | None:
        return await self._timed(
            "delete", self.inner.delete(key, expect_mod_revision=expect_mod_revision)
        )

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
        return await self._timed("txn", self.inner.txn(compares, ops))

    def watch(self, prefix: str, start_revision: int = 0) -> AsyncIterator[Event]:
        return self.inner.watch(prefix, start_revision)

    async def grant(self, ttl: float) -> LeaseId:
        return await self._timed("grant", self.inner.grant(ttl))

    async def keepalive(self, lease: LeaseId) -> None:
        return await self._timed("keepalive", self.inner.keepalive(lease))

    async def revoke(self, lease: LeaseId) -> int:
        return await self._timed("revoke", self.inner.revoke(lease))

    async def expire_leases(self) -> list[LeaseId]:
        return await self._timed("expire_leases", self.inner.expire_leases())

    async def compact(self, revision: int) -> None:
        return await self._timed("compact", self.inner.compact(revision))

    async def close(self) -> None:
        await self.inner.close()


# -- the HTTP listener ---------------------------------------------------------------------------
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 400: "Bad Request",
            503: "Service Unavailable"}  # fmt: skip


class ObservabilityServer:
    """``GET /metrics``, ``/healthz`` (the event loop answers), ``/readyz`` (serving, and the
    store answers within 2 s) over plain HTTP/1.1, one request per connection."""

    name = "observability"

    def __init__(
        self, listen: str, metrics: HubMetrics, ready: Callable[[], Awaitable[str | None]]
    ) -> None:
        self.host, self.port = parse_host_port(listen)
        self.metrics = metrics
        self.ready = ready
        self.bound: asyncio.Event = asyncio.Event()

    async def _answer(self, method: str, path: str) -> tuple[int, str, bytes]:
        if path not in ("/metrics", "/healthz", "/readyz"):
            return 404, "text/plain; charset=utf-8", b"not found: try /metrics, /healthz, /readyz\n"
        if method not in ("GET", "HEAD"):
            return 405, "text/plain; charset=utf-8", b"only GET\n"
        if path == "/metrics":
            return 200, CONTENT_TYPE, (await self.metrics.render_served()).encode()
        if path == "/healthz":
            return 200, "text/plain; charset=utf-8", b"ok\n"
        problem = await self.ready()
        if problem:
            return 503, "text/plain; charset=utf-8", f"not ready: {problem}\n".encode()
        return 200, "text/plain; charset=utf-8", b"ok\n"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
                status, ctype, body = 400, "text/plain; charset=utf-8", b"bad request\n"
                method = "GET"
            else:
                method = parts[0]
                status, ctype, body = await self._answer(method, parts[1].split("?", 1)[0])
            header = (
                f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(header.encode() + (b"" if method == "HEAD" else body))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError):  # fmt: skip
            pass  # a client that says nothing, too much, or goes away: just close
        finally:
            writer.close()

    async def run(self, stop: asyncio.Event) -> None:
        server = await asyncio.start_server(
            self._serve, self.host, self.port, limit=MAX_REQUEST_BYTES
        )
        self.port = server.sockets[0].getsockname()[1]
        log.info("observability listening", host=self.host, port=self.port)
        self.bound.set()
        try:
            await stop.wait()
        finally:
            server.close()
            await server.wait_closed()
