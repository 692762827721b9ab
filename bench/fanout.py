"""Hub fan-out: time for a push to reach N devices over real mTLS gRPC streams (see BENCHMARKS.md).

Baseline (``raw``): a bare grpcio asyncio server with one bidirectional stream per simulated
device; it writes a 1 KB message to every stream and times until every device has answered
with an acknowledgement. Devices are spread over several client processes (one HTTP/2
connection each: a local subchannel pool, as separate devices would have), so that clients are
not the bottleneck. The server's RSS per connected stream is measured too.

    .venv/bin/python bench/fanout.py --devices 500,1000,2000 [--clients 4] [--json]

The hub's own figure (``hub``: a real hub, real enrolled device certificates, the Sync stream)
is measured against this baseline in the same run when the hub is built.
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", default="500,1000,2000")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        certs = _make_certs(Path(tmp))
        results = []
        for n in [int(x) for x in args.devices.split(",")]:
            raw = measure_raw(n, args.clients, certs)
            results.append({"devices": n, "raw": raw})
            if not args.json:
                print(
                    f"N={n:5d}  raw push+ack {raw['seconds'] * 1000:7.1f} ms  "
                    f"server RSS/stream {raw['rss_per_stream_kib']:.0f} KiB",
                    flush=True,
                )
        if args.json:
            print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    sys.exit(main())
