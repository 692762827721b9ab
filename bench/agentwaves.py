"""AgentUpgrade in waves by region at fleet scale (issue 32): a root hub, ``--regions``
regional hubs and ``--devices`` simulated devices per region, every hub a ``hub serve``
process of its own.

What is real: the root (``hub init --region root``) and each regional hub (``hub init
--parent``: the region enrolled with the root over TLS with the CA pin, a token made by ``hub
token create --for-region``), each on its own SQLite store, the root's wave controller and
each region's ``ParentLink`` (the Federate stream, the slices, the reports up); two edged
releases of this checkout (``packaging/agent/build-release``: a good version and a bad one)
pushed **at the root only** with ``edgectl agent push``, which each region fetches from the
root through the relay (``FetchFederatedAgentRelease``,
hub/controllers/parentlink/agentrelay.py) and checks as a push before its devices are sent
it; the AgentUpgrade applied at the root with a real ``AdminService.Apply`` call, one wave per
region (``waves: [{regions: [r0]}, {regions: [r1]}, ...]``).

What is simulated: the devices, as in bench/agentupgrade.py: each has its record in its
region's store and a client certificate from its region's CA (what enrollment gives), and
speaks the real Sync protocol over mutual TLS with its own HTTP/2 connection, the devices of
a region in a client process of their own. Each reports ``Status.agent`` as edged's agent
controller under its launcher would: committed on this checkout's version; a desired release
it has not tried is tried for ``--commit-ms`` (download, install, smoke test, switch), then
reported ``Committed`` for the upgrade and revision it was sent or, for the bad version,
``RolledBack`` (CrashLoop: its launcher went back by itself).

Figures (/work/shared/BENCHMARKS.md: each against a baseline measured in the same run):

* **a good release** (each region's own rollout: canary 1%, 10%, 50%, then all;
  ``maxUnavailable: 10%``): seconds from the Apply at the root to every device committed, and
  per wave (the wave's first device sent the release, its last committed, the root's
  WavePassed event); CPU seconds of the root and of each regional hub from the Apply to the
  root's Complete, per device (the root's over every device, a region's over its own), and
  each hub's idle CPU over the same time (the fleet connected, nothing applied: 10 s after
  Complete, scaled), and every hub together less that idle cost. **Baseline**:
  the same number of devices on one hub alone (no federation, no waves), the same
  AgentUpgrade without waves, from Apply to Complete, run first in the same run: the ratio
  says what the waves and the hop through the root cost per device upgraded;
* **a failing release** (the bad version, ``failureThreshold: 5``, ``canary: 10%``): wave 1's
  canary devices report RolledBack. From the failure report that reaches the threshold (the
  5th) to the region's rollout stopped (its RolledBack event), to the root stopping the waves
  (its RegionFailed event), and to every device that was sent the bad release sent a desired
  state without it (sent back); the devices of later waves sent it (the waves' promise: 0);
  against the same bad version on the single hub of the baseline (from the 5th failure to its
  RolledBack event, and to its devices sent back).

    .venv/bin/python bench/agentwaves.py [--regions 4] [--devices 250] [--commit-ms 500] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.agentupgrade import upgrade, versions  # noqa: E402
from bench.common import cpu_seconds  # noqa: E402
from bench.simfleet import DeviceKeys, device_sync, run_devices  # noqa: E402

NAME = "bench"  # the AgentUpgrade's name (the same object: the bad version is revision 2)
THRESHOLD = 5
Event = tuple[str, float, str, str]  # (device, time.time(), what, version)


# -- the simulated devices -------------------------------------------------------------------------
def _devices_main(
    port: int, ca: bytes, devices: list[DeviceKeys], commit_s: float, bad: str,
    plat: tuple[str, str], conn: Any,
) -> None:  # fmt: skip
    """One region's simulated devices; sends :data:`Event` tuples to the parent in batches:
    "up" (the first desired state), "desired" (the desired release changed: its version, ""
    for none), "got" (a release to try), "committed", "failed" (RolledBack reported)."""
    import grpc

    from edgefleet.v1 import device_pb2
    from edgefleet.versioning import installed_version

    arch, abi = plat

    async def session(name: str, creds: Any, out: list[Any], wake: asyncio.Event) -> None:
        async with device_sync(port, creds, name) as call:
            lock = asyncio.Lock()
            me = {"version": installed_version(), "committed": installed_version(),
                  "phase": "Idle", "reason": "", "upgrade": "", "revision": 0}  # fmt: skip
            tried: set[tuple[str, int, str]] = set()
            desired = ""
            trials: set[asyncio.Future[None]] = set()  # kept until the session ends

            async def report() -> None:
                agent = device_pb2.AgentStatus(
                    version=str(me["version"]), committed_version=str(me["committed"]),
                    phase=str(me["phase"]), reason=str(me["reason"]), arch=arch,
                    python_abi=abi, launcher=True, slot="a", upgrade=str(me["upgrade"]),
                    upgrade_revision=int(me["revision"]),
                )  # fmt: skip
                async with lock:
                    await call.write(
                        device_pb2.DeviceMessage(status=device_pb2.Status(agent=agent))
                    )

            async def trial(agent: Any) -> None:
                me.update(upgrade=agent.upgrade, revision=agent.upgrade_revision,
                          phase="Trying", reason="")  # fmt: skip
                await report()
                await asyncio.sleep(commit_s)
                if agent.version == bad:
                    me.update(phase="RolledBack", reason="CrashLoop")
                    out.append((name, time.time(), "failed", agent.version))
                    await report()
                else:
                    me.update(version=agent.version, committed=agent.version, phase="Committed")
                    await report()
                    out.append((name, time.time(), "committed", agent.version))
                wake.set()

            async def beating(interval: float) -> None:
                while True:  # as edged does when it has nothing else to say
                    await asyncio.sleep(interval)
                    async with lock:
                        await call.write(device_pb2.DeviceMessage(heartbeat=device_pb2.Heartbeat()))

            await report()
            beat: asyncio.Future[None] | None = None
            try:
                while True:
                    msg = await call.read()
                    if msg is grpc.aio.EOF:
                        return
                    if msg.WhichOneof("message") != "desired_state":
                        continue
                    now = time.time()
                    ds = msg.desired_state
                    if beat is None:  # the first desired state: connected
                        out.append((name, now, "up", ""))
                        wake.set()
                        interval = ds.heartbeat_interval.ToTimedelta().total_seconds()
                        beat = asyncio.ensure_future(beating(interval))
                    async with lock:
                        ack = device_pb2.Ack(generation=ds.generation)
                        await call.write(device_pb2.DeviceMessage(ack=ack))
                    a = ds.agent if ds.HasField("agent") else None
                    version = a.version if a is not None else ""
                    if version != desired:
                        desired = version
                        out.append((name, now, "desired", version))
                        wake.set()
                    if a is not None:
                        key = (a.upgrade, a.upgrade_revision, a.version)
                        if key not in tried and a.version != me["committed"]:
                            tried.add(key)
                            out.append((name, now, "got", a.version))
                            wake.set()
                            trials.add(asyncio.ensure_future(trial(a)))
            finally:
                if beat is not None:
                    beat.cancel()

    run_devices(ca, devices, session, conn)


# -- the hubs --------------------------------------------------------------------------------------
def _program(*args: Any, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    from edgefleet.launching import program_command

    return subprocess.run(
        program_command(*args), check=True, capture_output=True, text=True, timeout=timeout
    )


def _device_keys(data: Path, region: str, names: list[str]) -> list[DeviceKeys]:
    """A client certificate from the hub's CA for each device (what enrollment gives) and
    its record in the hub's store (the hub not running yet)."""
    from hub import pki
    from hub.decide.devices import Device
    from hub.state import storekeys
    from hub.state.store import Put, open_store

    ca = pki.load_certified_key(data / "ca.crt", data / "ca.key")
    keys: list[DeviceKeys] = []
    records = []
    for name in names:
        ck = pki.issue_client_certificate(ca, pki.Identity(pki.Role.DEVICE, name, region))
        keys.append((name, pki.private_key_pem(ck.key), pki.certificate_pem(ck.certificate)))
        serial = format(ck.certificate.serial_number, "x")
        records.append(Device(name, labels={"bench": "yes"}, certificate_serial=serial))

    async def seed() -> None:
        store = await open_store(None, data_dir=data)
        ops = [Put(storekeys.device_key(d.name), storekeys.dumps(d.to_json())) for d in records]
        for start in range(0, len(ops), 500):
            await store.txn((), ops[start : start + 500])
        await store.close()

    asyncio.run(seed())
    return keys


@dataclass
class BenchHub:
    """A ``hub serve`` process, the devices it knows and their client process."""

    name: str
    data: Path
    port: int
    devices: list[DeviceKeys] = field(default_factory=list)
    launched: Any = None
    procs: list[Any] = field(default_factory=list)
    pipes: list[Any] = field(default_factory=list)
    _stub: Any = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return int(self.launched.process.pid)

    def serve(self, workdir: Path) -> None:
        """``hub serve``; the simulated devices answer no attestation challenge, so the hub
        challenges every 2 h and waits an hour for answers, not 5 min and 30 s (otherwise each
        device turns Untrusted, an event and a write each, 30 s after it connected: in a
        figure or not by chance)."""
        from edgefleet.launching import start_hub

        toml = self.data / "hub.toml"
        text = toml.read_text()
        for was, now in (
            ('period = "300s"', 'period = "7200s"'),
            ('timeout = "30s"', 'timeout = "3600s"'),
        ):
            assert f"\n{was}\n" in text, f"hub.toml's [attestation] {was} moved"
            text = text.replace(f"\n{was}\n", f"\n{now}\n")
        toml.write_text(text)

        self.launched = start_hub(
            self.data, listen=self.address, log=workdir / f"{self.name}.log",
            args=["--log-level", os.environ.get("BENCH_HUB_LOG_LEVEL", "warning")],
        )  # fmt: skip
        self.launched.wait_listening(60)

    def start_devices(self, clients: int, commit_s: float, bad: str, plat: tuple[str, str]) -> None:
        ctx = mp.get_context("spawn")
        ca = (self.data / "ca.crt").read_bytes()
        for c in range(clients):
            parent, child = ctx.Pipe()
            mine = self.devices[c::clients]
            p = ctx.Process(
                target=_devices_main, args=(self.port, ca, mine, commit_s, bad, plat, child)
            )
            p.start()
            self.pipes.append(parent)
            self.procs.append(p)

    def stub(self) -> Any:
        import grpc

        from edgefleet.v1 import admin_pb2_grpc

        if self._stub is None:
            creds = grpc.ssl_channel_credentials(
                (self.data / "ca.crt").read_bytes(),
                (self.data / "admin.key").read_bytes(),
                (self.data / "admin.crt").read_bytes(),
            )
            channel = grpc.secure_channel(
                self.address, creds, options=[("grpc.ssl_target_name_override", "localhost")]
            )
            self._stub = admin_pb2_grpc.AdminServiceStub(channel)
        return self._stub

    def apply(self, doc: bytes) -> float:
        from edgefleet.v1 import admin_pb2

        t0 = time.time()
        self.stub().Apply(admin_pb2.ApplyRequest(documents=[doc]), timeout=120)
        return t0

    def status(self) -> dict[str, Any]:
        from edgefleet.v1 import admin_pb2

        got = self.stub().Get(admin_pb2.GetRequest(kind="AgentUpgrade", name=NAME), timeout=60)
        return dict(json.loads(got.json).get("status", {}))

    def events(self) -> list[dict[str, Any]]:
        """The upgrade's events (``edgectl get events --for``), oldest first."""
        out = _program("edgectl", "--config", self.data / "admin.toml", "get", "events",
                       "--for", f"agentupgrade/{NAME}", "-o", "json")  # fmt: skip
        doc = json.loads(out.stdout)
        items = doc["items"] if isinstance(doc, dict) else doc
        for e in items:  # "2026-12-07T12:45:30.246Z" -> seconds since the epoch
            e["time"] = datetime.fromisoformat(str(e["time"]).replace("Z", "+00:00")).timestamp()
        return sorted(items, key=lambda e: float(e["time"]))

    def event_time(self, reason: str, after: float) -> float | None:
        """The first event ``reason`` of the upgrade at or after ``after``."""
        times = [float(e["time"]) for e in self.events() if e["reason"] == reason]
        later = [t for t in times if t >= after - 0.001]
        return min(later) if later else None

    def close(self) -> None:
        for p in self.procs:
            p.terminate()
        if self.launched is not None:
            self.launched.stop(30)


class Fleet:
    """Hubs and their devices, with every device event received so far."""

    def __init__(self, hubs: list[BenchHub], others: tuple[BenchHub, ...] = ()) -> None:
        self.hubs = hubs
        self.others = others  # hubs without devices of their own (the root)
        self.events: list[Event] = []
        self.region_of = {d[0]: h.name for h in hubs for d in h.devices}

    def collect(self, timeout: float = 0.05) -> None:
        first = True
        for h in self.hubs:
            for pipe in h.pipes:
                while pipe.poll(timeout if first else 0):
                    self.events.extend(pipe.recv())
                first = False

    def wait(self, until: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.collect()
            if until():
                return
        raise RuntimeError(f"timed out waiting for {what}:\n{self.explain()}")

    def explain(self) -> str:
        """Each hub's status of the upgrade and what its devices last said (a timeout's)."""
        lines = []
        for h in [*self.others, *self.hubs]:
            try:
                lines.append(f"{h.name}: {json.dumps(h.status(), sort_keys=True)[:1500]}")
            except Exception as exc:  # never hides the timeout
                lines.append(f"{h.name}: status unreadable ({exc!r})")
        last: dict[str, Event] = {}
        for e in self.events:
            last[e[0]] = e
        counts: dict[tuple[str, str, str], int] = {}
        for name, _, what, version in last.values():
            key = (self.region_of[name], what, version)
            counts[key] = counts.get(key, 0) + 1
        lines += [f"{k}: {v} devices" for k, v in sorted(counts.items())]
        return "\n".join(lines)

    def since(self, mark: int, what: str, region: str | None = None) -> list[Event]:
        return [
            e for e in self.events[mark:]
            if e[2] == what and (region is None or self.region_of[e[0]] == region)
        ]  # fmt: skip

    def connected(self) -> int:
        return len({e[0] for e in self.events if e[2] == "up"})


def _build_releases(workdir: Path, good: str, bad: str) -> dict[str, Path]:
    out = {}
    for version in (good, bad):
        path = workdir / f"edged-{version}.tar.gz"
        subprocess.run(
            [sys.executable, str(REPO / "packaging" / "agent" / "build-release"),
             "--version", version, "--out", str(path)],
            check=True, capture_output=True, timeout=120,
            env={**os.environ, "SOURCE_DATE_EPOCH": "0"},
        )  # fmt: skip
        out[version] = path
    return out


def _push(hub: BenchHub, releases: dict[str, Path]) -> None:
    for version, path in releases.items():
        _program("edgectl", "--config", hub.data / "admin.toml", "agent", "push", path,
                 "--version", version)  # fmt: skip


def _init(workdir: Path, name: str, *extra: Any) -> BenchHub:
    from edgefleet.launching import free_port_pair

    hub = BenchHub(name, workdir / name, free_port_pair())
    _program("hub", "init", "--data-dir", hub.data, "--hub-address", hub.address,
             "--region", name, *extra)  # fmt: skip
    return hub


def _settle(fleet: Fleet, n: int) -> None:
    fleet.wait(lambda: fleet.connected() >= n, 600, "every device connected")
    time.sleep(3.0)  # the connections' first projections, the regions' first reports
    fleet.collect()


def _idle_cpu(hubs: list[BenchHub], seconds: float) -> dict[str, float]:
    """Each hub's CPU seconds per second with its fleet connected and nothing applied."""
    before = {h.name: cpu_seconds(h.pid) for h in hubs}
    time.sleep(seconds)
    return {h.name: (cpu_seconds(h.pid) - before[h.name]) / seconds for h in hubs}


def _good_rollout() -> dict[str, Any]:
    return {"maxUnavailable": "10%", "canary": {"steps": ["1%", "10%", "50%"]}}


def _bad_rollout() -> dict[str, Any]:
    return {"maxUnavailable": "10%", "failureThreshold": THRESHOLD, "canary": {"steps": ["10%"]}}


def _wait_phase(fleet: Fleet, hub: BenchHub, phase: str, timeout: float) -> dict[str, Any]:
    """``hub``'s upgrade in ``phase``, asked at most twice a second."""
    found: dict[str, Any] = {}

    def reached() -> bool:
        found.clear()
        found.update(hub.status())
        if found.get("phase") == phase:
            return True
        fleet.collect(0.45)
        return False

    fleet.wait(reached, timeout, f"{hub.name}'s upgrade {phase}")
    return found


def _stop_figures(fleet: Fleet, mark: int, bad: str, region: str | None) -> dict[str, Any]:
    """From the failures and the desired states after ``mark``: the threshold failure's time,
    the devices sent the bad release and when the last of them was sent back."""
    failed = sorted(e[1] for e in fleet.since(mark, "failed", region))
    sent = {e[0] for e in fleet.since(mark, "desired") if e[3] == bad}
    back: dict[str, float] = {}
    seen_bad: set[str] = set()
    for name, t, what, version in fleet.events[mark:]:
        if what != "desired":
            continue
        if version == bad:
            seen_bad.add(name)
            back.pop(name, None)
        elif name in seen_bad:
            back[name] = t
    return {
        "failed": len(failed),
        "threshold_at": failed[THRESHOLD - 1] if len(failed) >= THRESHOLD else None,
        "sent": sent,
        "all_back": bool(sent) and sent <= set(back),
        "last_back": max((back[n] for n in sent if n in back), default=None),
    }


# -- the baseline: one hub alone, no waves ---------------------------------------------------------
def measure_single(
    workdir: Path, n: int, clients: int, commit_s: float, releases: dict[str, Path],
    plat: tuple[str, str],
) -> dict[str, Any]:  # fmt: skip
    _, good, bad = versions()
    hub = _init(workdir, "single")
    try:
        hub.devices = _device_keys(hub.data, "single", [f"s-{i:05d}" for i in range(n)])
        hub.serve(workdir)
        _push(hub, releases)
        hub.start_devices(clients, commit_s, bad, plat)
        fleet = Fleet([hub])
        _settle(fleet, n)

        mark = len(fleet.events)
        cpu0 = cpu_seconds(hub.pid)
        t0 = hub.apply(upgrade(NAME, good, **_good_rollout()))
        fleet.wait(lambda: len(fleet.since(mark, "committed")) >= n, 600, "all committed")
        done = _wait_phase(fleet, hub, "Complete", 120)
        complete_at = hub.event_time("RolloutComplete", t0) or time.time()
        cpu = cpu_seconds(hub.pid) - cpu0
        last_commit = max(e[1] for e in fleet.since(mark, "committed"))
        idle = _idle_cpu([hub], min(10.0, complete_at - t0))[hub.name]

        mark = len(fleet.events)
        t1 = hub.apply(upgrade(NAME, bad, **_bad_rollout()))

        def stopped() -> bool:
            f = _stop_figures(fleet, mark, bad, None)
            return f["threshold_at"] is not None and f["all_back"]

        fleet.wait(stopped, 120, "the bad version stopped, its devices sent back")
        time.sleep(1.0)
        fleet.collect()
        f = _stop_figures(fleet, mark, bad, None)
        rolled_back_at = hub.event_time("RolledBack", t1)
        return {
            "devices": n,
            "upgraded": done.get("doneDevices"),
            "upgrade_s": complete_at - t0,
            "all_committed_s": last_commit - t0,
            "cpu_s": cpu,
            "cpu_ms_per_device": cpu / n * 1000,
            "idle_cpu_s_same_time": idle * (complete_at - t0),
            "bad_sent": len(f["sent"]),
            "bad_failed": f["failed"],
            "stop_s": (rolled_back_at - f["threshold_at"]) if rolled_back_at else None,
            "sent_back_s": f["last_back"] - f["threshold_at"],
        }
    finally:
        hub.close()


# -- the federation: a root, regional hubs, waves by region ---------------------------------------
def measure_waves(
    workdir: Path, regions: int, per_region: int, clients: int, commit_s: float,
    releases: dict[str, Path], plat: tuple[str, str],
) -> dict[str, Any]:  # fmt: skip
    _, good, bad = versions()
    root = _init(workdir, "root")
    hubs: list[BenchHub] = []
    try:
        root.serve(workdir)
        for r in range(regions):
            name = f"r{r}"
            out = _program("hub", "token", "create", "--data-dir", root.data, "--for-region", name)
            token, pin = out.stdout.strip(), out.stderr.split("CA hash ")[1].strip()
            hub = _init(workdir, name, "--parent", root.address, "--token", token,
                        "--parent-ca-hash", pin)  # fmt: skip
            hub.devices = _device_keys(
                hub.data, name, [f"{name}-{i:05d}" for i in range(per_region)]
            )
            hub.serve(workdir)
            hub.start_devices(clients, commit_s, bad, plat)
            hubs.append(hub)
        _push(root, releases)  # at the root only: each region fetches what its slice names
        fleet = Fleet(hubs, (root,))
        n = regions * per_region
        _settle(fleet, n)
        every = [root, *hubs]
        waves = [{"regions": [h.name]} for h in hubs]

        # the good release, in waves
        mark = len(fleet.events)
        cpu0 = {h.name: cpu_seconds(h.pid) for h in every}
        t0 = root.apply(upgrade(NAME, good, waves=waves, **_good_rollout()))
        fleet.wait(lambda: len(fleet.since(mark, "committed")) >= n, 900, "all committed")
        done = _wait_phase(fleet, root, "Complete", 120)
        root_events = root.events()
        complete_at = min(
            (float(e["time"]) for e in root_events
             if e["reason"] == "RolloutComplete" and float(e["time"]) >= t0),
            default=time.time(),
        )  # fmt: skip
        cpu = {h.name: cpu_seconds(h.pid) - cpu0[h.name] for h in every}
        passed = [float(e["time"]) - t0 for e in root_events
                  if e["reason"] == "WavePassed" and float(e["time"]) >= t0]  # fmt: skip
        per_wave = []
        for i, h in enumerate(hubs):
            got = [e[1] for e in fleet.since(mark, "got", h.name)]
            committed = [e[1] for e in fleet.since(mark, "committed", h.name)]
            per_wave.append({
                "region": h.name,
                "first_sent_s": min(got) - t0,
                "last_committed_s": max(committed) - t0,
                "took_s": max(committed) - min(got),
                "root_passed_s": passed[i] if i < len(passed) else None,
                "cpu_ms_per_device": cpu[h.name] / per_region * 1000,
            })  # fmt: skip
        last_commit = max(e[1] for e in fleet.since(mark, "committed"))
        idle = _idle_cpu(every, min(10.0, complete_at - t0))

        # the bad release: wave 1's canary fails
        time.sleep(1.0)
        fleet.collect()
        mark = len(fleet.events)
        t1 = root.apply(upgrade(NAME, bad, waves=waves, **_bad_rollout()))
        first = hubs[0]

        def stopped() -> bool:
            f = _stop_figures(fleet, mark, bad, first.name)
            return f["threshold_at"] is not None and f["all_back"]

        fleet.wait(stopped, 120, "wave 1 stopped, its devices sent back")
        stop = _wait_phase(fleet, root, "RolledBack", 120)
        time.sleep(5.0)  # ten of the root's steps: a later wave would be sent it by now
        fleet.collect()
        f = _stop_figures(fleet, mark, bad, first.name)
        later = {name for name in f["sent"] if fleet.region_of[name] != first.name}
        region_stop = first.event_time("RolledBack", t1)
        root_stop = root.event_time("RegionFailed", t1)
        at = f["threshold_at"]
        return {
            "regions": regions,
            "devices_per_region": per_region,
            "devices": n,
            "upgraded": done.get("doneDevices"),
            "released": done.get("released"),
            "upgrade_s": complete_at - t0,
            "all_committed_s": last_commit - t0,
            "waves": per_wave,
            "cpu_s": cpu,
            "root_cpu_ms_per_device": cpu["root"] / n * 1000,
            "regions_cpu_ms_per_device": sum(cpu[h.name] for h in hubs) / n * 1000,
            "all_cpu_ms_per_device": sum(cpu.values()) / n * 1000,
            "idle_cpu_s_same_time": {k: v * (complete_at - t0) for k, v in idle.items()},
            "bad_phase": stop.get("phase"),
            "bad_reason": stop.get("reason"),
            "bad_failed_region": stop.get("failedRegion"),
            "bad_sent": len(f["sent"]),
            "bad_failed": f["failed"],
            "bad_sent_later_waves": len(later),
            "region_stop_s": (region_stop - at) if region_stop else None,
            "root_stop_s": (root_stop - at) if root_stop else None,
            "sent_back_s": f["last_back"] - at,
        }
    finally:
        for h in hubs:
            h.close()
        root.close()


def _ratio(a: float | None, b: float | None) -> float:
    return a / b if a is not None and b else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--regions", type=int, default=4)
    ap.add_argument("--devices", type=int, default=250, help="per region")
    ap.add_argument("--clients", type=int, default=1, help="device processes per region")
    ap.add_argument("--commit-ms", type=float, default=500.0, help="simulated trial to commit")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", type=Path, help="work in this new folder and keep it (hub logs)")
    args = ap.parse_args()
    if args.regions < 1 or args.devices < 50:
        ap.error("--regions must be at least 1 and --devices at least 50 (a canary of 10% fails)")
    from edgefleet.trust.agentreleases import this_platform

    here = this_platform()
    plat = (here.arch, here.python_abi)
    load = os.getloadavg()[0]
    _, good, bad = versions()
    n = args.regions * args.devices
    commit_s = args.commit_ms / 1000
    with tempfile.TemporaryDirectory(prefix="bench-agentwaves-") as tmp:
        work = Path(tmp)
        if args.keep is not None:
            args.keep.mkdir(parents=True)
            work = args.keep.resolve()
        releases = _build_releases(work, good, bad)
        single_clients = max(1, min(args.regions * args.clients, 4))
        single = measure_single(work, n, single_clients, commit_s, releases, plat)
        fed = measure_waves(
            work, args.regions, args.devices, args.clients, commit_s, releases, plat
        )
    per_device = single["cpu_ms_per_device"]
    # less each hub's idle CPU over the same time: what the upgrade itself cost
    single_net = (single["cpu_s"] - single["idle_cpu_s_same_time"]) / n * 1000
    waves_net = (sum(fed["cpu_s"].values()) - sum(fed["idle_cpu_s_same_time"].values())) / n * 1000
    out = {
        "cpus": os.cpu_count(),
        "load_average_before": round(load, 1),
        "commit_ms": args.commit_ms,
        "single": single,
        "waves": fed,
        "ratio_all_cpu_per_device": _ratio(fed["all_cpu_ms_per_device"], per_device),
        "ratio_root_cpu_per_device": _ratio(fed["root_cpu_ms_per_device"], per_device),
        "single_net_cpu_ms_per_device": single_net,
        "waves_net_cpu_ms_per_device": waves_net,
        "ratio_net_cpu_per_device": _ratio(waves_net, single_net),
        "ratio_region_stop": _ratio(fed["region_stop_s"], single["stop_s"]),
        "ratio_root_stop": _ratio(fed["root_stop_s"], single["stop_s"]),
        "ratio_sent_back": _ratio(fed["sent_back_s"], single["sent_back_s"]),
    }  # fmt: skip
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    s, w = single, fed
    print(f"{os.cpu_count()} CPUs, load average before the run {load:.1f}; trial "
          f"{args.commit_ms:.0f} ms; each rollout: canary 1%/10%/50%/all, "
          "maxUnavailable 10%")  # fmt: skip
    print(f"baseline, one hub alone, {n} devices, no waves: {s['upgraded']} upgraded, Complete "
          f"{s['upgrade_s']:.1f} s after the Apply; hub CPU {s['cpu_s']:.2f} s = "
          f"{s['cpu_ms_per_device']:.2f} ms/device (idle over the same time "
          f"{s['idle_cpu_s_same_time']:.2f} s)")  # fmt: skip
    print(f"waves, root + {args.regions} regions x {args.devices} devices: {w['upgraded']} "
          f"upgraded, all committed {w['all_committed_s']:.1f} s, root Complete "
          f"{w['upgrade_s']:.1f} s after the Apply (released {w['released']})")  # fmt: skip
    for i, wave in enumerate(w["waves"]):
        passed = wave["root_passed_s"]
        idle = w["idle_cpu_s_same_time"][wave["region"]]
        print(f"  wave {i + 1} ({wave['region']}): first sent {wave['first_sent_s']:.1f} s, last "
              f"committed {wave['last_committed_s']:.1f} s ({wave['took_s']:.1f} s), root passed "
              f"{'-' if passed is None else f'{passed:.1f} s'}; region CPU "
              f"{w['cpu_s'][wave['region']]:.2f} s = {wave['cpu_ms_per_device']:.2f} ms/device of "
              f"its own (idle over the same time {idle:.2f} s)")  # fmt: skip
    print(f"  root CPU {w['cpu_s']['root']:.2f} s = {w['root_cpu_ms_per_device']:.3f} ms/device "
          f"(idle over the same time {w['idle_cpu_s_same_time']['root']:.2f} s) = "
          f"{out['ratio_root_cpu_per_device']:.3f}x the lone hub's per device")  # fmt: skip
    print(f"  every hub together {w['all_cpu_ms_per_device']:.2f} ms/device = "
          f"{out['ratio_all_cpu_per_device']:.2f}x the lone hub's; less each hub's idle CPU over "
          f"the same time {waves_net:.2f} ms/device = {out['ratio_net_cpu_per_device']:.2f}x the "
          f"lone hub's ({single_net:.2f})")  # fmt: skip
    print(f"bad version, baseline (one hub): {s['bad_sent']} sent it, {s['bad_failed']} failed; "
          f"RolledBack {s['stop_s']:.2f} s after the {THRESHOLD}th failure, every device sent "
          f"back {s['sent_back_s']:.2f} s after it")  # fmt: skip
    print(f"bad version, waves: root {w['bad_phase']} ({w['bad_reason']}, region "
          f"{w['bad_failed_region']}); {w['bad_sent']} devices of wave 1 sent it, "
          f"{w['bad_failed']} failed; after the {THRESHOLD}th failure: region stopped "
          f"{w['region_stop_s']:.2f} s ({out['ratio_region_stop']:.2f}x), root stopped the waves "
          f"{w['root_stop_s']:.2f} s ({out['ratio_root_stop']:.2f}x), every device sent back "
          f"{w['sent_back_s']:.2f} s ({out['ratio_sent_back']:.2f}x); devices of later waves "
          f"sent it: {w['bad_sent_later_waves']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    sys.exit(main())
