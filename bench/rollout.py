"""Rollouts at fleet scale: a real ``hub serve`` and N simulated devices (see BENCHMARKS.md).

The simulated devices speak the real Sync protocol over mTLS, each with its own certificate
from the hub CA and its own HTTP/2 connection, spread over a few client processes: Hello, then
for every desired state an Ack and a Status that reports the revision it was sent as Ready
(after ``--load-ms``, a model load), or as Failed (ModelLoadFailed) when its version is the
bad one. Device records and certificates are made directly with the hub's modules, as in
``bench/fanout.py``.

Two figures, each against a baseline measured in the same run:

* **rollback**: every device serves 1.0.0; 2.0.0 (bad) is rolled out with ``maxSurge: 10%``;
  the devices given it report it Failed. From the first Failed report sent, the time until
  every device that was given 2.0.0 has acknowledged the stable revision again (target
  <= 5 s). Baseline: a fan-out of one version to every device (apply to all acknowledged).
* **full rollout**: 3.0.0 with ``maxSurge: 0, maxUnavailable: 10%``, from Apply to the
  rollout Complete, against **ten sequential fan-out waves**: ten deployments on ten groups of
  N/10 devices, each applied after the previous one is served everywhere (target: the
  rollout within 1.5x).

    .venv/bin/python bench/rollout.py --devices 1000 [--clients 4] [--load-ms 200] [--json]
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
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.simfleet import device_sync, run_devices  # noqa: E402

BAD = "2.0.0"
ERRING = "4.0.0"  # loads, then answers half its requests with errors
METRICS_S = 5.0  # how often a simulated device reports its counters (edged's metricsPeriod)


def deployment(name: str, version: str, selector: dict[str, str], **rollout: Any) -> bytes:
    doc: dict[str, Any] = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "bench", "version": version},
            "replicas": {"perDevice": 1},
            "placement": {"nodeSelector": selector},
        },
    }
    if rollout:
        doc["spec"]["rollout"] = rollout
    return json.dumps(doc).encode()


def _devices_main(
    port: int, ca: bytes, devices: list[tuple[str, bytes, bytes]], load_s: float, conn: Any
) -> None:
    """Simulated devices; sends (name, time, event, version) tuples to the parent in batches:
    event "got" when a desired state arrives and is acked, "failed" when a Failed status is
    sent."""
    import grpc

    from edgefleet.v1 import device_pb2

    async def session(name: str, creds: Any, out: list[Any], wake: asyncio.Event) -> None:
        async with device_sync(port, creds, name) as call:
            lock = asyncio.Lock()
            loading: asyncio.Task[None] | None = None
            # what each (workload, version) answered: requests, errors (edged's counters)
            counters: dict[tuple[str, str], list[int]] = {}
            current: list[Any] = [{}, {}]  # workloads, phases

            def metrics(w: str, v: str) -> device_pb2.RevisionMetrics | None:
                got = counters.get((w, v))
                if got is None:
                    return None
                return device_pb2.RevisionMetrics(
                    requests=got[0],
                    errors=got[1],
                    latency_p95_seconds=0.002,
                    latency_window_seconds=60,
                    window_requests=min(got[0], 1000),
                )

            async def report(workloads: dict[str, str], phase_of: dict[str, str]) -> None:
                current[:] = [workloads, phase_of]
                status = device_pb2.Status(
                    workloads=[
                        device_pb2.WorkloadStatus(
                            name=w,
                            desired_replicas=1,
                            ready_replicas=1 if phase_of[w] == "Ready" else 0,
                            model_version=v,
                            revisions=[
                                device_pb2.RevisionStatus(
                                    model_version=v,
                                    phase=phase_of[w],
                                    ready_replicas=1 if phase_of[w] == "Ready" else 0,
                                    reason="ModelLoadFailed" if phase_of[w] == "Failed" else "",
                                    wanted=True,
                                    metrics=metrics(w, v),
                                )
                            ],
                        )
                        for w, v in sorted(workloads.items())
                    ]
                )
                async with lock:
                    await call.write(device_pb2.DeviceMessage(status=status))

            async def traffic() -> None:
                """Every METRICS_S: 20 more requests answered by what serves (10 of them
                errors on ERRING), reported like edged's metricsPeriod."""
                import random

                await asyncio.sleep(random.uniform(0, METRICS_S))
                while True:
                    workloads, phases = current
                    if workloads:
                        for w, v in workloads.items():
                            if phases.get(w) == "Ready":
                                c = counters.setdefault((w, v), [0, 0])
                                c[0] += 20
                                c[1] += 10 if v == ERRING else 0
                                if v == ERRING and c[1] == 10:
                                    out.append((name, time.time(), "erred", v))
                        await report(workloads, phases)
                    await asyncio.sleep(METRICS_S)

            ticker = asyncio.ensure_future(traffic())

            async def load(workloads: dict[str, str]) -> None:
                await asyncio.sleep(load_s)
                phases = {w: ("Failed" if v == BAD else "Ready") for w, v in workloads.items()}
                await report(workloads, phases)
                if BAD in workloads.values():
                    out.append((name, time.time(), "failed", BAD))
                    wake.set()

            while True:
                msg = await call.read()
                if msg is grpc.aio.EOF:
                    ticker.cancel()
                    return
                if msg.WhichOneof("message") != "desired_state":
                    continue
                ds = msg.desired_state
                workloads = {}
                for m in ds.manifests:
                    doc = json.loads(m)
                    if doc.get("kind") == "ModelDeployment":
                        workloads[doc["metadata"]["name"]] = doc["spec"]["model"]["version"]
                async with lock:
                    await call.write(
                        device_pb2.DeviceMessage(ack=device_pb2.Ack(generation=ds.generation))
                    )
                now = time.time()
                for v in set(workloads.values()):
                    out.append((name, now, "got", v))
                wake.set()
                if loading is not None:
                    loading.cancel()
                loading = asyncio.ensure_future(load(workloads))

    run_devices(ca, devices, session, conn)


class Fleet:
    """A hub process and the simulated devices, with what each device said when."""

    def __init__(self, n: int, clients: int, load_s: float, workdir: Path) -> None:
        from edgefleet.launching import free_port_pair, program_command, start_hub
        from hub import pki
        from hub.decide.devices import Device
        from hub.state import storekeys as objects
        from hub.state.store import Put, open_store

        self.n = n
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
                    labels={"bench": "yes", "wave": str(i % 10)},
                    certificate_serial=format(ck.certificate.serial_number, "x"),
                )
            )

        async def seed() -> None:
            store = await open_store(None, data_dir=self.data)
            await store.txn(
                (), [Put(objects.device_key(d.name), objects.dumps(d.to_json())) for d in records]
            )
            await store.close()

        asyncio.run(seed())
        self.hub = start_hub(
            self.data,
            listen=address,
            log=workdir / "hub.log",
            args=["--log-level", "warning"],
        )
        self.hub.wait_listening(60)
        for version in ("1.0.0", "1.0.1", BAD, ERRING, "3.0.0", *(f"1.1.{w}" for w in range(10))):
            self.push(version)
        ctx = mp.get_context("spawn")
        self.pipes, self.procs = [], []
        ca_pem = (self.data / "ca.crt").read_bytes()
        for c in range(clients):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=_devices_main, args=(self.port, ca_pem, devices[c::clients], load_s, child)
            )
            p.start()
            self.pipes.append(parent)
            self.procs.append(p)
        self.events: list[tuple[str, float, str, str]] = []

    def push(self, version: str) -> None:
        from edgefleet.demo import TINY_MLP, build_mlp
        from edgefleet.launching import program_command

        model = self.data / f"bench-{version}.onnx"
        build_mlp(model, TINY_MLP, seed=sum(map(ord, version)))
        subprocess.run(
            program_command("edgectl", "--config", self.data / "admin.toml", "models", "push",
                            model, "--name", "bench", "--version", version),
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip

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

    def status(self, name: str) -> dict[str, Any]:
        from edgefleet.v1 import admin_pb2

        got = self.stub().Get(admin_pb2.GetRequest(kind="ModelDeployment", name=name), timeout=60)
        status: dict[str, Any] = json.loads(got.json)["status"]
        return status

    def collect(self, timeout: float = 0.05) -> None:
        for pipe in self.pipes:
            while pipe.poll(timeout if pipe is self.pipes[0] else 0):
                self.events.extend(pipe.recv())

    def wait(self, until: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.collect()
            if until():
                return
        raise RuntimeError(f"timed out waiting for {what}")

    def latest(self) -> dict[str, tuple[float, str]]:
        out: dict[str, tuple[float, str]] = {}
        for name, t, kind, version in self.events:
            if kind == "got":
                out[name] = (t, version)
        return out

    def close(self) -> None:
        for p in self.procs:
            p.terminate()
        self.hub.stop(30)


def measure_canary(fleet: Fleet, everyone: dict[str, str]) -> dict[str, Any]:
    """ERRING as a 10% canary with an error-rate analysis: the canary devices report half
    their requests failed, the analysis fails, every canary device goes back. From the moment
    the hub decided (the rollout's changedAt, the hub's wall clock, same machine) until the
    last canary device acknowledged the stable revision again."""
    mark = len(fleet.events)
    fleet.apply(
        deployment(
            "main",
            ERRING,
            everyone,
            maxSurge="10%",
            maxUnavailable=0,
            canary={
                "steps": ["10%", "100%"],
                "analysis": {"maxErrorRateIncrease": 0.05, "window": "10s", "minRequests": 20},
            },
        )
    )
    fleet.wait(
        lambda: fleet.status("main")["rollout"]["phase"] == "RolledBack", 300, "canary rollback"
    )
    rollout = fleet.status("main")["rollout"]
    # when the hub decided (RFC 3339, whole seconds: the figures below are ~1 s coarse on that
    # side; an older hub's float seconds read too)
    changed = rollout["changedAt"]
    decided = (
        float(changed)
        if isinstance(changed, (int, float))
        else datetime.fromisoformat(str(changed).replace("Z", "+00:00")).timestamp()
    )

    def back() -> bool:
        took = {e[0] for e in fleet.events[mark:] if e[2] == "got" and e[3] == ERRING}
        latest = {e[0]: e[3] for e in fleet.events[mark:] if e[2] == "got"}
        return bool(took) and all(latest.get(d) != ERRING for d in took)

    fleet.wait(back, 120, "every canary device back on the stable revision")
    events = fleet.events[mark:]
    took = {e[0] for e in events if e[2] == "got" and e[3] == ERRING}
    acked = max(e[1] for e in events if e[2] == "got" and e[3] != ERRING and e[0] in took)
    first_error = min((e[1] for e in events if e[2] == "erred"), default=decided)
    return {
        "canary_devices": len(took),
        "canary_reason": rollout["reason"],
        "canary_message": rollout["message"],
        "canary_first_error_to_decision_s": decided - first_error,
        "canary_rollback_ack_s": acked - decided,
    }


def measure(
    n: int, clients: int, load_s: float, workdir: Path, parts: set[str] | None = None
) -> dict[str, Any]:
    parts = parts or {"rollback", "canary", "full"}
    fleet = Fleet(n, clients, load_s, workdir)
    try:
        everyone = {"bench": "yes"}
        fleet.apply(deployment("main", "1.0.0", everyone, maxSurge="100%", maxUnavailable=0))
        fleet.wait(lambda: fleet.status("main")["readyDevices"] == n, 300, "1.0.0 everywhere")

        # baseline 1: one fan-out to every device (apply: all acknowledged)
        mark = len(fleet.events)
        t0 = fleet.apply(deployment("main", "1.0.1", everyone, maxSurge="100%", maxUnavailable=0))
        fleet.wait(
            lambda: sum(1 for e in fleet.events[mark:] if e[2] == "got" and e[3] == "1.0.1") >= n,
            300,
            "1.0.1 everywhere",
        )
        fanout_s = max(e[1] for e in fleet.events[mark:] if e[3] == "1.0.1") - t0
        fleet.wait(lambda: fleet.status("main")["rollout"]["phase"] == "Complete", 300, "1.0.1")

        result: dict[str, Any] = {"devices": n, "load_s": load_s, "fanout_all_acked_s": fanout_s}
        if "canary" in parts:
            result.update(measure_canary(fleet, everyone))
        if "rollback" not in parts and "full" not in parts:
            return result

        # rollback: 10% get the bad version, report it Failed, and go back
        mark = len(fleet.events)
        fleet.apply(deployment("main", BAD, everyone, maxSurge="10%", maxUnavailable=0))
        fleet.wait(
            lambda: fleet.status("main")["rollout"]["phase"] == "RolledBack", 120, "rollback"
        )

        def back() -> bool:
            took = {e[0] for e in fleet.events[mark:] if e[2] == "got" and e[3] == BAD}
            latest = {e[0]: e[3] for e in fleet.events[mark:] if e[2] == "got"}
            return bool(took) and all(latest.get(d) == "1.0.1" for d in took)

        fleet.wait(back, 60, "every device that took the bad version back on the stable one")
        events = fleet.events[mark:]
        took = {e[0] for e in events if e[2] == "got" and e[3] == BAD}
        first_failed = min(e[1] for e in events if e[2] == "failed")
        acked_back = max(e[1] for e in events if e[2] == "got" and e[3] == "1.0.1" and e[0] in took)
        rollback_s = acked_back - first_failed

        # baseline 2: ten sequential fan-out waves over N/10 devices each
        t_waves = time.time()
        for w in range(10):
            name = f"wave-{w}"
            fleet.apply(deployment(name, f"1.1.{w}", {"wave": str(w)}, maxSurge="100%"))
            fleet.wait(
                lambda name=name: fleet.status(name)["readyDevices"] == n // 10,  # type: ignore[misc]
                300,
                f"wave {w}",
            )
        waves_s = time.time() - t_waves

        # the full rollout: maxUnavailable 10%, no analysis
        t_roll = fleet.apply(
            deployment("main", "3.0.0", everyone, maxSurge=0, maxUnavailable="10%")
        )
        fleet.wait(
            lambda: fleet.status("main")["rollout"]["phase"] == "Complete", 600, "full rollout"
        )
        rollout_s = time.time() - t_roll
        steps = fleet.status("main")["rollout"]["steps"]
        return {
            **result,
            "rollback_devices": len(took),
            "rollback_ack_s": rollback_s,
            "ten_waves_s": waves_s,
            "full_rollout_s": rollout_s,
            "full_rollout_steps": steps,
            "rollout_over_waves": rollout_s / waves_s,
        }
    finally:
        fleet.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--load-ms", type=float, default=200.0, help="simulated model load time")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--canary-only",
        action="store_true",
        help="only the canary rollback (after the baseline fan-out)",
    )
    args = ap.parse_args()
    parts = {"canary"} if args.canary_only else None
    with tempfile.TemporaryDirectory() as tmp:
        r = measure(args.devices, args.clients, args.load_ms / 1000, Path(tmp), parts)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    if "canary_devices" in r:
        print(
            f"N={r['devices']}  canary analysis failed ({r['canary_reason']}): "
            f"{r['canary_devices']} canary devices back on the stable revision "
            f"{r['canary_rollback_ack_s']:.2f} s after the hub decided (first error reported "
            f"{r['canary_first_error_to_decision_s']:.2f} s before it; one fan-out to all: "
            f"{r['fanout_all_acked_s']:.2f} s)\n  {r['canary_message']}"
        )
    if "rollback_devices" in r:
        print(
            f"N={r['devices']}  rollback: {r['rollback_devices']} devices back on the stable "
            f"revision {r['rollback_ack_s']:.2f} s after the first failure (one fan-out to all: "
            f"{r['fanout_all_acked_s']:.2f} s)\n"
            f"N={r['devices']}  full rollout (maxUnavailable 10%, {r['full_rollout_steps']} "
            f"steps) {r['full_rollout_s']:.1f} s vs ten sequential waves {r['ten_waves_s']:.1f} s"
            f" = {r['rollout_over_waves']:.2f}x  (model load {r['load_s'] * 1000:.0f} ms)"
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    sys.exit(main())
