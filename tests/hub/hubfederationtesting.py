"""Shared pieces of the federation tests (docs/federation.md): manifests and model records,
region reports, and a root hub made by ``hub init`` serving its two federation services over
real gRPC with real certificates on loopback (:class:`Root`)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from edgefleet.api import parse_manifest
from edgefleet.launching import free_port_pair
from edgefleet.v1 import federation_pb2
from hub import pki
from hub.controllers.parentlink.regionenrollment import enroll_with_parent
from hub.initializing import HubPaths, init_hub
from hub.server import build_context, start_server
from hub.state import storekeys, tokens
from hub.trustsetup import quickstart_trust


def deployment(
    name: str, regions: list[str] | None = None, version: str = "1.0.0"
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {"model": {"name": name, "version": version}, "replicas": {"perDevice": 1}},
    }
    if regions is not None:
        doc["spec"]["placement"] = {"regions": regions}
    return parse_manifest(doc).to_dict()


def record(name: str, version: str, envelope: bytes = b"{}") -> storekeys.ModelRecord:
    return storekeys.ModelRecord(
        name, version, f"{name}{version}".ljust(64, "0")[:64], 10, envelope, 1.0
    )


def report(devices: int = 1, **fields: Any) -> federation_pb2.RegionReport:
    deployments = [federation_pb2.RegionDeploymentStatus(name="a", desired=2, updated=1, ready=1)]
    inventory = federation_pb2.RegionInventory(
        total=devices,
        devices=[federation_pb2.RegionDevice(name=f"d{i}", phase="Ready") for i in range(devices)],
    )
    r = federation_pb2.RegionReport(generation=1, deployments=deployments, inventory=inventory)
    for k, v in fields.items():
        setattr(r, k, v)
    return r


class Root:
    def __init__(self, tmp: Path, *, region_lifetime_s: float | None = None) -> None:
        self.tmp = tmp
        self.region_lifetime_s = region_lifetime_s  # [certificates] regionLifetime, if not default

    async def __aenter__(self) -> Root:
        port = free_port_pair()
        result = await init_hub(
            self.tmp / "root",
            region="root",
            hub_address=f"127.0.0.1:{port}",
            trust_setup=quickstart_trust,
        )
        self.paths = result.paths
        self.ctx = await build_context(self.paths.data_dir)
        if self.region_lifetime_s is not None:
            c = self.ctx.config
            self.ctx.config = dataclasses.replace(
                c,
                certificates=dataclasses.replace(
                    c.certificates, region_lifetime_s=self.region_lifetime_s
                ),
            )
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self.ctx.writer.run(self._stop))]
        self.running = await start_server(self.ctx, listen=f"127.0.0.1:{port}")
        self.address = f"127.0.0.1:{port}"
        self.pin = result.ca_pin
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.running.server.stop(None)
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self.ctx.store.close()

    async def token(self, region: str = "") -> str:
        token, _ = await tokens.create_token(
            self.ctx.store, now=self.ctx.clock(), ttl=600, for_region=region
        )
        return token

    async def enroll(self, region: str) -> HubPaths:
        paths = HubPaths.of(self.tmp / f"region-{region}-{len(list(self.tmp.iterdir()))}")
        paths.data_dir.mkdir()
        await enroll_with_parent(
            paths,
            parent=self.address,
            token=await self.token(region),
            ca_hash=self.pin,
            region=region,
        )
        return paths

    def channel(self, cert: bytes, key: bytes) -> grpc.aio.Channel:
        creds = grpc.ssl_channel_credentials(self.paths.ca_certificate.read_bytes(), key, cert)
        return grpc.aio.secure_channel(self.address, creds)

    def region_channel(self, paths: HubPaths) -> grpc.aio.Channel:
        d = paths.data_dir
        return self.channel(
            (d / "federation.crt").read_bytes(), (d / "federation.key").read_bytes()
        )


async def messages(
    *items: federation_pb2.RegionMessage, hold: float = 0.5
) -> AsyncIterator[federation_pb2.RegionMessage]:
    for item in items:
        yield item
    await asyncio.sleep(hold)


def hello(region: str) -> federation_pb2.RegionMessage:
    return federation_pb2.RegionMessage(hello=federation_pb2.RegionHello(region=region))


def admin_channel(root: Root) -> grpc.aio.Channel:
    admin = pki.load_certified_key(root.paths.admin_certificate, root.paths.admin_key)
    return root.channel(pki.certificate_pem(admin.certificate), pki.private_key_pem(admin.key))


def inventory_report(phases: dict[str, int], deployments: int = 1) -> federation_pb2.RegionReport:
    rows = [
        federation_pb2.RegionDevice(name=f"{phase.lower()}-{i}", phase=phase)
        for phase, n in phases.items()
        for i in range(n)
    ]
    return federation_pb2.RegionReport(
        generation=1,
        deployments=[
            federation_pb2.RegionDeploymentStatus(name=f"dep-{i}") for i in range(deployments)
        ],
        inventory=federation_pb2.RegionInventory(total=len(rows), by_phase=phases, devices=rows),
    )


def model_value(r: storekeys.ModelRecord, generation: int | None) -> bytes:
    doc = r.to_json()
    if generation is not None:
        doc["federated"] = {"generation": generation}
    return storekeys.dumps(doc)
