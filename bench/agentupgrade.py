"""AgentUpgrade at fleet scale (issue 32): a real ``hub serve`` and N simulated devices.

The simulated devices speak the real Sync protocol over mTLS, each with its own certificate
from the hub CA and its own HTTP/2 connection, spread over a few client processes (device
records and certificates made directly with the hub's modules, as in ``bench/rollout.py``).
Each reports ``Status.agent`` as edged under its launcher would: committed on the hub's own
version; a desired release it has not tried yet is tried for ``--commit-ms`` (download,
install, smoke test, switch, commit), then reported ``Committed`` for the upgrade and
revision it was sent, or, for the bad version, ``RolledBack`` (CrashLoop: the launcher went
back by itself). The release records are put in the hub's store as the push writes them.

Two figures, each against a baseline measured in the same run, on the same fleet:

* **hub CPU per device**: the hub's CPU seconds from Apply of an upgrade (canary steps 1%,
  10%, 50%, then all; ``maxUnavailable: 10%``) to Complete, per device upgraded, against a
  ModelDeployment fanned out to the same fleet (its first revision: every device at once,
  from Apply until every device received it), per device; and the hub's CPU over the same
  wall time with the fleet connected and idle (heartbeats only: the idle sync cost);
* **time to stop a failing rollout**: a bad version (``failureThreshold: 5``, ``canary: 10%``,
  ``maxUnavailable: 10%``): from the 5th RolledBack report sent to the moment every device
  that was sent the bad release has received a desired state without it; against the time
  the same hub took to send the first step of the good upgrade (Apply to the last of its
  canary devices having received the release): stopping costs about one step.

    .venv/bin/python bench/agentupgrade.py --devices 1000 [--clients 4] [--commit-ms 500] [--json]
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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import cpu_seconds  # noqa: E402
from bench.simfleet import device_sync, run_devices  # noqa: E402

ARCH, ABI = "x86_64", "cp311"


def versions() -> tuple[str, str, str]:
    """(what devices run: the hub's own version, a good patch release, a bad one)."""
    from edgefleet.versioning import installed_version

    old = installed_version()
    major, minor, patch = (int(x) for x in old.split(".")[:3])
    return old, f"{major}.{minor}.{patch + 1}", f"{major}.{minor}.{patch + 2}"


def upgrade(name: str, version: str, **rollout: Any) -> bytes:
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "AgentUpgrade",
        "metadata": {"name": name},
        "spec": {"version": version, "selector": {"matchLabels": {"bench": "yes"}},
                 "rollout": rollout},
    }  # fmt: skip
    return json.dumps(doc).encode()


def deployment() -> bytes:
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": "fanout"},
        "spec": {"model": {"name": "bench", "version": "1.0.0"}, "replicas": {"perDevice": 1},
                 "placement": {"nodeSelector": {"bench": "yes"}}},
    }  # fmt: skip
    return json.dumps(doc).encode()


def _devices_main(
    port: int, ca: bytes, devices: list[tuple[str, bytes, bytes]], commit_s: float, bad: str,
    conn: Any,
) -> None:  # fmt: skip
    """Simulated devices; sends (name, time, event, version) tuples to the parent in batches:
    "up" (the first desired state), "deployment" (the first with a ModelDeployment), "got" a
    desired release, "committed", "failed" (RolledBack sent), "cleared" (a desired state
    without a release after one with it)."""
    import grpc

    from edgefleet.v1 import device_pb2
    from edgefleet.versioning import installed_version

    async def session(name: str, creds: Any, out: list[Any], wake: asyncio.Event) -> None:
        async with device_sync(port, creds, name) as call:
            lock = asyncio.Lock()
            me = {"version": installed_version(), "committed": installed_version(),
                  "phase": "Idle", "reason": "", "upgrade": "", "revision": 0}  # fmt: skip
            tried: set[tuple[str, int, str]] = set()
            had_agent = False
            got_deployment = False
            trials: set[asyncio.Future[None]] = set()  # kept until the session ends

            async def report() -> None:
                status = device_pb2.Status(
                    agent=device_pb2.AgentStatus(
                        version=str(me["version"]),
                        committed_version=str(me["committed"]),
                        phase=str(me["phase"]),
                        reason=str(me["reason"]),
                        arch=ARCH,
                        python_abi=ABI,
                        launcher=True,
                        slot="a",
                        upgrade=str(me["upgrade"]),
                        upgrade_revision=int(me["revision"]),
                    )
                )
                async with lock:
                    await call.write(device_pb2.DeviceMessage(status=status))

            async def trial(agent: Any) -> None:
                me.update(upgrade=agent.upgrade, revision=agent.upgrade_revision,
                          phase="Trying", reason="")  # fmt: skip
                await report()
                await asyncio.sleep(commit_s)
                if agent.version == bad:
                    me.update(phase="RolledBack", reason="CrashLoop")
                    await report()
                    out.append((name, time.time(), "failed", agent.version))
                else:
                    me.update(version=agent.version, committed=agent.version, phase="Committed")
                    await report()
                    out.append((name, time.time(), "committed", agent.version))
                wake.set()

            await report()
            first = True
            while True:
                msg = await call.read()
                if msg is grpc.aio.EOF:
                    return
                if msg.WhichOneof("message") != "desired_state":
                    continue
                if first:
                    first = False
                    out.append((name, time.time(), "up", ""))
                    wake.set()
                ds = msg.desired_state
                async with lock:
                    await call.write(
                        device_pb2.DeviceMessage(ack=device_pb2.Ack(generation=ds.generation))
                    )
                if not got_deployment and any(b"ModelDeployment" in m for m in ds.manifests):
                    got_deployment = True
                    out.append((name, time.time(), "deployment", ""))
                    wake.set()
                if ds.HasField("agent"):
                    had_agent = True
                    a = ds.agent
                    key = (a.upgrade, a.upgrade_revision, a.version)
                    if key not in tried and a.version != me["committed"]:
                        tried.add(key)
                        out.append((name, time.time(), "got", a.version))
                        wake.set()
                        trials.add(asyncio.ensure_future(trial(a)))
                elif had_agent:
                    had_agent = False
                    out.append((name, time.time(), "cleared", ""))
                    wake.set()

    run_devices(ca, devices, session, conn)


class Fleet:
    """A hub process and the simulated devices, with what each device said when."""

    def __init__(self, n: int, clients: int, commit_s: float, workdir: Path) -> None:
        from edgefleet.launching import free_port_pair, program_command, start_hub
        from hub import pki
        from hub.decide.agentreleases import AgentReleaseRecord
        from hub.decide.devices import Device
        from hub.state import storekeys as objects
        from hub.state.store import Put, open_store

        self.n = n
        self.old, self.good, self.bad = versions()
        self.data = workdir / "hub"
        self.port = free_port_pair()
        address = f"127.0.0.1:{self.port}"
        subprocess.run(
            program_command("hub", "init", "--data-dir", self.data, "--hub-address", address),
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        ca = pki.load_certified_key(self.data / "ca.crt", self.data / "ca.key")
        devices, records = [], []
        for i in range(n):
            name = f"sim-{i:05d}"
            ck = pki.issue_client_certificate(ca, pki.Identity(pki.Role.DEVICE, name, "default"))
            devices.append((name, pki.private_key_pem(ck.key), pki.certificate_pem(ck.certificate)))
            records.append(
                Device(
                    name,
                    labels={"bench": "yes"},
                    certificate_serial=format(ck.certificate.serial_number, "x"),
                )
            )
        releases = [
            AgentReleaseRecord(v, ARCH, ABI, "ab" * 32, 1 << 20, f'{{"v":"{v}"}}'.encode(), 1.0)
            for v in (self.old, self.good, self.bad)
        ]

        async def seed() -> None:
            store = await open_store(None, data_dir=self.data)
            await store.txn(
                (),
                [Put(objects.device_key(d.name), objects.dumps(d.to_json())) for d in records]
                + [Put(r.key, objects.dumps(r.to_json())) for r in releases],
            )
            await store.close()

        asyncio.run(seed())
        self.hub = start_hub(
            self.data, listen=address, log=workdir / "hub.log", args=["--log-level", "warning"]
        )
        self.hub.wait_listening(60)
        ctx = mp.get_context("spawn")
        self.pipes, self.procs = [], []
        ca_pem = (self.data / "ca.crt").read_bytes()
        for c in range(clients):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=_devices_main,
                args=(self.port, ca_pem, devices[c::clients], commit_s, self.bad, child),
            )
            p.start()
            self.pipes.append(parent)
            self.procs.append(p)
        self.events: list[tuple[str, float, str, str]] = []

    def push_model(self) -> None:
        from edgefleet.demo import TINY_MLP, build_mlp
        from edgefleet.launching import program_command

        model = self.data / "bench.onnx"
        build_mlp(model, TINY_MLP, seed=1)
        subprocess.run(
            program_command("edgectl", "--config", self.data / "admin.toml", "models", "push",
                            model, "--name", "bench", "--version", "1.0.0"),
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip

    @property
    def pid(self) -> int:
        return int(self.hub.process.pid)

    def stub(self) -> Any:
        import grpc

        from edgefleet.v1 import admin_pb2_grpc

        creds = grpc.ssl_channel_credentials(
            (self.data / "ca.crt").read_bytes(),
            (self.data / "admin.key").read_bytes(),
            (self.data / "admin.crt").read_bytes(),
        )
        channel = grpc.secure_channel(
            f"127.0.0.1:{self.port}",
            creds,
            options=[("grpc.ssl_target_name_override", "localhost")],
        )
        return admin_pb2_grpc.AdminServiceStub(channel)

    def apply(self, doc: bytes) -> float:
        from edgefleet.v1 import admin_pb2

        t0 = time.time()
        self.stub().Apply(admin_pb2.ApplyRequest(documents=[doc]), timeout=120)
        return t0

    def status(self, kind: str, name: str) -> dict[str, Any]:
        from edgefleet.v1 import admin_pb2

        got = self.stub().Get(admin_pb2.GetRequest(kind=kind, name=name), timeout=60)
        return dict(json.loads(got.json).get("status", {}))

    def devices_connected(self) -> int:
        """Devices sent their first desired state (connected, projected)."""
        return len({e[0] for e in self.events if e[2] == "up"})

    def collect(self, timeout: float = 0.05) -> None:
        for pipe in self.pipes:
            while pipe.poll(timeout if pipe is self.pipes[0] else 0):
                self.events.extend(pipe.recv())

    def wait(self, until: Any, timeout: float, what: str, every: float = 0.05) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.collect(every)
            if until():
                return
        raise RuntimeError(f"timed out waiting for {what}")

    def close(self) -> None:
        for p in self.procs:
            p.terminate()
        self.hub.stop(30)


def measure(n: int, clients: int, commit_s: float, workdir: Path) -> dict[str, Any]:
    fleet = Fleet(n, clients, commit_s, workdir)
    try:
        fleet.wait(lambda: fleet.devices_connected() >= n, 300, "every device connected", 1.0)
        time.sleep(3.0)  # the connections' first projections settle

        # baseline: a ModelDeployment fanned out to the same fleet, from Apply to all received
        fleet.push_model()
        mark = len(fleet.events)
        cpu0 = cpu_seconds(fleet.pid)
        t0 = fleet.apply(deployment())
        fleet.wait(
            lambda: len({e[0] for e in fleet.events[mark:] if e[2] == "deployment"}) >= n,
            300,
            "the deployment on every device",
        )
        fanout_s = max(e[1] for e in fleet.events[mark:] if e[2] == "deployment") - t0
        fanout_cpu = cpu_seconds(fleet.pid) - cpu0
        time.sleep(2.0)
        fleet.collect()

        # the good upgrade: canary 1%, 10%, 50%, then all; maxUnavailable 10%
        mark = len(fleet.events)
        cpu0 = cpu_seconds(fleet.pid)
        t0 = fleet.apply(
            upgrade(
                "good", fleet.good, maxUnavailable="10%", canary={"steps": ["1%", "10%", "50%"]}
            )
        )
        first_step = max(1, -(-n // 100))
        fleet.wait(
            lambda: sum(1 for e in fleet.events[mark:] if e[2] == "got") >= first_step,
            120,
            "the first canary step sent",
        )
        step_s = max(e[1] for e in fleet.events[mark:] if e[2] == "got") - t0
        fleet.wait(
            lambda: fleet.status("AgentUpgrade", "good").get("phase") == "Complete",
            900,
            "the good upgrade Complete",
            0.5,
        )
        upgrade_s = time.time() - t0
        upgrade_cpu = cpu_seconds(fleet.pid) - cpu0
        done = fleet.status("AgentUpgrade", "good")

        # baseline: the same fleet connected and idle, for as long
        idle_s = min(upgrade_s, 60.0)
        cpu1 = cpu_seconds(fleet.pid)
        time.sleep(idle_s)
        idle_cpu = (cpu_seconds(fleet.pid) - cpu1) * (upgrade_s / idle_s)

        # the bad version: stopped at its threshold, every device sent it cleared. The good
        # upgrade goes first (its devices keep the release they committed: no desired one)
        from edgefleet.v1 import admin_pb2

        fleet.stub().Delete(admin_pb2.DeleteRequest(kind="AgentUpgrade", name="good"), timeout=60)
        time.sleep(3.0)
        fleet.collect()
        mark = len(fleet.events)
        fleet.apply(
            upgrade(
                "bad",
                fleet.bad,
                maxUnavailable="10%",
                failureThreshold=5,
                canary={"steps": ["10%"]},
            )
        )

        def stopped() -> bool:
            events = fleet.events[mark:]
            took = {e[0] for e in events if e[2] == "got" and e[3] == fleet.bad}
            failed = [e for e in events if e[2] == "failed"]
            cleared = {e[0] for e in events if e[2] == "cleared"}
            return len(failed) >= 5 and bool(took) and took <= cleared

        fleet.wait(stopped, 300, "the bad upgrade stopped and cleared")
        events = fleet.events[mark:]
        took = {e[0] for e in events if e[2] == "got" and e[3] == fleet.bad}
        fifth = sorted(e[1] for e in events if e[2] == "failed")[4]
        cleared_at = max(e[1] for e in events if e[2] == "cleared" and e[0] in took)
        bad = fleet.status("AgentUpgrade", "bad")
        return {
            "devices": n,
            "commit_s": commit_s,
            "upgrade_s": upgrade_s,
            "upgraded": done.get("doneDevices"),
            "hub_cpu_s": upgrade_cpu,
            "hub_cpu_ms_per_device": upgrade_cpu / n * 1000,
            "idle_cpu_s_same_time": idle_cpu,
            "cpu_over_idle": upgrade_cpu / idle_cpu if idle_cpu else float("inf"),
            "fanout_s": fanout_s,
            "fanout_cpu_s": fanout_cpu,
            "fanout_cpu_ms_per_device": fanout_cpu / n * 1000,
            "cpu_over_fanout": upgrade_cpu / fanout_cpu if fanout_cpu else float("inf"),
            "first_step_s": step_s,
            "bad_phase": bad.get("phase"),
            "bad_sent": len(took),
            "bad_failed": len(bad.get("failedDevices", {})),
            "stop_s": cleared_at - fifth,
            "stop_over_step": (cleared_at - fifth) / step_s if step_s else float("inf"),
        }
    finally:
        fleet.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--commit-ms", type=float, default=500.0, help="simulated trial to commit")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        r = measure(args.devices, args.clients, args.commit_ms / 1000, Path(tmp))
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(
        f"N={r['devices']}  upgrade (canary 1%/10%/50%/all, maxUnavailable 10%, commit "
        f"{r['commit_s'] * 1000:.0f} ms): {r['upgraded']} devices in {r['upgrade_s']:.1f} s; "
        f"hub CPU {r['hub_cpu_s']:.2f} s = {r['hub_cpu_ms_per_device']:.2f} ms/device = "
        f"{r['cpu_over_fanout']:.2f}x a ModelDeployment fanned out to the same fleet "
        f"({r['fanout_cpu_ms_per_device']:.2f} ms/device, {r['fanout_s']:.1f} s); the idle "
        f"fleet over the same time: {r['idle_cpu_s_same_time']:.2f} s\n"
        f"N={r['devices']}  bad version: {r['bad_phase']} after {r['bad_failed']} failures; "
        f"{r['bad_sent']} devices sent it, all cleared {r['stop_s']:.2f} s after the 5th "
        f"failure = {r['stop_over_step']:.2f}x one step of the good upgrade "
        f"({r['first_step_s']:.2f} s from Apply)"
    )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    sys.exit(main())
