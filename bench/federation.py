"""Federation: apply at the root -> every device of every region owed the deployment
(docs/federation.md, issue 16's figure: 10 regions x 1,000 devices, p99 <= 5 s).

    .venv/bin/python bench/federation.py [--regions 10] [--devices 1000] [--repeat 3] [--json]

What is real: a root hub and ``--regions`` regional hubs, each made by ``hub init`` (the
regions with ``hub init --parent``'s enrollment, ``hub.federating.enroll_with_parent``, over
real TLS with the CA pin), each on its own SQLite store, each running its writer, projector,
rollout controller and scheduler; the root serves its gRPC services on loopback with mutual
TLS and each region runs its real ``ParentLink`` (the Federate stream, the artifact fetched
from the root, the slice applied in one transaction). The deployment is applied with a real
``AdminService.Apply`` call at the root with the admin certificate; the model is a real tiny
ONNX file with publisher-signed metadata.

What is simulated (stated, as the issue allows): the devices. ``--devices`` device records per
region are written into each region's store before it starts (Ready, labelled), and a device
counts as *acknowledged* when its region's projector has written its desired state carrying the
deployment (an edged would then get it on its open Sync stream and acknowledge it; that part is
measured by bench/fanout.py). All hubs run in this one process, on this machine's shared cores.

Baseline, same run: ``--regions`` hubs that are not federated, in this same process, each with
``--devices`` devices, the same deployment applied at each of them at once (what the regions
would cost if an operator applied at every one). The figure is p99 (and max) from the Apply
call to a device's desired state, and the ratio federated / hubs alone: what the hop through
the root costs. All hubs share this one process (one core at most): the absolute figures are
about the sum of the regions' work; regional hubs on machines of their own would each take
about one region's share.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import median, percentile  # noqa: E402

DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: {name}}}
spec:
  model: {{name: det, version: "1.0.0"}}
  runtime: {{executionProviders: [CPUExecutionProvider]}}
  replicas: {{perDevice: 1}}
  placement: {{nodeSelector: {{site: a}}}}
"""


async def _seed_devices(data_dir: Path, count: int, prefix: str) -> None:
    from hub import storekeys
    from hub.devices import Device, DevicePhase
    from hub.store import Put, open_hub_store

    store = await open_hub_store(None, data_dir=data_dir)
    now = time.time()
    try:
        ops = [
            Put(
                storekeys.device_key(f"{prefix}-{i}"),
                storekeys.dumps(
                    Device(
                        f"{prefix}-{i}",
                        labels={"site": "a"},
                        phase=DevicePhase.READY,
                        last_heartbeat=now,
                        enrolled_at=now,
                    ).to_json()
                ),
            )
            for i in range(count)
        ]
        for start in range(0, len(ops), 500):
            await store.txn([], ops[start : start + 500])
    finally:
        await store.close()


async def _push_model(ctx: Any, tmp: Path) -> None:
    """A signed tiny model into a hub's blob store and model records (what a push leaves)."""
    from edgefleet.demo import TINY_MLP, build_mlp
    from edgefleet.trust import signing
    from hub import storekeys

    model = tmp / "det.onnx"
    build_mlp(model, TINY_MLP, seed=1)
    _, env = signing.sign_artifact(
        model, name="det", version="1.0.0", keys=[ctx.paths.data_dir / "publisher.key"]
    )
    sha = ctx.blobs.ingest_file(model, name="det", version="1.0.0", verifiers=[])
    record = storekeys.ModelRecord(
        "det", "1.0.0", sha, model.stat().st_size, env.to_bytes(), time.time()
    )
    await ctx.store.put(storekeys.model_key("det", "1.0.0"), storekeys.dumps(record.to_json()))
    ctx.cache.models[("det", "1.0.0")] = record


class Hub:
    """A hub context with its controllers running (no device-facing server needed)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self, *, serve: bool = False, link: bool = False) -> Hub:
        from hub.federating import ParentFiles, ParentLink
        from hub.server import build_context, start_server

        self.ctx = await build_context(self.data_dir)
        ctx = self.ctx
        components: list[Any] = [ctx.writer, ctx.projector, ctx.rollouts, ctx.scheduler]
        if link:
            files = ParentFiles.load(self.data_dir)
            assert files is not None
            self.link = ParentLink(ctx, files)
            components.append(self.link)
        self.tasks = [asyncio.create_task(c.run(self.stop)) for c in components if c is not None]
        if serve:
            self.running = await start_server(ctx, listen=self.listen)
        ctx.projector.mark_all()
        return self

    async def close(self) -> None:
        if getattr(self, "running", None) is not None:
            await self.running.server.stop(None)
        self.stop.set()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.ctx.store.close()


async def _apply(hub: Hub, address: str, name: str) -> float:
    import grpc

    from edgefleet.v1 import admin_pb2, admin_pb2_grpc
    from hub import pki

    paths = hub.ctx.paths
    admin = pki.load_certified_key(paths.admin_certificate, paths.admin_key)
    creds = grpc.ssl_channel_credentials(
        paths.ca_certificate.read_bytes(),
        pki.private_key_pem(admin.key),
        pki.certificate_pem(admin.certificate),
    )
    import yaml

    doc = json.dumps(yaml.safe_load(DEPLOYMENT.format(name=name))).encode()
    async with grpc.aio.secure_channel(address, creds) as channel:
        started = time.monotonic()
        await admin_pb2_grpc.AdminServiceStub(channel).Apply(
            admin_pb2.ApplyRequest(documents=[doc]), timeout=60
        )
    return started


async def _wait_delivered(
    hubs: list[Hub], name: str, started: float, total: int, timeout: float = 300.0
) -> list[float]:
    """Seconds from ``started`` until each device's desired state carries ``name``."""
    seen: dict[tuple[int, str], float] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < total and time.monotonic() < deadline:
        now = time.monotonic()
        for i, hub in enumerate(hubs):
            for device, record in hub.ctx.cache.desired.items():
                if (i, device) not in seen and name in record.deployments:
                    seen[(i, device)] = now - started
        await asyncio.sleep(0.02)
    if len(seen) < total:
        raise RuntimeError(f"only {len(seen)} of {total} devices got {name} within {timeout:g} s")
    return sorted(seen.values())


async def _alone(tmp: Path, count: int, devices: int, repeat: int) -> list[list[float]]:
    """The baseline: ``count`` hubs that are not federated, in this same process, each with
    ``devices`` devices; the same deployment applied at every one of them at once."""
    from edgefleet.launching import free_port_pair
    from hub.initializing import init_hub
    from hub.trustsetup import quickstart_trust

    hubs: list[Hub] = []
    addresses: list[str] = []
    runs = []
    try:
        for i in range(count):
            port = free_port_pair()
            data = tmp / f"alone-{i}"
            address = f"127.0.0.1:{port}"
            await init_hub(data, region=f"a{i}", hub_address=address, trust_setup=quickstart_trust)
            await _seed_devices(data, devices, "dev")
            hub = Hub(data)
            hub.listen = address  # type: ignore[attr-defined]
            hubs.append(await hub.start(serve=True))
            addresses.append(address)
            await _push_model(hub.ctx, tmp)
        for r in range(repeat):
            starts = await asyncio.gather(
                *(_apply(h, a, f"det{r}") for h, a in zip(hubs, addresses, strict=True))
            )
            runs.append(await _wait_delivered(hubs, f"det{r}", min(starts), count * devices))
    finally:
        for h in hubs:
            await h.close()
    return runs


async def _federated(
    tmp: Path, regions: int, devices: int, repeat: int
) -> tuple[list[list[float]], float]:
    from edgefleet.launching import free_port_pair
    from hub import tokens
    from hub.federating import enroll_with_parent
    from hub.initializing import init_hub
    from hub.trustsetup import quickstart_trust

    port = free_port_pair()
    root_address = f"127.0.0.1:{port}"
    result = await init_hub(
        tmp / "root", region="root", hub_address=root_address, trust_setup=quickstart_trust
    )
    root = Hub(tmp / "root")
    root.listen = root_address  # type: ignore[attr-defined]
    await root.start(serve=True)
    await _push_model(root.ctx, tmp)
    hubs: list[Hub] = []
    try:
        for r in range(regions):
            name = f"r{r}"
            token, _ = await tokens.create_token(
                root.ctx.store, now=time.time(), ttl=600, for_region=name
            )

            async def setup(paths: Any, ca: Any, token: str = token, name: str = name) -> None:
                await enroll_with_parent(
                    paths, parent=root_address, token=token, ca_hash=result.ca_pin, region=name
                )

            await init_hub(
                tmp / name,
                region=name,
                hub_address=f"127.0.0.1:{free_port_pair()}",
                trust_setup=setup,
            )
            await _seed_devices(tmp / name, devices, f"{name}-dev")
            hubs.append(await Hub(tmp / name).start(link=True))
        connect_started = time.monotonic()
        while not all(h.link.connected for h in hubs):  # noqa: ASYNC110 - a bench polls
            await asyncio.sleep(0.05)
        connected = time.monotonic() - connect_started
        runs = []
        for r in range(repeat):
            started = await _apply(root, root_address, f"det{r}")
            runs.append(await _wait_delivered(hubs, f"det{r}", started, regions * devices))
    finally:
        for h in hubs:
            await h.close()
        await root.close()
    return runs, connected


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--regions", type=int, default=10)
    p.add_argument("--devices", type=int, default=1000, help="per region")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    from edgefleet.logs import configure_logging

    configure_logging("warning")
    with tempfile.TemporaryDirectory(prefix="bench-federation-") as d:
        tmp = Path(d)
        single = asyncio.run(_alone(tmp, args.regions, args.devices, args.repeat))
        federated, connected = asyncio.run(_federated(tmp, args.regions, args.devices, args.repeat))
    single_p99 = median(percentile(r, 99) for r in single)
    fed_p99 = median(percentile(r, 99) for r in federated)
    fed_p50 = median(percentile(r, 50) for r in federated)
    fed_max = median(r[-1] for r in federated)
    out = {
        "regions": args.regions,
        "devicesPerRegion": args.devices,
        "devices": args.regions * args.devices,
        "repeat": args.repeat,
        "aloneP99S": round(single_p99, 3),
        "federatedP50S": round(fed_p50, 3),
        "federatedP99S": round(fed_p99, 3),
        "federatedMaxS": round(fed_max, 3),
        "ratioP99": round(fed_p99 / single_p99, 2) if single_p99 else None,
        "regionsConnectedS": round(connected, 2),
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"{args.regions} hubs alone (not federated, same process), {args.devices} devices "
            f"each, applied at each: p99 {single_p99:.2f} s (baseline)"
        )
        print(
            f"federated, {args.regions} regions x {args.devices} devices: p50 {fed_p50:.2f} s, "
            f"p99 {fed_p99:.2f} s, max {fed_max:.2f} s (median of {args.repeat} applies)"
        )
        print(f"ratio p99 federated / hubs alone: {out['ratioP99']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
