"""edged's two sockets: the status socket (:class:`StatusHandler`) and ``infer.sock`` (the
inference router), each with the limits edged.toml and the open-files limit allow, and the
inference ingress the baselines allow (:class:`Ingress`).

:meth:`Sockets.open` raises the open-files limit, splits it between the two
(:func:`connection_caps`), counts what each socket's limits do and listens. At shutdown
:meth:`Sockets.drain_inference` stops taking inference connections and waits for the requests
in flight; :meth:`Sockets.close_status` is last, so status answers until the end.

Both sockets outlive edged where a descriptor store is there (systemd's, or edged's launcher's:
``store``): each is stored as it starts listening (``FDSTORE=1``, ``FDNAME=inference`` /
``status``) and its file is left in place at the stop, so that a client connecting while edged
restarts waits in the socket's backlog instead of being refused; the next edged takes the
socket back (``inherited``: ``LISTEN_FDS``/``LISTEN_FDNAMES``) when it is a listening Unix
socket bound to the configured path, and binds the path anew otherwise
(docs/agent-updates.md, "Workers outlive edged").
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path

from edged.config import InferenceConfig, PathsConfig
from edged.runtime.httpserver import HttpServer, ServerLimits
from edged.runtime.limiting import raise_open_files_limit
from edged.runtime.securing import DeviceSecurity
from edged.serving.bounding import connection_caps
from edged.serving.counting import Counters
from edged.serving.inference import InferenceRouter
from edged.serving.ingress import TCP_FDNAME, Ingress
from edged.serving.status import StatusHandler
from edged.statusboard import StatusBoard
from edgefleet.logs import get_logger
from edgefleet.metrics import Registry

log = get_logger(__name__)

STATUS_MAX_BODY = 1 << 16
# connections that may wait for an answer while edged restarts (the kernel caps it with
# net.core.somaxconn)
INFERENCE_BACKLOG = 4096
INFERENCE_FDNAME = "inference"
STATUS_FDNAME = "status"


def inherited_listener(fd: int, path: Path) -> tuple[socket.socket | None, str]:
    """The socket of ``fd`` if it is a listening Unix stream socket bound to ``path`` and
    ``path`` is a socket file, else None and why (``fd`` is then closed)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        return None, f"descriptor {fd} is not a socket: {exc.strerror}"
    why = ""
    try:
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
            why = "not a Unix stream socket"
        elif not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            why = "not listening"
        elif sock.getsockname() != str(path):
            why = f"bound to {sock.getsockname()!r}, not {str(path)!r}"
        elif not stat.S_ISSOCK(os.lstat(path).st_mode):
            why = f"{path} is not a socket file"
    except OSError as exc:
        why = f"cannot check it: {exc.strerror or exc}"
    if why:
        sock.close()
        return None, why
    sock.setblocking(False)
    return sock, ""


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
        inherited: dict[str, int] | None = None,
        store: Callable[[str, int], bool] | None = None,
        unstore: Callable[[str], bool] | None = None,
    ) -> None:
        """``board`` and ``registry``: what the status socket serves; ``router``: what
        infer.sock serves; ``counters``: where each socket's limits are counted;
        ``security``: the baselines in force (the ingress); ``inherited``: descriptors the
        previous edged stored, by name (taken: those not used are closed); ``store(name,
        fd)``: keep a descriptor for the next edged (False: there is no store);
        ``unstore(name)``: drop one."""
        self._inherited = dict(inherited or {})
        self._store = store
        self._unstore = unstore
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
        self._router.serve_with(infer)  # infer connections go on to their models' workers
        self._counters.watch_servers({"status": status, "inference": infer})
        ingress = Ingress(
            infer,
            socket_path=self._paths.inference_socket,
            tcp=inf.listen_tcp,
            security=self._security,
            board=self._board,
            inherited_tcp=self._inherited.pop(TCP_FDNAME, None),
            store=self._store,
            unstore=self._unstore,
        )
        self._ingress = ingress
        status_path, infer_path = self._paths.status_socket, self._paths.inference_socket
        try:
            await status.listen_unix(status_path, sock=self._take(STATUS_FDNAME, status_path))
            await infer.listen_unix(
                infer_path,
                sock=self._take(INFERENCE_FDNAME, infer_path),
                backlog=INFERENCE_BACKLOG,
            )
            await ingress.apply()
        except OSError as exc:
            # say so, and leave the other edged's sockets where they are
            log.error("cannot open sockets", error=str(exc))
            status.stop_accepting()
            infer.stop_accepting()
            return False
        finally:
            for fd in self._inherited.values():  # names this edged does not know
                os.close(fd)
            self._inherited.clear()
        self._hand_on(STATUS_FDNAME, status, status_path)
        self._hand_on(INFERENCE_FDNAME, infer, infer_path)
        return True

    def _take(self, name: str, path: Path) -> socket.socket | None:
        fd = self._inherited.pop(name, None)
        if fd is None:
            return None
        sock, why = inherited_listener(fd, path)
        if sock is None:
            log.warning("stored socket not taken: bound anew", name=name, reason=why)
        else:
            log.info("socket taken from the descriptor store", name=name, path=str(path))
        return sock

    def _hand_on(self, name: str, server: HttpServer, path: Path) -> None:
        """Store the socket on ``path`` for the next edged, and leave its file at the stop."""
        if self._store is None:
            return
        fd = server.hand_on(path)
        if fd is not None and not self._store(name, fd):
            server.unlink_at_stop(path)  # no store after all: its file goes at the stop

    def baselines_changed(self) -> None:
        """The ingress follows the baselines (once infer.sock is made)."""
        if self._ingress is not None:
            self._ingress.reapply()

    async def drain_inference(self, timeout: float) -> None:
        """Take no more inference connections; wait up to ``timeout`` for those in flight."""
        if self._infer is None:
            return
        self._infer.stop_accepting()
        self._router.close_direct()  # the workers' handed connections close once idle
        if not await self._infer.drain(timeout):
            log.warning("in-flight requests did not finish in time", timeout=timeout)

    async def close_status(self) -> None:
        if self._status is None:
            return
        self._status.stop_accepting()
        await self._status.drain(1.0)
