"""Hub tests. Real: SQLite files (in tmp_path), certificates made with ``cryptography``, gRPC
servers and clients on loopback with mutual TLS, subprocesses for the CLI and kill -9.
Faked: only the clock (a ``FakeClock`` the test moves) where lease or token expiry is tested;
the in-memory store runs the same store suite as the SQLite one."""

from __future__ import annotations

from pathlib import Path

import pytest
from hubtesting import FakeClock, MakeStore

from hub.store import MemoryStore, SqliteStore
from hub.store.protocol import Clock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> MakeStore:
    """``await make_store()``: a fresh store of each kind (SQLite: a real file in tmp_path),
    on the fake clock; call it inside the test's event loop."""

    async def make(clock: Clock = clock) -> MemoryStore | SqliteStore:
        if request.param == "memory":
            return MemoryStore(clock=clock)
        return await SqliteStore.open(tmp_path / "hub.db", clock=clock)

    return make
