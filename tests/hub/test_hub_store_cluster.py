"""The etcd store on a real 3-member etcd cluster: the member that leads the cluster is killed
with kill -9 and the store keeps working through the other endpoints, with every write it
acknowledged still there."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from aetcd import rpc
from asynctesting import async_test
from etcdtesting import EtcdServer, start_cluster

from edgefleet.errors import StoreUnavailable
from hub.state.store import EtcdStore

pytestmark = pytest.mark.scenario


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[EtcdServer]]:
    members = start_cluster(tmp_path / "etcd")
    try:
        yield members
    finally:
        for m in members:
            m.stop()


async def _raft_leader(members: list[EtcdServer]) -> EtcdServer:
    for _ in range(100):
        for m in members:
            async with grpc.aio.insecure_channel(m.endpoint) as channel:
                status = await rpc.MaintenanceStub(channel).Status(rpc.StatusRequest(), timeout=5)
                if status.leader and status.leader == status.header.member_id:
                    return m
        await asyncio.sleep(0.1)
    raise AssertionError("the cluster has no leader")


async def _put_retrying(store: EtcdStore, key: str, value: bytes) -> int:
    """A write that meets a dead endpoint fails (it may or may not have been applied); the
    next call uses the next endpoint. Retrying the same put is safe (same value)."""
    for _ in range(10):
        try:
            return await store.put(key, value)
        except StoreUnavailable:
            await asyncio.sleep(0.2)
    raise AssertionError(f"{key} could not be written")


@async_test
async def test_the_etcd_leader_member_killed_the_store_keeps_working(
    cluster: list[EtcdServer],
) -> None:
    leader = await _raft_leader(cluster)
    # the dead member first in the list: the store must move on from it
    endpoints = [leader.endpoint] + [m.endpoint for m in cluster if m is not leader]
    store = await EtcdStore.open(endpoints, namespace="/hub", timeout=5)
    try:
        acknowledged = {}
        for i in range(20):
            acknowledged[f"/devices/d{i:03d}"] = await store.put(f"/devices/d{i:03d}", b"before")
        assert leader.process is not None
        leader.process.kill()  # kill -9 the member leading the raft
        leader.process.wait()
        for i in range(20, 40):
            key = f"/devices/d{i:03d}"
            acknowledged[key] = await _put_retrying(store, key, b"after")
        listed = await store.range("/devices/")
        assert {kv.key: kv.mod_revision for kv in listed.kvs} == acknowledged
        watch = store.watch("/devices/", start_revision=acknowledged["/devices/d000"])
        first = await asyncio.wait_for(watch.__anext__(), 20)
        assert first.kv.key == "/devices/d000"
        await watch.aclose()  # type: ignore[attr-defined]
    finally:
        await store.close()
