"""Who may use the inference API, as the SecurityBaselines say (docs/security.md): the group
and mode of ``infer.sock``, the users and groups let in per connection (:class:`PeerGate`), and
whether the configured loopback TCP port is served.

:meth:`Ingress.apply` follows :func:`edged.runtime.securing.plan_ingress` (pure) at start and
(:meth:`Ingress.reapply`) each time the baselines change, and puts what is in force into
status (``ingress``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from collections.abc import Callable
from pathlib import Path

from edged.config import TcpAddress
from edged.runtime.httpserver import HttpServer
from edged.runtime.securing import DeviceSecurity, plan_ingress, resolve_peers
from edged.serving.peers import PeerGate
from edged.statusboard import StatusBoard
from edgefleet.logs import get_logger

log = get_logger(__name__)


TCP_FDNAME = "inference-tcp"


def inherited_tcp_listener(fd: int, tcp: TcpAddress) -> tuple[socket.socket | None, str]:
    """The socket of ``fd`` if it is a listening TCP socket on ``tcp`` (any port when it
    says 0), else None and why (``fd`` is then closed)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        return None, f"descriptor {fd} is not a socket: {exc.strerror}"
    why = ""
    try:
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
            why = "not a TCP socket"
        elif not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            why = "not listening"
        else:
            host, port = sock.getsockname()[:2]
            if ipaddress.ip_address(host) != ipaddress.ip_address(tcp.host) or (
                tcp.port and port != tcp.port
            ):
                why = f"listening on {host}:{port}, not {tcp}"
    except (OSError, ValueError) as exc:
        why = f"cannot check it: {exc}"
    if why:
        sock.close()
        return None, why
    sock.setblocking(False)
    return sock, ""


class Ingress:
    def __init__(
        self,
        server: HttpServer,
        *,
        socket_path: Path,
        tcp: TcpAddress | None,
        security: Callable[[], DeviceSecurity],
        board: StatusBoard,
        inherited_tcp: int | None = None,
        store: Callable[[str, int], bool] | None = None,
        unstore: Callable[[str], bool] | None = None,
    ) -> None:
        """``server``: the inference server listening on ``socket_path``; ``tcp``: the loopback
        port edged.toml configures (served only where the baselines allow it); ``security``:
        the baselines in force; ``board``: where what is in force is shown;
        ``inherited_tcp``: the TCP listener the previous edged stored (its descriptor);
        ``store``/``unstore``: keep the TCP listener for the next edged, and drop it when the
        port is no longer served (the descriptor store would keep it listening)."""
        self._inherited_tcp = inherited_tcp
        self._store = store
        self._unstore = unstore
        self._server = server
        self._socket_path = socket_path
        self._tcp = tcp
        self._security = security
        self._board = board
        self._tcp_listener: asyncio.AbstractServer | None = None
        self._peer_gate: PeerGate | None = None  # infer.sock's per-connection user check
        self._reapplying: set[asyncio.Future[None]] = set()

    def reapply(self) -> None:
        """:meth:`apply` again, in the background: the baselines changed."""
        task = asyncio.ensure_future(self.apply())
        self._reapplying.add(task)
        task.add_done_callback(self._reapplying.discard)

    def _take_tcp(self, tcp: TcpAddress | None) -> socket.socket | None:
        """The stored TCP listener, once, when it is ``tcp``'s (None: closed, and when the
        port is not to be served, dropped from the store too)."""
        fd, self._inherited_tcp = self._inherited_tcp, None
        if fd is None:
            return None
        if tcp is None:
            os.close(fd)
            if self._unstore is not None:
                self._unstore(TCP_FDNAME)
            return None
        sock, why = inherited_tcp_listener(fd, tcp)
        if sock is None:
            log.warning("stored socket not taken: bound anew", name=TCP_FDNAME, reason=why)
        else:
            log.info("socket taken from the descriptor store", name=TCP_FDNAME, port=tcp.port)
        return sock

    async def apply(self) -> None:
        """Give infer.sock the group and mode the baselines say, and serve the configured
        loopback TCP port only if they allow it (``plan_ingress``); status shows the result.
        OSError when the TCP port cannot be opened (at start: edged exits)."""
        security = self._security()
        tcp = self._tcp
        plan = plan_ingress(security, tcp_port=tcp.port if tcp else None, group_exists=group_exists)
        problems = list(plan.problems)
        path = self._socket_path
        mode = plan.mode
        if plan.group is not None:
            try:
                os.chown(path, -1, group_id(plan.group))
            except OSError as exc:
                problems.append(f"cannot give infer.sock to group {plan.group}: {exc.strerror}")
                mode &= 0o600
        os.chmod(path, mode)
        rules, unknown = resolve_peers(security, user_id=user_id, group_id=group_id_or_none)
        problems += [f"{p}: it lets no one in" for p in unknown]
        if rules != (self._peer_gate.rules if self._peer_gate is not None else ()):
            self._peer_gate = PeerGate(rules, os.geteuid()) if rules else None
            self._server.set_admit(self._peer_gate.admit if self._peer_gate else None)
        inherited = self._take_tcp(tcp if plan.serve_tcp else None)
        if plan.serve_tcp and tcp is not None and self._tcp_listener is None:
            self._tcp_listener = await self._server.listen_tcp(tcp.host, tcp.port, sock=inherited)
            sockets = getattr(self._tcp_listener, "sockets", None) or ()
            if self._store is not None and sockets:
                self._store(TCP_FDNAME, int(sockets[0].fileno()))
        elif not plan.serve_tcp and self._tcp_listener is not None:
            self._tcp_listener.close()
            self._tcp_listener = None
            if self._unstore is not None:
                self._unstore(TCP_FDNAME)
        ingress = {
            "users": sorted({u for users, _ in security.socket_peers for u in users}),
            "groups": sorted({g for _, groups in security.socket_peers for g in groups}),
            "peersChecked": self._peer_gate is not None,
            "socketGroup": plan.group,
            "socketMode": f"{mode:04o}",
            "tcp": str(tcp) if tcp is not None and self._tcp_listener is not None else None,
            "problems": problems,
        }
        if ingress != self._board.ingress:
            for p in problems:
                log.warning("ingress policy not followed as configured", problem=p)
            self._board.ingress = ingress


def group_id(group: str) -> int:
    """A group's id (a number is itself); KeyError when the device has no such group."""
    import grp

    return int(group) if group.isdigit() else grp.getgrnam(group).gr_gid


def group_id_or_none(group: str) -> int | None:
    try:
        return group_id(group)
    except KeyError:
        return None


def user_id(user: str) -> int | None:
    import pwd

    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def group_exists(group: str) -> bool:
    try:
        group_id(group)
    except KeyError:
        return False
    return True
