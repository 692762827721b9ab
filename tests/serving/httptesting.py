"""The serving HTTP front end's tests: a recording handler, a connection over the unix socket, raw
requests and replies."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from edged.runtime.httpserver import Request, Response


class Handler:
    """Answers at once with what it saw, or holds the Response when ``hold`` is set."""

    def __init__(self, *, hold: bool = False) -> None:
        self.hold = hold
        self.seen: list[Request] = []
        self.held: list[Response] = []

    def __call__(self, req: Request, resp: Response) -> None:
        self.seen.append(req)
        if req.path == "/boom":
            raise RuntimeError("handler bug")
        if self.hold:
            self.held.append(resp)
        else:
            resp.send_json(200, describe(req))


def describe(req: Request) -> dict[str, Any]:
    return {"method": req.method, "path": req.path, "query": req.query, "body": len(req.body)}


@asynccontextmanager
async def connected(path: Path) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        yield reader, writer
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass  # the server closed the connection first (the tests' hostile clients): closed


def request(path: str = "/", *, method: str = "GET", body: bytes = b"", headers: str = "") -> bytes:
    length = f"Content-Length: {len(body)}\r\n" if body or method == "POST" else ""
    return f"{method} {path} HTTP/1.1\r\nHost: edged\r\n{length}{headers}\r\n".encode() + body


Reply = tuple[int, dict[str, str], bytes]


async def read_reply(reader: asyncio.StreamReader) -> Reply:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    status_line, *lines = head.split("\r\n")
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.lower()] = value.strip()
    body = await reader.readexactly(int(headers["content-length"]))
    return int(status_line.split()[1]), headers, body


async def read_closed(reader: asyncio.StreamReader) -> bool:
    """True when the server closed the connection (and sent nothing more).

    A Unix socket closed with unread data in it resets its peer: that is a close too.
    """
    try:
        return await reader.read() == b""
    except ConnectionResetError:
        return True
