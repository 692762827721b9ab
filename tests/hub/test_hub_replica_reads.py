"""Admin reads at a replica whose cache lags the store (hub.api.admin.reading.Reads.Get): two
hub contexts on one real etcd, as two replicas are; the reader's cache follows nothing here,
as a replica paused past its lease (SIGSTOP) or whose watch is behind holds it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from asynctesting import async_test
from etcdtesting import EtcdServer
from hubtesting import replica_contexts

from edgefleet.v1 import admin_pb2
from hub.state import storekeys
from hub.state.store.electing import LEADER_KEY
from hub.wiring import admin_servicer


class _Context:
    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise grpc.aio.AbortError(f"{code.name}: {details}")


async def _allowed(context: Any) -> None:
    return None


def _priority_class(value: str) -> str:
    return json.dumps(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "p0", "annotations": {"soak/value": value}},
            "spec": {"value": 7},
        }
    )


@async_test
async def test_a_read_at_a_replica_whose_cache_lags_answers_what_the_store_holds(
    tmp_path: Path, etcd_server: EtcdServer, etcd_namespace: str
) -> None:
    """Found by the soak harness (docs/soak.md, the 1-hour run of seed 62): a PriorityClass
    applied at the new leader (eu-r1) was read at eu-r0 just after eu-r0 resumed from a
    4.9 s SIGSTOP, and answered as it was before the apply: Get showed the replica's cache,
    which had not caught up, stamped with the store's current resourceVersion. Get now
    answers what the store holds: the cache's copy only when it is the stored one."""
    contexts = await replica_contexts(tmp_path, etcd_server.endpoint, etcd_namespace)
    lagging, leader = contexts
    try:
        assert leader.elector is not None
        leader.elector.term = await leader.store.put(LEADER_KEY, b"replica r1")
        writes, reads = admin_servicer(leader), admin_servicer(lagging).reads
        writes.applies.authorize = _allowed  # type: ignore[method-assign]
        writes.deletes.authorize = _allowed  # type: ignore[method-assign]
        reads.authorize = _allowed  # type: ignore[assignment]

        async def apply(value: str) -> None:
            request = admin_pb2.ApplyRequest(documents=[_priority_class(value).encode()])
            await writes.applies.Apply(request, _Context())

        async def read() -> dict[str, Any]:
            got = await reads.Get(admin_pb2.GetRequest(kind="PriorityClass", name="p0"), _Context())
            doc: dict[str, Any] = json.loads(got.json)
            assert doc["metadata"]["resourceVersion"] == str(got.resource_version)
            return doc

        async def listed() -> dict[str, str]:
            got = await reads.List(admin_pb2.ListRequest(kind="PriorityClass"), _Context())
            docs = [json.loads(item.json) for item in got.items]
            return {
                d["metadata"]["name"]: d["metadata"]["annotations"]["soak/value"]
                for d in docs
                if "soak/value" in d["metadata"].get("annotations", {})
            }

        await apply("w1")
        assert await listed() == {"p0": "w1"}
        # created at the leader, never in the lagging cache: shown from the store
        assert ("PriorityClass", "p0") not in lagging.cache.stored
        assert (await read())["metadata"]["annotations"]["soak/value"] == "w1"
        # the lagging cache holds w1 (as when it followed); the leader writes w2
        kv = await lagging.store.get(storekeys.object_key("PriorityClass", "p0"))
        assert kv is not None
        lagging.cache.put_object(storekeys.manifest_of(kv.value), kv.mod_revision)
        assert (await read())["metadata"]["annotations"]["soak/value"] == "w1"
        await apply("w2")
        doc = await read()
        assert doc["metadata"]["annotations"]["soak/value"] == "w2", "the cache's stale copy"
        after = await lagging.store.get(storekeys.object_key("PriorityClass", "p0"))
        assert after is not None and doc["metadata"]["resourceVersion"] == str(after.mod_revision)
        assert await listed() == {"p0": "w2"}  # a list too (hub.decide.paging.snapshot)
        # deleted at the leader: not found here, though the lagging cache still holds it
        await writes.deletes.Delete(
            admin_pb2.DeleteRequest(kind="PriorityClass", name="p0"), _Context()
        )
        assert ("PriorityClass", "p0") in lagging.cache.stored
        with pytest.raises(grpc.aio.AbortError, match="NOT_FOUND"):
            await read()
        assert await listed() == {}
        # a device enrolled at the other replica, not in this one's cache yet: shown
        record = {"name": "cam-9", "phase": "Pending"}
        await leader.store.put(storekeys.device_key("cam-9"), storekeys.dumps(record))
        assert "cam-9" not in lagging.cache.devices
        got = await reads.Get(admin_pb2.GetRequest(kind="Device", name="cam-9"), _Context())
        assert json.loads(got.json)["metadata"]["name"] == "cam-9"
        # a device removed from the store though still in the lagging cache: not found
        await leader.store.delete(storekeys.device_key("cam-9"))
        lagging.cache.devices["cam-9"] = leader.cache.devices.get("cam-9") or _device("cam-9")
        with pytest.raises(grpc.aio.AbortError, match="NOT_FOUND"):
            await reads.Get(admin_pb2.GetRequest(kind="Device", name="cam-9"), _Context())
    finally:
        for ctx in contexts:
            await ctx.store.close()


def _device(name: str) -> Any:
    from hub.decide.devices import Device

    return Device(name)
