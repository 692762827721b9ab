"""Network partitions in network namespaces the soak harness makes: a device cut off from its
hub.

The device's edged (and its workers) run in a network namespace of their own (``ip netns
add``, then ``nsenter --net``), whose loopback is not the host's: the hub replicas' addresses
(127.0.0.1:PORT) are reachable there only through a relay the harness keeps — listening sockets
made inside the namespace (one thread enters it with ``setns(2)``, binds, and leaves), each
connection carried to the same port on the host's loopback. The partition is the namespace's
network going down (``ip link set lo down`` in it): packets are dropped, not refused, so
edged's open stream stalls as on a real cut link (its keepalive notices after 60 + 20 s, or the
partition ends first and TCP resends), and new connections fail. Unix sockets (the status and
inference sockets, the workers') are not networking: they keep working, so the device serves
its models through the partition, as a device off the network would.

Needs root (CAP_SYS_ADMIN) and iproute2 and util-linux's nsenter; :func:`make` says why it
cannot where it cannot, and the run reports the fault kind as not run here."""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import subprocess
import threading
from pathlib import Path

CLONE_NEWNET = 0x40000000


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)


class DeviceNet:
    """The namespace ``name`` with a relay of ``ports`` to the host's loopback."""

    def __init__(self, name: str, ports: list[int], directory: Path) -> None:
        self.name = name
        self.ports = ports
        self.wrapper = directory / f"python-in-{name}"
        self._listeners: list[socket.socket] = []
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self.closed = False

    def start(self) -> None:
        nsenter = shutil.which("nsenter") or "nsenter"
        self.wrapper.write_text(
            f'#!/bin/sh\nexec {nsenter} --net=/run/netns/{self.name} -- "{_python()}" "$@"\n'
        )
        self.wrapper.chmod(0o755)
        for port in self.ports:
            ls = _listen_in(self.name, port)
            self._listeners.append(ls)
            threading.Thread(target=self._accept, args=(ls, port), daemon=True).start()

    def _accept(self, ls: socket.socket, port: int) -> None:
        while not self.closed:
            try:
                client, _ = ls.accept()
            except OSError:
                return
            try:  # made in this thread: the host's namespace
                upstream = socket.create_connection(("127.0.0.1", port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def cut(self) -> None:
        out = _ip("-n", self.name, "link", "set", "lo", "down")
        if out.returncode != 0:
            raise RuntimeError(f"ip link set lo down in {self.name}: {out.stderr.strip()}")

    def heal(self) -> None:
        out = _ip("-n", self.name, "link", "set", "lo", "up")
        if out.returncode != 0:
            raise RuntimeError(f"ip link set lo up in {self.name}: {out.stderr.strip()}")

    def close(self) -> None:
        self.closed = True
        for s in [*self._listeners, *self._conns]:
            try:
                s.close()
            except OSError:
                pass
        _ip("netns", "delete", self.name)


def make(name: str, ports: list[int], directory: Path) -> DeviceNet | str:
    """The namespace and its relay, started; or why it cannot be made here."""
    if shutil.which("ip") is None or shutil.which("nsenter") is None:
        return "needs ip (iproute2) and nsenter (util-linux)"
    _ip("netns", "delete", name)  # a namespace left by a run killed before its end
    out = _ip("netns", "add", name)
    if out.returncode != 0:
        return f"ip netns add: {out.stderr.strip() or out.returncode}"
    out = _ip("-n", name, "link", "set", "lo", "up")
    if out.returncode != 0:
        _ip("netns", "delete", name)
        return f"ip link set lo up in a namespace: {out.stderr.strip()}"
    net = DeviceNet(name, ports, directory)
    try:
        net.start()
    except OSError as exc:
        net.close()
        return f"a relay inside the namespace: {exc}"
    return net


def _python() -> str:
    import sys

    return sys.executable


def _listen_in(netns: str, port: int) -> socket.socket:
    """A socket listening on 127.0.0.1:``port`` inside ``netns``: made by a thread that enters
    the namespace (setns applies to the calling thread only) and ends there."""
    result: dict[str, object] = {}

    def enter() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns: {os.strerror(err)}")
            finally:
                os.close(fd)
            ls = socket.socket()
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ls.bind(("127.0.0.1", port))
            ls.listen(64)
            result["socket"] = ls
        except OSError as exc:
            result["error"] = exc

    th = threading.Thread(target=enter, daemon=True)  # it ends in the namespace: never reused
    th.start()
    th.join(10)
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    sock = result.get("socket")
    if not isinstance(sock, socket.socket):
        raise OSError("the thread entering the namespace did not answer")
    return sock


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
