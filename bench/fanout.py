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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import percentile  # noqa: E402
from bench.simfleet import (  # noqa: E402
    SimClients,
    SimHub,
    apply_documents,
    proc_io,
    push_model,
    start_sim_hub,
)

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
        # which these simulated devices do not send; bench/rollout.py measures rollouts).
        # maxUnavailable 100% as bench/modelconfig.py: with 0 the hub, rightly, moves no device
        # that never reported (the version change never reached one: this bench hung)
        "rollout": {"maxSurge": "100%", "maxUnavailable": "100%"},
    },
}


def measure_hub(n: int, clients: int, workdir: Path, heartbeat_s: float = 5.0) -> dict[str, Any]:
    import psutil

    sim = start_sim_hub(workdir, n, lambda i: {"bench": "yes"}, heartbeat_s=heartbeat_s)
    devices = SimClients(sim, clients, heartbeats=True)
    try:
        proc = psutil.Process(sim.pid)
        rss0 = proc.memory_info().rss
        _push_and_apply(sim, "1.0.0")
        devices.start()
        got = devices.got
        devices.collect(
            lambda: len(got) == n and all(r.version == "1.0.0" for r in got.values()), 300
        )
        time.sleep(1.0)
        rss1 = proc.memory_info().rss
        # steady state: heartbeats only
        io0, t_io = proc_io(sim.pid), time.monotonic()
        time.sleep(3 * heartbeat_s)
        io1, t_io1 = proc_io(sim.pid), time.monotonic()
        bits_per_s_per_device = (io1 - io0) * 8 / (t_io1 - t_io) / n
        t0 = _push_and_apply(sim, "1.0.1")
        devices.collect(lambda: all(r.version == "1.0.1" for r in got.values()), 300)
        lat = sorted(r.time - t0 for r in got.values())
        return {
            "all_acked_s": lat[-1],
            "p50_s": percentile(lat, 50),
            "p99_s": percentile(lat, 99),
            "rss_per_device_kib": (rss1 - rss0) / 1024 / n,
            "steady_kbit_s_per_device_at_interval": bits_per_s_per_device / 1000,
            "heartbeat_interval_s": heartbeat_s,
            "reconnects": devices.reconnects,
            "steady_kbit_s_per_device_at_30s": bits_per_s_per_device / 1000 * heartbeat_s / 30.0,
        }
    finally:
        devices.stop()
        sim.stop()


def _push_and_apply(sim: SimHub, version: str) -> float:
    """Push a model version (signed with the hub's quickstart publisher key), then time the
    Apply RPC that points every device at it; returns the wall time just before Apply."""
    push_model(sim.data, version, seed=len(version) + int(version.replace(".", "")))
    doc = json.loads(json.dumps(DEPLOYMENT))
    doc["spec"]["model"]["version"] = version
    return apply_documents(sim.data, sim.port, [doc], timeout=60)


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
