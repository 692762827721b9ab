"""A real hub serving AdminService for tests: a data directory made by ``hub init``, a SQLite
store in it (``hub.server.build_context``), the writer and projector loops running, and the
hub's gRPC server (``hub.server.start_server``) on loopback with mutual TLS and the hub's
real certificates."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from pathlib import Path
from types import TracebackType

import grpc

from edgefleet.v1 import admin_pb2_grpc
from hub import pki
from hub.initializing import HubPaths, init_hub
from hub.server import build_context, start_server

REGION = "eu-frankfurt"


async def make_hub_dir(data_dir: Path) -> HubPaths:
    result = await init_hub(data_dir, region=REGION, hub_address="127.0.0.1:7443")
    return result.paths


def client_credentials(paths: HubPaths, client: pki.CertifiedKey | None) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=paths.ca_certificate.read_bytes(),
        private_key=pki.private_key_pem(client.key) if client else None,
        certificate_chain=pki.certificate_pem(client.certificate) if client else None,
    )


class AdminHub:
    """``async with AdminHub(paths) as hub``: serving on ``hub.port`` until the block ends."""

    def __init__(self, paths: HubPaths) -> None:
        self.paths = paths
        self.port = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> AdminHub:
        self.ctx = await build_context(self.paths.data_dir)
        self._tasks = [
            asyncio.create_task(self.ctx.writer.run(self._stop)),
            asyncio.create_task(self.ctx.projector.run(self._stop)),
        ]
        if self.ctx.rollouts is not None:  # it reacts to applies (hub.state.feed)
            self._tasks.append(asyncio.create_task(self.ctx.rollouts.run(self._stop)))
        running = await start_server(self.ctx, listen="127.0.0.1:0", enroll_listen="127.0.0.1:0")
        self.server, self.port = running.server, running.port
        self.enroll_port = running.enroll_port
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.server.stop(None)
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self.ctx.store.close()

    def admin(self) -> pki.CertifiedKey:
        return pki.load_certified_key(self.paths.admin_certificate, self.paths.admin_key)

    def channel(self, client: pki.CertifiedKey | None = None) -> grpc.aio.Channel:
        """A channel with the admin's credentials (or ``client``'s)."""
        return grpc.aio.secure_channel(
            f"127.0.0.1:{self.port}", client_credentials(self.paths, client or self.admin())
        )

    def stub(self, channel: grpc.aio.Channel) -> admin_pb2_grpc.AdminServiceStub:
        return admin_pb2_grpc.AdminServiceStub(channel)


class ThreadedHub:
    """An :class:`AdminHub` on its own event loop in a thread, for tests that run edgectl as a
    subprocess. ``run(coro)`` runs a coroutine on the hub's loop (to read or seed its state)."""

    def __init__(self, paths: HubPaths) -> None:
        self.paths = paths
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._done: asyncio.Event | None = None
        self.hub: AdminHub | None = None
        self._error: BaseException | None = None

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        except BaseException as exc:
            self._error = exc
            self._ready.set()
        finally:
            self.loop.close()

    async def _serve(self) -> None:
        self._done = asyncio.Event()
        async with AdminHub(self.paths) as hub:
            self.hub = hub
            self._ready.set()
            await self._done.wait()

    def __enter__(self) -> ThreadedHub:
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None or self.hub is None:
            raise RuntimeError(f"the hub did not start: {self._error!r}")
        config = self.paths.admin_config
        text = config.read_text()
        config.write_text(
            re.sub(r'^hub = ".*"$', f'hub = "127.0.0.1:{self.hub.port}"', text, flags=re.M)
        )
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(RuntimeError):
            assert self._done is not None
            self.loop.call_soon_threadsafe(self._done.set)
        self._thread.join(10)

    def run(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)
