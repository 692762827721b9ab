"""The scale model's measurements: what one device costs a hub, measured, and what a fleet of
100,000 and 1,000,000 devices needs by that measure (docs/scale.md states the model).

    .venv/bin/python bench/scale.py [--devices 300,1200] [--seconds 60] [--status-every 2]

For each size N: a real ``hub serve`` (SQLite store, its own CA) with N enrolled device
records, and N simulated devices (bench/hubload.py's: each its own certificate, its own mTLS
HTTP/2 connection, Sync with Hello, then a changed Status every ``--status-every`` seconds
and a heartbeat every 30 s), spread over ``--clients`` processes. Measured on the hub
process (psutil):

* **memory per device**: RSS once every device is connected and has reported, at each size;
  the slope between the two sizes is the cost of one more device (record in the cache,
  session, HTTP/2 stream, TLS state), the intercept the hub's own;
* **CPU per status message**: the hub's CPU seconds (user + system) over the window divided
  by the status messages it received (heartbeats ride along, TLS and HTTP/2 included);
* **store bytes per device**: the stored device records (the JSON values under
  ``/devices/``, mean), and in a real etcd (one member on loopback, started here): N such
  records put, history compacted and the backend defragmented, etcd's own
  ``etcd_mvcc_db_total_size_in_use_in_bytes`` before and after, divided by N.

Baseline, same run: the memory and CPU per message of the same clients against a bare gRPC
server that reads the same stream and does nothing (bench/fanout.py's ``measure_raw``
method is the fan-out's; here a Sync echo): the hub's figures are given as a ratio of it.
The extrapolation (hubs per region, etcd size) is printed from the slopes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for path in (REPO, REPO / "tests", REPO / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from hubload import _make_hub, _status_client_main  # noqa: E402

HEARTBEAT_S = 30.0


def _run_clients(port: int, ca: bytes, devices: list[Any], every: float, seconds: float,
                 clients: int) -> dict[str, int]:  # fmt: skip
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for c in range(clients):
        parent, child = ctx.Pipe()
        p = ctx.Process(
            target=_status_client_main,
            args=(port, ca, devices[c::clients], every, HEARTBEAT_S, seconds, child),
        )
        p.start()
        pipes.append(parent)
        procs.append(p)
    counts: dict[str, int] = {}
    for pipe, p in zip(pipes, procs, strict=True):
        if pipe.poll(seconds + 180):
            for key, value in pipe.recv().items():
                counts[key] = counts.get(key, 0) + value
        p.join(30)
    return counts


def measure_hub(
    workdir: Path, n: int, seconds: float, every: float, clients: int
) -> dict[str, Any]:
    import psutil

    from edgefleet.launching import start_hub

    made = _make_hub(workdir, f"hub{n}", n, 1.0, compaction=True)
    data, port = made["data"], made["port"]
    hub = start_hub(data, listen=f"127.0.0.1:{port}", log=workdir / f"hub{n}.log")
    try:
        hub.wait_listening(60)
        proc = psutil.Process(hub.pid)
        time.sleep(2.0)
        idle_rss = proc.memory_info().rss
        ca = (data / "ca.crt").read_bytes()
        cpu0 = sum(proc.cpu_times()[:2])
        result: dict[str, Any] = {}

        def sample_rss() -> None:  # while every device is connected, late in the window
            time.sleep(seconds * 0.8)
            result["rss"] = proc.memory_info().rss

        import threading

        sampler = threading.Thread(target=sample_rss)
        sampler.start()
        counts = _run_clients(port, ca, made["devices"], every, seconds, clients)
        sampler.join()
        cpu = sum(proc.cpu_times()[:2]) - cpu0
    finally:
        hub.stop(30)
    records = asyncio.run(_device_records(data))
    return {
        "devices": n,
        "idle_rss": idle_rss,
        "rss": result["rss"],
        "cpu_s": cpu,
        "statuses": counts.get("status", 0),
        "errors": {k: v for k, v in counts.items() if k != "status"},
        "record_bytes": statistics.mean(len(r) for r in records) if records else 0,
        "records": records,
        "db_bytes": (data / "hub.db").stat().st_size,
    }


async def _device_records(data: Path) -> list[bytes]:
    from hub.state import storekeys
    from hub.state.store import open_store

    store = await open_store(None, data_dir=data)
    try:
        return [kv.value for kv in (await store.range(storekeys.DEVICES)).kvs]
    finally:
        await store.close()


# -- baseline: a bare Sync server ------------------------------------------------------------


def _bare_server_main(data: str, port: int, conn: Any) -> None:
    import grpc

    from edgefleet.v1 import device_pb2, device_pb2_grpc

    class Bare(device_pb2_grpc.DeviceServiceServicer):
        async def Sync(self, request_iterator: Any, context: Any) -> Any:
            first = True
            async for _ in request_iterator:
                if first:
                    first = False
                    yield device_pb2.HubMessage(desired_state=device_pb2.DesiredState())

    async def main() -> None:
        d = Path(data)
        creds = grpc.ssl_server_credentials(
            [((d / "hub.key").read_bytes(), (d / "hub.crt").read_bytes())],
            root_certificates=(d / "ca.crt").read_bytes(),
            require_client_auth=True,
        )
        server = grpc.aio.server()
        device_pb2_grpc.add_DeviceServiceServicer_to_server(Bare(), server)  # type: ignore[no-untyped-call]
        server.add_secure_port(f"127.0.0.1:{port}", creds)
        await server.start()
        conn.send("up")
        await server.wait_for_termination()

    asyncio.run(main())


def measure_bare(
    workdir: Path, n: int, seconds: float, every: float, clients: int
) -> dict[str, Any]:
    import psutil

    made = _make_hub(workdir, f"bare{n}", n, 1.0, compaction=True)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    server = ctx.Process(target=_bare_server_main, args=(str(made["data"]), made["port"], child))
    server.start()
    try:
        assert parent.poll(60) and parent.recv() == "up"
        proc = psutil.Process(server.pid)
        time.sleep(1.0)
        cpu0 = sum(proc.cpu_times()[:2])
        result: dict[str, Any] = {}

        def sample_rss() -> None:
            time.sleep(seconds * 0.8)
            result["rss"] = proc.memory_info().rss

        import threading

        sampler = threading.Thread(target=sample_rss)
        sampler.start()
        counts = _run_clients(
            made["port"], (made["data"] / "ca.crt").read_bytes(), made["devices"], every,
            seconds, clients,
        )  # fmt: skip
        sampler.join()
        cpu = sum(proc.cpu_times()[:2]) - cpu0
    finally:
        server.kill()
        server.join()
    return {"devices": n, "rss": result["rss"], "cpu_s": cpu, "statuses": counts.get("status", 0)}


# -- etcd bytes per device -------------------------------------------------------------------


def _etcd_in_use(etcd: Any) -> int:
    url = f"http://127.0.0.1:{etcd.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    match = re.search(r"^etcd_mvcc_db_total_size_in_use_in_bytes (\S+)$", text, re.M)
    assert match, "etcd reports no db size in use"
    return int(float(match.group(1)))


async def measure_etcd(workdir: Path, records: list[bytes], n: int) -> dict[str, float]:
    import aetcd
    from etcdtesting import EtcdServer

    from hub.state import storekeys
    from hub.state.store import EtcdStore, Put

    etcd = EtcdServer(workdir / "etcd").start()
    try:
        store = await EtcdStore.open([etcd.endpoint], namespace="/eu")
        host, port = etcd.endpoint.split(":")
        client = aetcd.Client(host=host, port=int(port))
        await client.connect()
        before = _etcd_in_use(etcd)
        ops = [
            Put(storekeys.device_key(f"sim-{i:07d}"), records[i % len(records)]) for i in range(n)
        ]
        for first in range(0, n, 1000):
            await store.txn((), ops[first : first + 1000])
        revision = (await store.range("/hub/none")).revision
        await client.compact(revision, physical=True)
        await client.defragment()
        await asyncio.sleep(1.0)
        after = _etcd_in_use(etcd)
        await client.close()
        await store.close()
    finally:
        etcd.stop()
    return {"devices": n, "bytes_per_device": (after - before) / n}


def watch_cost(records: list[bytes], rounds: int = 20) -> float:
    """CPU seconds per device record a replica takes from its watch (every replica follows
    every device record, hub/controllers/replicas.py ReplicaDevices): decode, Device, compare."""
    from hub.decide.devices import Device
    from hub.state import storekeys

    previous = {}
    started = time.process_time()
    for _ in range(rounds):
        for value in records:
            record = storekeys.loads(value)
            device = Device.from_json(record)
            old = previous.get(device.name)
            if old is None or old.with_(last_heartbeat=None) != device.with_(last_heartbeat=None):
                previous[device.name] = device
    return (time.process_time() - started) / (rounds * len(records))


# -- the model -------------------------------------------------------------------------------


def _slope(points: list[tuple[float, float]]) -> tuple[float, float]:
    (x1, y1), (x2, y2) = points[0], points[-1]
    slope = (y2 - y1) / (x2 - x1)
    return slope, y1 - slope * x1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", default="300,1200", help="two sizes, comma-separated")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--status-every", type=float, default=2.0)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--etcd-devices", type=int, default=20_000)
    p.add_argument("--json", type=Path, help="write every figure here")
    p.add_argument("--model-from", type=Path, help="no measuring: the model from a --json file")
    args = p.parse_args()
    if args.model_from is not None:
        figures = json.loads(args.model_from.read_text())
        report(figures, args.status_every, args.seconds)
        return 0
    sizes = [int(s) for s in args.devices.split(",")]
    rows, bare = [], []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        work = Path(tmp)
        for n in sizes:
            rows.append(measure_hub(work, n, args.seconds, args.status_every, args.clients))
            bare.append(measure_bare(work, n, args.seconds, args.status_every, args.clients))
        etcd = asyncio.run(measure_etcd(work, rows[-1]["records"], args.etcd_devices))
    watch = watch_cost(rows[-1].pop("records"))
    rows[0].pop("records")
    figures = {"hub": rows, "bare": bare, "etcd": etcd, "watch_s": watch}
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1))
    report(figures, args.status_every, args.seconds)
    return 0


STATUS_EVERY_S = 60.0
"""The model: a device sends a changed status every 60 s on average (docs/scale.md)."""
HEARTBEAT_EVERY_S = 30.0
RECORD_WRITE_EVERY_S = 20.0
"""On replicas a device's record is written on each status and, without one, its heartbeat
time every heartbeatGrace / 4 (22.5 s by default): about every 20 s."""
BUDGET_CORES = 0.5
"""A replica is one event loop: sized to use half a core."""


def report(figures: dict[str, Any], status_every: float, seconds: float) -> None:
    rows, bare, etcd, watch = figures["hub"], figures["bare"], figures["etcd"], figures["watch_s"]
    mib = 2**20
    conn_slope, _ = _slope([(r["devices"], r["rss"] - r["idle_rss"]) for r in rows])
    record_slope, mem_base = _slope([(r["devices"], r["idle_rss"]) for r in rows])
    bare_slope, _ = _slope([(b["devices"], b["rss"]) for b in bare])
    cpu_per_msg = [r["cpu_s"] / max(r["statuses"], 1) for r in rows]
    bare_cpu = [b["cpu_s"] / max(b["statuses"], 1) for b in bare]
    sizes = [r["devices"] for r in rows]
    print(f"scale model: {', '.join(map(str, sizes))} simulated devices, a changed status every "
          f"{status_every:g} s for {seconds:g} s; hub on SQLite")  # fmt: skip
    for r, b, c, bc in zip(rows, bare, cpu_per_msg, bare_cpu, strict=True):
        print(f"  {r['devices']:6d} devices: hub RSS {r['rss'] / mib:7.1f} MiB (idle with the "
              f"records {r['idle_rss'] / mib:.1f}), bare {b['rss'] / mib:6.1f} MiB; CPU per status "
              f"{c * 1e6:6.0f} us (bare {bc * 1e6:4.0f} us, ratio {c / bc:.1f}x); "
              f"{r['statuses']} statuses, errors {r['errors'] or 'none'}")  # fmt: skip
    cpu, cpu_bare = statistics.median(cpu_per_msg), statistics.median(bare_cpu)
    record = rows[-1]["record_bytes"]
    print(f"  memory per connected device: {conn_slope / 1024:.1f} KiB (bare gRPC server "
          f"{bare_slope / 1024:.1f} KiB, ratio {conn_slope / bare_slope:.1f}x); per device "
          f"record in the cache {record_slope / 1024:.1f} KiB; hub base {mem_base / mib:.0f} "
          "MiB")  # fmt: skip
    print(f"  CPU per status message: {cpu * 1e6:.0f} us (bare {cpu_bare * 1e6:.0f} us, ratio "
          f"{cpu / cpu_bare:.1f}x; medians over the sizes); per device record taken from the "
          f"watch (every replica): {watch * 1e6:.0f} us")  # fmt: skip
    sqlite_per_device = rows[-1]["db_bytes"] / rows[-1]["devices"]
    print(f"  store: device record {record:.0f} B (JSON); etcd {etcd['bytes_per_device']:.0f} B "
          f"per device in use ({etcd['devices']} records, compacted, defragmented); SQLite "
          f"file {sqlite_per_device:.0f} B per device (with history)")  # fmt: skip
    # Per device and second: the stream's replica pays its statuses (the hub's figure) and
    # heartbeats (the bare server's: a heartbeat only notes the time); every replica pays
    # the record writes it follows.
    stream = cpu / STATUS_EVERY_S + cpu_bare / HEARTBEAT_EVERY_S
    follow = watch / RECORD_WRITE_EVERY_S

    def region_max(replicas: int) -> int:
        return int(BUDGET_CORES / (follow + stream / replicas))

    print(f"  per device: {stream * 1e6:.1f} us/s of stream on its replica, {follow * 1e6:.1f} "
          "us/s on every replica to follow its record")  # fmt: skip
    print("  devices one region takes (replicas: devices): "
          + ", ".join(f"{r}: {region_max(r):,}" for r in (1, 2, 4, 8, 16)))  # fmt: skip
    for fleet in (100_000, 1_000_000):
        regions = 1
        while True:
            per_region = math.ceil(fleet / regions)
            if per_region * follow < BUDGET_CORES * 0.75:  # room left for the streams
                n = math.ceil(per_region * stream / (BUDGET_CORES - per_region * follow))
                if n <= 8:
                    break
            regions += 1
        memory = mem_base + per_region * record_slope + per_region / n * conn_slope
        etcd_bytes = per_region * etcd["bytes_per_device"]
        print(f"  {fleet:>9,} devices: {fleet * stream:.1f} cores of streams in all; "
              f"{regions} region(s) of {per_region:,} devices, each {n} replicas of "
              f"{memory / 2**30:.1f} GiB and an etcd of {etcd_bytes / 2**30:.2f} GiB of "
              f"device records taking {per_region / RECORD_WRITE_EVERY_S:,.0f} record "
              "writes/s")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
