"""Helpers for hub tests: a clock the test moves, and the type of the store factory fixture."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from hub.state.store import MemoryStore, SqliteStore
from hub.state.store.etcd import EtcdStore


class FakeClock:
    """Wall-clock seconds that move only when the test says so."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


MakeStore = Callable[..., Awaitable[MemoryStore | SqliteStore | EtcdStore]]


async def replica_contexts(tmp: Path, endpoint: str, namespace: str) -> list[Any]:
    """Two hub contexts (``r0``, ``r1``) made from copies of one data directory on one real
    etcd, as two replicas are (hub.controllers.replicas)."""
    import shutil

    from hub.initializing import init_hub
    from hub.server import build_context

    await init_hub(tmp / "r0", region="eu", store=f"etcd://{endpoint}{namespace}")
    shutil.copytree(tmp / "r0", tmp / "r1")
    contexts = []
    for d in ("r0", "r1"):
        store = await EtcdStore.open([endpoint], namespace=namespace)
        contexts.append(await build_context(tmp / d, store=store))
    return contexts
