"""The hub's store: etcd-like semantics behind one protocol (see :mod:`hub.store.protocol`).

``await open_store(url, data_dir=D)`` opens the store a URL names:

* ``sqlite:///abs/path/hub.db`` — the embedded default (``D/hub.db`` when no URL is given);
* ``memory://`` — in-memory, for tests;
* ``etcd://host:port,host:port`` — several hub replicas on an etcd cluster (not built yet).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from edgefleet.errors import StoreError, StoreUnavailable
from hub.store.identity import check_identity, check_store_file, read_marker
from hub.store.memory import MemoryStore
from hub.store.protocol import (
    NO_LEASE,
    Clock,
    Compare,
    Delete,
    Event,
    EventType,
    KeyValue,
    LeaseId,
    Op,
    Put,
    RangeResult,
    Store,
    system_clock,
)
from hub.store.sqlite import SqliteStore

__all__ = [
    "NO_LEASE",
    "Clock",
    "Compare",
    "Delete",
    "Event",
    "EventType",
    "KeyValue",
    "LeaseId",
    "MemoryStore",
    "Op",
    "Put",
    "RangeResult",
    "SqliteStore",
    "Store",
    "StoreLocation",
    "default_store_url",
    "open_hub_store",
    "open_store",
    "parse_store_url",
]

STORE_FILE_NAME = "hub.db"


@dataclass(frozen=True, slots=True)
class StoreLocation:
    """A parsed store URL: ``scheme`` is ``sqlite``, ``memory`` or ``etcd``."""

    scheme: str
    path: Path | None = None
    endpoints: tuple[str, ...] = ()


def default_store_url(data_dir: Path) -> str:
    return f"sqlite://{data_dir.absolute() / STORE_FILE_NAME}"


def parse_store_url(url: str) -> StoreLocation:
    """Check a store URL; raises StoreError saying what is wrong with it."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        if parts.netloc or not os.path.isabs(parts.path) or parts.path.endswith("/"):
            raise StoreError(
                f"store URL {url!r}: a SQLite store is sqlite:///ABSOLUTE/PATH "
                "(three slashes, then the path of the database file)"
            )
        return StoreLocation("sqlite", path=Path(parts.path))
    if parts.scheme == "memory":
        return StoreLocation("memory")
    if parts.scheme == "etcd":
        endpoints = tuple(e for e in parts.netloc.split(",") if e)
        if not endpoints or any(":" not in e for e in endpoints):
            raise StoreError(f"store URL {url!r}: an etcd store is etcd://HOST:PORT[,HOST:PORT]...")
        return StoreLocation("etcd", endpoints=endpoints)
    raise StoreError(
        f"store URL {url!r}: unknown scheme {parts.scheme!r} "
        "(expected sqlite:///PATH, etcd://HOST:PORT,... or memory://)"
    )


async def open_store(url: str | None, *, data_dir: Path, clock: Clock = system_clock) -> Store:
    """The store at ``url`` (``None``: the SQLite file in ``data_dir``), opened."""
    location = parse_store_url(url or default_store_url(data_dir))
    if location.scheme == "memory":
        return MemoryStore(clock=clock)
    if location.scheme == "etcd":
        raise StoreUnavailable(
            f"the etcd store is not built yet (endpoints {', '.join(location.endpoints)}); "
            "use the embedded SQLite store (sqlite:///PATH, the default)"
        )
    assert location.path is not None
    return await SqliteStore.open(location.path, clock=clock)


async def open_hub_store(url: str | None, *, data_dir: Path, clock: Clock = system_clock) -> Store:
    """The store of the hub in ``data_dir``, opened only if it is that hub's store: present,
    not empty, with the identity its marker names (:mod:`hub.store.identity`; StoreIdentityError
    saying what is missing and how to restore it otherwise). ``memory://`` is not checked."""
    location = parse_store_url(url or default_store_url(data_dir))
    if location.scheme == "sqlite":
        assert location.path is not None
        check_store_file(location.path, read_marker(data_dir), data_dir)
    store = await open_store(url, data_dir=data_dir, clock=clock)
    if location.scheme == "memory":
        return store
    try:
        await check_identity(store, data_dir, where=str(location.path or url))
    except BaseException:
        await store.close()
        raise
    return store
