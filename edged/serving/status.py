"""The status socket: ``GET /v1/status``, ``/healthz``, ``/readyz``, ``/metrics``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from edged.statusboard import StatusBoard
from edgefleet.metrics import CONTENT_TYPE, Registry

if TYPE_CHECKING:
    from edged.runtime.httpserver import Request, Response

PROMETHEUS = CONTENT_TYPE.encode()


class StatusHandler:
    def __init__(
        self, board: StatusBoard, registry: Registry, *, alive: Callable[[], bool]
    ) -> None:
        self._board = board
        self._registry = registry
        self._alive = alive

    def handle(self, req: Request, resp: Response) -> None:
        if req.method != "GET":
            resp.send_error(405, "use GET")
            return
        path = req.path
        if path == "/v1/status":
            resp.send_json(200, self._board.document())
        elif path == "/healthz":
            ok = self._alive()
            resp.send_json(200 if ok else 503, {"ok": ok})
        elif path == "/readyz":
            ready = self._board.ready()
            resp.send_json(200 if ready else 503, {"ready": ready})
        elif path == "/metrics":
            resp.send(200, self._registry.render().encode(), PROMETHEUS)
        else:
            resp.send_error(404, f"no such endpoint: {path}")
