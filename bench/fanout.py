"""Hub fan-out: time for a push to reach N devices over real mTLS gRPC streams (see BENCHMARKS.md).

Baseline (``raw``): a bare grpcio asyncio server with one bidirectional stream per simulated
device; it writes a 1 KB message to every stream and times until every device has answered
with an acknowledgement. Devices are spread over several client processes (one HTTP/2
connection each: a local subchannel pool, as separate devices would have), so that clients are
not the bottleneck. The server's RSS per connected stream is measured too.

    .venv/bin/python bench/fanout.py --devices 500,1000,2000 [--clients 4] [--json]

The hub (``hub``): a real ``hub serve`` process (SQLite store, its own CA) and N simulated
devices, each with its own device certificate from the hub CA and its own HTTP/2 connection,
speaking the real Sync protocol (Hello, then Ack for each desired state). Device records and
certificates are made directly with the hub's modules (enrolling 2,000 devices through the
Enroll RPC is not what is measured). After every device has acknowledged a first deployment,
a second model version is applied through AdminService and the time from the Apply call to
each device receiving (and acknowledging) its new desired state is recorded: the maximum is
compared with the raw push, and p50/p99 are reported. Also: the hub's RSS per connected device
(RSS with every device connected minus RSS before any), and the steady-state traffic per
device (bytes the hub process reads and writes, from /proc/PID/io, over a quiet window with a
short heartbeat interval, scaled to the default 30 s interval).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

METHOD = "/bench.Fanout/Stream"
PAYLOAD = b"x" * 1024


def _make_certs(folder: Path) -> dict[str, Path]:
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)

    def build(cn: str, issuer_key: Any, issuer: Any, key: Any, *, ca: bool, server: bool) -> Any:
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if server:
            b = b.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        return b.sign(issuer_key, hashes.SHA256())

    out: dict[str, Path] = {}
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench-ca")])
    ca = build("bench-ca", ca_key, ca_name, ca_key, ca=True, server=False)
    for name, server in (("server", True), ("client", False)):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = build(name, ca_key, ca_name, key, ca=False, server=server)
        (folder / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (folder / f"{name}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        out[f"{name}.crt"] = folder / f"{name}.crt"
        out[f"{name}.key"] = folder / f"{name}.key"
    (folder / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    out["ca.crt"] = folder / "ca.crt"
    return out


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


# -- simulated devices ---------------------------------------------------------------------------
def _client_main(port: int, certs: dict[str, Path], count: int) -> None:
    import grpc

    async def one(creds: grpc.ChannelCredentials) -> None:
        async with grpc.aio.secure_channel(
            f"localhost:{port}", creds, options=[("grpc.use_local_subchannel_pool", 1)]
        ) as channel:
            call = channel.stream_stream(METHOD)()
            await call.write(b"hello")
            first = await call.read()  # the server's welcome: the stream is registered
            assert first == b"welcome"
            msg = await call.read()
            if msg is not grpc.aio.EOF:
                await call.write(b"ack")
            await call.done_writing()
            await call.code()

    async def run() -> None:
        creds = grpc.ssl_channel_credentials(
            certs["ca.crt"].read_bytes(),
            certs["client.key"].read_bytes(),
            certs["client.crt"].read_bytes(),
        )
        await asyncio.gather(*(one(creds) for _ in range(count)))

    asyncio.run(run())


# -- the raw baseline server ---------------------------------------------------------------------
def _raw_server_main(certs: dict[str, Path], n: int, conn: Any) -> None:
    import grpc

    async def run() -> None:
        streams: list[asyncio.Queue[bytes]] = []
        acks = asyncio.Event()
        acked = [0]
        all_connected = asyncio.Event()

        async def handler(request_iterator: Any, context: Any) -> Any:
            queue: asyncio.Queue[bytes] = asyncio.Queue()
            it = request_iterator.__aiter__()
            await it.__anext__()  # hello
            streams.append(queue)
            if len(streams) == n:
                all_connected.set()
            yield b"welcome"
            yield await queue.get()
            await it.__anext__()  # ack
            acked[0] += 1
            if acked[0] == n:
                acks.set()

        server = grpc.aio.server(options=[("grpc.max_concurrent_streams", 100000)])
        server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    "bench.Fanout", {"Stream": grpc.stream_stream_rpc_method_handler(handler)}
                )
            ]
        )
        creds = grpc.ssl_server_credentials(
            [(certs["server.key"].read_bytes(), certs["server.crt"].read_bytes())],
            root_certificates=certs["ca.crt"].read_bytes(),
            require_client_auth=True,
        )
        port = server.add_secure_port("127.0.0.1:0", creds)
        await server.start()
        rss0 = _rss_kib()
        conn.send(port)
        await all_connected.wait()
        await asyncio.sleep(0.5)  # let connection setup settle before measuring RSS
        rss1 = _rss_kib()
        t0 = time.perf_counter()
        for q in streams:
            q.put_nowait(PAYLOAD)
        await acks.wait()
        elapsed = time.perf_counter() - t0
        conn.send({"seconds": elapsed, "rss_per_stream_kib": (rss1 - rss0) / n})
        await server.stop(1.0)

    asyncio.run(run())


def measure_raw(n: int, clients: int, certs: dict[str, Path]) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    server = ctx.Process(target=_raw_server_main, args=(certs, n, child))
    server.start()
    port = parent.recv()
    per = [n // clients + (1 if i < n % clients else 0) for i in range(clients)]
    procs = [ctx.Process(target=_client_main, args=(port, certs, c)) for c in per if c]
    for p in procs:
        p.start()
    result: dict[str, float] = parent.recv()
    for p in procs:
        p.join(60)
    server.join(10)
    return result


# -- the hub ------------------------------------------------------------------------------------
DEPLOYMENT = {
    "apiVersion": "edgefleet.io/v1",
    "kind": "ModelDeployment",
    "metadata": {"name": "bench"},
    "spec": {
        "model": {"name": "bench", "version": "1.0.0"},
        "replicas": {"perDevice": 1},
        # every device at once: what a fan-out is (a rolling update waits for device reports,
        # which these simulated devices do not send; bench/rollout.py measures rollouts)
        "rollout": {"maxSurge": "100%", "maxUnavailable": 0},
    },
}


def _device_client_main(
    port: int, ca: bytes, devices: list[tuple[str, bytes, bytes]], conn: Any
) -> None:
    """Simulated devices: Hello, then Ack every desired state; report receive times."""
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
            lock = asyncio.Lock()
            await call.write(
                device_pb2.DeviceMessage(
                    hello=device_pb2.Hello(edged_version=installed_version(), device_name=name)
                )
            )
            beat: asyncio.Task[None] | None = None

            async def heartbeats(interval: float) -> None:
                while True:  # as edged does when it has nothing else to say
                    await asyncio.sleep(interval)
                    async with lock:
                        await call.write(device_pb2.DeviceMessage(heartbeat=device_pb2.Heartbeat()))

            try:
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
                    async with lock:
                        await call.write(
                            device_pb2.DeviceMessage(ack=device_pb2.Ack(generation=ds.generation))
                        )
                    if beat is None:
                        interval = ds.heartbeat_interval.ToTimedelta().total_seconds()
                        beat = asyncio.ensure_future(heartbeats(interval))
                    seen["events"].append((name, now, versions[0] if versions else ""))
                    seen["wake"].set()
            finally:
                if beat is not None:
                    beat.cancel()

    async def one(name: str, key: bytes, cert: bytes, seen: dict[str, Any]) -> None:
        """One device: reconnects with jittered backoff like edged; counts why it had to."""
        import random

        creds = grpc.ssl_channel_credentials(ca, key, cert)
        attempt = 0
        while True:
            try:
                await session(name, creds, seen)
                reason = "EOF"
            except grpc.aio.AioRpcError as exc:
                reason = f"{exc.code().name}: {exc.details()}"
            seen["reconnects"][reason] = seen["reconnects"].get(reason, 0) + 1
            await asyncio.sleep(random.uniform(0, min(10.0, 0.5 * 2.0**attempt)))
            attempt += 1

    async def run() -> None:
        seen: dict[str, Any] = {"events": [], "wake": asyncio.Event(), "reconnects": {}}
        tasks = [asyncio.ensure_future(one(n, k, c, seen)) for n, k, c in devices]
        while True:  # forward receive events to the controller in batches
            try:
                await asyncio.wait_for(seen["wake"].wait(), 1.0)
            except TimeoutError:
                pass
            seen["wake"].clear()
            await asyncio.sleep(0.05)
            events, seen["events"] = seen["events"], []
            conn.send((events, dict(seen["reconnects"])))
            if any(t.done() for t in tasks):
                failed = [t for t in tasks if t.done()]
                conn.send(("error", repr(failed[0].exception())))
                return

    asyncio.run(run())


def _merge(counts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


def _proc_io(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        fields = dict(line.split(": ") for line in f.read().splitlines())
    return int(fields["rchar"]) + int(fields["wchar"])


def measure_hub(n: int, clients: int, workdir: Path, heartbeat_s: float = 5.0) -> dict[str, Any]:
    import subprocess

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
    toml = data / "hub.toml"
    toml.write_text(
        toml.read_text().replace(
            'heartbeatInterval = "30s"', f'heartbeatInterval = "{heartbeat_s:g}s"'
        )
    )
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
                labels={"bench": "yes"},
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
    try:
        hub.wait_listening(60)
        time.sleep(0.5)  # its controllers start right after the port opens
        proc = psutil.Process(hub.pid)
        rss0 = proc.memory_info().rss
        _push_and_apply(data, port, "1.0.0", first=True)
        ctx = mp.get_context("spawn")
        pipes = []
        procs = []
        ca_pem = (data / "ca.crt").read_bytes()
        for c in range(clients):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=_device_client_main, args=(port, ca_pem, devices[c::clients], child)
            )
            p.start()
            pipes.append(parent)
            procs.append(p)
        got: dict[str, tuple[float, str]] = {}
        reconnects: dict[int, dict[str, int]] = {}

        def collect(until: Callable[[], bool], timeout: float) -> None:
            deadline = time.monotonic() + timeout
            while not until() and time.monotonic() < deadline:
                for pipe in pipes:
                    while pipe.poll(0.01):
                        item = pipe.recv()
                        if item[0] == "error":
                            raise RuntimeError(f"client failed: {item}")
                        events, reasons = item
                        reconnects[id(pipe)] = reasons
                        for name, t, version in events:
                            got[name] = (t, version)
            if not until():
                raise RuntimeError(f"timed out: {sum(1 for v in got.values())} of {n} devices")

        collect(lambda: len(got) == n and all(v == "1.0.0" for _, v in got.values()), 300)
        time.sleep(1.0)
        rss1 = proc.memory_info().rss
        # steady state: heartbeats only
        io0, t_io = _proc_io(hub.pid), time.monotonic()
        time.sleep(3 * heartbeat_s)
        io1, t_io1 = _proc_io(hub.pid), time.monotonic()
        bits_per_s_per_device = (io1 - io0) * 8 / (t_io1 - t_io) / n
        t0 = _push_and_apply(data, port, "1.0.1")
        collect(lambda: all(v == "1.0.1" for _, v in got.values()), 300)
        lat = sorted(t - t0 for t, _ in got.values())
        for p in procs:
            p.terminate()
        return {
            "all_acked_s": lat[-1],
            "p50_s": percentile(lat, 50),
            "p99_s": percentile(lat, 99),
            "rss_per_device_kib": (rss1 - rss0) / 1024 / n,
            "steady_kbit_s_per_device_at_interval": bits_per_s_per_device / 1000,
            "heartbeat_interval_s": heartbeat_s,
            "reconnects": _merge(reconnects.values()),
            "steady_kbit_s_per_device_at_30s": bits_per_s_per_device / 1000 * heartbeat_s / 30.0,
        }
    finally:
        hub.stop(30)


def _push_and_apply(data: Path, port: int, version: str, *, first: bool = False) -> float:
    """Push a model version (signed with the hub's quickstart publisher key), then time the
    Apply RPC that points every device at it; returns the wall time just before Apply."""
    import subprocess

    import grpc

    from edgefleet.demo import TINY_MLP, build_mlp
    from edgefleet.launching import program_command
    from edgefleet.v1 import admin_pb2, admin_pb2_grpc

    model = data / f"bench-{version}.onnx"
    build_mlp(model, TINY_MLP, seed=len(version) + int(version.replace(".", "")))
    subprocess.run(
        program_command("edgectl", "--config", data / "admin.toml", "models", "push", model,
                        "--name", "bench", "--version", version),
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    doc = json.loads(json.dumps(DEPLOYMENT))
    doc["spec"]["model"]["version"] = version
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
        stub.Apply(admin_pb2.ApplyRequest(documents=[json.dumps(doc).encode()]), timeout=60)
    del first
    return t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", default="500,1000,2000")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only", choices=["raw", "hub"], help="measure one side only")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        certs = _make_certs(Path(tmp))
        results = []
        for n in [int(x) for x in args.devices.split(",")]:
            row: dict[str, Any] = {"devices": n}
            if args.only != "hub":
                raw = row["raw"] = measure_raw(n, args.clients, certs)
                if not args.json:
                    print(
                        f"N={n:5d}  raw push+ack {raw['seconds'] * 1000:7.1f} ms  "
                        f"server RSS/stream {raw['rss_per_stream_kib']:.0f} KiB",
                        flush=True,
                    )
            if args.only != "raw":
                h = row["hub"] = measure_hub(n, args.clients, Path(tmp))
                if not args.json:
                    ratio = (
                        f" = {h['all_acked_s'] / row['raw']['seconds']:.2f}x raw"
                        if "raw" in row
                        else ""
                    )
                    print(
                        f"N={n:5d}  hub all acked {h['all_acked_s'] * 1000:7.1f} ms{ratio}  "
                        f"p50 {h['p50_s'] * 1000:.0f} ms  p99 {h['p99_s'] * 1000:.0f} ms  "
                        f"hub RSS/device {h['rss_per_device_kib']:.0f} KiB  "
                        f"steady {h['steady_kbit_s_per_device_at_30s']:.3f} kbit/s/device "
                        f"(at 30 s heartbeats; "
                        f"{h['steady_kbit_s_per_device_at_interval']:.3f} at "
                        f"{h['heartbeat_interval_s']:g} s)",
                        flush=True,
                    )
            results.append(row)
        if args.json:
            print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    sys.exit(main())
