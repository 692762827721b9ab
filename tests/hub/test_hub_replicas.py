"""Hub replicas: three real ``hub serve`` processes on one real etcd (copies of one data
directory). One leads (its controllers run); the others serve reads (following the leader's
writes) and refuse admin writes, naming the leader; the leader killed with kill -9, another
leads within the lease TTL + 2 s and takes admin writes."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from asynctesting import async_test, eventually
from etcdtesting import EtcdServer
from hubserving import client_credentials

from edgefleet.launching import program_command
from edgefleet.v1 import admin_pb2, admin_pb2_grpc
from hub import pki
from hub.initializing import HubPaths
from hub.state.store import EtcdStore
from hub.state.store.identity import LEADER_KEY

pytestmark = pytest.mark.scenario

LEASE_S = 3.0
MANIFEST = (
    b'{"apiVersion": "edgefleet.io/v1", "kind": "ModelDeployment", "metadata": '
    b'{"name": "%(name)s"}, "spec": {"model": {"name": "%(name)s", "version": "1.0.0"}, '
    b'"replicas": {"perDevice": 1}}}'
)


class _Replica:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.proc = subprocess.Popen(
            program_command("hub", "serve", "--data-dir", str(data_dir),
                            "--listen", "127.0.0.1:0", "--enroll-listen", "127.0.0.1:0",
                            "--metrics-listen", "127.0.0.1:0"),
            stdout=subprocess.PIPE, stderr=(data_dir / "serve.log").open("w"), text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = re.search(r"on port (\d+)", line)
        assert match, f"hub serve did not start: {line!r}"
        self.port = int(match.group(1))

    def stub(self) -> tuple[grpc.aio.Channel, admin_pb2_grpc.AdminServiceStub]:
        paths = HubPaths.of(self.data_dir)
        admin = pki.load_certified_key(paths.admin_certificate, paths.admin_key)
        channel = grpc.aio.secure_channel(
            f"127.0.0.1:{self.port}", client_credentials(paths, admin)
        )
        return channel, admin_pb2_grpc.AdminServiceStub(channel)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


@pytest.fixture
def replicas(
    tmp_path: Path, etcd_server: EtcdServer, etcd_namespace: str
) -> Iterator[list[_Replica]]:
    first = tmp_path / "r0"
    out = subprocess.run(
        program_command("hub", "init", "--data-dir", str(first), "--hub-address",
                        "127.0.0.1:7443", "--store",
                        f"etcd://{etcd_server.endpoint}{etcd_namespace}"),
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    config = first / "hub.toml"
    config.write_text(
        config.read_text().replace('leaderLease = "10s"', f'leaderLease = "{LEASE_S:g}s"')
    )
    dirs = [first]
    for i in (1, 2):  # more replicas of the hub: copies of its data directory
        shutil.copytree(first, tmp_path / f"r{i}")
        dirs.append(tmp_path / f"r{i}")
    started: list[_Replica] = []
    try:
        for d in dirs:
            started.append(_Replica(d))
        yield started
    finally:
        for r in started:
            r.stop()


async def _leader(store: EtcdStore, replicas: list[_Replica], *, not_: _Replica | None = None,
                  within: float) -> _Replica:  # fmt: skip
    async def leading() -> _Replica | None:
        kv = await store.get(LEADER_KEY)
        if kv is not None:
            for r in replicas:
                if r is not not_ and kv.value.decode().endswith(f"port {r.port}"):
                    return r
        return None

    leader: _Replica = await eventually(
        leading, within, f"a leader (other than {not_ and not_.port})", interval=0.02
    )
    return leader


async def _apply(replica: _Replica, name: bytes) -> None:
    channel, stub = replica.stub()
    async with channel:
        await stub.Apply(admin_pb2.ApplyRequest(documents=[MANIFEST % {b"name": name}]), timeout=20)


async def _shows(replica: _Replica, name: str) -> bool:
    return name in await _names(replica)


async def _names(replica: _Replica) -> set[str]:
    channel, stub = replica.stub()
    async with channel:
        listed = await stub.List(admin_pb2.ListRequest(kind="ModelDeployment"), timeout=20)
    return {json.loads(o.json)["metadata"]["name"] for o in listed.items}


@async_test
async def test_one_replica_leads_the_others_serve_reads_and_the_leader_fails_over(
    replicas: list[_Replica], etcd_server: EtcdServer, etcd_namespace: str
) -> None:
    store = await EtcdStore.open([etcd_server.endpoint], namespace=etcd_namespace)
    try:
        leader = await _leader(store, replicas, within=20)
        follower = next(r for r in replicas if r is not leader)
        await _apply(leader, b"first")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _apply(follower, b"refused")
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        assert f"port {leader.port}" in (refused.value.details() or "")
        assert "first" in await _names(leader)
        assert "refused" not in await _names(leader)
        # followers' caches follow the leader's writes
        await eventually(
            lambda: _shows(follower, "first"),
            15,
            "a follower to show the leader's write",
            interval=0.1,
        )

        leader.proc.kill()  # kill -9: its lease must expire
        killed = time.monotonic()
        successor = await _leader(store, replicas, not_=leader, within=LEASE_S + 15)
        took = time.monotonic() - killed
        assert took <= LEASE_S + 2, f"a replica led {took:.1f} s after the leader was killed"
        # once elected it reloads what the old leader wrote, then takes writes
        deadline = time.monotonic() + 15
        while "first" not in await _names(successor):
            assert time.monotonic() < deadline, "the new leader never showed the old one's write"
            await asyncio.sleep(0.1)
        while True:  # its term starts just after the reload
            try:
                await _apply(successor, b"second")
                break
            except grpc.aio.AioRpcError as exc:
                assert exc.code() is grpc.StatusCode.UNAVAILABLE
                assert time.monotonic() < deadline, exc.details()
                await asyncio.sleep(0.1)
        assert {"first", "second"} <= await _names(successor)
    finally:
        await store.close()
