"""Who is at the other end of an infer.sock connection (``SO_PEERCRED``: pid, uid, gid at
``connect()``; ``SO_PEERGROUPS``: the peer's supplementary groups, Linux 4.13+), and the gate
that refuses those the baselines' ``ingress.users``/``groups`` do not name
(``securing.peer_allowed`` decides). The HTTP server answers a refused connection 403 before
reading a request. Logging is bounded: one record per refused uid per
:data:`LOG_EVERY_S`, at most :data:`MAX_LOGGED_UIDS` uids remembered."""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

from edged.runtime.securing import PeerRule, peer_allowed
from edgefleet.logs import get_logger

log = get_logger(__name__)

SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)
LOG_EVERY_S = 60.0
MAX_LOGGED_UIDS = 256
MAX_GROUPS = 65536
_CRED = struct.Struct("3i")


def read_peer(sock: Any) -> tuple[int, int, tuple[int, ...]]:
    """(pid, uid, primary and supplementary gids) of a connected unix socket's peer."""
    pid, uid, gid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    size = 64 * 4
    while True:
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, size)
            break
        except OSError as exc:  # ERANGE: more groups than room
            if exc.errno != 34 or size >= MAX_GROUPS * 4:
                raise
            size *= 4
    extra = struct.unpack(f"{len(raw) // 4}I", raw[: len(raw) // 4 * 4])
    return pid, uid, (gid, *extra)


class PeerGate:
    """``admit(sock)``: None to serve the connection, else why it is refused."""

    def __init__(self, rules: tuple[PeerRule, ...], own_uid: int) -> None:
        self.rules = rules
        self.own_uid = own_uid
        self.refused = 0
        self._logged: dict[int, float] = {}  # uid -> when last logged
        self._unlogged = 0

    def admit(self, sock: Any) -> str | None:
        if not self.rules or sock.family != socket.AF_UNIX:
            return None
        try:
            pid, uid, gids = read_peer(sock)
        except OSError as exc:
            return self._refuse(-1, -1, f"cannot tell who connected ({exc.strerror})")
        if peer_allowed(self.rules, uid=uid, gids=gids, own_uid=self.own_uid):
            return None
        return self._refuse(
            pid,
            uid,
            f"uid {uid} may not use the inference API: the SecurityBaseline's "
            "network.ingress users and groups do not name it or any of its groups",
        )

    def _refuse(self, pid: int, uid: int, why: str) -> str:
        self.refused += 1
        now = time.monotonic()
        last = self._logged.get(uid)
        if last is None or now - last >= LOG_EVERY_S:
            if last is None and len(self._logged) >= MAX_LOGGED_UIDS:
                self._logged.pop(next(iter(self._logged)))
            self._logged[uid] = now
            log.warning(
                "inference connection refused",
                uid=uid,
                pid=pid,
                reason=why,
                unlogged=self._unlogged,
            )
            self._unlogged = 0
        else:
            self._unlogged += 1
        return why
