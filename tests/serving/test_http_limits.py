"""HttpServer's bounds on a real Unix socket: per-request body limits, bytes buffered over all
connections, the connection cap, header/body/idle timeouts, and connections freed without the
cyclic garbage collector."""

from __future__ import annotations

import asyncio
import gc
import weakref
from pathlib import Path

import orjson
from asynctesting import async_test, eventually
from httptesting import Handler, connected, read_closed, read_reply, request

from edged.runtime.httpserver import (
    EVICT_IDLE_AFTER_S,
    HttpConnection,
    HttpServer,
    Request,
    ServerLimits,
)


def limited(req: Request) -> tuple[int, str] | None:
    if req.path == "/small":
        return 100, "what /small takes"
    return None


async def start(sock_dir: Path, handler: Handler, **limits: float) -> tuple[HttpServer, Path]:
    server = HttpServer(handler, limits=ServerLimits(**limits), body_limit=limited)  # type: ignore[arg-type]
    path = sock_dir / "http.sock"
    await server.listen_unix(path)
    return server, path


async def stop(server: HttpServer) -> None:
    server.stop_accepting()
    assert await server.drain(1.0)


@async_test
async def test_body_limit_of_the_request_is_checked_before_the_body_is_read(
    sock_dir: Path,
) -> None:
    handler = Handler()
    server, path = await start(sock_dir, handler, max_body=1000)
    async with connected(path) as (reader, writer):
        # headers only: the 413 comes although not a byte of the body was sent
        writer.write(b"POST /small HTTP/1.1\r\nHost: e\r\nContent-Length: 101\r\n\r\n")
        status, headers, body = await read_reply(reader)
        assert status == 413
        assert orjson.loads(body) == {
            "error": "request body larger than 100 bytes (what /small takes)"
        }
        assert headers["connection"] == "close"
        assert await read_closed(reader)
    async with connected(path) as (reader, writer):  # other paths: the server's limit
        writer.write(request("/other", method="POST", body=b"x" * 1000))
        assert (await read_reply(reader))[0] == 200
        writer.write(request("/other", method="POST", body=b"x" * 1001))
        status, _, body = await read_reply(reader)
        assert (status, orjson.loads(body)["error"]) == (413, "request body larger than 1000 bytes")
    assert server.counters()["bufferedBytes"] == 0
    await stop(server)


@async_test
async def test_chunked_body_is_cut_at_the_limit(sock_dir: Path) -> None:
    server, path = await start(sock_dir, Handler(), max_body=1000)
    async with connected(path) as (reader, writer):
        writer.write(b"POST /small HTTP/1.1\r\nHost: e\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(3):
            writer.write(b"40\r\n" + b"y" * 64 + b"\r\n")  # never ends on its own
        status, _, body = await read_reply(reader)
        assert status == 413 and "100 bytes" in orjson.loads(body)["error"]
        assert await read_closed(reader)
    await eventually(lambda: server.counters()["bufferedBytes"] == 0)
    await stop(server)


@async_test
async def test_bytes_buffered_over_all_connections_are_capped(sock_dir: Path) -> None:
    server, path = await start(sock_dir, Handler(), max_body=10_000, max_buffered_bytes=6000)
    async with connected(path) as (r1, w1), connected(path) as (r2, w2):
        head = b"POST /big HTTP/1.1\r\nHost: e\r\nContent-Length: 5000\r\n\r\n"
        w1.write(head + b"a" * 2500)  # unfinished
        await eventually(lambda: server.counters()["bufferedBytes"] == 2500)
        w2.write(head + b"b" * 4000)
        status, _, body = await read_reply(r2)
        assert status == 503
        assert "limit 6000" in orjson.loads(body)["error"]
        w1.write(b"a" * 2500)  # the first one is served
        assert (await read_reply(r1))[0] == 200
    await eventually(lambda: server.counters()["bufferedBytes"] == 0)
    await stop(server)


@async_test
async def test_connection_cap_evicts_the_longest_idle_then_refuses(sock_dir: Path) -> None:
    handler = Handler(hold=True)
    server, path = await start(sock_dir, handler, max_connections=2)
    async with connected(path) as (idle_r, _), connected(path) as (busy_r, busy_w):
        busy_w.write(request("/held"))
        await eventually(lambda: len(handler.held) == 1 and server.active_connections == 2)
        async with connected(path) as (early_r, _):  # idle for less than a second: kept
            assert (await read_reply(early_r))[0] == 503
        await asyncio.sleep(EVICT_IDLE_AFTER_S)
        async with connected(path) as (new_r, new_w):
            assert await read_closed(idle_r)  # made room
            new_w.write(request("/held-too"))
            await eventually(lambda: len(handler.held) == 2)
            # nobody idle now: a fourth connection is refused, and says why
            async with connected(path) as (refused_r, _):
                status, headers, body = await read_reply(refused_r)
                assert status == 503
                assert orjson.loads(body) == {
                    "error": "too many connections (limit 2); retry later"
                }
                assert headers["retry-after"] == "1"
                assert await read_closed(refused_r)
            for resp in handler.held:
                resp.send(200, b"ok")
            assert (await read_reply(busy_r))[2] == b"ok"
            assert (await read_reply(new_r))[2] == b"ok"
    counters = server.counters()
    assert (counters["refusedConnections"], counters["evictedIdleConnections"]) == (2, 1)
    await stop(server)


@async_test
async def test_slow_headers_get_408(sock_dir: Path) -> None:
    server, path = await start(sock_dir, Handler(), header_timeout_s=0.2)
    async with connected(path) as (reader, writer):
        writer.write(b"GET / HTTP/1.1\r\nHost: e\r\n")  # and nothing more
        status, _, body = await read_reply(reader)
        assert status == 408
        assert orjson.loads(body) == {"error": "request headers not complete within 0.2s"}
        assert await read_closed(reader)
    assert server.counters()["timedOutConnections"] == 1
    await stop(server)


@async_test
async def test_unfinished_body_gets_408_and_its_bytes_are_released(sock_dir: Path) -> None:
    server, path = await start(sock_dir, Handler(), body_timeout_s=0.2)
    async with connected(path) as (reader, writer):
        writer.write(b"POST / HTTP/1.1\r\nHost: e\r\nContent-Length: 100\r\n\r\n" + b"z" * 10)
        await eventually(lambda: server.counters()["bufferedBytes"] == 10)
        status, _, body = await read_reply(reader)
        assert status == 408
        assert "body not complete within 0.2s" in orjson.loads(body)["error"]
    assert server.counters()["bufferedBytes"] == 0
    await stop(server)


@async_test
async def test_idle_connection_is_closed_but_a_busy_one_is_not(sock_dir: Path) -> None:
    handler = Handler(hold=True)
    server, path = await start(sock_dir, handler, idle_timeout_s=0.2)
    async with connected(path) as (idle_r, idle_w), connected(path) as (busy_r, busy_w):
        idle_w.write(request("/a"))
        busy_w.write(request("/b"))
        await eventually(lambda: len(handler.held) == 2)
        handler.held[0].send(200, b"a")
        assert (await read_reply(idle_r))[2] == b"a"
        assert await read_closed(idle_r)  # idle for 0.2 s after its answer
        await asyncio.sleep(0.3)  # waiting for an answer is not idle
        handler.held[1].send(200, b"b")
        assert (await read_reply(busy_r))[2] == b"b"
    await stop(server)


@async_test
async def test_keep_alive_requests_are_not_cut_by_timeouts(sock_dir: Path) -> None:
    # each gap well under each timeout (a loaded CI machine delays a wake-up by tens of
    # milliseconds: 30 ms gaps under 50 ms timeouts were cut there), all of them together
    # over the timeouts' sum
    server, path = await start(
        sock_dir, Handler(), header_timeout_s=0.2, body_timeout_s=0.2, idle_timeout_s=0.2
    )
    async with connected(path) as (reader, writer):
        for _ in range(15):
            await asyncio.sleep(0.05)
            writer.write(request("/", method="POST", body=b"x"))
            assert (await read_reply(reader))[0] == 200
    await stop(server)


@async_test
async def test_closed_connections_are_freed_without_the_cyclic_gc(sock_dir: Path) -> None:
    handler = Handler()
    server, path = await start(sock_dir, handler, max_body=1 << 20)
    refs: list[weakref.ref[HttpConnection]] = []
    gc.disable()
    try:
        for _ in range(5):
            async with connected(path) as (reader, writer):
                writer.write(request("/", method="POST", body=b"x" * 1000))
                await read_reply(reader)
                # an unfinished body too
                writer.write(
                    b"POST / HTTP/1.1\r\nHost: e\r\nContent-Length: 99999\r\n\r\n" + b"y" * 500
                )
                await eventually(lambda: server.active_connections == 1)
                refs += [weakref.ref(c) for c in server._state.connections]
            await eventually(lambda: server.active_connections == 0)
        handler.seen.clear()
        await asyncio.sleep(0.01)
        assert [r for r in refs if r() is not None] == []
    finally:
        gc.enable()
    await stop(server)
