"""A real hub (:class:`hubserving.AdminHub`: ``hub init`` data directory, SQLite store, mutual
TLS gRPC on loopback) with its web dashboard (:class:`hub.api.dashboard.serving.DashboardServer`)
on a free loopback port, and HTTPS clients for it: with the admin's client certificate, with
another certificate, or with none."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from types import TracebackType

from hubserving import AdminHub

from edgefleet.v1 import admin_pb2
from hub import pki
from hub.decide.devices import Device, DevicePhase
from hub.initializing import HubPaths
from hub.server import dashboard_server


def client_tls(paths: HubPaths, client: pki.CertifiedKey | None, tmp: Path) -> ssl.SSLContext:
    """Trusts the hub CA; presents ``client``'s certificate when given."""
    context = ssl.create_default_context(cafile=str(paths.ca_certificate))
    context.check_hostname = False  # the hub's certificate names its configured address
    if client is not None:
        cert, key = tmp / "client.pem", tmp / "client.key"
        cert.write_bytes(pki.certificate_pem(client.certificate))
        key.write_bytes(pki.private_key_pem(client.key))
        context.load_cert_chain(cert, key)
    return context


class DashboardHub:
    """``async with DashboardHub(paths) as d``: the hub (``d.hub``) and its dashboard on
    ``d.url``, until the block ends."""

    def __init__(self, paths: HubPaths, *, rollouts: bool = False) -> None:
        self.hub = AdminHub(paths)
        self.paths = paths
        self.rollouts = rollouts  # run the rollout controller too
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> DashboardHub:
        await self.hub.__aenter__()
        self.server = dashboard_server(self.hub.ctx, "127.0.0.1:0")
        self._tasks.append(asyncio.create_task(self.server.run(self._stop)))
        if self.rollouts and self.hub.ctx.rollouts is not None:
            self._tasks.append(asyncio.create_task(self.hub.ctx.rollouts.run(self._stop)))
        await asyncio.wait_for(self.server.bound.wait(), 10)
        self.url = f"https://127.0.0.1:{self.server.port}"
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self.hub.__aexit__(t, e, tb)

    async def token(self, ttl_s: float = 0) -> str:
        """A dashboard token from the hub's admin API, as `edgectl dashboard` gets one."""
        request = admin_pb2.CreateDashboardTokenRequest()
        if ttl_s:
            request.ttl.FromNanoseconds(int(ttl_s * 1e9))
        async with self.hub.channel() as channel:
            response = await self.hub.stub(channel).CreateDashboardToken(request)
        assert response.port == self.server.port
        return str(response.token)


def fake_device(name: str, **labels: str) -> Device:
    """A device record as the hub keeps it (injected into the cache and store directly)."""
    return Device(name=name, labels=labels, phase=DevicePhase.READY, last_heartbeat=1.0)
