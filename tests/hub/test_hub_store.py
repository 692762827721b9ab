"""The Store contract (etcd semantics), run against the in-memory, the SQLite and the etcd store.

Revisions are asserted relative to the store's revision when the test starts (``r0``): 0 for a
fresh SQLite or in-memory store; on etcd, revisions are the cluster's and the session's etcd is
shared by the tests (each in its own namespace, one at a time)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from asynctesting import async_test, eventually
from etcdtesting import EtcdServer
from hubtesting import FakeClock, MakeStore

from edgefleet.errors import Compacted, CompareFailed, LeaseNotFound, StoreError
from hub.state.store import (
    Compare,
    Delete,
    EtcdStore,
    Event,
    EventType,
    Put,
    SqliteStore,
    Store,
    open_store,
    parse_store_url,
)


async def _take(it: object, n: int) -> list[Event]:
    assert hasattr(it, "__anext__")
    return [await asyncio.wait_for(it.__anext__(), 5) for _ in range(n)]


async def _r0(store: Store) -> int:
    return (await store.range("")).revision


@async_test
async def test_put_get_and_revisions(make_store: MakeStore) -> None:
    store = await make_store()
    try:
        r0 = await _r0(store)
        assert await store.get("/devices/a") is None
        assert await store.put("/devices/a", b"1") == r0 + 1
        assert await store.put("/devices/b", b"x") == r0 + 2
        assert await store.put("/devices/a", b"2") == r0 + 3
        kv = await store.get("/devices/a")
        assert kv is not None
        assert (kv.value, kv.create_revision, kv.mod_revision, kv.version) == (
            b"2",
            r0 + 1,
            r0 + 3,
            2,
        )
    finally:
        await store.close()


@async_test
async def test_range_is_sorted_bounded_by_the_prefix_and_says_its_revision(
    make_store: MakeStore,
) -> None:
    store = await make_store()
    try:
        r0 = await _r0(store)
        for key in (
            "/devices/b",
            "/devices/a",
            "/devicesx",
            "/deployments/a",
            "/devices/\U0010ffff",
        ):
            await store.put(key, key.encode())
        result = await store.range("/devices/")
        assert [kv.key for kv in result.kvs] == ["/devices/a", "/devices/b", "/devices/\U0010ffff"]
        assert result.revision == r0 + 5
        assert len((await store.range("")).kvs) == 5
        assert (await store.range("/nothing/")).kvs == ()
    finally:
        await store.close()


@async_test
async def test_compare_and_swap(make_store: MakeStore) -> None:
    store = await make_store()
    try:
        r0 = await _r0(store)
        assert await store.put("/k", b"1", expect_mod_revision=0) == r0 + 1
        with pytest.raises(CompareFailed) as info:
            await store.put("/k", b"2", expect_mod_revision=0)
        assert (info.value.key, info.value.expected, info.value.actual) == ("/k", 0, r0 + 1)
        assert f"expected it not to exist, but it is at mod revision {r0 + 1}" in str(info.value)
        with pytest.raises(CompareFailed):
            await store.put("/k", b"2", expect_mod_revision=r0 + 7)
        assert await store.put("/k", b"2", expect_mod_revision=r0 + 1) == r0 + 2
        with pytest.raises(CompareFailed):
            await store.put("/other", b"", expect_mod_revision=r0 + 2)
        assert (await store.range("")).revision == r0 + 2  # failures wrote nothing
        kv = await store.get("/k")
        assert kv is not None and kv.value == b"2"
    finally:
        await store.close()


@async_test
async def test_a_failed_transaction_names_every_key_whose_compare_failed(
    make_store: MakeStore,
) -> None:
    """The device writer merges every record changed elsewhere after one failure, rather
    than one per try (docs/soak.md, seed 62: etcd's log took 1.4 GB in 9 minutes)."""
    store = await make_store()
    try:
        r0 = await _r0(store)
        for k in ("/a", "/b", "/c", "/d"):
            await store.put(k, b"1")
        compares = [Compare(k, r0 + i + 1) for i, k in enumerate(("/a", "/b", "/c", "/d"))]
        await store.put("/b", b"2")
        await store.put("/d", b"2")
        with pytest.raises(CompareFailed) as info:
            await store.txn([*compares, Compare("/e", 0)], [Put("/a", b"3")])
        assert (info.value.key, info.value.also) == ("/b", ("/d",))
        with pytest.raises(CompareFailed) as info:
            await store.txn([Compare("/a", r0 + 1), Compare("/z", r0 + 1)], [])
        assert (info.value.key, info.value.actual, info.value.also) == ("/z", 0, ())
        kv = await store.get("/a")
        assert kv is not None and kv.value == b"1"  # nothing written
    finally:
        await store.close()


@async_test
async def test_only_one_of_many_concurrent_creators_wins(make_store: MakeStore) -> None:
    store = await make_store()
    try:
        results = await asyncio.gather(
            *(store.put("/lock", str(i).encode(), expect_mod_revision=0) for i in range(20)),
            return_exceptions=True,
        )
        assert sum(isinstance(r, int) for r in results) == 1
        assert sum(isinstance(r, CompareFailed) for r in results) == 19
    finally:
        await store.close()


@async_test
async def test_delete(make_store: MakeStore) -> None:
    store = await make_store()
    try:
        r0 = await _r0(store)
        assert await store.delete("/k") is None
        await store.put("/k", b"1")
        with pytest.raises(CompareFailed):
            await store.delete("/k", expect_mod_revision=r0 + 5)
        assert await store.delete("/k", expect_mod_revision=r0 + 1) == r0 + 2
        assert await store.get("/k") is None
        assert await store.put("/k", b"again") == r0 + 3
        kv = await store.get("/k")
        assert kv is not None and (kv.create_revision, kv.version) == (r0 + 3, 1)
    finally:
        await store.close()


@async_test
async def test_txn_is_atomic_and_one_revision(make_store: MakeStore) -> None:
    store = await make_store()
    try:
        r0 = await _r0(store)
        await store.put("/a", b"1")
        await store.put("/b", b"1")
        revision = await store.txn(
            [Compare("/a", r0 + 1), Compare("/new", 0)],
            [Put("/a", b"2"), Put("/new", b"n"), Delete("/b"), Delete("/absent")],
        )
        assert revision == r0 + 3
        assert [kv.mod_revision for kv in (await store.range("")).kvs] == [r0 + 3, r0 + 3]
        with pytest.raises(CompareFailed) as info:
            await store.txn([Compare("/a", r0 + 3), Compare("/new", 0)], [Put("/a", b"3")])
        assert info.value.key == "/new"
        a = await store.get("/a")
        assert a is not None and a.value == b"2"
        assert await store.txn([], [Delete("/absent")]) == r0 + 3  # nothing changed
        with pytest.raises(StoreError, match="appears twice"):
            await store.txn([], [Put("/a", b""), Delete("/a")])
        with pytest.raises(StoreError, match="non-empty"):
            await store.put("", b"")
    finally:
        await store.close()


@async_test
async def test_watch_follows_live_changes_under_its_prefix(make_store: MakeStore) -> None:
    store = await make_store()
    try:
        r0 = await _r0(store)
        await store.put("/devices/a", b"old")
        watch = store.watch("/devices/")
        first = asyncio.ensure_future(watch.__anext__())
        await eventually(lambda: store.watching == 1, within=10)  # subscribed: from now on
        await store.put("/deployments/x", b"ignored")
        await store.put("/devices/a", b"new")
        await store.delete("/devices/a")
        put = await asyncio.wait_for(first, 5)
        assert put.type is EventType.PUT and put.kv.value == b"new" and put.revision == r0 + 3
        assert put.prev_kv is not None and put.prev_kv.value == b"old"
        (gone,) = await _take(watch, 1)
        assert gone.type is EventType.DELETE and gone.revision == r0 + 4
        assert gone.kv.key == "/devices/a" and gone.prev_kv is not None
        assert gone.prev_kv.value == b"new"
        await watch.aclose()
    finally:
        await store.close()


@async_test
async def test_watch_from_a_past_revision_replays_then_follows_without_gap(
    make_store: MakeStore,
) -> None:
    store = await make_store()
    try:
        r0 = await _r0(store)
        for i in range(5):
            await store.put(f"/k/{i}", b"v")
        watch = store.watch("/k/", start_revision=r0 + 3)
        writer = asyncio.ensure_future(
            asyncio.gather(*(store.put(f"/k/{i}", b"w") for i in range(5, 10)))
        )
        events = await _take(watch, 7)
        await writer
        assert [e.revision for e in events] == list(range(r0 + 3, r0 + 10))
        await watch.aclose()
    finally:
        await store.close()


@async_test
async def test_watch_below_the_compaction_point_is_refused(make_store: MakeStore) -> None:
    store = await make_store()
    try:
        r0 = await _r0(store)
        for i in range(5):
            await store.put("/k", str(i).encode())
        await store.compact(r0 + 4)
        with pytest.raises(Compacted) as info:
            await store.watch("/k", start_revision=r0 + 2).__anext__()
        assert info.value.compact_revision == r0 + 4
        watch = store.watch("/k", start_revision=r0 + 4)
        assert [e.kv.value for e in await _take(watch, 2)] == [b"3", b"4"]
        await watch.aclose()
        with pytest.raises(StoreError, match="cannot compact"):
            await store.compact(r0 + 99)
    finally:
        await store.close()


@async_test
async def test_range_at_a_past_revision_sees_the_keys_as_they_were(make_store: MakeStore) -> None:
    """What a paged List reads after its first page: the snapshot of the list's revision,
    whatever was put, changed or deleted since (also in one txn, also outside the prefix)."""
    store = await make_store()
    try:
        r0 = await _r0(store)
        await store.put("/d/a", b"a1")
        await store.put("/d/b", b"b1")
        await store.put("/other", b"o")
        then = (await store.range("/d/")).revision
        await store.put("/d/a", b"a2")  # changed twice: the value before the first change
        await store.put("/d/a", b"a3")
        await store.delete("/d/b")
        await store.txn([], [Put("/d/c", b"c1"), Put("/other", b"o2")])  # created since
        await store.put("/d/b", b"b2")  # deleted, then created again
        at = await store.range_at("/d/", then)
        assert at.revision == then
        assert [(kv.key, kv.value, kv.mod_revision) for kv in at.kvs] == [
            ("/d/a", b"a1", r0 + 1),
            ("/d/b", b"b1", r0 + 2),
        ]
        assert [kv.value for kv in (await store.range_at("/d/", r0 + 1)).kvs] == [b"a1"]
        now = await store.range("/d/")
        assert (await store.range_at("/d/", now.revision)).kvs == now.kvs
        with pytest.raises(StoreError, match="cannot read at revision"):
            await store.range_at("/d/", now.revision + 5)
        await store.compact(now.revision - 1)
        with pytest.raises(Compacted):
            await store.range_at("/d/", then)
    finally:
        await store.close()


@async_test
async def test_leases_expire_by_the_clock_and_delete_their_keys(
    make_store: MakeStore, clock: FakeClock
) -> None:
    if make_store.kind == "etcd":  # type: ignore[attr-defined]
        pytest.skip("etcd expires leases by its own clock: test_etcd_expires_leases_itself")
    store = await make_store()
    try:
        lease = await store.grant(10)
        await store.put("/heartbeats/a", b"", lease=lease)
        await store.put("/devices/a", b"kept")
        clock.advance(9)
        assert await store.expire_leases() == []
        await store.keepalive(lease)
        clock.advance(9)
        assert await store.expire_leases() == []
        watch = store.watch("/heartbeats/", start_revision=3)
        clock.advance(2)
        assert await store.expire_leases() == [lease]
        (gone,) = await _take(watch, 1)
        assert gone.type is EventType.DELETE and gone.kv.key == "/heartbeats/a"
        await watch.aclose()
        assert await store.get("/heartbeats/a") is None
        assert await store.get("/devices/a") is not None
        with pytest.raises(LeaseNotFound):
            await store.keepalive(lease)
        with pytest.raises(LeaseNotFound):
            await store.put("/x", b"", lease=lease)
    finally:
        await store.close()


@async_test
async def test_revoke_and_detaching_a_key_from_its_lease(make_store: MakeStore) -> None:
    store = await make_store()
    try:
        r0 = await _r0(store)
        lease = await store.grant(60)
        await store.put("/a", b"", lease=lease)
        await store.put("/b", b"", lease=lease)
        await store.put("/b", b"no lease now")  # a put without lease detaches the key
        revision = await store.revoke(lease)
        assert revision == r0 + 4
        assert [kv.key for kv in (await store.range("")).kvs] == ["/b"]
        with pytest.raises(LeaseNotFound):
            await store.revoke(lease)
        with pytest.raises(StoreError, match="TTL"):
            await store.grant(0)
    finally:
        await store.close()


@async_test
async def test_sqlite_keeps_everything_across_reopen(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "hub.db"
    store = await SqliteStore.open(path, clock=clock)
    lease = await store.grant(30)
    await store.put("/a", b"1", lease=lease)
    await store.put("/a", b"2", lease=lease)
    await store.close()
    store = await SqliteStore.open(path, clock=clock)
    try:
        kv = await store.get("/a")
        assert kv is not None and (kv.value, kv.version, kv.lease) == (b"2", 2, lease)
        assert await store.put("/b", b"") == 3
        watch = store.watch("/a", start_revision=1)
        assert [e.kv.value for e in await _take(watch, 2)] == [b"1", b"2"]
        await watch.aclose()
        clock.advance(31)
        assert await store.expire_leases() == [lease]
    finally:
        await store.close()


def test_store_urls(tmp_path: Path) -> None:
    assert parse_store_url("sqlite:///var/lib/hub/hub.db").path == Path("/var/lib/hub/hub.db")
    assert parse_store_url("etcd://a:2379,b:2379").endpoints == ("a:2379", "b:2379")
    for bad in ("sqlite://relative/hub.db", "sqlite:///", "etcd://", "redis://x", "hub.db"):
        with pytest.raises(StoreError):
            parse_store_url(bad)


@async_test
async def test_open_store_defaults_to_sqlite_in_the_data_dir(tmp_path: Path) -> None:
    store: Store = await open_store(None, data_dir=tmp_path)
    await store.put("/k", b"v")
    await store.close()
    assert (tmp_path / "hub.db").exists()


@async_test
async def test_open_store_opens_etcd_from_its_url(
    tmp_path: Path, etcd_server: EtcdServer, etcd_namespace: str
) -> None:
    url = f"etcd://{etcd_server.endpoint}{etcd_namespace}"
    store: Store = await open_store(url, data_dir=tmp_path)
    try:
        revision = await store.put("/k", b"v")
        kv = await store.get("/k")
        assert kv is not None and kv.mod_revision == revision
        assert isinstance(store, EtcdStore) and store.namespace == etcd_namespace
    finally:
        await store.close()
    assert not (tmp_path / "hub.db").exists()
