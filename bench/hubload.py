"""Hub under load: store size and RSS under an hour of status traffic, compaction's cost, and
enrollment throughput while a brute-force client runs (issue 14; method: BENCHMARKS.md).

    .venv/bin/python bench/hubload.py [--devices 2000] [--hour-in 120] [--clients 4]
    .venv/bin/python bench/hubload.py --only enroll

**Status traffic.** A real ``hub serve`` (SQLite, its own CA) and N simulated devices, each with
its own certificate and HTTP/2 connection, speaking Sync: Hello, then a *changed* Status every
``--status-every`` seconds (default 30 s: pessimistic, since edged sends status only when it
changes) plus a heartbeat every 30 s. One hour is compressed into ``--hour-in`` seconds
(factor k = 3600 / hour-in) and every interval of the hub is scaled by the same k: status and
heartbeat periods, ``[history] retention`` (15 min) and ``compactionPeriod`` (5 min), the
heartbeat grace, and the per-device status rate limit (raised by k, since a compressed device
sends k times as often). Each device's statuses stay at least 0.2 s apart (the writer's batch),
so no write is coalesced that would not be in real time; the store sees the same number of
writes per hub-hour as in real time. Two phases in the same run, same traffic:

* ``baseline``: compaction off (retention longer than the run), as before issue 14;
* ``compacted``: the defaults, scaled.

Figures: hub RSS and store size (hub.db + WAL) at the start, every 10 % of the hour and at the
end; history rows kept; each compaction's duration (from the hub's ``store-compacted`` log
events). The ratio end/start of the store size in each phase says whether growth is bounded.

**Enrollment.** A real hub; legitimate devices enroll with fresh CSRs, each over its own
connection from its own source address (127.0.1.x, through a relay that binds the source
address, so the hub sees distinct peers as it would in the field); the attacker sends wrong
secrets for the same token id as fast as it can from one address, and, in a second round, from
64 addresses. Baseline: legitimate enrollments/s with no attacker, same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.simfleet import device_sync  # noqa: E402


def _set(toml: Path, **values: str) -> None:
    text = toml.read_text()
    for key, value in values.items():
        text, n = re.subn(rf"^{key} = .*$", f"{key} = {value}", text, flags=re.M)
        assert n == 1, key
    toml.write_text(text)


def _file_mib(path: Path) -> float:
    return path.stat().st_size / 2**20 if path.exists() else 0.0


def _sample(t: float, proc: Any, data: Path) -> dict[str, float]:
    db, wal = _file_mib(data / "hub.db"), _file_mib(data / "hub.db-wal")
    return {
        "t": t,
        "rss_mib": proc.memory_info().rss / 2**20,
        "db_mib": db,
        "wal_mib": wal,
        "store_mib": db + wal,
        "history_rows": _history_rows(data),
    }


def _history_rows(data: Path) -> int:
    import sqlite3

    db = sqlite3.connect(f"file:{data / 'hub.db'}?mode=ro", uri=True)
    try:
        return int(db.execute("SELECT count(*) FROM events").fetchone()[0])
    finally:
        db.close()


# -- status traffic --------------------------------------------------------------------------


def _status_client_main(
    port: int,
    ca: bytes,
    devices: list[tuple[str, bytes, bytes]],
    status_every: float,
    heartbeat_every: float,
    duration: float,
    conn: Any,
) -> None:
    import random

    import grpc

    from edgefleet.v1 import common_pb2, device_pb2

    async def session(
        name: str, creds: Any, deadline: float, counts: dict[str, int], i: list[int]
    ) -> None:
        async with device_sync(port, creds, name) as call:
            await call.read()
            await asyncio.sleep(random.uniform(0, status_every))
            next_beat = time.monotonic() + heartbeat_every
            while time.monotonic() < deadline:
                i[0] += 1
                n = i[0]
                workload = device_pb2.WorkloadStatus(
                    name="det",
                    model_version="1.0.0",
                    revision=f"r{n % 7}",
                    desired_replicas=1,
                    ready_replicas=n % 2,
                    conditions=[
                        common_pb2.Condition(
                            type="Ready", status="True" if n % 2 else "False", reason="Probe"
                        )
                    ],
                )
                await call.write(
                    device_pb2.DeviceMessage(status=device_pb2.Status(workloads=[workload]))
                )
                counts["status"] += 1
                if time.monotonic() >= next_beat:
                    await call.write(device_pb2.DeviceMessage(heartbeat=device_pb2.Heartbeat()))
                    next_beat += heartbeat_every
                await asyncio.sleep(status_every)
            call.cancel()

    async def device(name: str, key: bytes, cert: bytes, counts: dict[str, int]) -> None:
        """One device: reconnects with jittered backoff like edged; counts why it had to."""
        creds = grpc.ssl_channel_credentials(ca, key, cert)
        deadline = time.monotonic() + duration
        i = [0]
        attempt = 0
        while time.monotonic() < deadline:
            try:
                await session(name, creds, deadline, counts, i)
                return
            except grpc.aio.AioRpcError as exc:
                reason = f"reconnect after {exc.code().name}"
                counts[reason] = counts.get(reason, 0) + 1
            attempt += 1
            await asyncio.sleep(random.uniform(0, min(10.0, 0.5 * 2.0**attempt)))

    async def run() -> None:
        counts = {"status": 0}
        await asyncio.gather(*(device(n, k, c, counts) for n, k, c in devices))
        conn.send(counts)

    asyncio.run(run())


def _make_hub(workdir: Path, name: str, n: int, k: float, *, compaction: bool) -> dict[str, Any]:
    from edgefleet.launching import free_port_pair, program_command
    from hub import pki
    from hub.decide.devices import Device
    from hub.state import storekeys as objects
    from hub.state.store import Put, open_store

    data = workdir / name
    port = free_port_pair()
    subprocess.run(
        program_command("hub", "init", "--data-dir", data, "--hub-address", f"127.0.0.1:{port}"),
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    retention = 900 / k if compaction else 10 * 24 * 3600
    _set(
        data / "hub.toml",
        heartbeatInterval=f'"{30 / k:g}s"',
        heartbeatGrace=f'"{90 / k:g}s"',
        statusRate=f"{k:g}",
        statusBurst=f"{max(30, int(k * 30))}",
        retention=f'"{retention:g}s"',
        compactionPeriod=f'"{300 / k:g}s"',
    )
    ca = pki.load_certified_key(data / "ca.crt", data / "ca.key")
    devices, records = [], []
    for i in range(n):
        dname = f"sim-{i:05d}"
        ck = pki.issue_client_certificate(ca, pki.Identity(pki.Role.DEVICE, dname, "default"))
        devices.append((dname, pki.private_key_pem(ck.key), pki.certificate_pem(ck.certificate)))
        records.append(Device(dname, certificate_serial=format(ck.certificate.serial_number, "x")))

    async def seed() -> None:
        store = await open_store(None, data_dir=data)
        await store.txn(
            (), [Put(objects.device_key(d.name), objects.dumps(d.to_json())) for d in records]
        )
        await store.close()

    asyncio.run(seed())
    return {"data": data, "port": port, "devices": devices}


def measure_status(
    workdir: Path,
    n: int,
    hour_in: float,
    clients: int,
    status_every_real: float,
    *,
    compaction: bool,
    hours: float = 1.0,
) -> dict[str, Any]:
    import psutil

    from edgefleet.launching import start_hub

    k = 3600.0 / hour_in
    status_every = status_every_real / k
    if status_every < 0.2:
        raise SystemExit(
            f"--hour-in {hour_in:g} compresses too much: statuses {status_every:.3f} s apart"
        )
    phase = "compacted" if compaction else "baseline"
    made = _make_hub(workdir, phase, n, k, compaction=compaction)
    data, port = made["data"], made["port"]
    log = workdir / f"{phase}.log"
    hub = start_hub(data, listen=f"127.0.0.1:{port}", log=log, args=["--log-level", "info"])
    samples: list[dict[str, float]] = []
    try:
        hub.wait_listening(60)
        proc = psutil.Process(hub.pid)
        time.sleep(1.0)
        start = _sample(0.0, proc, data)
        duration = hour_in * hours
        ctx = mp.get_context("spawn")
        pipes, procs = [], []
        ca_pem = (data / "ca.crt").read_bytes()
        for c in range(clients):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=_status_client_main,
                args=(
                    port,
                    ca_pem,
                    made["devices"][c::clients],
                    status_every,
                    30 / k,
                    duration,
                    child,
                ),
            )
            p.start()
            pipes.append(parent)
            procs.append(p)
        t0 = time.monotonic()
        samples.append(start)
        while any(p.is_alive() for p in procs) and time.monotonic() - t0 < duration + 120:
            time.sleep(hour_in / 10)
            samples.append(_sample((time.monotonic() - t0) * k / 60, proc, data))  # hub-minutes
        counts: dict[str, int] = {}
        for pipe, p in zip(pipes, procs, strict=True):
            if pipe.poll(60):
                for key, value in pipe.recv().items():
                    counts[key] = counts.get(key, 0) + value
            else:
                counts[f"client {p.pid} failed (exit {p.exitcode})"] = 1
        for p in procs:
            p.join(10)
        time.sleep(2.0)
        end = _sample((time.monotonic() - t0) * k / 60, proc, data)
        samples.append(end)
    finally:
        hub.stop(30)
    compactions = []
    for line in log.read_text().splitlines():
        if '"store-compacted"' in line:
            compactions.append(json.loads(line)["took_ms"])
    return {
        "phase": phase,
        "hours": hours,
        "devices": n,
        "statuses": counts.get("status", 0),
        "errors": {k_: v for k_, v in counts.items() if k_ != "status"},
        "samples": samples,
        "history_rows": _history_rows(data),
        "compactions_ms": compactions,
    }


# -- enrollment ------------------------------------------------------------------------------


class SourceRelay:
    """127.0.0.1:port -> the hub, each accepted connection from the next source address of
    ``sources`` (so that the hub sees distinct peers, as it would in the field)."""

    def __init__(self, target: int, sources: list[str]) -> None:
        self.target, self.sources, self.next = target, sources, 0
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=512)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            source = self.sources[self.next % len(self.sources)]
            self.next += 1
            try:
                hub = socket.create_connection(
                    ("127.0.0.1", self.target), source_address=(source, 0)
                )
            except OSError:
                client.close()
                continue
            for a, b in ((client, hub), (hub, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


def _csrs(n: int) -> list[bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    out = []
    for i in range(n):
        key = ec.generate_private_key(ec.SECP256R1())
        csr = (
            x509.CertificateSigningRequestBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"d{i}")]))
            .sign(key, hashes.SHA256())
        )
        out.append(csr.public_bytes(serialization.Encoding.PEM))
    return out


def _attacker_main(port: int, ca: bytes, token_id: str, duration: float, conn: Any) -> None:
    """Wrong guesses as fast as one client can: for ``token_id`` ("" : random ids too)."""
    import random
    import string

    import grpc

    from edgefleet.v1 import enrollment_pb2, enrollment_pb2_grpc

    counts: dict[str, int] = {}
    creds = grpc.ssl_channel_credentials(ca)
    options = [
        ("grpc.ssl_target_name_override", "localhost"),
        ("grpc.use_local_subchannel_pool", 1),
    ]
    channel = grpc.secure_channel(f"127.0.0.1:{port}", creds, options=options)
    stub = enrollment_pb2_grpc.EnrollmentServiceStub(channel)
    deadline = time.monotonic() + duration
    i = 0
    while time.monotonic() < deadline:
        i += 1
        if i % 10 == 0:  # a new connection now and then: from the relay's next address
            channel.close()
            channel = grpc.secure_channel(f"127.0.0.1:{port}", creds, options=options)
            stub = enrollment_pb2_grpc.EnrollmentServiceStub(channel)
        tid = token_id or "".join(random.choices(string.ascii_lowercase + string.digits, k=6))
        guess = f"{tid}.{i:016d}"[:23]
        try:
            stub.Enroll(
                enrollment_pb2.EnrollRequest(token=guess, csr_pem=b"x", name="evil"), timeout=5
            )
            code = "OK"
        except grpc.RpcError as exc:
            code = exc.code().name
        counts[code] = counts.get(code, 0) + 1
    channel.close()
    conn.send(counts)


def _legit_enroll(
    port: int, ca: bytes, token: str, csrs: list[bytes], prefix: str
) -> tuple[float, int, dict[str, int]]:
    import grpc

    from edgefleet.v1 import enrollment_pb2, enrollment_pb2_grpc

    creds = grpc.ssl_channel_credentials(ca)
    ok, refused = 0, {}
    t0 = time.monotonic()
    for i, csr in enumerate(csrs):
        with grpc.secure_channel(
            f"127.0.0.1:{port}",
            creds,
            options=[
                ("grpc.ssl_target_name_override", "localhost"),
                ("grpc.use_local_subchannel_pool", 1),
            ],
        ) as channel:
            stub = enrollment_pb2_grpc.EnrollmentServiceStub(channel)
            try:
                stub.Enroll(
                    enrollment_pb2.EnrollRequest(token=token, csr_pem=csr, name=f"{prefix}-{i}"),
                    timeout=10,
                )
                ok += 1
            except grpc.RpcError as exc:
                refused[exc.code().name] = refused.get(exc.code().name, 0) + 1
    return time.monotonic() - t0, ok, refused


def measure_enroll(workdir: Path, legit: int, attack_s: float) -> dict[str, Any]:
    from edgefleet.launching import free_port_pair, program_command, start_hub

    data = workdir / "enroll"
    port = free_port_pair()
    subprocess.run(
        program_command("hub", "init", "--data-dir", data, "--hub-address", f"127.0.0.1:{port}"),
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    token = subprocess.run(
        program_command("hub", "token", "create", "--data-dir", data),
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    token_id = token.split(".")[0]
    hub = start_hub(
        data,
        listen=f"127.0.0.1:{port}",
        log=workdir / "enroll.log",
        args=["--log-level", "warning"],
    )
    ca = (data / "ca.crt").read_bytes()
    enroll_port = port + 1
    legit_relay = SourceRelay(enroll_port, [f"127.0.1.{i}" for i in range(1, 251)])
    attacker_one = SourceRelay(enroll_port, ["127.0.2.1"])
    attacker_many = SourceRelay(enroll_port, [f"127.0.3.{i}" for i in range(1, 65)])
    rows: dict[str, Any] = {}
    try:
        hub.wait_listening(60)
        csrs = _csrs(4 * legit)
        seconds, ok, refused = _legit_enroll(legit_relay.port, ca, token, csrs[:legit], "base")
        rows["baseline"] = {"per_s": ok / seconds, "ok": ok, "refused": refused}
        rounds = [
            ("random ids, 1 address", attacker_one, "", csrs[legit : 2 * legit]),
            ("random ids, 64 addresses", attacker_many, "", csrs[2 * legit : 3 * legit]),
            ("known id, 1 address", attacker_one, token_id, csrs[3 * legit :]),
        ]
        for label, relay, target, part in rounds:
            ctx = mp.get_context("spawn")
            parent, child = ctx.Pipe()
            attacker = ctx.Process(
                target=_attacker_main, args=(relay.port, ca, target, attack_s, child)
            )
            attacker.start()
            time.sleep(1.0)
            seconds, ok, refused = _legit_enroll(
                legit_relay.port, ca, token, part, label[:1] + label[-9:-8] + str(len(rows))
            )
            counts = parent.recv()
            attacker.join(30)
            rows[label] = {
                "per_s": ok / seconds,
                "ok": ok,
                "refused": refused,
                "attacker": counts,
                "attacker_guesses_checked_per_s": counts.get("UNAUTHENTICATED", 0) / attack_s,
                "attacker_attempts_per_s": sum(counts.values()) / attack_s,
            }
    finally:
        for r in (legit_relay, attacker_one, attacker_many):
            r.close()
        hub.stop(30)
    return rows


def _print_status(row: dict[str, Any], hour_in: float) -> None:
    s = row["samples"]
    print(
        f"{row['phase']:9s} {row['devices']} devices, {row['statuses']} statuses in "
        f"{row['hours']:g} hub-hour(s) of {hour_in:g} s: "
        f"store {s[0]['store_mib']:.1f} -> {s[-1]['store_mib']:.1f} MiB "
        f"({s[-1]['store_mib'] / max(s[0]['store_mib'], 0.001):.1f}x), "
        f"RSS {s[0]['rss_mib']:.0f} -> {s[-1]['rss_mib']:.0f} MiB, "
        f"history rows {row['history_rows']}"
        + (f", errors {row['errors']}" if row["errors"] else "")
    )
    print(
        "          db+WAL MiB by hub-minute: "
        + "  ".join(f"{x['t']:.0f}:{x['db_mib']:.1f}+{x['wal_mib']:.1f}" for x in s)
    )
    print(
        "          history rows by hub-minute: "
        + "  ".join(f"{x['t']:.0f}:{x['history_rows']}" for x in s)
    )
    print(
        "          RSS MiB by hub-minute:   "
        + "  ".join(f"{x['t']:.0f}:{x['rss_mib']:.0f}" for x in s)
    )
    if row["compactions_ms"]:
        c = row["compactions_ms"]
        print(
            f"          compactions: {len(c)}, median {statistics.median(c):.0f} ms, "
            f"max {max(c):.0f} ms"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=2000)
    ap.add_argument("--hour-in", type=float, default=120.0, help="seconds one hub-hour takes")
    ap.add_argument("--hours", type=float, default=1.0, help="hub-hours of traffic")
    ap.add_argument("--status-every", type=float, default=30.0, help="real seconds per status")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--legit", type=int, default=60, help="legitimate enrollments per round")
    ap.add_argument("--attack-seconds", type=float, default=20.0)
    ap.add_argument("--only", choices=["status", "enroll"])
    ap.add_argument("--json", type=Path, help="also write every figure here")
    args = ap.parse_args()
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.only != "enroll":
            out["status"] = []
            for compaction in (False, True):
                row = measure_status(
                    work, args.devices, args.hour_in, args.clients, args.status_every,
                    compaction=compaction, hours=args.hours,
                )  # fmt: skip
                out["status"].append(row)
                _print_status(row, args.hour_in)
            base, comp = out["status"]
            print(
                f"store at the end: compacted / baseline = "
                f"{comp['samples'][-1]['store_mib'] / base['samples'][-1]['store_mib']:.2f}; "
                f"history rows {comp['history_rows']} / {base['history_rows']}"
            )
        if args.only != "status":
            rows = out["enroll"] = measure_enroll(work, args.legit, args.attack_seconds)
            base_rate = rows["baseline"]["per_s"]
            for label, r in rows.items():
                extra = ""
                if "attacker" in r:
                    extra = (
                        f"; attacker {r['attacker_attempts_per_s']:.0f} attempts/s, "
                        f"{r['attacker_guesses_checked_per_s']:.1f} guesses/s checked, "
                        f"answers {r['attacker']}"
                    )
                print(
                    f"enroll {label:21s} {r['per_s']:6.1f} legit enrollments/s "
                    f"({r['per_s'] / base_rate:.2f}x baseline), ok {r['ok']}, "
                    f"refused {r['refused']}{extra}"
                )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
