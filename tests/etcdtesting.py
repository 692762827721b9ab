"""A real etcd (Debian's etcd-server, installed by scripts/install-system-deps) for tests:
one member on loopback, random ports, a temporary data directory, torn down after.

Where etcd is not installed the tests that need it are skipped, saying so; CI installs it."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ETCD = shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)
SKIP_REASON = "etcd is not installed (scripts/install-system-deps installs etcd-server; CI has it)"

# What a hub's etcd runs with (docs/etcd.md): the device writer's batches are large.
HUB_ETCD_FLAGS = ["--max-txn-ops", "10000", "--max-request-bytes", "33554432"]


def require_etcd() -> str:
    if ETCD is None:
        pytest.skip(SKIP_REASON)
    return ETCD


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


PORT_TAKEN = "address already in use"
"""In etcd's log when a port :func:`free_port` chose was taken by another process (a test on
another xdist worker) before etcd bound it: the members start again on fresh ports."""
LAUNCH_TRIES = 3


class PortTaken(RuntimeError):
    """etcd exited because a port it was to listen on had been taken meanwhile."""


class EtcdServer:
    """``EtcdServer(dir).start()``; ``endpoint`` is HOST:PORT for clients; ``stop()``."""

    def __init__(
        self,
        directory: Path,
        *,
        extra: list[str] | None = None,
        scheme: str = "http",
        name: str = "test",
    ) -> None:
        self.binary = require_etcd()
        self.scheme = scheme
        self.directory = directory
        self.extra = extra or []
        self.name = name
        self.client_port = free_port()
        self.peer_port = free_port()
        self.metrics_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.initial_cluster = ""

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def start(self, *, ready_within: float = 60.0) -> EtcdServer:
        self.launch()
        self.wait_healthy(ready_within)
        return self

    def launch(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        peer = f"http://127.0.0.1:{self.peer_port}"
        client = f"{self.scheme}://127.0.0.1:{self.client_port}"
        log = (self.directory / "etcd.log").open("ab")
        self.process = subprocess.Popen(
            [
                self.binary,
                f"--name={self.name}",
                f"--data-dir={self.directory / 'data'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster={self.initial_cluster or f'{self.name}={peer}'}",
                f"--listen-metrics-urls=http://127.0.0.1:{self.metrics_port}",
                *HUB_ETCD_FLAGS,
                *self.extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_environment(),
        )
        log.close()

    def wait_healthy(self, ready_within: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + ready_within
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_tail()
                raise (PortTaken if PORT_TAKEN in tail else RuntimeError)(f"etcd exited: {tail}")
            with contextlib.suppress(OSError):
                url = f"http://127.0.0.1:{self.metrics_port}/health"
                with urllib.request.urlopen(url, timeout=2) as response:
                    if b'"health":"true"' in response.read():
                        return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"etcd did not become healthy: {self.log_tail()}")

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.directory / "etcd.log").read_text(errors="replace")[-2000:]
        return ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def start_cluster(
    directory: Path, size: int = 3, *, extra: list[str] | None = None
) -> list[EtcdServer]:
    """A ``size``-member etcd cluster on loopback (members started together, then awaited;
    all again on fresh ports and fresh data when one lost a port before binding it);
    ``extra``: more flags for every member."""
    for attempt in range(LAUNCH_TRIES):
        base = directory / f"try{attempt}" if attempt else directory
        members = [EtcdServer(base / f"m{i}", name=f"m{i}", extra=extra) for i in range(size)]
        cluster = ",".join(f"{m.name}={m.peer_url}" for m in members)
        try:
            for m in members:
                m.initial_cluster = cluster
                m.launch()
            for m in members:
                m.wait_healthy(90)
        except PortTaken:
            for m in members:
                m.stop()
            if attempt == LAUNCH_TRIES - 1:
                raise
            continue
        except BaseException:
            for m in members:
                m.stop()
            raise
        return members
    raise AssertionError("unreachable")


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    if platform.machine() in ("aarch64", "arm64"):  # etcd 3.4 asks for this on arm64
        env.setdefault("ETCD_UNSUPPORTED_ARCH", "arm64")
    return env


@contextlib.contextmanager
def running_etcd(directory: Path) -> Iterator[EtcdServer]:
    for attempt in range(LAUNCH_TRIES):  # fresh ports when one was taken before etcd bound it
        try:
            server = EtcdServer(directory).start()
            break
        except PortTaken:
            shutil.rmtree(directory, ignore_errors=True)
            if attempt == LAUNCH_TRIES - 1:
                raise
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)
