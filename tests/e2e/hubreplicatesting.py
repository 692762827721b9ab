"""Hub replicas on a real etcd: the namespace they share and the port of the replica that leads."""

from __future__ import annotations

import asyncio
import re

from etcdtesting import EtcdServer

from hub.state.store import EtcdStore
from hub.state.store.identity import LEADER_KEY

NAMESPACE = "/fleet"


def leader_port(etcd: EtcdServer) -> int | None:
    async def read() -> int | None:
        store = await EtcdStore.open([etcd.endpoint], namespace=NAMESPACE)
        try:
            kv = await store.get(LEADER_KEY)
        finally:
            await store.close()
        match = re.search(r"port (\d+)$", kv.value.decode()) if kv is not None else None
        return int(match.group(1)) if match else None

    return asyncio.run(read())


def stored(etcd: EtcdServer, prefix: str) -> dict[str, tuple[int, bytes]]:
    """The keys under ``prefix`` in the replicas' namespace: key -> (mod revision, value)."""

    async def read() -> dict[str, tuple[int, bytes]]:
        store = await EtcdStore.open([etcd.endpoint], namespace=NAMESPACE)
        try:
            listed = await store.range(prefix)
        finally:
            await store.close()
        return {kv.key: (kv.mod_revision, kv.value) for kv in listed.kvs}

    return asyncio.run(read())
