"""A test notify socket standing in for systemd's (sd_notify): tests/systemd uses it."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class NotifySocket:
    """A notify socket: ``env`` is what systemd would set; ``messages`` (time, text) arrive."""

    sock: socket.socket
    env_value: str
    messages: list[tuple[float, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def received(self) -> list[tuple[float, str]]:
        with self.lock:
            return list(self.messages)

    def wait_for(self, line: str, timeout: float = 30.0) -> float:
        """The time the first datagram with ``line`` arrived (waits with a deadline)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, text in self.received():
                if line in text.split("\n"):
                    return t
            time.sleep(0.02)
        raise AssertionError(f"no {line!r} within {timeout}s; got {self.received()}")

    def count(self, line: str) -> int:
        return sum(1 for _, text in self.received() if line in text.split("\n"))


@contextmanager
def open_notify_socket() -> Iterator[NotifySocket]:
    """An abstract-namespace notify socket (``@...``), as systemd may hand out."""
    name = f"edgefleet-test-notify-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    sock.bind("\0" + name)
    sock.settimeout(0.1)
    ns = NotifySocket(sock, "@" + name)
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            try:
                data = sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            with ns.lock:
                ns.messages.append((time.monotonic(), data.decode()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    yield ns
    done.set()
    reader.join(5)
    sock.close()
