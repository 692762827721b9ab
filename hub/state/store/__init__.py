"""The hub's store: etcd-like semantics behind one protocol (see :mod:`hub.state.store.protocol`).

``await open_store(url, data_dir=D)`` opens the store a URL names:

* ``sqlite:///abs/path/hub.db`` — the embedded default (``D/hub.db`` when no URL is given);
* ``memory://`` — in-memory, for tests;
* ``etcd://host:port,host:port[/namespace]`` — several hub replicas on an etcd cluster
  (:mod:`hub.state.store.etcd`; TLS to etcd with ``etcd_tls``), keys under ``namespace`` if given.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from edgefleet.errors import StoreError
from hub.state.store.etcd import EtcdStore, EtcdTls
from hub.state.store.identity import check_identity, check_store_file, read_marker
from hub.state.store.memory import MemoryStore
from hub.state.store.protocol import (
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
from hub.state.store.sqlite import SqliteStore

__all__ = [
    "NO_LEASE",
    "Clock",
    "Compare",
    "Delete",
    "EtcdStore",
    "EtcdTls",
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
    namespace: str = ""
    """etcd: the prefix of every key of this hub (the URL's path; empty: none)."""


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
        return _parse_etcd(url, parts.netloc, parts.path, parts.query or parts.fragment)
    raise StoreError(
        f"store URL {url!r}: unknown scheme {parts.scheme!r} "
        "(expected sqlite:///PATH, etcd://HOST:PORT,... or memory://)"
    )


ETCD_USAGE = "an etcd store is etcd://HOST:PORT[,HOST:PORT...][/NAMESPACE]"


def _parse_etcd(url: str, netloc: str, path: str, extra: str) -> StoreLocation:
    if extra:
        raise StoreError(f"store URL {url!r}: query and fragment are not supported; {ETCD_USAGE}")
    if "@" in netloc:
        raise StoreError(
            f"store URL {url!r}: etcd user names and passwords are not supported yet "
            "(use TLS client certificates: etcd certFile/keyFile)"
        )
    endpoints = tuple(netloc.split(",")) if netloc else ()
    if not endpoints:
        raise StoreError(f"store URL {url!r}: no endpoint; {ETCD_USAGE}")
    for endpoint in endpoints:
        host, sep, port = endpoint.rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise StoreError(
                f"store URL {url!r}: endpoint {endpoint!r} is not HOST:PORT "
                f"(a port from 1 to 65535); {ETCD_USAGE}"
            )
    if len(set(endpoints)) != len(endpoints):
        raise StoreError(f"store URL {url!r}: an endpoint appears twice")
    namespace = path.rstrip("/")
    if "\x00" in namespace or "//" in namespace:
        raise StoreError(f"store URL {url!r}: the namespace {path!r} is not a clean key prefix")
    return StoreLocation("etcd", endpoints=endpoints, namespace=namespace)


def _check_tls(location: StoreLocation, etcd_tls: EtcdTls | None) -> None:
    if etcd_tls is not None and location.scheme != "etcd":
        raise StoreError(
            f"etcd TLS options (CA, client certificate and key) apply only to an etcd:// "
            f"store; this store is {location.scheme}"
        )


async def open_store(
    url: str | None,
    *,
    data_dir: Path,
    clock: Clock = system_clock,
    etcd_tls: EtcdTls | None = None,
) -> Store:
    """The store at ``url`` (``None``: the SQLite file in ``data_dir``), opened. ``clock``
    judges lease expiry, except on etcd (its own); ``etcd_tls``: TLS to etcd (etcd only)."""
    location = parse_store_url(url or default_store_url(data_dir))
    _check_tls(location, etcd_tls)
    if location.scheme == "memory":
        return MemoryStore(clock=clock)
    if location.scheme == "etcd":
        return await EtcdStore.open(location.endpoints, namespace=location.namespace, tls=etcd_tls)
    assert location.path is not None
    return await SqliteStore.open(location.path, clock=clock)


async def open_hub_store(
    url: str | None,
    *,
    data_dir: Path,
    clock: Clock = system_clock,
    etcd_tls: EtcdTls | None = None,
) -> Store:
    """The store of the hub in ``data_dir``, opened only if it is that hub's store: present,
    not empty, with the identity its marker names (:mod:`hub.state.store.identity`;
    StoreIdentityError
    saying what is missing and how to restore it otherwise), and of a schema this hub reads
    (:func:`hub.state.migrations.check_schema`; StoreSchemaError otherwise, nothing written).
    ``memory://`` is not checked."""
    location = parse_store_url(url or default_store_url(data_dir))
    _check_tls(location, etcd_tls)
    if location.scheme == "sqlite":
        assert location.path is not None
        check_store_file(location.path, read_marker(data_dir), data_dir)
    store = await open_store(url, data_dir=data_dir, clock=clock, etcd_tls=etcd_tls)
    if location.scheme == "memory":
        return store
    from hub.state.migrations import check_schema  # the migrations build on this package

    try:
        where = str(location.path or url)
        await check_identity(store, data_dir, where=where)
        await check_schema(store, where=f"the store {where}")
    except BaseException:
        await store.close()
        raise
    return store
