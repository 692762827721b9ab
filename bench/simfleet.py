"""Simulated devices against a real ``hub serve``, shared by the hub benches that only need
devices to receive and acknowledge desired states (bench/fanout.py, bench/modelconfig.py).

- :func:`start_sim_hub`: ``hub init`` in a folder, one device certificate per simulated device
  from the hub's CA and its device record written straight into the store (enrolling
  thousands through the Enroll RPC is not what is measured), then ``hub serve`` started.
- :class:`SimClients`: the devices, spread over a few ``spawn`` processes (one HTTP/2
  connection each per device, a local subchannel pool, as separate devices would have). Each
  speaks the real Sync protocol: Hello, then an Ack for every desired state (and heartbeats
  as edged does, when asked); it reconnects with a jittered backoff as edged does and counts
  why it had to (never silently). :meth:`SimClients.collect` gathers what they received.
- :func:`push_model`, :func:`apply_documents`: a model version pushed with ``edgectl``, and
  documents applied through AdminService (the time just before the Apply returned).
- :func:`device_sync`, :func:`reconnecting`, :func:`run_devices`: a simulated device's session
  opening (its own connection, the Sync stream, its Hello), edged's jittered reconnect backoff,
  and a client process's loop forwarding what its devices saw to the parent in batches; also
  used by the benches whose devices say more (bench/rollout.py, bench/agentupgrade.py,
  bench/hubload.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing as mp
import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DeviceKeys = tuple[str, bytes, bytes]
"""A simulated device: its name, private key and certificate (PEM)."""


class Received(NamedTuple):
    """A desired state one device received (and acknowledged)."""

    time: float  # time.time() when it arrived
    version: str  # the model version of its (first) ModelDeployment, "" when none
    config_digest: str  # the digest of its (first) merged model config, "" when none
    size: int  # the message's bytes


def proc_io(pid: int) -> int:
    """Bytes a process has read and written so far (/proc/PID/io, rchar + wchar)."""
    with open(f"/proc/{pid}/io") as f:
        fields = dict(line.split(": ") for line in f.read().splitlines())
    return int(fields["rchar"]) + int(fields["wchar"])


# -- the hub --------------------------------------------------------------------------------------
@dataclass
class SimHub:
    data: Path
    port: int
    devices: list[DeviceKeys]
    hub: Any  # edgefleet.launching.LaunchedHub

    @property
    def pid(self) -> int:
        return int(self.hub.pid)

    def stop(self) -> None:
        self.hub.stop(30)


def start_sim_hub(
    workdir: Path,
    n: int,
    labels: Callable[[int], dict[str, str]],
    *,
    heartbeat_s: float | None = None,
) -> SimHub:
    """A hub (SQLite) in ``workdir/hub-N`` that knows ``n`` devices ``sim-00000``...
    (``labels(i)`` the i-th one's labels), listening; ``heartbeat_s``: its heartbeat interval
    (None: the default)."""
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
    if heartbeat_s is not None:
        toml = data / "hub.toml"
        toml.write_text(
            toml.read_text().replace(
                'heartbeatInterval = "30s"', f'heartbeatInterval = "{heartbeat_s:g}s"'
            )
        )
    ca = pki.load_certified_key(data / "ca.crt", data / "ca.key")
    devices: list[DeviceKeys] = []
    records = []
    for i in range(n):
        name = f"sim-{i:05d}"
        ck = pki.issue_client_certificate(ca, pki.Identity(pki.Role.DEVICE, name, "default"))
        devices.append((name, pki.private_key_pem(ck.key), pki.certificate_pem(ck.certificate)))
        serial = format(ck.certificate.serial_number, "x")
        records.append(Device(name, labels=labels(i), certificate_serial=serial))

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
    except BaseException:
        hub.stop(30)
        raise
    time.sleep(0.5)  # its controllers start right after the port opens
    return SimHub(data, port, devices, hub)


def push_model(data: Path, version: str, seed: int) -> None:
    """``edgectl models push`` of a tiny MLP as model ``bench`` ``version`` (signed with the
    hub's quickstart publisher key)."""
    from edgefleet.demo import TINY_MLP, build_mlp
    from edgefleet.launching import program_command

    model = data / f"bench-{version}.onnx"
    build_mlp(model, TINY_MLP, seed=seed)
    subprocess.run(
        program_command("edgectl", "--config", data / "admin.toml", "models", "push", model,
                        "--name", "bench", "--version", version),
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip


def apply_documents(data: Path, port: int, docs: list[dict[str, Any]], timeout: float) -> float:
    """Apply ``docs`` through AdminService as the admin; the wall time just before the call."""
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
        stub.Apply(request, timeout=timeout)
    return t0


# -- the simulated devices ------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def device_sync(port: int, creds: Any, name: str, version: str = "") -> AsyncIterator[Any]:
    """A simulated device's Sync stream with the hub on 127.0.0.1:``port``: a connection of its
    own (a local subchannel pool, as a separate device would have; the hub's certificate
    checked for "localhost"), its Hello sent, saying edged ``version`` (this checkout's by
    default). Yields the call; the connection closes when the block ends."""
    import grpc

    from edgefleet.v1 import device_pb2, device_pb2_grpc
    from edgefleet.versioning import installed_version

    async with grpc.aio.secure_channel(
        f"127.0.0.1:{port}",
        creds,
        options=[
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.ssl_target_name_override", "localhost"),
        ],
    ) as channel:
        call = device_pb2_grpc.DeviceServiceStub(channel).Sync()
        hello = device_pb2.Hello(edged_version=version or installed_version(), device_name=name)
        await call.write(device_pb2.DeviceMessage(hello=hello))
        yield call


async def reconnecting(
    session: Callable[[], Awaitable[None]],
    ended: Callable[[str], None] = lambda why: None,
) -> None:
    """Run ``session()`` again each time it ends or fails, after a jittered backoff as edged's
    (up to 10 s), forever; ``ended(why)``: "EOF", or the gRPC status and details of the
    failure."""
    import grpc

    attempt = 0
    while True:
        try:
            await session()
            why = "EOF"
        except grpc.aio.AioRpcError as exc:
            why = f"{exc.code().name}: {exc.details()}"
        ended(why)
        await asyncio.sleep(random.uniform(0, min(10.0, 0.5 * 2.0**attempt)))
        attempt += 1


SessionOf = Callable[[str, Any, list[Any], asyncio.Event], Awaitable[None]]


def run_devices(
    ca: bytes, devices: list[tuple[str, bytes, bytes]], session: SessionOf, conn: Any
) -> None:
    """A client process's devices: ``session(name, credentials, out, wake)`` of each, again
    after each end (:func:`reconnecting`); what they append to ``out`` goes to the parent
    through ``conn`` in batches (at least one a second; ``wake`` sends the next one sooner).
    Returns when a device's task ended (it never should)."""
    import grpc

    async def run() -> None:
        out: list[Any] = []
        wake = asyncio.Event()
        tasks = []
        for name, key, cert in devices:
            creds = grpc.ssl_channel_credentials(ca, key, cert)
            one = reconnecting(lambda n=name, c=creds: session(n, c, out, wake))
            tasks.append(asyncio.ensure_future(one))
        while True:
            try:
                await asyncio.wait_for(wake.wait(), 1.0)
            except TimeoutError:
                pass
            wake.clear()
            await asyncio.sleep(0.02)
            batch, out[:] = list(out), []
            conn.send(batch)
            if any(t.done() for t in tasks):
                return

    asyncio.run(run())


def _clients_main(
    port: int, ca: bytes, devices: list[DeviceKeys], heartbeats: bool, conn: Any
) -> None:
    """One client process: its devices' sessions; sends ``(events, reconnect reasons)`` to the
    parent in batches (an event: ``(name, *Received)``), or ``("error", what)`` when a device's
    task ended (it never should)."""
    import grpc

    from edgefleet.v1 import device_pb2

    async def session(name: str, creds: Any, seen: dict[str, Any]) -> None:
        async with device_sync(port, creds, name) as call:
            lock = asyncio.Lock()
            beat: asyncio.Task[None] | None = None

            async def beating(interval: float) -> None:
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
                    digest = ds.model_configs[0].digest if ds.model_configs else ""
                    async with lock:
                        ack = device_pb2.Ack(generation=ds.generation)
                        await call.write(device_pb2.DeviceMessage(ack=ack))
                    if heartbeats and beat is None:
                        interval = ds.heartbeat_interval.ToTimedelta().total_seconds()
                        beat = asyncio.ensure_future(beating(interval))
                    version = versions[0] if versions else ""
                    seen["events"].append((name, now, version, digest, ds.ByteSize()))
                    seen["wake"].set()
            finally:
                if beat is not None:
                    beat.cancel()

    async def one(name: str, key: bytes, cert: bytes, seen: dict[str, Any]) -> None:
        """One device: reconnects with jittered backoff like edged; counts why it had to."""
        creds = grpc.ssl_channel_credentials(ca, key, cert)

        def ended(why: str) -> None:  # counted and reported, then reconnected
            seen["reconnects"][why] = seen["reconnects"].get(why, 0) + 1

        await reconnecting(lambda: session(name, creds, seen), ended)

    async def run() -> None:
        seen: dict[str, Any] = {"events": [], "wake": asyncio.Event(), "reconnects": {}}
        tasks = [asyncio.ensure_future(one(n, k, c, seen)) for n, k, c in devices]
        while True:  # forward receive events to the parent in batches
            try:
                await asyncio.wait_for(seen["wake"].wait(), 1.0)
            except TimeoutError:
                pass  # nothing new for a second: the batch (maybe empty) goes anyway
            seen["wake"].clear()
            await asyncio.sleep(0.05)
            events, seen["events"] = seen["events"], []
            conn.send((events, dict(seen["reconnects"])))
            if any(t.done() for t in tasks):
                failed = [t for t in tasks if t.done()]
                conn.send(("error", repr(failed[0].exception())))
                return

    asyncio.run(run())


@dataclass
class SimClients:
    """The simulated devices of a :class:`SimHub`, over ``clients`` processes; ``got``: the
    last desired state each device received; ``reconnects``: why devices reconnected (all
    client processes together)."""

    sim: SimHub
    clients: int
    heartbeats: bool = False
    got: dict[str, Received] = field(default_factory=dict)
    _pipes: list[Any] = field(default_factory=list)
    _procs: list[Any] = field(default_factory=list)
    _reconnects: dict[int, dict[str, int]] = field(default_factory=dict)

    def start(self) -> SimClients:
        ctx = mp.get_context("spawn")
        ca_pem = (self.sim.data / "ca.crt").read_bytes()
        for c in range(self.clients):
            parent, child = ctx.Pipe()
            mine = self.sim.devices[c :: self.clients]
            args = (self.sim.port, ca_pem, mine, self.heartbeats, child)
            p = ctx.Process(target=_clients_main, args=args)
            p.start()
            self._pipes.append(parent)
            self._procs.append(p)
        return self

    def collect(self, until: Callable[[], bool], timeout: float) -> None:
        """Gather what the devices received until ``until()``; RuntimeError after ``timeout``
        seconds, or when a client process failed."""
        deadline = time.monotonic() + timeout
        while not until() and time.monotonic() < deadline:
            for pipe in self._pipes:
                while pipe.poll(0.01):
                    item = pipe.recv()
                    if item[0] == "error":
                        raise RuntimeError(f"client failed: {item}")
                    events, reasons = item
                    self._reconnects[id(pipe)] = reasons
                    for name, *received in events:
                        self.got[name] = Received(*received)
        if not until():
            n = len(self.sim.devices)
            raise RuntimeError(
                f"timed out: {len(self.got)} of {n} devices, e.g. "
                f"{next(iter(self.got.items()), None)}; reconnects {self.reconnects}"
            )

    @property
    def reconnects(self) -> dict[str, int]:
        return _merge(self._reconnects.values())

    def stop(self) -> None:
        for p in self._procs:
            p.terminate()


def _merge(counts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out
