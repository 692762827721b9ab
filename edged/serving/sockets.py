"""edged's two sockets: the status socket (:class:`StatusHandler`) and ``infer.sock`` (the
inference router), each with the limits edged.toml and the open-files limit allow, and the
inference ingress the baselines allow (:class:`Ingress`).

:meth:`Sockets.open` raises the open-files limit, splits it between the two
(:func:`connection_caps`), counts what each socket's limits do and listens. At shutdown
:meth:`Sockets.drain_inference` stops taking inference connections and waits for the requests
in flight; :meth:`Sockets.close_status` is last, so status answers until the end.
"""

from __future__ import annotations

from collections.abc import Callable

from edged.config import InferenceConfig, PathsConfig
from edged.runtime.limiting import raise_open_files_limit
from edged.runtime.securing import DeviceSecurity
from edged.serving.bounding import connection_caps
from edged.serving.counting import Counters
from edged.serving.http import HttpServer, ServerLimits
from edged.serving.inference import InferenceRouter
from edged.serving.ingress import Ingress
from edged.serving.status import StatusHandler
from edged.statusboard import StatusBoard
from edgefleet.logs import get_logger
from edgefleet.metrics import Registry

log = get_logger(__name__)

STATUS_MAX_BODY = 1 << 16


class Sockets:
    def __init__(
        self,
        paths: PathsConfig,
        inference: InferenceConfig,
        *,
        board: StatusBoard,
        registry: Registry,
        router: InferenceRouter,
        counters: Counters,
        security: Callable[[], DeviceSecurity],
    ) -> None:
        """``board`` and ``registry``: what the status socket serves; ``router``: what
        infer.sock serves; ``counters``: where each socket's limits are counted;
        ``security``: the baselines in force (the ingress)."""
        self._paths = paths
        self._inference = inference
        self._board = board
        self._registry = registry
        self._router = router
        self._counters = counters
        self._security = security
        self._status: HttpServer | None = None
        self._infer: HttpServer | None = None
        self._ingress: Ingress | None = None  # once the inference socket is made

    async def open(self) -> bool:
        """Listen on both sockets, infer.sock as the ingress allows; False (logged, nothing
        left listening) when a socket cannot be opened, typically another edged on the same
        data directory."""
        open_files = raise_open_files_limit()
        infer_cap, status_cap, lowered = connection_caps(
            open_files, self._inference.max_connections
        )
        if lowered:
            log.warning("connection cap lowered", reason=lowered, open_files=open_files)
        status = HttpServer(
            StatusHandler(self._board, self._registry, alive=lambda: True).handle,
            limits=ServerLimits(max_body=STATUS_MAX_BODY, max_connections=status_cap),
        )
        inf = self._inference
        infer = HttpServer(
            self._router.handle,
            limits=ServerLimits(
                max_body=inf.max_request_bytes,
                max_connections=infer_cap,
                max_buffered_bytes=inf.max_buffered_bytes,
                header_timeout_s=inf.header_timeout_s,
                body_timeout_s=inf.body_timeout_s,
                idle_timeout_s=inf.idle_timeout_s,
            ),
            body_limit=self._router.body_limit,
        )
        self._status, self._infer = status, infer
        self._counters.watch_servers({"status": status, "inference": infer})
        ingress = Ingress(
            infer,
            socket_path=self._paths.inference_socket,
            tcp=inf.listen_tcp,
            security=self._security,
            board=self._board,
        )
        self._ingress = ingress
        try:
            await status.listen_unix(self._paths.status_socket)
            await infer.listen_unix(self._paths.inference_socket)
            await ingress.apply()
        except OSError as exc:
            # say so, and leave the other edged's sockets where they are
            log.error("cannot open sockets", error=str(exc))
            status.stop_accepting()
            infer.stop_accepting()
            return False
        return True

    def baselines_changed(self) -> None:
        """The ingress follows the baselines (once infer.sock is made)."""
        if self._ingress is not None:
            self._ingress.reapply()

    async def drain_inference(self, timeout: float) -> None:
        """Take no more inference connections; wait up to ``timeout`` for those in flight."""
        if self._infer is None:
            return
        self._infer.stop_accepting()
        if not await self._infer.drain(timeout):
            log.warning("in-flight requests did not finish in time", timeout=timeout)

    async def close_status(self) -> None:
        if self._status is None:
            return
        self._status.stop_accepting()
        await self._status.drain(1.0)
