"""The store's schema and its migrations (hub.state.migrations), on a real in-memory store:
steps in order and idempotent, the schema key written after each; a store of a newer schema
that this hub cannot read refused with nothing changed, a newer one it can read served; a
migration older replicas cannot follow waits for `hub migrate` on a shared store; a step cut
short is finished by the next run. Stores written by the previous release: test_hub_upgrade."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from asynctesting import async_test
from hubserving import make_hub_dir

from hub.cli import main
from hub.state.migrations import (
    MIGRATIONS,
    SCHEMA,
    SCHEMA_KEY,
    Migration,
    SchemaWatch,
    StoreSchemaError,
    check_schema,
    migrate,
    read_schema,
    stamp_schema,
)
from hub.state.store import MemoryStore, SqliteStore, Store


def _steps(log: list[str], *, third_compatible: bool = True) -> list[Migration]:
    def step(n: int):  # type: ignore[no-untyped-def]
        async def apply(store: Store) -> None:
            log.append(f"step {n}")
            if await store.get(f"/test/{n}") is None:  # idempotent: once written, left alone
                await store.put(f"/test/{n}", b"done")

        return apply

    return [
        Migration(1, "one", step(1), compatible=True),
        Migration(2, "two", step(2), compatible=True),
        Migration(3, "three", step(3), compatible=third_compatible),
    ]


async def _everything(store: Store) -> list[tuple[str, bytes]]:
    return [(kv.key, kv.value) for kv in (await store.range("")).kvs]


@async_test
async def test_a_store_from_before_schemas_is_migrated_in_order_once() -> None:
    store, log = MemoryStore(), []
    await store.put("/devices/cam-1", b"{}")  # a 0.1.0 store: data, no schema key
    assert (await read_schema(store)).version == 0
    applied = await migrate(store, shared=False, migrations=_steps(log), hub_version="9.9.9")
    assert applied == [1, 2, 3] and log == ["step 1", "step 2", "step 3"]
    record = orjson.loads((await store.get(SCHEMA_KEY)).value)  # type: ignore[union-attr]
    assert record["version"] == 3 and record["oldestReader"] == 0 and record["hub"] == "9.9.9"
    assert await migrate(store, shared=False, migrations=_steps(log)) == []  # nothing again
    assert len(log) == 3
    await store.close()


@async_test
async def test_a_step_cut_short_is_finished_by_the_next_run() -> None:
    store, log = MemoryStore(), []
    steps = _steps(log)

    async def crash(store: Store) -> None:
        await store.put("/test/2", b"done")  # the step's work, then the hub dies
        raise RuntimeError("power cut")

    broken = [steps[0], Migration(2, "two", crash, compatible=True), steps[2]]
    with pytest.raises(RuntimeError):
        await migrate(store, shared=False, migrations=broken)
    assert (await read_schema(store)).version == 1  # step 2 not recorded
    assert await migrate(store, shared=False, migrations=steps) == [2, 3]
    assert [k for k, _ in await _everything(store) if k.startswith("/test/")] == [
        "/test/1", "/test/2", "/test/3"
    ]  # fmt: skip
    await store.close()


@async_test
async def test_a_store_of_a_newer_schema_is_refused_unless_this_hub_can_read_it() -> None:
    store = MemoryStore()
    await store.put("/devices/cam-1", b"{}")
    newer = {"version": SCHEMA + 1, "oldestReader": SCHEMA + 1, "hub": "7.0.0", "migratedAt": 0}
    await store.put(SCHEMA_KEY, orjson.dumps(newer))
    before = await _everything(store)
    for attempt in (check_schema(store), migrate(store, shared=False)):
        with pytest.raises(StoreSchemaError) as refused:
            await attempt
        message = str(refused.value)
        assert f"schema {SCHEMA + 1} (written by hub 7.0.0)" in message, message
        assert f"reads schema {SCHEMA}" in message and "nothing was changed" in message
    assert await _everything(store) == before  # nothing was written
    # newer, but its migrations kept older hubs working: served as it is
    await store.put(SCHEMA_KEY, orjson.dumps({**newer, "oldestReader": SCHEMA}))
    assert (await check_schema(store)).version == SCHEMA + 1
    assert await migrate(store, shared=True) == []
    for junk in (b"not json", b'{"version": "1"}', b'{"version": -1}', b"{" + b" " * 5000 + b"}"):
        await store.put(SCHEMA_KEY, junk)
        with pytest.raises(StoreSchemaError, match="is not a schema record"):
            await check_schema(store)
    await store.close()


@async_test
async def test_a_migration_older_replicas_cannot_follow_waits_for_hub_migrate() -> None:
    """On a shared store (etcd) a step that is not compatible is not run by `hub serve`:
    replicas of the previous release may still serve it. `hub migrate` runs it; on a store
    no other replica shares (SQLite), serve does."""
    store, log = MemoryStore(), []
    steps = _steps(log, third_compatible=False)
    with pytest.raises(StoreSchemaError, match=r"migration 3 \(three\).*hub migrate"):
        await migrate(store, shared=True, migrations=steps)
    assert log == [] and await _everything(store) == []  # refused before any step
    assert await migrate(store, shared=True, migrations=steps, allow_incompatible=True) == [1, 2, 3]
    assert (await read_schema(store)).oldest_reader == 3  # older hubs now refuse it
    assert await migrate(
        MemoryStore(), shared=False, migrations=_steps([], third_compatible=False)
    ) == [1, 2, 3]
    await store.close()


@async_test
async def test_a_new_store_starts_at_this_schema() -> None:
    store = MemoryStore()
    await stamp_schema(store)
    record = await read_schema(store)
    assert record.version == SCHEMA == MIGRATIONS[-1].version
    assert await migrate(store, shared=True) == []
    assert [m.version for m in MIGRATIONS] == list(range(1, SCHEMA + 1))  # one per schema
    await store.close()


def test_hub_migrate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`hub migrate` on a hub data directory: nothing on a store of this schema; a store from
    before schemas brought to this one."""
    paths = asyncio.run(make_hub_dir(tmp_path / "hub"))
    assert main(["migrate", "--data-dir", str(paths.data_dir)]) == 0
    assert f"store schema {SCHEMA}: nothing to migrate" in capsys.readouterr().out

    async def forget() -> None:
        store = await SqliteStore.open(paths.data_dir / "hub.db")
        try:
            await store.delete(SCHEMA_KEY)
        finally:
            await store.close()

    asyncio.run(forget())
    assert main(["migrate", "--data-dir", str(paths.data_dir)]) == 0
    assert f"store migrated from schema 0 to {SCHEMA}" in capsys.readouterr().out


@async_test
async def test_a_replica_stops_when_the_shared_store_outgrows_it() -> None:
    """SchemaWatch: a newer schema this hub still reads leaves it serving; one it cannot read
    (another replica ran `hub migrate`) stops it, saying why."""
    store = MemoryStore()
    await stamp_schema(store)
    watch, stop = SchemaWatch(store, period=0.01), asyncio.Event()
    running = asyncio.ensure_future(watch.run(stop))
    compatible = {"version": SCHEMA + 1, "oldestReader": SCHEMA, "hub": "7.0.0"}
    await store.put(SCHEMA_KEY, orjson.dumps(compatible))
    await asyncio.sleep(0.1)
    assert not stop.is_set() and not watch.refused
    await store.put(SCHEMA_KEY, orjson.dumps({**compatible, "oldestReader": SCHEMA + 1}))
    await asyncio.wait_for(running, 5)
    assert stop.is_set() and "it is older than the store" in watch.refused
    await store.close()
