"""edged's end of the hand-off socket to one worker (issue 34, item 1; the worker's end:
``direct.py``; docs/edged.md, "The control process and the data path").

:class:`HandoffLink` sends accepted client connections to the worker (``SOCK_SEQPACKET``,
each message a connection id with the socket as ``SCM_RIGHTS``), remembers which ids it
handed, and takes back the ones the worker returns idle (on DRAIN). A worker runs a model
edged does not trust, so what it says of its connections is held to what was handed: a
connection it reports closed, or returns, must be one handed to it and not yet closed or
returned; anything else is dropped (a descriptor that comes with it is closed). When the
worker goes, every connection it held is gone with it (:meth:`close` says how many).
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable

from edged.runtime.framing import CONN_ID
from edgefleet.logs import get_logger

log = get_logger(__name__)


class HandoffLink:
    def __init__(
        self, sock: socket.socket, on_returned: Callable[[socket.socket, bool], None]
    ) -> None:
        """``on_returned(sock, keep)``: a connection the worker handed back, to serve again
        (``keep``: here for good, not handed again: it uses shared memory)."""
        self._sock: socket.socket | None = sock
        sock.setblocking(False)
        self._on_returned = on_returned
        self.open: dict[int, int | None] = {}  # id -> the client's uid (when asked) of each
        self._next = 1
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._on_message)

    @property
    def alive(self) -> bool:
        return self._sock is not None

    def hand(self, fd: int, uid: int | None) -> int | None:
        """Send the connection of ``fd`` (the caller keeps and closes ``fd``); its id, or None
        when the socket cannot take it now (nothing was sent)."""
        sock = self._sock
        if sock is None:
            return None
        conn_id = self._next
        self._next = (conn_id + 1) & 0xFFFFFFFF or 1
        try:
            socket.send_fds(sock, [CONN_ID.pack(conn_id)], [fd])
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            self.close()
            return None
        self.open[conn_id] = uid
        return conn_id

    def forget(self, conn_id: int) -> bool:
        """The worker says a handed connection closed (or returned it): True if it was one
        handed to it and still open."""
        if conn_id in self.open:
            del self.open[conn_id]
            return True
        return False

    def uid_of(self, conn_id: int) -> int | None:
        return self.open.get(conn_id)

    def _on_message(self) -> None:
        sock = self._sock
        while sock is not None:
            try:
                msg, fds, _, _ = socket.recv_fds(sock, CONN_ID.size + 1, 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                msg, fds = b"", []
            if not msg:
                for fd in fds:
                    os.close(fd)
                self.close()
                return
            conn_id = CONN_ID.unpack_from(msg)[0] if len(msg) in (4, 5) else 0
            if len(fds) != 1 or not self.forget(conn_id):
                for fd in fds:
                    os.close(fd)
                log.warning("worker returned a connection it was not handed", id=conn_id)
                continue
            self._on_returned(socket.socket(fileno=fds[0]), msg[4:] == b"\x01")

    def close(self) -> int:
        """The worker is gone (or its socket is): the number of connections it held."""
        sock, self._sock = self._sock, None
        if sock is not None:
            self._loop.remove_reader(sock.fileno())
            sock.close()
        held = len(self.open)
        self.open.clear()
        return held
