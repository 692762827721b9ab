"""Federation: apply at the root -> every simulated device of every region acknowledged
(docs/federation.md, issue 16's figure: 10 regions x 1,000 devices, p99 <= 5 s).

    .venv/bin/python bench/federation.py [--regions 10] [--devices 1000] [--repeat 3] [--json]

**Processes.** The root hub runs in the bench's own process; each regional hub runs in a
process of its own (``bench/federation.py --child ...``), with its simulated devices in that
same process, as a regional hub runs on a machine of its own. So the figure is not one Python
interpreter's GIL serving eleven hubs; the processes still share this machine's cores (say how
many, and how loaded, when quoting it).

What is real: the root and ``--regions`` regional hubs, each made by ``hub init`` (the regions
with ``hub init --parent``'s enrollment,
``hub.controllers.parentlink.regionenrollment.enroll_with_parent``, over real TLS
with the CA pin), each on its own SQLite store, each running its writer, projector, rollout
controller and scheduler; the root serves its gRPC services on loopback with mutual TLS and
each region runs its real ``ParentLink`` (the Federate stream, the artifact fetched from the
root, the slice applied in one transaction, reports up). The deployment is applied with a real
``AdminService.Apply`` call at the root with the admin certificate; the model is a real tiny
ONNX file with publisher-signed metadata.

What is simulated (stated, as the issue allows): the devices, ``--devices`` per region, as
light in-process fakes of the device protocol. Each holds a real client certificate from its
region's CA (as enrollment gives it) and drives the hub's real
``DeviceServicer.Sync`` handler with a stand-in for gRPC's servicer context: a Hello, then, for
every ``HubMessage``, the bytes a device would get (``SerializeToString`` and parse back), the
deployments named in its manifests read, and an ``Ack`` of its generation sent back on the
stream (serialized and parsed back too). No TLS, no HTTP/2, no edged: what a real device's
stream adds is measured by bench/fanout.py. A device counts as *acknowledged* when its
region's cache holds its ack (``generation_acked``) of a desired state carrying the
deployment, as the Sync handler records it (the writer stores it with its next batch, 0.2 s).

Baseline, same run: ``--regions`` hubs that are not federated, each in its own process with
the same fake devices, the same deployment applied at each of them at once (what the regions
would cost if an operator applied at every one). The figure is p50, p99 (and max) from the
Apply call to a device's acknowledgement, over all devices, median of ``--repeat`` applies, and
the ratio federated / hubs alone: what the hop through the root costs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import median, percentile  # noqa: E402

DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: {name}}}
spec:
  model: {{name: {name}, version: "1.0.0"}}
  runtime: {{executionProviders: [CPUExecutionProvider]}}
  replicas: {{perDevice: 1}}
  placement: {{nodeSelector: {{site: a}}}}
"""
LINE = "BENCH "  # a child's lines to the bench start with this (logs go to stderr)
TIMEOUT = 300.0


async def _seed_devices(data_dir: Path, count: int, prefix: str) -> None:
    from hub.decide.devices import Device, DevicePhase
    from hub.state import storekeys
    from hub.state.store import Put, open_hub_store

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


async def _push_model(ctx: Any, tmp: Path, repeat: int) -> None:
    """A signed tiny model into a hub's blob store and model records (what a push leaves),
    under one name per apply (``det0``...: a device serves one deployment per model name)."""
    from edgefleet.demo import TINY_MLP, build_mlp
    from edgefleet.trust import signing
    from hub.state import storekeys

    model = tmp / "det.onnx"
    build_mlp(model, TINY_MLP, seed=1)
    for r in range(repeat):
        name = f"det{r}"
        _, env = signing.sign_artifact(
            model, name=name, version="1.0.0", keys=[ctx.paths.data_dir / "publisher.key"]
        )
        sha = ctx.blobs.ingest_file(model, name=name, version="1.0.0", verifiers=[])
        record = storekeys.ModelRecord(
            name, "1.0.0", sha, model.stat().st_size, env.to_bytes(), time.time()
        )
        await ctx.store.put(storekeys.model_key(name, "1.0.0"), storekeys.dumps(record.to_json()))
        ctx.cache.models[(name, "1.0.0")] = record


class Hub:
    """A hub context with its controllers running (the gRPC server when ``serve``)."""

    def __init__(self, data_dir: Path, listen: str = "") -> None:
        self.data_dir = data_dir
        self.listen = listen
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.running: Any = None

    async def start(self, *, serve: bool = False, link: bool = False) -> Hub:
        from hub.controllers.parentlink.regionenrollment import ParentFiles
        from hub.server import build_context, parent_link, start_server

        self.ctx = await build_context(self.data_dir)
        ctx = self.ctx
        components: list[Any] = [ctx.writer, ctx.projector, ctx.rollouts, ctx.scheduler]
        if link:
            files = ParentFiles.load(self.data_dir)
            assert files is not None
            self.link = parent_link(ctx, files)
            components.append(self.link)
        self.tasks = [asyncio.create_task(c.run(self.stop)) for c in components if c is not None]
        if serve:
            self.running = await start_server(ctx, listen=self.listen)
        ctx.projector.mark_all()
        return self

    async def close(self) -> None:
        if self.running is not None:
            await self.running.server.stop(None)
        self.stop.set()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.ctx.store.close()


async def _apply(data_dir: Path, address: str, name: str) -> float:
    """Apply the deployment ``name`` at the hub of ``data_dir`` with its admin certificate;
    the monotonic time just before the call."""
    import grpc
    import yaml

    from edgefleet.v1 import admin_pb2, admin_pb2_grpc
    from hub import pki
    from hub.initializing import HubPaths

    paths = HubPaths.of(data_dir)
    admin = pki.load_certified_key(paths.admin_certificate, paths.admin_key)
    creds = grpc.ssl_channel_credentials(
        paths.ca_certificate.read_bytes(),
        pki.private_key_pem(admin.key),
        pki.certificate_pem(admin.certificate),
    )
    doc = json.dumps(yaml.safe_load(DEPLOYMENT.format(name=name))).encode()
    async with grpc.aio.secure_channel(address, creds) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        await channel.channel_ready()
        started = time.monotonic()
        await stub.Apply(admin_pb2.ApplyRequest(documents=[doc]), timeout=60)
    return started


# -- the simulated devices (in the regional hub's process) ----------------------------------------
class _Aborted(Exception):
    pass


class _Context:
    """What ``DeviceServicer.Sync`` asks of gRPC's servicer context: the peer's certificate
    (as gRPC's auth context gives it after mutual TLS), its address, abort."""

    def __init__(self, pem: bytes) -> None:
        self._auth = {"x509_pem_cert": [pem]}

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth

    def peer(self) -> str:
        return "ipv4:127.0.0.1:0"

    async def abort(self, code: Any, details: str) -> None:
        raise _Aborted(f"{code}: {details}")


class FakeDevice:
    """One device's side of a Sync stream, in process: Hello, then an Ack of every desired
    state, with the message bytes serialized and parsed both ways as over the wire."""

    cpu = 0.0  # seconds of CPU the fakes' own work took, all of them (not the hub's)

    def __init__(self, name: str, pem: bytes) -> None:
        from edgefleet.v1 import device_pb2
        from edgefleet.versioning import installed_version

        self.name = name
        self.context = _Context(pem)
        self.outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.first: dict[str, int] = {}  # deployment -> first generation that carried it
        self.states = 0
        hello = device_pb2.DeviceMessage(
            hello=device_pb2.Hello(edged_version=installed_version(), device_name=name)
        )
        self.outbox.put_nowait(hello.SerializeToString())

    async def _requests(self) -> AsyncIterator[Any]:
        from edgefleet.v1 import device_pb2

        while (data := await self.outbox.get()) is not None:
            started = time.process_time()
            message = device_pb2.DeviceMessage.FromString(data)
            FakeDevice.cpu += time.process_time() - started
            yield message

    async def run(self, servicer: Any) -> None:
        import orjson

        from edgefleet.v1 import device_pb2

        async for message in servicer.Sync(self._requests(), self.context):
            started = time.process_time()
            received = device_pb2.HubMessage.FromString(message.SerializeToString())
            if received.WhichOneof("message") != "desired_state":
                continue
            state = received.desired_state
            self.states += 1
            for manifest in state.manifests:
                name = orjson.loads(manifest).get("metadata", {}).get("name")
                if isinstance(name, str):
                    self.first.setdefault(name, state.generation)
            ack = device_pb2.DeviceMessage(ack=device_pb2.Ack(generation=state.generation))
            self.outbox.put_nowait(ack.SerializeToString())
            FakeDevice.cpu += time.process_time() - started


async def _device_certificates(ctx: Any, names: list[str]) -> dict[str, bytes]:
    """A client certificate from the hub's CA for each device (what enrollment gives it)."""
    from hub import pki
    from hub.pki import Identity, Role

    ca = pki.load_certified_key(ctx.paths.ca_certificate, ctx.paths.ca_key)
    pems = {}
    for i, name in enumerate(names):
        issued = pki.issue_client_certificate(ca, Identity(Role.DEVICE, name, ctx.region))
        pems[name] = pki.certificate_pem(issued.certificate)
        if i % 100 == 99:
            await asyncio.sleep(0)
    return pems


def _say(doc: dict[str, Any]) -> None:
    sys.stdout.write(LINE + json.dumps(doc) + "\n")
    sys.stdout.flush()


async def _child(args: argparse.Namespace) -> None:
    """One regional hub (or a hub alone) and its simulated devices; says ``ready``, then, for
    each deployment det0.. in turn, when each device acknowledged a state carrying it."""
    from hub.initializing import init_hub
    from hub.server import device_servicer
    from hub.trustsetup import quickstart_trust

    data = Path(args.data)
    name = args.name
    if args.parent:
        from hub.controllers.parentlink.regionenrollment import enroll_with_parent

        async def setup(paths: Any, ca: Any) -> None:
            await enroll_with_parent(
                paths, parent=args.parent, token=args.token, ca_hash=args.pin, region=name
            )

        await init_hub(data, region=name, hub_address=args.listen, trust_setup=setup)
    else:
        await init_hub(data, region=name, hub_address=args.listen, trust_setup=quickstart_trust)
    names = [f"{name}-dev-{i}" for i in range(args.devices)]
    await _seed_devices(data, args.devices, f"{name}-dev")
    hub = await Hub(data, args.listen).start(serve=not args.parent, link=bool(args.parent))
    ctx = hub.ctx
    if not args.parent:
        await _push_model(ctx, data, args.repeat)
    servicer = device_servicer(ctx)
    pems = await _device_certificates(ctx, names)
    fakes = [FakeDevice(n, pems[n]) for n in names]
    streams = [asyncio.create_task(f.run(servicer)) for f in fakes]
    try:
        deadline = time.monotonic() + TIMEOUT
        # ready: connected to the root (federated), every device sent its first state
        while (args.parent and not hub.link.connected) or any(f.states == 0 for f in fakes):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: not ready within {TIMEOUT:g} s")
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # the hellos' writes and re-projections settle
        profile = None
        if args.profile:  # the measured part only
            import cProfile

            profile = cProfile.Profile()
            profile.enable()
        _say({"ready": name})
        for r in range(args.repeat):
            cpu, fakes_cpu = time.process_time(), FakeDevice.cpu
            deployment = f"det{r}"
            acked: dict[str, float] = {}
            deadline = time.monotonic() + TIMEOUT
            while len(acked) < len(fakes):
                now = time.monotonic()
                if now > deadline:
                    raise RuntimeError(
                        f"{name}: {len(acked)} of {len(fakes)} devices acknowledged {deployment}"
                    )
                for f in fakes:
                    generation = f.first.get(deployment)
                    if generation is None or f.name in acked:
                        continue
                    device = ctx.cache.devices.get(f.name)
                    if device is not None and device.generation_acked >= generation:
                        acked[f.name] = now
                await asyncio.sleep(0.01)
            _say(
                {
                    "name": deployment,
                    "acked": sorted(acked.values()),
                    # this process's CPU from the last apply's end to this one's, and the
                    # fake devices' share of it
                    "cpuS": time.process_time() - cpu,
                    "fakesCpuS": FakeDevice.cpu - fakes_cpu,
                }
            )
        await ctx.writer.flush()
        if profile is not None:
            profile.disable()
            profile.dump_stats(Path(args.profile) / f"{name}.prof")
    finally:
        for f in fakes:
            f.outbox.put_nowait(None)
        await asyncio.wait(streams, timeout=10)
        for s in streams:
            s.cancel()
        await hub.close()


# -- the bench's own process ---------------------------------------------------------------------
class Child:
    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self.proc = proc
        self.name = name

    async def line(self, timeout: float = TIMEOUT) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
            if not raw:
                code = await self.proc.wait()
                raise RuntimeError(f"{self.name} exited ({code}) early; see its stderr above")
            text = raw.decode()
            if text.startswith(LINE):
                doc: dict[str, Any] = json.loads(text[len(LINE) :])
                return doc


async def _spawn(*args: str, name: str, profile: str = "") -> Child:
    if profile:
        args = (*args, "--profile", profile)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SCRIPT),
        "--child",
        *args,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return Child(proc, name)


@dataclass
class Measured:
    runs: list[list[float]] = field(default_factory=list)  # per apply: each device's seconds
    cpu_us: list[float] = field(default_factory=list)  # per apply: hubs' CPU per device
    fakes_us: list[float] = field(default_factory=list)  # per apply: of which the fakes'


async def _measure(children: list[Child], repeat: int, apply: Any) -> Measured:
    for c in children:
        await c.line()  # ready
    out = Measured()
    for r in range(repeat):
        started = await apply(f"det{r}")
        times: list[float] = []
        cpu = fakes = 0.0
        for c in children:
            doc = await c.line()
            assert doc["name"] == f"det{r}", doc
            times.extend(t - started for t in doc["acked"])
            cpu += doc["cpuS"]
            fakes += doc["fakesCpuS"]
        out.runs.append(sorted(times))
        out.cpu_us.append(cpu / len(times) * 1e6)
        out.fakes_us.append(fakes / len(times) * 1e6)
    for c in children:
        if await c.proc.wait() != 0:
            raise RuntimeError(f"{c.name} failed")
    return out


async def _alone(tmp: Path, count: int, devices: int, repeat: int, profile: str = "") -> Measured:
    """The baseline: ``count`` hubs that are not federated, each in its own process with its
    ``devices`` fake devices; the same deployment applied at every one of them at once."""
    from edgefleet.launching import free_port_pair

    hubs = [(tmp / f"alone-{i}", f"127.0.0.1:{free_port_pair()}") for i in range(count)]
    children = [
        await _spawn(
            "--data", str(d), "--name", f"a{i}", "--listen", a,
            "--devices", str(devices), "--repeat", str(repeat), name=f"a{i}", profile=profile,
        )
        for i, (d, a) in enumerate(hubs)
    ]  # fmt: skip

    async def apply(name: str) -> float:
        return min(await asyncio.gather(*(_apply(d, a, name) for d, a in hubs)))

    try:
        return await _measure(children, repeat, apply)
    finally:
        for c in children:
            if c.proc.returncode is None:
                c.proc.kill()


async def _federated(
    tmp: Path, regions: int, devices: int, repeat: int, profile: str = ""
) -> Measured:
    from edgefleet.launching import free_port_pair
    from hub.initializing import init_hub
    from hub.state import tokens
    from hub.trustsetup import quickstart_trust

    root_address = f"127.0.0.1:{free_port_pair()}"
    result = await init_hub(
        tmp / "root", region="root", hub_address=root_address, trust_setup=quickstart_trust
    )
    root = await Hub(tmp / "root", root_address).start(serve=True)
    await _push_model(root.ctx, tmp, repeat)
    children: list[Child] = []
    try:
        for r in range(regions):
            name = f"r{r}"
            token, _ = await tokens.create_token(
                root.ctx.store, now=time.time(), ttl=600, for_region=name
            )
            children.append(
                await _spawn(
                    "--data", str(tmp / name), "--name", name,
                    "--listen", f"127.0.0.1:{free_port_pair()}",
                    "--parent", root_address, "--token", token, "--pin", result.ca_pin,
                    "--devices", str(devices), "--repeat", str(repeat), name=name, profile=profile,
                )
            )  # fmt: skip

        async def apply(name: str) -> float:
            return await _apply(tmp / "root", root_address, name)

        if not profile:
            return await _measure(children, repeat, apply)
        import cProfile

        with cProfile.Profile() as root_profile:  # the root's process, the measured part
            measured = await _measure(children, repeat, apply)
        root_profile.dump_stats(Path(profile) / "root.prof")
        return measured
    finally:
        for c in children:
            if c.proc.returncode is None:
                c.proc.kill()
        await root.close()


def _figures(m: Measured) -> dict[str, float]:
    return {
        "p50": median(percentile(r, 50) for r in m.runs),
        "p99": median(percentile(r, 99) for r in m.runs),
        "max": median(r[-1] for r in m.runs),
        "cpu": median(m.cpu_us),
        "fakes": median(m.fakes_us),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--regions", type=int, default=10)
    p.add_argument("--devices", type=int, default=1000, help="per region")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--profile",
        default="",
        metavar="DIR",
        help="profile each hub's process (cProfile, the measured part) into DIR/NAME.prof",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--data", "--name", "--listen", "--parent", "--token", "--pin"):
        p.add_argument(hidden, default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    from edgefleet.logs import configure_logging

    configure_logging("warning")
    if args.child:
        asyncio.run(_child(args))
        return 0
    load = os.getloadavg()[0]  # before this bench's own processes: the others' load
    with tempfile.TemporaryDirectory(prefix="bench-federation-") as d:
        tmp = Path(d)
        profile = str(Path(args.profile).resolve()) if args.profile else ""
        alone_runs = _alone(tmp, args.regions, args.devices, args.repeat, profile)
        alone = _figures(asyncio.run(alone_runs))
        fed_runs = _federated(tmp, args.regions, args.devices, args.repeat, profile)
        fed = _figures(asyncio.run(fed_runs))
    ratio = fed["p99"] / alone["p99"] if alone["p99"] else float("nan")
    out = {
        "regions": args.regions,
        "devicesPerRegion": args.devices,
        "devices": args.regions * args.devices,
        "repeat": args.repeat,
        "processes": "root in the bench's process, each regional hub with its devices in its own",
        "cpus": os.cpu_count(),
        "loadAverageBefore": round(load, 1),
        "aloneP50S": round(alone["p50"], 3),
        "aloneP99S": round(alone["p99"], 3),
        "federatedP50S": round(fed["p50"], 3),
        "federatedP99S": round(fed["p99"], 3),
        "federatedMaxS": round(fed["max"], 3),
        "ratioP99": round(ratio, 2),
        # CPU of a hub's process per device per apply (its controllers, the Sync handler,
        # the fakes), and the fakes' own share of it
        "aloneCpuPerDeviceUs": round(alone["cpu"]),
        "federatedCpuPerDeviceUs": round(fed["cpu"]),
        "fakesCpuPerDeviceUs": round(fed["fakes"]),
    }
    if args.json:
        print(json.dumps(out))
        return 0
    print(
        f"one process per hub (root in the bench's; each region with its {args.devices} fake "
        f"devices in its own), {os.cpu_count()} CPUs, load average before it {load:.1f}"
    )
    print(
        f"{args.regions} hubs alone (not federated), applied at each: p50 {alone['p50']:.2f} s, "
        f"p99 {alone['p99']:.2f} s (baseline)"
    )
    print(
        f"federated, {args.regions} regions x {args.devices} devices, applied at the root: "
        f"p50 {fed['p50']:.2f} s, p99 {fed['p99']:.2f} s, max {fed['max']:.2f} s "
        f"(apply -> device ack, median of {args.repeat} applies)"
    )
    print(f"ratio p99 federated / hubs alone: {out['ratioP99']}")
    print(
        f"CPU per device per apply, a region's process: {fed['cpu']:.0f} us federated, "
        f"{alone['cpu']:.0f} us alone; of which the fake devices' own {fed['fakes']:.0f} us"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
