"""Telling systemd how the daemon is doing: the sd_notify protocol, without libsystemd.

A ``Type=notify`` unit sets ``$NOTIFY_SOCKET`` (a Unix datagram socket; a leading ``@`` means
the abstract namespace) and, with ``WatchdogSec=``, ``$WATCHDOG_USEC`` (and ``$WATCHDOG_PID``).
Each notification is one datagram of ``KEY=value`` lines:

* ``READY=1`` once the daemon serves (edged: persisted state loaded and status socket up);
* ``STATUS=...`` one human line shown by ``systemctl status``, on notable changes;
* ``WATCHDOG=1`` from the main event loop every half ``$WATCHDOG_USEC`` (:class:`WatchdogPinger`):
  a loop that is stuck sends none, and systemd kills and restarts the service;
* ``STOPPING=1`` when shutdown begins;
* ``FDSTORE=1`` with ``FDNAME=`` and the descriptor (SCM_RIGHTS): keep it for the next start
  of the service (:meth:`Notifier.store_fd`), which gets it back as ``LISTEN_FDS`` (from 3),
  ``LISTEN_FDNAMES`` and ``LISTEN_PID`` (:func:`listen_fds`). edged's launcher speaks the same.

Without ``$NOTIFY_SOCKET`` (not under systemd) every call is a no-op. Sending never raises: a
notification that cannot be sent is logged once and dropped.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import Mapping, MutableMapping

from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop

log = get_logger(__name__)


def socket_address(value: str) -> str | None:
    """The address to ``sendto`` for a ``$NOTIFY_SOCKET`` value (``None``: not usable)."""
    if value.startswith("@"):
        return "\0" + value[1:]  # abstract namespace
    if value.startswith("/"):
        return value
    return None  # vsock and relative paths are not supported


def watchdog_interval(env: Mapping[str, str], pid: int) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings: half of ``$WATCHDOG_USEC`` (``None``: no watchdog).

    ``$WATCHDOG_PID``, when set, names the process the watchdog is meant for; another process
    (a child that inherited the environment) must not ping."""
    usec_text = env.get("WATCHDOG_USEC", "")
    pid_text = env.get("WATCHDOG_PID", "")
    if pid_text and pid_text != str(pid):
        return None
    try:
        usec = int(usec_text)
    except ValueError:
        return None
    if usec <= 0:
        return None
    return usec / 2 / 1_000_000


MAX_LISTEN_FDS = 64


def listen_fds(env: Mapping[str, str], pid: int) -> list[tuple[str, int]]:
    """Pure: the descriptors handed to process ``pid`` by systemd's protocol (``LISTEN_PID``,
    ``LISTEN_FDS`` from descriptor 3, ``LISTEN_FDNAMES`` colon-separated), as (name, fd);
    none when ``LISTEN_PID`` names another process (they were not meant for this one)."""
    if env.get("LISTEN_PID", "") != str(pid):
        return []
    try:
        count = int(env.get("LISTEN_FDS", "0"))
    except ValueError:
        return []
    names = env.get("LISTEN_FDNAMES", "").split(":")
    count = max(0, min(count, MAX_LISTEN_FDS))
    return [(names[i] if i < len(names) and names[i] else "unknown", 3 + i) for i in range(count)]


def take_listen_fds(env: MutableMapping[str, str]) -> dict[str, int]:
    """The descriptors systemd (or edged's launcher) handed this process, by name, taken out
    of ``env`` (the ``LISTEN_*`` variables go: no child must take them for its own) and made
    non-inheritable; a name given twice keeps its first descriptor, the others are closed."""
    found: dict[str, int] = {}
    for name, fd in listen_fds(env, os.getpid()):
        try:
            os.set_inheritable(fd, False)
        except OSError:
            continue  # not open after all
        if name in found:
            os.close(fd)
        else:
            found[name] = fd
    for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        env.pop(key, None)
    return found


class Notifier:
    """Sends sd_notify datagrams to one address (``None``: does nothing)."""

    def __init__(self, address: str | None, *, watchdog_interval_s: float | None = None) -> None:
        self.address = address
        self.watchdog_interval_s = watchdog_interval_s if address is not None else None
        self._warned = False

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> Notifier:
        env = os.environ if env is None else env
        address = socket_address(env.get("NOTIFY_SOCKET", ""))
        return cls(address, watchdog_interval_s=watchdog_interval(env, os.getpid()))

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *lines: str) -> bool:
        """Send one datagram of ``lines``; ``False`` if it could not be sent (or no socket)."""
        if self.address is None:
            return False
        payload = "\n".join(line.replace("\n", " ") for line in lines).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.sendto(payload, self.address)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("cannot notify systemd", error=str(exc))
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={status}")

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def stopping(self, status: str = "stopping") -> bool:
        return self.send("STOPPING=1", f"STATUS={status}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def remove_fd(self, name: str) -> bool:
        """Drop the descriptor stored as ``name`` (``FDSTOREREMOVE=1``)."""
        return self.send("FDSTOREREMOVE=1", f"FDNAME={name}")

    def store_fd(self, name: str, fd: int) -> bool:
        """Keep ``fd`` in the service's descriptor store as ``name``, replacing one of that
        name; False when there is no store (not under systemd or the launcher) or the send
        failed."""
        if self.address is None:
            return False
        self.remove_fd(name)
        payload = f"FDSTORE=1\nFDNAME={name}".encode()
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fd.to_bytes(4, sys.byteorder))]
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.sendmsg([payload], rights, 0, self.address)  # send_fds drops the address
        except OSError as exc:
            log.warning("cannot store a descriptor", name=name, error=str(exc))
            return False
        return True


class WatchdogPinger:
    """Pings the systemd watchdog from the event loop it runs on, until ``stop`` is set.

    It runs as a task of the main loop on purpose: when that loop is stuck (a blocking call,
    a busy coroutine), no ping goes out and systemd restarts the service."""

    name = "watchdog"

    def __init__(self, notifier: Notifier) -> None:
        self._notifier = notifier

    async def run(self, stop: asyncio.Event) -> None:
        interval = self._notifier.watchdog_interval_s
        if interval is None:
            return
        while not stop.is_set():
            self._notifier.watchdog()
            await wait_for_stop(stop, interval)
