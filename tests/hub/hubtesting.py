"""Helpers for hub tests: a clock the test moves, and the type of the store factory fixture."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

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
