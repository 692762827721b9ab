"""A descriptor store as systemd keeps one for a service (``FileDescriptorStoreMax=``), for
tests that restart a real edged: the sd_notify side (``NOTIFY_SOCKET``: ``FDSTORE=1``,
``FDNAME=``, ``FDSTOREREMOVE=1`` with SCM_RIGHTS) and the start side (the stored descriptors
at 3.. with ``LISTEN_FDS``, ``LISTEN_FDNAMES`` and ``LISTEN_PID``).

The start side is a "python" wrapper (:attr:`FdStore.python`): it fetches the stored
descriptors from the store over a Unix socket, puts them at 3.., sets the ``LISTEN_*``
variables for its own pid and execs the real interpreter, so ``LISTEN_PID`` is edged's pid
as systemd makes it. edged's launcher speaks the same protocol on both sides.
"""

from __future__ import annotations

import array
import json
import os
import socket
import sys
import threading
from pathlib import Path

WRAPPER = """#!{python}
import array, fcntl, json, os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect({fds_path!r})
msg, anc, _, _ = s.recvmsg(65536, socket.CMSG_SPACE(64 * 4))
s.close()
names = json.loads(msg.decode())
got = array.array("i")
for level, kind, data in anc:
    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
        got.frombytes(data[: len(data) - len(data) % got.itemsize])
high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in got]  # above 3.., whatever is there
for fd in got:
    os.close(fd)
for i, fd in enumerate(high):
    os.dup2(fd, 3 + i, inheritable=True)
    os.close(fd)
if names:
    os.environ["LISTEN_FDS"] = str(len(names))
    os.environ["LISTEN_FDNAMES"] = ":".join(names)
    os.environ["LISTEN_PID"] = str(os.getpid())
os.execv({python!r}, [{python!r}, *sys.argv[1:]])
"""


class FdStore:
    """The store: :attr:`env` (``NOTIFY_SOCKET``) and :attr:`python` start an edged that
    stores into it and gets its descriptors back."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.fds: dict[str, int] = {}
        self.messages: list[str] = []
        self._lock = threading.Lock()
        self.notify_path = directory / "notify.sock"
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._notify.bind(str(self.notify_path))
        self.fds_path = directory / "fds.sock"
        self._handoff = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._handoff.bind(str(self.fds_path))
        self._handoff.listen(8)
        self.python = directory / "python-fdstore"
        self.python.write_text(WRAPPER.format(python=sys.executable, fds_path=str(self.fds_path)))
        self.python.chmod(0o755)
        self._closed = False
        for target in (self._receive, self._hand_out):
            threading.Thread(target=target, daemon=True).start()

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "NOTIFY_SOCKET": str(self.notify_path)}

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self.fds)

    def _receive(self) -> None:
        while not self._closed:
            try:
                msg, anc, _, _ = self._notify.recvmsg(65536, socket.CMSG_SPACE(64 * 4))
            except OSError:
                return
            got = array.array("i")
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    got.frombytes(data[: len(data) - len(data) % got.itemsize])
            lines = msg.decode(errors="replace").split("\n")
            names = [line[7:] for line in lines if line.startswith("FDNAME=")]
            name = names[0] if names else "stored"
            with self._lock:
                self.messages.append(msg.decode(errors="replace"))
                if "FDSTOREREMOVE=1" in lines and name in self.fds:
                    os.close(self.fds.pop(name))
                for fd in got:
                    if "FDSTORE=1" in lines:
                        old = self.fds.pop(name, None)
                        if old is not None:
                            os.close(old)
                        self.fds[name] = fd
                    else:
                        os.close(fd)

    def _hand_out(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._handoff.accept()
            except OSError:
                return
            with self._lock, conn:
                items = list(self.fds.items())
                payload = json.dumps([name for name, _ in items]).encode()
                fds = [fd for _, fd in items]
                if fds:
                    socket.send_fds(conn, [payload], fds)
                else:
                    conn.sendall(payload)

    def close(self) -> None:
        self._closed = True
        for sock in (self._notify, self._handoff):
            sock.close()
        with self._lock:
            for fd in self.fds.values():
                os.close(fd)
            self.fds.clear()
