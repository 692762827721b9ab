"""The hub's cost of a fleet-wide model configuration change (kind: ModelConfig) against a
model version change of the same fleet, in one run (issue 36; docs/model-config.md).

A real ``hub serve`` (SQLite) and N simulated devices over real mTLS gRPC streams (each its
own certificate and HTTP/2 connection, spread over a few client processes, as in
``bench/fanout.py``): Hello, then an Ack for every desired state. The devices carry labels of
ten sites; the ModelConfig has fleet-wide defaults, an override per site and one for each of
N/20 devices by name, so the hub merges a config per device group and per named device.

Both changes go to every device at once (``maxSurge`` and ``maxUnavailable`` 100%: the
simulated devices send no status, so a rolling update would wait; bench/rollout.py measures
rollouts):

* **version change** (the baseline): the deployment moved to a new model version;
* **config change**: the ModelConfig's defaults changed (a new revision, every device sent its
  newly merged config).

For each: the time from the Apply to every device having received (and acknowledged) its
new desired state, the hub process' CPU seconds (user + system) and its bytes read and written
(/proc/PID/io) over that time, and the mean size of the desired states received; then the
config change's figures as a ratio of the version change's.

    .venv/bin/python bench/modelconfig.py --devices 1000 [--clients 4] [--json]
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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.fanout import _proc_io, percentile  # noqa: E402

SITES = 10


def deployment(version: str) -> dict[str, Any]:
    return {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": "bench"},
        "spec": {
            "model": {"name": "bench", "version": version},
            "replicas": {"perDevice": 1},
            "rollout": {"maxSurge": "100%", "maxUnavailable": "100%"},
        },
    }


def model_config(n: int, threshold: float) -> dict[str, Any]:
    return {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelConfig",
        "metadata": {"name": "bench"},
        "spec": {
            "model": "bench",
            "data": {"threshold": threshold, "labels": [f"class-{i}" for i in range(80)]},
            "overrides": [
                *(
                    {"selector": {"site": f"s{s}"}, "data": {"zones": {"door": [s, s, 64, 64]}}}
                    for s in range(SITES)
                ),
                *(
                    {"devices": [f"sim-{i:05d}"], "data": {"crop": [i % 7, 0, 224, 224]}}
                    for i in range(0, n, 20)
                ),
            ][:64],
        },
    }


def _say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _clients_main(port: int, ca: bytes, devices: list[tuple[str, bytes, bytes]], conn: Any) -> None:
    """Simulated devices: Hello, then Ack every desired state; report (name, time, version,
    config digest, message bytes) for each."""
    import grpc

    from edgefleet.v1 import device_pb2, device_pb2_grpc
    from edgefleet.versioning import installed_version

    async def session(name: str, creds: Any, seen: dict[str, Any]) -> None:
        async with grpc.aio.secure_channel(
            f"127.0.0.1:{port}",
            creds,
            options=[
                ("grpc.use_local_subchannel_pool", 1),
                ("grpc.ssl_target_name_override", "localhost"),
            ],
        ) as channel:
            call = device_pb2_grpc.DeviceServiceStub(channel).Sync()
            hello = device_pb2.Hello(edged_version=installed_version(), device_name=name)
            await call.write(device_pb2.DeviceMessage(hello=hello))
            while True:
                msg = await call.read()
                if msg is grpc.aio.EOF:
                    return
                if msg.WhichOneof("message") != "desired_state":
                    continue
                ds = msg.desired_state
                now = time.time()
                versions = [
                    json.loads(m)["spec"]["model"]["version"]
                    for m in ds.manifests
                    if b"ModelDeployment" in m
                ]
                digest = ds.model_configs[0].digest if ds.model_configs else ""
                ack = device_pb2.Ack(generation=ds.generation)
                await call.write(device_pb2.DeviceMessage(ack=ack))
                version = versions[0] if versions else ""
                seen["events"].append((name, now, version, digest, ds.ByteSize()))
                seen["wake"].set()

    async def one(name: str, key: bytes, cert: bytes, seen: dict[str, Any]) -> None:
        creds = grpc.ssl_channel_credentials(ca, key, cert)
        while True:
            try:
                await session(name, creds, seen)
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.5)

    async def run() -> None:
        seen: dict[str, Any] = {"events": [], "wake": asyncio.Event()}
        tasks = [asyncio.ensure_future(one(n, k, c, seen)) for n, k, c in devices]
        while True:
            try:
                await asyncio.wait_for(seen["wake"].wait(), 1.0)
            except TimeoutError:
                pass
            seen["wake"].clear()
            await asyncio.sleep(0.05)
            events, seen["events"] = seen["events"], []
            conn.send(events)
            if any(t.done() for t in tasks):
                return

    asyncio.run(run())


def _apply(data: Path, port: int, docs: list[dict[str, Any]]) -> float:
    import grpc

    from edgefleet.v1 import admin_pb2, admin_pb2_grpc

    creds = grpc.ssl_channel_credentials(
        (data / "ca.crt").read_bytes(),
        (data / "admin.key").read_bytes(),
        (data / "admin.crt").read_bytes(),
    )
    with grpc.secure_channel(
        f"127.0.0.1:{port}", creds, options=[("grpc.ssl_target_name_override", "localhost")]
    ) as ch:
        stub = admin_pb2_grpc.AdminServiceStub(ch)
        t0 = time.time()
        request = admin_pb2.ApplyRequest(documents=[json.dumps(d).encode() for d in docs])
        stub.Apply(request, timeout=120)
    return t0


def _push(data: Path, version: str) -> None:
    from edgefleet.demo import TINY_MLP, build_mlp
    from edgefleet.launching import program_command

    model = data / f"bench-{version}.onnx"
    build_mlp(model, TINY_MLP, seed=int(version.replace(".", "")))
    subprocess.run(
        program_command("edgectl", "--config", data / "admin.toml", "models", "push", model,
                        "--name", "bench", "--version", version),
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip


def measure(n: int, clients: int, workdir: Path) -> dict[str, Any]:
    import psutil

    from edgefleet.launching import free_port_pair, program_command, start_hub
    from hub import pki
    from hub.decide.devices import Device
    from hub.state import storekeys as objects
    from hub.state.store import Put, open_store

    data = workdir / f"hub-{n}"
    port = free_port_pair()
    address = f"127.0.0.1:{port}"
    subprocess.run(
        program_command("hub", "init", "--data-dir", data, "--hub-address", address),
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    ca = pki.load_certified_key(data / "ca.crt", data / "ca.key")
    devices: list[tuple[str, bytes, bytes]] = []
    records = []
    for i in range(n):
        name = f"sim-{i:05d}"
        ck = pki.issue_client_certificate(ca, pki.Identity(pki.Role.DEVICE, name, "default"))
        devices.append((name, pki.private_key_pem(ck.key), pki.certificate_pem(ck.certificate)))
        records.append(
            Device(
                name,
                labels={"site": f"s{i % SITES}"},
                certificate_serial=format(ck.certificate.serial_number, "x"),
            )
        )

    async def seed() -> None:
        store = await open_store(None, data_dir=data)
        await store.txn(
            (), [Put(objects.device_key(d.name), objects.dumps(d.to_json())) for d in records]
        )
        await store.close()

    asyncio.run(seed())
    hub = start_hub(
        data, listen=address, log=workdir / f"hub-{n}.log", args=["--log-level", "warning"]
    )
    procs = []
    try:
        hub.wait_listening(60)
        time.sleep(0.5)
        proc = psutil.Process(hub.pid)
        for version in ("1.0.0", "1.0.1"):
            _push(data, version)
        _say("pushed; applying")
        _apply(data, port, [deployment("1.0.0"), model_config(n, 0.5)])
        ctx = mp.get_context("spawn")
        pipes = []
        ca_pem = (data / "ca.crt").read_bytes()
        for c in range(clients):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_clients_main, args=(port, ca_pem, devices[c::clients], child))
            p.start()
            pipes.append(parent)
            procs.append(p)
        got: dict[str, tuple[float, str, str, int]] = {}

        def collect(until: Callable[[], bool], timeout: float) -> None:
            deadline = time.monotonic() + timeout
            while not until() and time.monotonic() < deadline:
                for pipe in pipes:
                    while pipe.poll(0.01):
                        for name, t, version, digest, size in pipe.recv():
                            got[name] = (t, version, digest, size)
            if not until():
                raise RuntimeError(
                    f"timed out: {len(got)} of {n} devices, e.g. {next(iter(got.items()), None)}"
                )

        def change(
            docs: list[dict[str, Any]], done: Callable[[str, str, str], bool]
        ) -> dict[str, Any]:
            """Apply ``docs``; wait until ``done(version, digest, digest before)`` for every
            device; the figures of that change."""
            before = {k: v[2] for k, v in got.items()}

            def all_done() -> bool:
                return len(got) == n and all(
                    done(v[1], v[2], before.get(k, "")) for k, v in got.items()
                )

            cpu0, io0 = sum(proc.cpu_times()[:2]), _proc_io(hub.pid)
            t0 = _apply(data, port, docs)
            collect(all_done, 600)
            cpu1, io1 = sum(proc.cpu_times()[:2]), _proc_io(hub.pid)
            lat = sorted(t - t0 for t, _, _, _ in got.values())
            return {
                "all_acked_s": lat[-1],
                "p50_s": percentile(lat, 50),
                "hub_cpu_s": cpu1 - cpu0,
                "hub_io_bytes": io1 - io0,
                "desired_state_bytes": sum(s for *_, s in got.values()) / n,
                "configs_changed": sum(1 for k, v in got.items() if v[2] != before.get(k)),
            }

        _say(f"{n} devices connecting")
        collect(lambda: len(got) == n and all(v[1] == "1.0.0" and v[2] for v in got.values()), 600)
        _say("every device runs 1.0.0 with its config; the version change")
        time.sleep(2.0)
        version = change([deployment("1.0.1")], lambda v, d, was: v == "1.0.1")
        time.sleep(2.0)
        _say("the config change")
        config = change([model_config(n, 0.6)], lambda v, d, was: bool(d) and d != was)
        ratio = {
            k: (config[k] / version[k] if version[k] else float("nan"))
            for k in ("all_acked_s", "hub_cpu_s", "hub_io_bytes", "desired_state_bytes")
        }
        return {"devices": n, "version_change": version, "config_change": config, "ratio": ratio}
    finally:
        for p in procs:
            p.terminate()
        hub.stop(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        row = measure(args.devices, args.clients, Path(tmp))
    if args.json:
        print(json.dumps(row, indent=2))
        return 0
    for what in ("version_change", "config_change"):
        r = row[what]
        print(
            f"N={row['devices']}  {what:15s} all acked {r['all_acked_s'] * 1000:7.0f} ms  "
            f"p50 {r['p50_s'] * 1000:6.0f} ms  hub CPU {r['hub_cpu_s']:6.2f} s  "
            f"hub I/O {r['hub_io_bytes'] / 2**20:6.1f} MiB  "
            f"desired state {r['desired_state_bytes']:6.0f} B/device",
            flush=True,
        )
    q = row["ratio"]
    print(
        f"config change / version change: time {q['all_acked_s']:.2f}x, hub CPU "
        f"{q['hub_cpu_s']:.2f}x, hub I/O {q['hub_io_bytes']:.2f}x, desired state "
        f"{q['desired_state_bytes']:.2f}x",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    sys.exit(main())
