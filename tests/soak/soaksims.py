"""Simulated devices for the soak harness: one process, one real mTLS Sync stream per device
(its own certificate and HTTP/2 connection), as bench/fanout.py's. Each sends Hello, acknowledges
every desired state, sends heartbeats at the interval the hub asks for, and on any failure dials
the next hub replica after a jittered backoff, as edged does. Every second the process writes
what each device last received (``{device: {deployment: version}}``, the time it came, and the
reconnects by reason) to a JSON file, atomically."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from typing import Any


def run_sims(
    addresses: list[str], ca: bytes, devices: list[tuple[str, bytes, bytes]], out: str
) -> None:
    import grpc

    from edgefleet.v1 import device_pb2, device_pb2_grpc
    from edgefleet.versioning import installed_version

    seen: dict[str, Any] = {"devices": {}, "received": {}, "reconnects": {}}

    async def session(name: str, address: str, creds: Any) -> None:
        async with grpc.aio.secure_channel(
            address,
            creds,
            options=[
                ("grpc.use_local_subchannel_pool", 1),
                ("grpc.ssl_target_name_override", "localhost"),
            ],
        ) as channel:
            call = device_pb2_grpc.DeviceServiceStub(channel).Sync()
            lock = asyncio.Lock()
            hello = device_pb2.Hello(edged_version=installed_version(), device_name=name)
            await call.write(device_pb2.DeviceMessage(hello=hello))
            beat: asyncio.Task[None] | None = None

            async def heartbeats(interval: float) -> None:
                while True:
                    await asyncio.sleep(interval)
                    async with lock:
                        await call.write(device_pb2.DeviceMessage(heartbeat=device_pb2.Heartbeat()))

            try:
                while True:
                    msg = await asyncio.wait_for(call.read(), 120)
                    if msg is grpc.aio.EOF:
                        return
                    if msg.WhichOneof("message") != "desired_state":
                        continue
                    ds = msg.desired_state
                    versions = {}
                    for m in ds.manifests:
                        if b"ModelDeployment" in m:
                            doc = json.loads(m)
                            versions[doc["metadata"]["name"]] = doc["spec"]["model"]["version"]
                    async with lock:
                        ack = device_pb2.Ack(generation=ds.generation)
                        await call.write(device_pb2.DeviceMessage(ack=ack))
                    if beat is None:
                        interval = ds.heartbeat_interval.ToTimedelta().total_seconds()
                        beat = asyncio.ensure_future(heartbeats(max(interval, 0.5)))
                    seen["devices"][name] = versions
                    seen["received"][name] = time.time()
            finally:
                if beat is not None:
                    beat.cancel()

    async def one(number: int, name: str, key: bytes, cert: bytes) -> None:
        creds = grpc.ssl_channel_credentials(ca, key, cert)
        attempt = 0
        index = number % len(addresses)  # half start at each replica
        while True:
            try:
                await session(name, addresses[index], creds)
                reason = "EOF"
            except grpc.aio.AioRpcError as exc:
                reason = exc.code().name
            except Exception as exc:  # any failure of one session: it reconnects
                # (a write on a call the hub had just ended raised InvalidStateError and, not
                # caught, ended every simulated device: seed 62's 1-hour run, docs/soak.md)
                reason = type(exc).__name__
            seen["reconnects"][reason] = seen["reconnects"].get(reason, 0) + 1
            index = (index + 1) % len(addresses)
            await asyncio.sleep(random.uniform(0, min(5.0, 0.5 * 2.0 ** min(attempt, 4))))
            attempt = attempt + 1 if reason != "EOF" else 0

    async def dump() -> None:
        while True:
            await asyncio.sleep(1.0)
            tmp = out + ".tmp"
            with open(tmp, "w") as f:  # noqa: ASYNC230 - a small file, once a second
                json.dump(seen, f)
            os.replace(tmp, out)

    async def run() -> None:
        tasks = [asyncio.ensure_future(one(i, *d)) for i, d in enumerate(devices)]
        await asyncio.gather(dump(), *tasks)

    asyncio.run(run())
