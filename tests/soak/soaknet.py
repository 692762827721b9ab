"""Network partitions in network namespaces the soak harness makes: a device cut off from its
hub (:class:`DeviceNet`), a hub replica from etcd (:class:`ReplicaNet`), a region from its root
(:class:`RootLink`).

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
import json
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

CLONE_NEWNET = 0x40000000
LOOPBACK = "127.0.0.1"
WAN_CONNECT_S = 30.0  # a relay's connection across a cut link: longer than gRPC's connect deadline


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)


class DeviceNet:
    """The namespace ``name`` with a relay of ``ports`` to the host's loopback."""

    def __init__(self, name: str, ports: list[int], directory: Path) -> None:
        self.name = name
        self.ports = ports
        self.wrapper = directory / f"python-in-{name}"
        self.relays: list[Relay] = []
        self.closed = False

    def start(self) -> None:
        nsenter = shutil.which("nsenter") or "nsenter"
        self.wrapper.write_text(
            f'#!/bin/sh\nexec {nsenter} --net=/run/netns/{self.name} -- "{_python()}" "$@"\n'
        )
        self.wrapper.chmod(0o755)
        for port in self.ports:  # the relay's threads live in the host's namespace
            self.relays.append(Relay(_listen_in(self.name, port), _to(LOOPBACK, port)).start())

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
        for relay in self.relays:
            relay.close()
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


def _listen_in(netns: str, port: int, host: str = "127.0.0.1") -> socket.socket:
    """A socket listening on ``host``:``port`` inside ``netns``: made by a thread that enters
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
            ls.bind((host, port))
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


class Relay:
    """Carries each connection accepted on ``listener`` to a connection ``connect()`` makes
    (in a thread of its own: one across a cut link waits as a dropped SYN does), both ways;
    when either side ends, both sockets are shut down and, once both directions have stopped,
    closed and forgotten. (The relays once only shut them down and kept them until the run's
    end: two descriptors per connection ever carried; the 1-hour soak's harness ran out of
    descriptors after 41 minutes of simulated devices reconnecting through eu-r1's relay,
    docs/soak.md, defects.)"""

    def __init__(self, listener: socket.socket, connect: Callable[[], socket.socket]) -> None:
        self.listener = listener
        self.connect = connect
        self.live: set[socket.socket] = set()  # the sockets of the connections now carried
        self.carried = 0  # connections carried since the start
        self._lock = threading.Lock()
        self.closed = False

    def start(self) -> Relay:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._carry, args=(client,), daemon=True).start()

    def _carry(self, client: socket.socket) -> None:
        try:
            upstream = self.connect()
            upstream.settimeout(None)
        except OSError:
            client.close()
            return
        with self._lock:
            if self.closed:
                client.close()
                upstream.close()
                return
            self.live |= {client, upstream}
            self.carried += 1
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()  # both directions stopped: no thread uses either socket any more
        with self._lock:
            self.live -= {client, upstream}
        client.close()
        upstream.close()

    def close(self) -> None:
        """Stops accepting and ends every connection carried (their threads close them)."""
        with self._lock:
            self.closed = True
            live = list(self.live)
        try:  # wakes the thread blocked in accept()
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        for s in live:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _to(host: str, port: int, timeout: float = 5.0) -> Callable[[], socket.socket]:
    """A connection to ``host``:``port`` in the calling thread's namespace."""
    return lambda: socket.create_connection((host, port), timeout=timeout)


class ReplicaNet:
    """A hub replica in a network namespace of its own, with two paths out: its etcd members
    through a veth pair (the hub's store URL names the host side's address, where a relay
    carries each connection to the member on the host's loopback), and everything else over
    the namespace's loopback (relays both ways: the devices, the operator and the root reach
    its ports; it reaches the other replica's ports). The ``outward`` addresses (the root's,
    as :class:`RootLink` shows it) are the namespace's own too, relayed to the same address in
    the host's namespace: across the root link's veth, which that link's cut drops. The
    partition takes the veth's host side down: the replica's packets to etcd are dropped while
    its devices stay connected to it, as a replica cut off from etcd by the network would
    be."""

    def __init__(self, name: str, directory: Path) -> None:
        tag = os.getpid() & 0xFFFF
        self.name = name
        self.host_if, self.ns_if = f"sk{tag}h", f"sk{tag}n"
        c, d = (tag >> 6) & 0xFF, (tag & 0x3F) << 2
        self.host_ip, self.ns_ip = f"10.243.{c}.{d + 1}", f"10.243.{c}.{d + 2}"
        self.wrapper = directory / f"python-in-{name}"
        self.relays: list[Relay] = []
        self._requests: list[tuple[int, threading.Event, dict[str, object]]] = []
        self._wake = threading.Condition()
        self.closed = False

    def start(
        self,
        etcd_ports: list[int],
        inward: list[int],
        exposed: list[int],
        outward: list[tuple[str, int]] | None = None,
    ) -> None:
        for args in (
            ("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if,
             "netns", self.name),
            ("addr", "add", f"{self.host_ip}/30", "dev", self.host_if),
            ("link", "set", self.host_if, "up"),
            ("-n", self.name, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if),
            ("-n", self.name, "link", "set", self.ns_if, "up"),
        ):  # fmt: skip
            out = _ip(*args)
            if out.returncode != 0:
                raise OSError(f"ip {' '.join(args)}: {out.stderr.strip()}")
        nsenter = shutil.which("nsenter") or "nsenter"
        self.wrapper.write_text(
            f'#!/bin/sh\nexec {nsenter} --net=/run/netns/{self.name} -- "{_python()}" "$@"\n'
        )
        self.wrapper.chmod(0o755)
        threading.Thread(target=self._connector, daemon=True).start()
        for port in etcd_ports:  # host side of the veth -> the member on the host's loopback
            self._relay(_listen((self.host_ip, port)), _to(LOOPBACK, port, WAN_CONNECT_S))
        for port in inward:  # the namespace's loopback -> the host's
            self._relay(_listen_in(self.name, port), _to(LOOPBACK, port, WAN_CONNECT_S))
        for port in exposed:  # the host's loopback -> the namespace's
            self._relay(_listen((LOOPBACK, port)), self._inside(port))
        for host, port in outward or []:  # an address of the host's namespace, the same inside
            if _ip("-n", self.name, "addr", "add", f"{host}/32", "dev", "lo").returncode != 0:
                raise OSError(f"ip addr add {host}/32 dev lo in {self.name} failed")
            self._relay(_listen_in(self.name, port, host), _to(host, port, WAN_CONNECT_S))

    def _relay(self, listener: socket.socket, connect: Callable[[], socket.socket]) -> None:
        self.relays.append(Relay(listener, connect).start())

    def _connector(self) -> None:
        """Lives in the namespace: makes the connections to the replica's own ports there."""
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{self.name}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                return
        finally:
            os.close(fd)
        while not self.closed:
            with self._wake:
                while not self._requests and not self.closed:
                    self._wake.wait(1.0)
                if self.closed:
                    return
                port, done, out = self._requests.pop(0)
            try:
                out["socket"] = socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError as exc:
                out["error"] = exc
            done.set()

    def _connect_inside(self, port: int) -> socket.socket:
        done, out = threading.Event(), {}  # type: ignore[var-annotated]
        with self._wake:
            self._requests.append((port, done, out))
            self._wake.notify()
        if not done.wait(10) or "socket" not in out:
            raise OSError(f"no connection to the replica's port {port}: {out.get('error')}")
        sock = out["socket"]
        assert isinstance(sock, socket.socket)
        return sock

    def _inside(self, port: int) -> Callable[[], socket.socket]:
        return lambda: self._connect_inside(port)

    def store_url(self, url: str, etcd_ports: list[int]) -> str:
        """``url`` with each member's loopback address replaced by the veth's host side."""
        for port in etcd_ports:
            url = url.replace(f"127.0.0.1:{port}", f"{self.host_ip}:{port}")
        return url

    def cut(self) -> None:
        out = _ip("link", "set", self.host_if, "down")
        if out.returncode != 0:
            raise RuntimeError(f"ip link set {self.host_if} down: {out.stderr.strip()}")

    def heal(self) -> None:
        out = _ip("link", "set", self.host_if, "up")
        if out.returncode != 0:
            raise RuntimeError(f"ip link set {self.host_if} up: {out.stderr.strip()}")

    def close(self) -> None:
        self.closed = True
        with self._wake:
            self._wake.notify_all()
        for relay in self.relays:
            relay.close()
        _ip("link", "delete", self.host_if)
        _ip("netns", "delete", self.name)


def make_replica(
    name: str,
    directory: Path,
    etcd_ports: list[int],
    inward: list[int],
    exposed: list[int],
    outward: list[tuple[str, int]] | None = None,
) -> ReplicaNet | str:
    """A replica's namespace, veth and relays, started; or why they cannot be made here."""
    if shutil.which("ip") is None or shutil.which("nsenter") is None:
        return "needs ip (iproute2) and nsenter (util-linux)"
    _ip("netns", "delete", name)
    out = _ip("netns", "add", name)
    if out.returncode != 0:
        return f"ip netns add: {out.stderr.strip() or out.returncode}"
    net = ReplicaNet(name, directory)
    _ip("link", "delete", net.host_if)  # left by a run killed before its end
    try:
        if _ip("-n", name, "link", "set", "lo", "up").returncode != 0:
            raise OSError("ip link set lo up in the namespace failed")
        net.start(etcd_ports, inward, exposed, outward)
    except OSError as exc:
        net.close()
        return str(exc)
    return net


def _listen(address: tuple[str, int]) -> socket.socket:
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(address)
    ls.listen(256)
    return ls


class RootLink:
    """The region's link to its root as a WAN: a namespace of its own (``name``) on the far
    side of a veth pair, where a listening socket at :attr:`address` (the veth's namespace
    side, ``10.244.C.D``, a name in the root's certificate: ``hub init --san``) carries each
    connection to the root on the host's loopback. The region dials :attr:`address`; its
    packets cross the veth. The cut takes the namespace's side of the veth down: the host's
    side keeps its route and a permanent neighbour entry, so the region's packets are sent
    and dropped (no reset, no "unreachable"): its open stream stalls until its keepalive
    gives up, and new connections wait as on a cut cable. The root's own clients, the
    operator and the harness reach it on the loopback as before."""

    def __init__(self, name: str, root_port: int) -> None:
        tag = os.getpid() & 0xFFFF
        self.name = name
        self.root_port = root_port
        self.host_if, self.ns_if = f"sl{tag}h", f"sl{tag}n"
        c, d = (tag >> 6) & 0xFF, (tag & 0x3F) << 2
        self.host_ip, self.ip = f"10.244.{c}.{d + 1}", f"10.244.{c}.{d + 2}"
        self.relay: Relay | None = None
        self.closed = False

    @property
    def address(self) -> str:
        """Where the region dials its root."""
        return f"{self.ip}:{self.root_port}"

    def start(self) -> None:
        for args in (
            ("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if,
             "netns", self.name),
            ("addr", "add", f"{self.host_ip}/30", "dev", self.host_if),
            ("link", "set", self.host_if, "up"),
            ("-n", self.name, "addr", "add", f"{self.ip}/30", "dev", self.ns_if),
            ("-n", self.name, "link", "set", self.ns_if, "up"),
            ("-n", self.name, "link", "set", "lo", "up"),
        ):  # fmt: skip
            out = _ip(*args)
            if out.returncode != 0:
                raise OSError(f"ip {' '.join(args)}: {out.stderr.strip()}")
        # each side knows the other's MAC for good: a cut drops packets rather than failing
        # neighbour discovery (which would answer the sender "no route to host")
        for ns, dev, ip, peer_ns, peer_dev in (
            (None, self.host_if, self.ip, self.name, self.ns_if),
            (self.name, self.ns_if, self.host_ip, None, self.host_if),
        ):
            mac = _mac(peer_ns, peer_dev)
            args = ("neigh", "replace", ip, "lladdr", mac, "dev", dev, "nud", "permanent")
            out = _ip(*(("-n", ns) if ns else ()), *args)
            if out.returncode != 0:
                raise OSError(f"ip {' '.join(args)}: {out.stderr.strip()}")
        # the relay's threads live in the host's namespace: its loopback; a root that is down
        # refuses, as it would
        listener = _listen_in(self.name, self.root_port, self.ip)
        self.relay = Relay(listener, _to(LOOPBACK, self.root_port)).start()

    def cut(self) -> None:
        out = _ip("-n", self.name, "link", "set", self.ns_if, "down")
        if out.returncode != 0:
            raise RuntimeError(f"ip link set {self.ns_if} down: {out.stderr.strip()}")

    def heal(self) -> None:
        out = _ip("-n", self.name, "link", "set", self.ns_if, "up")
        if out.returncode != 0:
            raise RuntimeError(f"ip link set {self.ns_if} up: {out.stderr.strip()}")
        # the namespace's side lost its neighbour entry with its link: put it back
        mac = _mac(None, self.host_if)
        _ip("-n", self.name, "neigh", "replace", self.host_ip, "lladdr", mac, "dev", self.ns_if,
            "nud", "permanent")  # fmt: skip

    def close(self) -> None:
        self.closed = True
        if self.relay is not None:
            self.relay.close()
        _ip("link", "delete", self.host_if)
        _ip("netns", "delete", self.name)


def make_root_link(name: str, root_port: int) -> RootLink | str:
    """The region's link to a root listening on 127.0.0.1:``root_port``, started; or why it
    cannot be made here. The root needs ``--san`` :attr:`RootLink.ip` in its certificate."""
    if shutil.which("ip") is None:
        return "needs ip (iproute2)"
    _ip("netns", "delete", name)
    out = _ip("netns", "add", name)
    if out.returncode != 0:
        return f"ip netns add: {out.stderr.strip() or out.returncode}"
    link = RootLink(name, root_port)
    _ip("link", "delete", link.host_if)  # left by a run killed before its end
    try:
        link.start()
    except OSError as exc:
        link.close()
        return str(exc)
    return link


def _mac(netns: str | None, dev: str) -> str:
    out = _ip(*(("-n", netns) if netns else ()), "-j", "link", "show", dev)
    if out.returncode != 0:
        raise OSError(f"ip link show {dev}: {out.stderr.strip()}")
    return str(json.loads(out.stdout)[0]["address"])
