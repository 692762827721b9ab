"""A prototype for ``bench/directpath.py``: an inference worker that serves HTTP connections
handed to it over ``SCM_RIGHTS`` itself (issue 34, item 1's chosen design, docs/edged.md),
built from the worker's own parts: its model load (``Model``), its batch queue, decoding and
encoding (``WorkerProtocol``), and edged's HTTP connection (``serving/http.py``).

    python bench/directworker.py FD SPEC_JSON

``FD``: its end of a socket pair on which each message carries accepted connections; one
byte ``R`` is written on it once the model is loaded. Not edged's worker: no sandbox, no
probes, no hand-back of a connection (one model), no drain; a measurement of what the path
costs, nothing else.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson

from edged.runtime.framing import HEADER, NO_HEADER_LENGTH, RESULT_PREFIX, U32, FrameType
from edged.runtime.launching import LaunchSpec
from edged.runtime.worker import Model
from edged.runtime.workerprotocol import WorkerProtocol
from edged.serving.http import HttpConnection, HttpServerState, Request, Response, ServerLimits

_BINARY = b"application/octet-stream"


class DirectProtocol(WorkerProtocol):
    """The worker's batch queue, fed from HTTP requests and answering into their responses
    instead of frames on edged's socket."""

    def __init__(self, spec: LaunchSpec, model: Model, done: asyncio.Future[int]) -> None:
        super().__init__(spec, model, done)
        self.responses: dict[int, Response] = {}
        self._next_id = 1

    def infer(self, req: Request, resp: Response) -> None:
        hdr = req.headers.get("inference-header-content-length")
        hlen = NO_HEADER_LENGTH if hdr is None else int(hdr)
        rid = self._next_id
        self._next_id += 1
        self.responses[rid] = resp
        self._on_frame(FrameType.INFER, rid, U32.pack(hlen) + req.body)  # type: ignore[arg-type]
        self._maybe_run()

    def _send_results(self, parts: list[bytes | memoryview]) -> bool:
        i = 0
        while i < len(parts):
            head = parts[i]
            i += 1
            size, _, rid = HEADER.unpack_from(head, 0)
            status, hlen = RESULT_PREFIX.unpack_from(head, HEADER.size)
            got = len(head) - HEADER.size
            body: list[bytes | memoryview] = []
            while got < size:
                body.append(parts[i])
                got += len(parts[i])
                i += 1
            resp = self.responses.pop(rid)
            data = b"".join(body)
            if hlen == NO_HEADER_LENGTH:
                resp.send(status, data)
            else:
                resp.send(status, data, _BINARY, b"Inference-Header-Content-Length: %d\r\n" % hlen)
        return True


async def serve(fd: int, spec: LaunchSpec, model: Model) -> int:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()
    proto = DirectProtocol(spec, model, done)

    def handler(req: Request, resp: Response) -> None:
        if req.method == "POST" and req.path.endswith("/infer"):
            proto.infer(req, resp)
        else:
            resp.send_json(200, {"live": True})

    state = HttpServerState(handler, ServerLimits())
    chan = socket.socket(fileno=fd)
    chan.setblocking(False)
    tasks: set[asyncio.Task[Any]] = set()

    def on_message() -> None:
        while True:
            try:
                msg, fds, _, _ = socket.recv_fds(chan, 64, 64)
            except BlockingIOError:
                return
            if not msg:
                loop.remove_reader(fd)
                if not done.done():
                    done.set_result(0)
                return
            for conn_fd in fds:
                conn = socket.socket(fileno=conn_fd)
                conn.setblocking(False)
                task = loop.create_task(
                    loop.connect_accepted_socket(lambda: HttpConnection(state), sock=conn)
                )
                tasks.add(task)
                task.add_done_callback(tasks.discard)

    loop.add_reader(fd, on_message)
    chan.send(b"R")
    try:
        return await done
    finally:
        proto.close()


def main() -> int:
    spec = LaunchSpec.from_json(orjson.loads(sys.argv[2]))
    model = Model(spec, Path(spec.artifact_path).read_bytes())
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    return int(runner(serve(int(sys.argv[1]), spec, model)))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
