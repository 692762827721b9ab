"""Federated waves at the hub, in this process: root and regional hubs with their real controllers
over real SQLite and gRPC (Hub, Fleet), a device per region, a deployment, pushing a version,
and waiting for it to roll out."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import orjson
from asynctesting import eventually
from hubserving import client_credentials

from edgefleet.launching import free_port_pair
from edgefleet.supervising import Component
from edgefleet.v1 import admin_pb2, admin_pb2_grpc
from hub import pki
from hub.controllers.parentlink.regionenrollment import ParentFiles, enroll_with_parent
from hub.controllers.replicas import CacheFollower
from hub.controllers.wave import WaveObserver
from hub.decide.devices import Device, DevicePhase, RevisionPhase, RevisionReport, WorkloadReport
from hub.initializing import HubPaths, init_hub
from hub.server import build_context, parent_link, start_server
from hub.state import storekeys, tokens
from hub.state.regions import RegionsFollower
from hub.state.store.electing import LeaderOnly
from hub.trustsetup import quickstart_trust

DEADLINE = 60.0  # for a loaded machine; not a timed assertion


def slow_test(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Like :func:`asynctesting.async_test`, with a guard sized for three hubs."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        async def main() -> None:
            await asyncio.wait_for(fn(*args, **kwargs), 240)
            await asyncio.sleep(0.2)  # tasks cancelled by the hubs' links finish
            leaked = asyncio.all_tasks() - {asyncio.current_task()}
            assert not leaked, f"leaked tasks: {leaked}"

        asyncio.run(main())

    return wrapper


def deployment(
    version: str,
    waves: list[Any] | None = None,
    canary: dict[str, Any] | None = None,
    deadline: int | None = None,
    annotations: dict[str, str] | None = None,
) -> bytes:
    rollout: dict[str, Any] = {"maxSurge": 1, "maxUnavailable": 0}
    if waves is not None:
        rollout["waves"] = waves
    if canary is not None:
        rollout["canary"] = canary
    if deadline is not None:
        rollout["progressDeadlineSeconds"] = deadline
    return orjson.dumps(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "ModelDeployment",
            "metadata": {"name": "det", **({"annotations": annotations} if annotations else {})},
            "spec": {
                "model": {"name": "det", "version": version},
                "replicas": {"perDevice": 1},
                "rollout": rollout,
            },
        }
    )


async def until(
    what: Callable[[], Any],
    why: str,
    timeout: float = DEADLINE,
    detail: Callable[[], str] | None = None,
) -> Any:
    return await eventually(what, timeout, why, interval=0.05, detail=detail)


class Hub:
    """A hub of a data directory, serving, with its controllers running."""

    def __init__(self, paths: HubPaths, listen: str = "127.0.0.1:0") -> None:
        self.paths = paths
        self.listen = listen
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Hub:
        ctx = self.ctx = await build_context(self.paths.data_dir)
        components: list[Component] = [ctx.projector]
        assert ctx.rollouts is not None
        components.append(ctx.rollouts)
        if ctx.waves is not None:
            components.append(ctx.waves)
        if ctx.elector is not None:  # a replica on etcd, as hub serve runs one
            ctx.elector.identity = f"replica {self.paths.data_dir.name}"
            followers = [ctx.waves] if ctx.waves is not None else []
            components = [
                ctx.elector,
                *(LeaderOnly(c, ctx.elector) for c in components),
                CacheFollower(ctx.store, ctx.cache, ctx.sessions, ctx.elector, followers),
            ]
            if ctx.waves is not None:
                components.append(WaveObserver(ctx.waves, ctx.elector))
        components.insert(0, ctx.writer)
        if ctx.regions is not None:  # every region's report, whatever replica took it
            components.append(RegionsFollower(ctx.store, ctx.regions))
        parent = ParentFiles.load(self.paths.data_dir)
        if parent is not None:
            components.append(parent_link(ctx, parent))
        self._tasks = [asyncio.create_task(c.run(self._stop)) for c in components]
        enroll = "127.0.0.1:0" if self.listen.endswith(":0") else None
        running = await start_server(ctx, listen=self.listen, enroll_listen=enroll)
        self.server, self.port = running.server, running.port
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop(None)
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self.ctx.store.close()

    def stub(self, channel: grpc.aio.Channel) -> admin_pb2_grpc.AdminServiceStub:
        return admin_pb2_grpc.AdminServiceStub(channel)

    def channel(self) -> grpc.aio.Channel:
        admin = pki.load_certified_key(self.paths.admin_certificate, self.paths.admin_key)
        return grpc.aio.secure_channel(
            f"127.0.0.1:{self.port}", client_credentials(self.paths, admin)
        )

    async def apply(self, document: bytes) -> None:
        async with self.channel() as channel:
            await self.stub(channel).Apply(admin_pb2.ApplyRequest(documents=[document]))

    async def get(self) -> dict[str, Any]:
        async with self.channel() as channel:
            got = await self.stub(channel).Get(
                admin_pb2.GetRequest(kind="ModelDeployment", name="det")
            )
        doc: dict[str, Any] = orjson.loads(got.json)
        return doc

    def version(self) -> str | None:
        dep = self.ctx.cache.deployments.get("det")
        return dep.spec.model.version if dep is not None else None

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.ctx.cache.events if e.get("reason") == reason]


class Fleet:
    """The root's and the regions' data directories, made once."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = free_port_pair()
        self.address = f"127.0.0.1:{self.port}"

    async def make(self, store: str = "") -> None:
        result = await init_hub(
            self.tmp / "root",
            region="root",
            hub_address=self.address,
            trust_setup=quickstart_trust,
            store=store,
        )
        self.root_paths, self.pin = result.paths, result.ca_pin

    async def region(self, root: Hub, name: str) -> HubPaths:
        token, _ = await tokens.create_token(
            root.ctx.store, now=root.ctx.clock(), ttl=600, for_region=name
        )

        async def setup(paths: HubPaths, ca: pki.CertifiedKey) -> None:
            await enroll_with_parent(
                paths, parent=self.address, token=token, ca_hash=self.pin, region=name
            )

        result = await init_hub(
            self.tmp / name, region=name, hub_address="127.0.0.1:7443", trust_setup=setup
        )
        return result.paths

    def root(self) -> Hub:
        return Hub(self.root_paths, listen=self.address)


async def push(root: Hub, version: str, name: str = "det") -> None:
    """A model pushed at the root: its bytes in the blob store (the regions fetch them)."""
    path = root.paths.data_dir / f"{name}-{version}.bin"
    path.write_bytes(f"model {name} {version}".encode() * 100)
    sha = root.ctx.blobs.ingest_file(path, name=name, version=version, verifiers=[])
    record = storekeys.ModelRecord(name, version, sha, path.stat().st_size, b"{}", 1.0)
    if root.ctx.shared_blobs is not None:  # replicas: the bytes for every replica, as a push
        await root.ctx.shared_blobs.publish(sha)
    await root.ctx.store.put(storekeys.model_key(name, version), storekeys.dumps(record.to_json()))
    root.ctx.cache.models[(name, version)] = record


async def device(
    hub: Hub,
    name: str,
    stop: asyncio.Event,
    refuse: frozenset[str],
    hold: dict[str, asyncio.Event],
    failing: frozenset[str] = frozenset(),
) -> None:
    """One device of a region: reports what the region sends it Ready (Refused for a version
    in ``refuse``; Loading while ``hold[version]`` is not set), answering 10 requests every
    0.05 s; a version in ``failing`` answers half of them with errors once the region's
    rollout of it is Complete."""
    writer, cache = hub.ctx.writer, hub.ctx.cache
    writer.update(Device(name=name, phase=DevicePhase.READY))
    # what enrollment and a Sync hello do for a real device: without it, a slice that
    # arrived before this device was written would never be projected onto it
    hub.ctx.projector.mark([name])
    counters: dict[str, tuple[int, int]] = {}
    while not stop.is_set():
        sent = cache.revision_for("det", name)
        record = cache.models.get(sent.model) if sent is not None else None
        current = cache.devices[name]
        if sent is not None and record is not None:
            version = sent.model[1]
            requests, errors = counters.get(version, (0, 0))
            rollout = cache.rollouts.get("det")
            complete = rollout is not None and rollout.phase.value == "Complete"
            counters[version] = (
                requests + 10,
                errors + (5 if version in failing and complete else 0),
            )
            requests, errors = counters[version]
            if version in refuse:
                rev = RevisionReport(
                    version,
                    record.sha256,
                    RevisionPhase.REFUSED,
                    wanted=True,
                    reason="UnknownKey",
                    message="signed only by keys the trust root does not allow",
                )
            elif version in hold and not hold[version].is_set():
                rev = RevisionReport(version, record.sha256, RevisionPhase.LOADING, wanted=True)
            else:
                rev = RevisionReport(
                    version,
                    record.sha256,
                    RevisionPhase.READY,
                    1,
                    wanted=True,
                    requests=requests,
                    errors=errors,
                )
            report = WorkloadReport(version, desired_replicas=1, ready_replicas=1, revisions=(rev,))
            if current.workloads.get("det") != report:
                writer.update(replace(current, workloads={"det": report}))
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def devices(
    *hubs: Hub,
    refuse: frozenset[str] = frozenset(),
    hold: dict[str, asyncio.Event] | None = None,
    failing: frozenset[str] = frozenset(),
    per_region: int = 1,
) -> Any:
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(device(h, f"cam-{h.ctx.region}-{i}", stop, refuse, hold or {}, failing))
        for h in hubs
        for i in range(per_region)
    ]
    try:
        yield
    finally:
        stop.set()
        await asyncio.gather(*tasks)


def rolled_out(hub: Hub, version: str) -> bool:
    state = hub.ctx.cache.rollouts.get("det")
    if state is None or hub.version() != version:
        return False
    rev = hub.ctx.cache.revisions.get("det", {}).get(state.revision)
    return rev is not None and rev.model[1] == version and state.phase.value == "Complete"
