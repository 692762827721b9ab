"""Hub tests. Real: SQLite files (in tmp_path), etcd (one member on loopback, shared by the
session, each test in its own key namespace), certificates made with ``cryptography``, gRPC
servers and clients on loopback with mutual TLS, subprocesses for the CLI and kill -9.
Faked: only the clock (a ``FakeClock`` the test moves) where lease or token expiry is tested;
the in-memory store runs the same store suite as the SQLite and etcd ones."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from etcdtesting import EtcdServer, running_etcd
from hubtesting import FakeClock, MakeStore

from hub.state.store import MemoryStore, SqliteStore
from hub.state.store.etcd import EtcdStore
from hub.state.store.protocol import Clock

_namespaces = itertools.count(1)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """A real etcd for the session (skipped, saying why, where etcd is not installed)."""
    with running_etcd(tmp_path_factory.mktemp("etcd")) as server:
        yield server


@pytest.fixture
def etcd_namespace() -> str:
    """A key namespace no other test uses, on the session's etcd."""
    return f"/test-{next(_namespaces)}"


@pytest.fixture(params=["memory", "sqlite", "etcd"])
def make_store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock, etcd_namespace: str
) -> MakeStore:
    """``await make_store()``: a fresh store of each kind (SQLite: a real file in tmp_path;
    etcd: a namespace of the session's real etcd), on the fake clock where the kind has a
    clock (etcd judges lease expiry itself); call it inside the test's event loop.
    ``make_store.kind`` names the kind."""
    if request.param == "etcd":
        etcd: EtcdServer = request.getfixturevalue("etcd_server")

    async def make(clock: Clock = clock) -> MemoryStore | SqliteStore | EtcdStore:
        if request.param == "memory":
            return MemoryStore(clock=clock)
        if request.param == "etcd":
            return await EtcdStore.open([etcd.endpoint], namespace=etcd_namespace)
        return await SqliteStore.open(tmp_path / "hub.db", clock=clock)

    make.kind = request.param  # type: ignore[attr-defined]
    return make
