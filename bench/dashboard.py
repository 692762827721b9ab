"""The hub's web dashboard with a large fleet (see /work/shared/BENCHMARKS.md for the method).

A hub data directory (``hub init``) whose SQLite store is given N device records (default
10,000: 5 regions, 200 sites, a few NotReady, unhealthy and Untrusted, each reporting a
workload of one ModelDeployment) by the hub's own device writer; the hub's context is then
loaded from that store as ``hub serve`` loads it, and its dashboard
(:class:`hub.api.dashboard.serving.DashboardServer`, HTTPS, token auth) serves on loopback.

1. **Pages**: each page is fetched R times over one keep-alive HTTPS connection (an aiohttp
   client in the same process); the dashboard's per-second render memo is cleared before
   each fetch, so every fetch is a *first render*. Baseline: a route added to the same
   application that returns a fixed page (same TLS, same middlewares: CSP headers, token
   check), in the same run. Reported per page: median latency, median minus the baseline's
   (the page's own server time), and the bytes of the body.
2. **Live CPU**: the hub process's CPU (user + system, ``time.process_time``) over W seconds
   while a rollout-like stream of device reports goes on (every device reports a new
   revision phase once, spread over the window; events every few updates), first with no
   dashboard open (baseline), then with D dashboards open (D ``curl -N --parallel``
   processes, each following the fleet and the deployment's live sections and the event
   stream: 3 streams per dashboard).

    .venv/bin/python bench/dashboard.py [--devices 10000] [--repeat 20] [--dashboards 10]
        [--window 10] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEPLOYMENT = "detector"
SITES = 200
REGIONS = 5


def _manifest() -> dict[str, Any]:
    return {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": DEPLOYMENT},
        "spec": {
            "model": {"name": "detector", "version": "1.0.0"},
            "placement": {"nodeSelector": {"tier": "edge"}},
        },
    }


def _device(i: int, version: str) -> Any:
    from hub.decide.devices import (
        Attestation,
        Device,
        DevicePhase,
        Health,
        RevisionPhase,
        RevisionReport,
        TrustState,
        WorkloadReport,
    )

    phase = DevicePhase.NOT_READY if i % 97 == 0 else DevicePhase.READY
    revision = RevisionReport(version, phase=RevisionPhase.READY, ready_replicas=1, wanted=True)
    return Device(
        name=f"dev-{i:05d}",
        labels={"region": f"region-{i % REGIONS}", "site": f"site-{i % SITES}", "tier": "edge"},
        reported_labels={"arch": "arm64", "accelerator": "npu" if i % 3 else "none"},
        phase=phase,
        last_heartbeat=time.time(),
        health=Health(i % 53 != 0, ("disk full",) if i % 53 == 0 else ()),
        attestation=Attestation(TrustState.UNTRUSTED if i % 211 == 0 else TrustState.TRUSTED),
        facts={"cpuCount": 4, "memoryBytes": 4 << 30},
        workloads={
            DEPLOYMENT: WorkloadReport(
                version, desired_replicas=1, ready_replicas=1, revisions=(revision,)
            )
        },
    )


async def _seed(data_dir: Path, devices: int) -> None:
    """Write the fleet into the hub's SQLite store through its writer."""
    from hub.decide import apply
    from hub.server import build_context
    from hub.state import storekeys
    from hub.state.store import Put

    ctx = await build_context(data_dir)
    try:
        for i in range(devices):
            ctx.writer.update(_device(i, "1.0.0"))
        await ctx.writer.flush()
        manifest = apply.parse_documents([storekeys.dumps(_manifest())])[0].manifest
        key = storekeys.object_key("ModelDeployment", DEPLOYMENT)
        ops = [Put(key, storekeys.object_value(manifest, time.time()))]
        for i in range(devices):
            name = f"dev-{i:05d}"
            record = storekeys.DesiredRecord(1, (DEPLOYMENT,), "bench")
            ops.append(Put(storekeys.DESIRED + name, storekeys.dumps(record.to_json())))
        await ctx.store.txn((), ops)
        for i in range(0, devices, max(1, devices // 500)):
            ctx.writer.event("Device", f"dev-{i:05d}", "Normal", "Connected", "stream opened")
        await ctx.writer.flush()
    finally:
        await ctx.store.close()


async def _pages(server: Any, url: str, token: str, repeat: int, devices: int) -> dict[str, Any]:
    import ssl

    import aiohttp

    tls = ssl.create_default_context()
    tls.check_hostname = False
    tls.verify_mode = ssl.CERT_NONE
    headers = {"Authorization": f"Bearer {token}"}
    paths = {
        "baseline (static page)": "/bench-baseline",
        "fleet": "/",
        "devices page 1": "/devices",
        "devices filtered, page 2": "/devices?selector=site%3Dsite-7&phase=Ready&page=2&per=20",
        "device": f"/devices/dev-{devices // 2:05d}",
        "deployments": "/deployments",
        "deployment": f"/deployments/{DEPLOYMENT}",
        "events": "/events",
        "models": "/models",
    }
    times: dict[str, list[float]] = {label: [] for label in paths}
    sizes: dict[str, int] = {}
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=tls, limit=1), headers=headers
    ) as session:
        for round_ in range(repeat + 2):  # interleaved: the machine's noise hits every page
            for label, path in paths.items():
                server.dashboard.memo.clear()  # a first render every time
                started = time.perf_counter()
                async with session.get(url + path) as r:
                    body = await r.read()
                    assert r.status == 200, (path, r.status, body[:200])
                if round_ >= 2:  # two warm-up rounds
                    times[label].append(time.perf_counter() - started)
                sizes[label] = len(body)
    out: dict[str, Any] = {
        label: {"median_ms": statistics.median(times[label]) * 1000, "bytes": sizes[label]}
        for label in paths
    }
    base = out["baseline (static page)"]["median_ms"]
    for row in out.values():
        row["server_ms"] = row["median_ms"] - base
    return out


async def _rollout(ctx: Any, devices: int, window: float) -> float:
    """Every device reports a new revision once over ``window`` seconds; CPU seconds used."""
    from hub.decide.devices import RevisionPhase

    started_cpu = time.process_time()
    started = time.monotonic()
    batch = max(1, devices // int(window * 10))
    for start in range(0, devices, batch):
        for i in range(start, min(devices, start + batch)):
            device = ctx.cache.devices[f"dev-{i:05d}"]
            report = device.workloads[DEPLOYMENT]
            rev = report.revisions[0]
            phase = (
                RevisionPhase.LOADING if rev.phase is RevisionPhase.READY else RevisionPhase.READY
            )
            new = rev.__class__(rev.model_version, phase=phase, ready_replicas=1, wanted=True)
            ctx.writer.update(
                device.with_(workloads={DEPLOYMENT: report.__class__(
                    report.model_version, desired_replicas=1, ready_replicas=1, revisions=(new,)
                )})
            )  # fmt: skip
        ctx.writer.event("ModelDeployment", DEPLOYMENT, "Normal", "Progress", f"{start} devices")
        await asyncio.sleep(
            max(0.0, started + window * (start + batch) / devices - time.monotonic())
        )
    await ctx.writer.flush()
    return time.process_time() - started_cpu


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from aiohttp import web

    from hub.initializing import init_hub
    from hub.server import build_context, dashboard_server

    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as tmp:
        data_dir = Path(tmp) / "hub"
        await init_hub(data_dir, region="bench", hub_address="127.0.0.1:7443")
        t0 = time.perf_counter()
        await _seed(data_dir, args.devices)
        seeded = time.perf_counter() - t0
        ctx = await build_context(data_dir)  # loaded from the store, as hub serve does
        stop = asyncio.Event()
        writer = asyncio.create_task(ctx.writer.run(stop))
        server = dashboard_server(ctx, "127.0.0.1:0")

        async def baseline(request: web.Request) -> web.Response:
            return web.Response(text="<!doctype html><p>static</p>" * 50, content_type="text/html")

        server.dashboard.app.router.add_get("/bench-baseline", baseline)
        task = asyncio.create_task(server.run(stop))
        await asyncio.wait_for(server.bound.wait(), 30)
        url = f"https://127.0.0.1:{server.port}"
        token, _ = ctx.dashboard.issue("bench", "0", now=time.time(), ttl=900)
        pages = await _pages(server, url, token, args.repeat, args.devices)

        cpu_without = await _rollout(ctx, args.devices, args.window)
        streams = ["/live/fleet", f"/live/deployments/{DEPLOYMENT}", "/events/stream"]
        curls = [
            subprocess.Popen(  # noqa: ASYNC220 (started once, before measuring)
                [
                    "curl",
                    "-sNkZ",
                    "-H",
                    f"Authorization: Bearer {token}",
                    "-o",
                    "/dev/null",
                    *[url + s for s in streams],
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for _ in range(args.dashboards)
        ]
        try:
            deadline = time.monotonic() + 30
            while (  # noqa: ASYNC110 (curl processes open them)
                server.dashboard.streams < args.dashboards * len(streams)
                and time.monotonic() < deadline
            ):
                await asyncio.sleep(0.1)
            opened = server.dashboard.streams
            cpu_with = await _rollout(ctx, args.devices, args.window)
        finally:
            for c in curls:
                c.terminate()
            for c in curls:
                c.wait(10)
        stop.set()
        await task
        await writer
        await ctx.store.close()
    return {
        "devices": args.devices,
        "seed_s": seeded,
        "pages": pages,
        "live": {
            "window_s": args.window,
            "streams_open": opened,
            "cpu_s_without_dashboards": cpu_without,
            "cpu_s_with_dashboards": cpu_with,
            "cpu_ratio": cpu_with / cpu_without if cpu_without else float("nan"),
            "dashboard_cpu_share": (cpu_with - cpu_without) / args.window,
        },
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--dashboards", type=int, default=10)
    p.add_argument("--window", type=float, default=10.0)
    p.add_argument("--json", type=Path, metavar="PATH", help="also write every figure as JSON")
    args = p.parse_args()
    result = asyncio.run(main_async(args))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{result['devices']} devices (seeded into SQLite in {result['seed_s']:.1f} s)")
    base = result["pages"]["baseline (static page)"]["median_ms"]
    print(f"{'page':28} {'median ms':>10} {'server ms':>10} {'x baseline':>10} {'bytes':>9}")
    for label, row in result["pages"].items():
        print(
            f"{label:28} {row['median_ms']:10.2f} {row['server_ms']:10.2f} "
            f"{row['median_ms'] / base:10.1f} {row['bytes']:9d}"
        )
    live = result["live"]
    print(
        f"hub CPU over {live['window_s']:g} s of device reports: "
        f"{live['cpu_s_without_dashboards']:.2f} s without dashboards, "
        f"{live['cpu_s_with_dashboards']:.2f} s with {live['streams_open']} live streams open "
        f"(x{live['cpu_ratio']:.2f}; dashboards add {100 * live['dashboard_cpu_share']:.1f}% "
        "of a core)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
