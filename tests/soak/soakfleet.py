"""The soak harness's fleet, all real processes on loopback: a root hub, a regional hub of two
replicas on a 3-member etcd, real ``edged run`` devices enrolled with the region, and simulated
devices (real mTLS Sync streams from one helper process, bench/fanout.py's way: device records
and certificates made with the hub's own modules, then Hello, Ack, Heartbeat).

Each process the faults act on is a :class:`Target`: killed (kill -9, then started again),
stopped (SIGSTOP, then SIGCONT) and sampled (RSS, open descriptors) by name.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
from etcdtesting import EtcdServer, start_cluster
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll, set_device_timers
from harness import Edged, wait_for
from hubreplicatesting import NAMESPACE, leader_port
from rollouttesting import build_unloadable
from soakplan import BROKEN, DEPLOYMENTS, VERSIONS, VM_DEPLOYMENT
from soakvms import GUEST_HUB_HOST

from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.launching import free_port_pair

if TYPE_CHECKING:
    from soaknet import RootLink

SITE = "a"  # the real devices' label
SIM_SITE = "sim"  # the simulated devices'
LEADER_LEASE = "3s"
STEADY = "steady"  # applied once at the start, never touched: inference must not fail on it
# a replicas.total deployment on the real devices, applied once at the start and never touched:
# the scheduler keeps its placements unless a device is silent for rescheduleAfter (the
# "no replica moves off a device Ready in its own view" invariant is sampled on it)
PLACED = "soak-t"
MODELS = {STEADY: ("1.0.0",), PLACED: ("1.0.0",)} | {
    name: (*VERSIONS, BROKEN) if name != "soak-sim" else VERSIONS for name in DEPLOYMENTS
}


@dataclass
class Target:
    """One process the faults act on: ``pid()`` the live one (None: not running), ``restart``
    starts it again after a kill."""

    name: str
    kind: str  # hub, etcd, edged, worker, link (the region's), net (a device's), disk, clock, io
    pid: Callable[[], int | None]
    restart: Callable[[], None] | None = None
    # a link (kind "link"): cut and healed, no process
    cut: Callable[[], None] | None = None
    heal: Callable[[], None] | None = None
    # a device's wall clock (kind "clock"): stepped by a fault's offset, corrected by heal
    jump: Callable[[float], None] | None = None
    # a device's disk (kind "io"): slowed by a fault's delay per operation, normal by heal
    slow: Callable[[float], None] | None = None
    stopped: bool = False
    down: bool = False


def device_timers(sim_devices: int) -> dict[str, float]:
    """The region's ``[devices]`` timers, in seconds: short, so that a hub that counted its own
    downtime against its devices (a stop or kill of a replica lasts up to 8 s) would move
    ``soak-t``'s replicas within the run; heartbeats less often with many simulated devices
    (the two cores carry about 50 heartbeats a second besides the rest)."""
    interval = max(2.0, sim_devices / 50)
    grace = 2.5 * interval
    return {"heartbeatInterval": interval, "heartbeatGrace": grace, "rescheduleAfter": grace}


@dataclass
class Fleet:
    directory: Path
    real_devices: int = 2
    sim_devices: int = 50
    root: HubProcess | None = None
    etcd: list[EtcdServer] = field(default_factory=list)
    replicas: list[HubProcess] = field(default_factory=list)
    edged: list[Edged] = field(default_factory=list)
    sim_process: Any = None
    root_link: RootLink | None = None  # the region's link to its root (a veth the faults cut)
    targets: dict[str, Target] = field(default_factory=dict)
    started_at: float = 0.0
    full_disks: bool = True  # the root's and dev-0's state on a small tmpfs the faults fill
    disk_mib: int = 64  # the size of each of those
    disks: dict[str, Any] = field(default_factory=dict)  # target name -> soakdisks.Disk
    partitions: bool = True  # the last device in a network namespace of its own, cut off
    nets: dict[str, Any] = field(default_factory=dict)  # target name -> soaknet.DeviceNet
    clock_jumps: bool = True  # every real device's edged and workers on a clock that can jump
    clocks: dict[str, Any] = field(default_factory=dict)  # target name -> soakclock.DeviceClock
    slow_io: bool = True  # dev-1's data directory on a FUSE mount the faults slow down
    slow_disks: dict[str, Any] = field(default_factory=dict)  # target name -> slowfs.SlowFs
    # the root's data directory (its SQLite store) and etcd-2's on FUSE mounts the faults slow
    slow_hub_io: bool = True
    vm_devices: int = 0  # lab VMs (soakvms): the device image in QEMU, power cuts
    vms: list[Any] = field(default_factory=list)  # soakvms.SoakVm
    # fault kinds this run cannot make here, and why (the report says so)
    unsupported: dict[str, str] = field(default_factory=dict)

    # -- start ------------------------------------------------------------------------------
    def start(self) -> Fleet:
        self.started_at = time.monotonic()
        d = self.directory
        d.mkdir(parents=True, exist_ok=True)
        if self.full_disks:  # the root's disk, under its slow mount when there is one
            self._mount("root-disk", d / ("root.backing" if self.slow_hub_io else "root"))
        if self.slow_hub_io:
            self._mount_slow("root-io", d / "root")
            slow_member = d / "etcd" / "m2" / "data"  # etcd.log beside it, not slowed
            self._mount_slow("etcd-2-io", slow_member)
            if "etcd-2-io" in self.slow_disks:
                for path in (slow_member, slow_member.with_name("data.backing")):
                    path.chmod(0o700)  # etcd asks that of its data directory
        root = HubProcess(d / "root", d / "root.log")
        self._root_link(root.port)  # the root's certificate names the address it shows
        sans = ["--san", self.root_link.ip] if self.root_link is not None else []
        self.root = root.init("--region", "root", *sans).start()
        # etcd 3.5's default: 3.4 (Debian's) keeps 100,000 raft entries in memory before a
        # snapshot, which the region's device records fill at about 300 MB an hour
        # (docs/etcd.md, "etcd"; docs/soak.md)
        self.etcd = start_cluster(d / "etcd", 3, extra=["--snapshot-count=10000"])
        slowed = self.slow_disks.get("etcd-2-io")
        if slowed is not None and self.etcd[2].directory / "data" != slowed.mountpoint:
            # start_cluster made the members again elsewhere (a port was taken)
            self.unsupported.setdefault("io", f"etcd-2's data is not {slowed.mountpoint}")
            slowed.unmount()
            del self.slow_disks["etcd-2-io"]
        endpoints = ",".join(m.endpoint for m in self.etcd)
        p0 = free_port_pair()
        p1 = free_port_pair()
        while p1 in (p0 - 1, p0, p0 + 1, self.root.port, self.root.port + 1):
            p1 = free_port_pair()
        token, pin = self.root.token("--for-region", "eu")
        r0 = HubProcess(d / "r0", d / "r0.log", port=p0)
        r0.init(
            "--region",
            "eu",
            "--parent",
            self.root.address,
            "--token",
            token,
            "--parent-ca-hash",
            pin,
            "--store",
            f"etcd://{endpoints}{NAMESPACE}",
            "--replica-address",
            f"127.0.0.1:{p1}",
            # the lab VMs' guests dial the replicas at 10.0.2.100 (QEMU's guestfwd, soakvms)
            *(["--san", GUEST_HUB_HOST] if self.vm_devices else []),
        )
        if self.root_link is not None:  # the region dials its root across the link's veth
            parent = r0.data / "parent.json"
            doc = json.loads(parent.read_text())
            doc["parent"] = self.root_link.address
            parent.write_text(json.dumps(doc))
        config = r0.data / "hub.toml"
        config.write_text(
            config.read_text().replace('leaderLease = "10s"', f'leaderLease = "{LEADER_LEASE}"')
        )
        timers = device_timers(self.sim_devices)
        set_device_timers(r0, **{k: f"{v:g}s" for k, v in timers.items()})
        shutil.copytree(r0.data, d / "r1")
        r1 = NsHubProcess(d / "r1", d / "r1.log", port=p1)
        config = r1.data / "hub.toml"
        config.write_text(
            re.sub(r'metricsListen = "[^"]*"', 'metricsListen = ""', config.read_text())
        )
        if self.partitions:  # eu-r1 in a namespace of its own, reaching etcd through a veth
            self._replica_netns(r1, [p0, p0 + 1])
        self.replicas = [r0, r1]
        # r0 leads first (the same start for every seed); the devices enroll at (and first
        # connect to) either replica, half at each
        r0.start()
        wait_for(lambda: leader_port(self.etcd[0]) == p0, 60, "r0 to lead the region")
        r1.start()
        self._push_models()
        for i in range(self.real_devices):
            name = f"dev-{i}"
            # half at the follower: its artifacts come from the root through the leader's
            # link and the store the replicas share (docs/soak.md, defects)
            if i == 0 and self.full_disks:
                self._mount(f"{name}-disk", d / name)
            if i == 1 and self.slow_io:
                self._mount_slow(f"{name}-io", d / name)
            out = enroll(self.replicas[i % 2], d / name, name, {"site": SITE})
            assert out.returncode == 0, out.stdout + out.stderr
            e = Edged(
                d / name,
                None,
                d / f"{name}.log",
                config=SIGNED_DEVICE_CONFIG.format(absent=d / "no-root"),
            )
            if i == self.real_devices - 1 and self.partitions:
                self._netns(e, name)
            if self.clock_jumps:
                self._clock(e, name)
            self.edged.append(e.start())
        if self.sim_devices:
            self._start_sims()
        if self.vm_devices:
            from soakvms import start_vms, unavailable

            reason = unavailable()
            if reason:
                raise AssertionError(f"--vm-devices {self.vm_devices}: {reason}")
            self.vms = start_vms(self, self.vm_devices)
        self._targets()
        return self

    def _root_link(self, root_port: int) -> None:
        """The region's link to its root, a veth into a namespace of its own (soaknet.RootLink),
        when namespaces can be made here; else the region dials the root's loopback, uncut."""
        from soaknet import make_root_link

        link = make_root_link(f"soak{os.getpid()}-eu-root-link", root_port)
        if isinstance(link, str):
            self.unsupported.setdefault("link", link)
            return
        self.root_link = link

    def _replica_netns(self, hub: NsHubProcess, others: list[int]) -> None:
        from soaknet import make_replica

        assert self.root is not None
        ports = [int(m.endpoint.rsplit(":", 1)[1]) for m in self.etcd]
        link = self.root_link
        net = make_replica(
            f"soak{os.getpid()}-eu-r1",
            self.directory,
            ports,
            inward=others if link is not None else [self.root.port, *others],
            exposed=[hub.port, hub.port + 1],
            outward=[(link.ip, link.root_port)] if link is not None else [],
        )
        if isinstance(net, str):
            self.unsupported.setdefault("net (a replica from etcd)", net)
            return
        self.nets["eu-r1-etcd"] = net
        hub.python = net.wrapper
        config = hub.data / "hub.toml"
        lines = config.read_text().splitlines()
        lines = [net.store_url(x, ports) if x.startswith("store = ") else x for x in lines]
        config.write_text("\n".join(lines) + "\n")

    def _netns(self, e: Edged, device: str) -> None:
        """``e`` runs in a network namespace of its own that reaches the replicas' ports."""
        from soaknet import make

        net = make(f"soak{os.getpid()}-{device}", [r.port for r in self.replicas], self.directory)
        if isinstance(net, str):
            self.unsupported.setdefault("net", net)
            return
        self.nets[f"{device}-net"] = net
        e.python = net.wrapper

    def _clock(self, e: Edged, device: str) -> None:
        """``e`` (and the workers it starts, which inherit its environment) on a wall clock
        the faults step; the hubs and etcd keep the true time."""
        from soakclock import make

        clock = make(self.directory, device)
        if isinstance(clock, str):
            self.unsupported.setdefault("clock", clock)
            return
        self.clocks[f"{device}-clock"] = clock
        e.env = clock.env(e.env)

    def _mount(self, target: str, path: Path) -> None:
        from soakdisks import mount

        disk = mount(path, self.disk_mib)
        if isinstance(disk, str):
            self.unsupported.setdefault("disk", disk)
        else:
            self.disks[target] = disk

    def _mount_slow(self, target: str, path: Path) -> None:
        """``path`` (a device's or a hub's data directory, before it is first written) on a
        slow-I/O FUSE mount of a directory beside it (slowfs.py): a device's state,
        artifacts and sockets; the root's SQLite store, TUF repository and blobs; an etcd
        member's WAL and snapshots."""
        from slowfs import mount

        fs = mount(path.with_name(path.name + ".backing"), path,
                   self.directory / f"{target}.sock", self.directory / f"{target}.log")  # fmt: skip
        if isinstance(fs, str):
            self.unsupported.setdefault("io", fs)
        else:
            self.slow_disks[target] = fs

    def _push_models(self) -> None:
        """One model per deployment, named as it (two deployments of one model on the same
        devices are refused): 1.0.0 and 1.1.0 (two MLPs), and 9.0.0 (unloadable: a canary to a
        broken version) of those a rollout may break; pushed at the root (a regional hub relays
        its root's TUF metadata: models reach it with the root's deployments)."""
        assert self.root is not None
        models = MODELS | ({VM_DEPLOYMENT: VERSIONS} if self.vm_devices else {})
        for model, versions in models.items():
            for version in versions:
                path = self.directory / f"{model}-{version}.onnx"
                if version == BROKEN:
                    build_unloadable(path)
                else:
                    build_mlp(path, TINY_MLP, seed=1 + VERSIONS.index(version))
                self.root.edgectl(
                    "models", "push", str(path), "--name", model, "--version", version
                )

    def _start_sims(self) -> None:
        from hub import pki
        from hub.decide.devices import Device
        from hub.state import storekeys as objects
        from hub.state.store import Put, open_store

        r0 = self.replicas[0]
        ca = pki.load_certified_key(r0.data / "ca.crt", r0.data / "ca.key")
        devices: list[tuple[str, bytes, bytes]] = []
        records = []
        for i in range(self.sim_devices):
            name = f"sim-{i:04d}"
            ck = pki.issue_client_certificate(ca, pki.Identity(pki.Role.DEVICE, name, "eu"))
            devices.append((name, pki.private_key_pem(ck.key), pki.certificate_pem(ck.certificate)))
            records.append(
                Device(
                    name,
                    labels={"site": SIM_SITE},
                    certificate_serial=format(ck.certificate.serial_number, "x"),
                )
            )

        async def seed() -> None:
            endpoints = ",".join(m.endpoint for m in self.etcd)
            store = await open_store(f"etcd://{endpoints}{NAMESPACE}", data_dir=r0.data)
            try:
                await store.txn(
                    (),
                    [Put(objects.device_key(r.name), objects.dumps(r.to_json())) for r in records],
                )
            finally:
                await store.close()

        asyncio.run(seed())
        from soaksims import run_sims

        ctx = mp.get_context("spawn")
        self.sim_process = ctx.Process(
            target=run_sims,
            args=(
                [r.address for r in self.replicas],
                (r0.data / "ca.crt").read_bytes(),
                devices,
                str(self.directory / "sims.json"),
            ),
            daemon=True,
        )
        self.sim_process.start()

    def _targets(self) -> None:
        assert self.root is not None
        hubs = [("root", self.root), ("eu-r0", self.replicas[0]), ("eu-r1", self.replicas[1])]
        for name, hub in hubs:
            self.targets[name] = Target(name, "hub", _hub_pid(hub), _restart_hub(hub))
        for i, m in enumerate(self.etcd):
            self.targets[f"etcd-{i}"] = Target(f"etcd-{i}", "etcd", _etcd_pid(m), _restart_etcd(m))
        if self.root_link is not None:
            link = self.root_link
            self.targets["eu-root-link"] = Target("eu-root-link", "link", lambda: None,
                                                  cut=link.cut, heal=link.heal)  # fmt: skip
        for name, net in self.nets.items():
            self.targets[name] = Target(name, "net", lambda: None, cut=net.cut, heal=net.heal)
        for name, disk in self.disks.items():
            self.targets[name] = Target(name, "disk", lambda: None, cut=disk.fill, heal=disk.empty)
        for name, fs in self.slow_disks.items():
            self.targets[name] = Target(name, "io", lambda: None, heal=fs.normal,
                                        slow=fs.set_delay)  # fmt: skip
        for name, clock in self.clocks.items():
            self.targets[name] = Target(name, "clock", lambda: None, heal=clock.correct,
                                        jump=clock.jump)  # fmt: skip
        for k, vm in enumerate(self.vms):
            self.targets[f"vm-{k}"] = Target(f"vm-{k}", "vm", vm.pid, vm.start)
        for i, e in enumerate(self.edged):
            self.targets[f"dev-{i}"] = Target(f"dev-{i}", "edged", _edged_pid(e), e.start)
            self.targets[f"dev-{i}-worker"] = Target(f"dev-{i}-worker", "worker", _worker_pid(e))

    # -- reading ----------------------------------------------------------------------------
    def sims(self) -> dict[str, Any]:
        try:
            doc: dict[str, Any] = json.loads((self.directory / "sims.json").read_text())
            return doc
        except (OSError, ValueError):
            return {}

    def wait_connected(self, timeout: float = 120) -> None:
        for e in self.edged:
            wait_for(lambda e=e: _connected(e), timeout, f"{e.data.name} to connect")  # type: ignore[misc]

    def processes(self) -> dict[str, int]:
        """The live pid of each process sampled for growth (the workers' come and go)."""
        out = {}
        for t in self.targets.values():
            if t.kind in ("hub", "edged", "etcd"):
                pid = t.pid()
                if pid is not None:
                    out[t.name] = pid
        return out

    # -- stop -------------------------------------------------------------------------------
    def stop(self) -> None:
        for t in self.targets.values():  # nothing stays stopped: SIGTERM must reach it
            pid = t.pid()
            if pid is not None:
                _signal(pid, signal.SIGCONT)
        if self.sim_process is not None:
            self.sim_process.terminate()
            self.sim_process.join(10)
        for e in self.edged:
            if e.proc is not None and e.proc.poll() is None:
                e.terminate()
        for h in [*self.replicas, *([self.root] if self.root else [])]:
            h.stop()
        for m in self.etcd:
            m.stop()
        for vm in self.vms:
            vm.cut()
        if self.root_link is not None:
            self.root_link.close()
        for fs in self.slow_disks.values():  # after every process that used it
            fs.unmount()
        for disk in self.disks.values():  # after the slow mount over the root's
            disk.unmount()
        for net in self.nets.values():
            net.close()
        for clock in self.clocks.values():
            clock.close()


class NsHubProcess(HubProcess):
    """A hub started through ``python`` (a wrapper that enters its network namespace)."""

    python: Path | None = None

    def start(self) -> HubProcess:
        from edgefleet.launching import LaunchError, start_hub

        self.launched = start_hub(
            self.data, listen=self.address, log=self.log, env=self.env, cwd=self.cwd,
            python=self.python,
        )  # fmt: skip
        try:
            self.launched.wait_listening(30)
        except LaunchError as exc:
            raise AssertionError(str(exc)) from None
        return self


def _connected(e: Edged) -> bool:
    try:
        return bool((e.status().get("hub") or {}).get("connected"))
    except (OSError, KeyError, ValueError, TypeError):
        return False


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _alive(proc: Any) -> int | None:
    if proc is None or proc.poll() is not None:
        return None
    return int(proc.pid)


def _hub_pid(hub: HubProcess) -> Callable[[], int | None]:
    return lambda: _alive(hub.proc)


def _restart_hub(hub: HubProcess) -> Callable[[], None]:
    def restart() -> None:
        if hub.proc is not None:
            hub.proc.wait(10)  # reaped: the port is free
        hub.start()

    return restart


def _etcd_pid(m: EtcdServer) -> Callable[[], int | None]:
    return lambda: _alive(m.process)


ETCD_HEALTHY_WITHIN = 60.0


def _restart_etcd(m: EtcdServer) -> Callable[[], None]:
    """Start a member again (same name, ports and data: it rejoins the cluster) and wait for it
    to be healthy, up to ETCD_HEALTHY_WITHIN; one still catching up then is left running, as
    systemd leaves it (seed 62: a member loading its data from a slow disk took longer,
    ``wait_healthy`` stopped it, and it stayed down for the last 27 minutes of the run). One
    that exits is the supervisor's to start again."""

    def restart() -> None:
        if m.process is not None:
            m.process.wait(10)
        m.launch()
        deadline = time.monotonic() + ETCD_HEALTHY_WITHIN
        while time.monotonic() < deadline and not _etcd_healthy(m):
            if m.process is None or m.process.poll() is not None:
                raise RuntimeError(f"etcd {m.name} exited as it started: {m.log_tail()[-500:]}")
            time.sleep(0.2)

    return restart


def _etcd_healthy(m: EtcdServer) -> bool:
    import urllib.request

    try:
        url = f"http://127.0.0.1:{m.metrics_port}/health"
        with urllib.request.urlopen(url, timeout=2) as response:
            return b'"health":"true"' in response.read()
    except OSError:
        return False


def _edged_pid(e: Edged) -> Callable[[], int | None]:
    return lambda: _alive(e.proc)


def _worker_pid(e: Edged) -> Callable[[], int | None]:
    def pid() -> int | None:
        edged = _alive(e.proc)
        if edged is None:
            return None
        try:
            children = psutil.Process(edged).children(recursive=True)
        except psutil.NoSuchProcess:
            return None
        workers = sorted(c.pid for c in children)
        return workers[0] if workers else None

    return pid
