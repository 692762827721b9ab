"""The store's schema version and its migrations (docs/agent-updates.md, "Upgrading hubs").

The store (SQLite and etcd alike) carries its schema at :data:`SCHEMA_KEY`::

    {"version": 1, "oldestReader": 0, "hub": "0.2.0", "migratedAt": 1796000000.0}

``version`` is the newest migration applied; a store without the key was written before
schema versions (edgefleet 0.1.0): schema 0. ``oldestReader`` is the oldest schema whose hubs
still read and write the store correctly: the version of the newest migration applied that
was not ``compatible``, 0 while every one was. ``hub`` and ``migratedAt``: which hub wrote it,
when.

:data:`MIGRATIONS` is the list of steps, in order, one per schema version. Each step is
idempotent (run again after a crash it changes nothing more), and the schema key is written
after its step, with a compare on the key, so that two replicas upgrading at once apply each
step at most twice and record it once. A step is ``compatible`` when hubs of the schema
before it go on working on the migrated store (additive changes: a new key prefix, a new
optional field an older hub ignores): those are applied by ``hub serve`` itself, with replicas
of the previous release still serving the same etcd store (a rolling upgrade). A step that is
not compatible is applied by ``hub serve`` only on a store no other replica shares (SQLite);
on etcd it waits for ``hub migrate``, run while every replica is stopped. Write a change as
compatible steps where it can be (add in one release, stop using the old form in the next):
only those roll.

A hub opens only a store it can read (:func:`check_schema`, every command): a store of a newer
schema whose ``oldestReader`` is above this hub's :data:`SCHEMA` is refused with
:class:`StoreSchemaError`, naming both, and nothing is written. A replica already serving a
shared store stops when the store becomes one it cannot read (:class:`SchemaWatch`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from edgefleet.errors import CompareFailed, StoreError
from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop
from edgefleet.versioning import installed_version
from hub.state.store.protocol import Store

log = get_logger(__name__)

SCHEMA_KEY = "/hub/schema"
MAX_SCHEMA_BYTES = 4096


class StoreSchemaError(StoreError):
    """The store's schema is not one this hub can serve (newer, or a migration it must not
    run by itself); nothing was changed."""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int  # the schema it brings the store to: its place in MIGRATIONS, from 1
    title: str  # what changes, for logs and errors
    apply: Callable[[Store], Awaitable[None]]  # idempotent
    compatible: bool  # hubs of the schema before it keep working on the migrated store


async def _nothing_to_rewrite(store: Store) -> None:
    """Additive only: nothing of a schema 0 store is rewritten."""


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "schema versions begin (edgefleet 0.2.0): device records may carry agentVersion, "
        "agentRefused and agent, agent releases live under /agentreleases/, AgentUpgrade "
        "objects under /objects/ and their rollouts under /agentupgrades/; all additive, a "
        "0.1.0 hub ignores them",
        _nothing_to_rewrite,
        compatible=True,
    ),
)
SCHEMA = MIGRATIONS[-1].version
"""The schema this hub writes and reads."""


@dataclass(frozen=True, slots=True)
class SchemaRecord:
    version: int = 0
    oldest_reader: int = 0
    hub: str = ""  # the hub version that wrote it ("": a store from before schema versions)
    migrated_at: float = 0.0
    mod_revision: int = 0  # of the key; 0: absent

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "version": self.version,
                "oldestReader": self.oldest_reader,
                "hub": self.hub,
                "migratedAt": self.migrated_at,
            }
        )

    @classmethod
    def parse(cls, value: bytes, mod_revision: int) -> SchemaRecord:
        try:
            if len(value) > MAX_SCHEMA_BYTES:
                raise ValueError(f"over {MAX_SCHEMA_BYTES} bytes")
            doc: Any = orjson.loads(value)
            version, oldest = doc["version"], doc.get("oldestReader", doc["version"])
            if not isinstance(version, int) or not isinstance(oldest, int) or version < 0:
                raise ValueError("version and oldestReader must be whole numbers")
            return cls(
                version, oldest, str(doc.get("hub", "")), float(doc.get("migratedAt", 0.0)),
                mod_revision,
            )  # fmt: skip
        except (ValueError, TypeError, KeyError, orjson.JSONDecodeError) as exc:
            raise StoreSchemaError(
                f"the store's {SCHEMA_KEY} is not a schema record ({exc}): refusing to serve "
                "a store whose schema is unknown; restore a backup"
            ) from None


async def read_schema(store: Store) -> SchemaRecord:
    kv = await store.get(SCHEMA_KEY)
    return SchemaRecord() if kv is None else SchemaRecord.parse(kv.value, kv.mod_revision)


def _oldest_reader(migrations: Sequence[Migration], version: int) -> int:
    return max((m.version for m in migrations if m.version <= version and not m.compatible),
               default=0)  # fmt: skip


async def check_schema(
    store: Store, *, schema: int = SCHEMA, where: str = "the store"
) -> SchemaRecord:
    """The store's schema record; :class:`StoreSchemaError` when this hub (``schema``) cannot
    read it: written by a newer hub whose migrations older hubs cannot follow."""
    record = await read_schema(store)
    if record.version > schema:
        if record.oldest_reader > schema:
            raise StoreSchemaError(
                f"{where} has schema {record.version} (written by hub {record.hub or '?'}), "
                f"which hubs of schema {record.oldest_reader} or newer read; this hub "
                f"({installed_version()}) reads schema {schema}: it is older than the store. "
                f"Run hub {record.hub or 'of the newer release'} (or newer) on it, or restore "
                "a backup taken before the upgrade; nothing was changed"
            )
        log.warning(
            "store schema newer than this hub, compatible",
            schema=record.version,
            hub=record.hub,
            reads=schema,
        )
    return record


async def migrate(
    store: Store,
    *,
    shared: bool,
    allow_incompatible: bool = False,
    migrations: Sequence[Migration] = MIGRATIONS,
    hub_version: str | None = None,
    clock: Callable[[], float] = time.time,
) -> list[int]:
    """Bring the store to the newest schema of ``migrations``; the versions applied.

    ``shared``: other replicas may serve the store now (etcd): a migration that is not
    compatible is then applied only with ``allow_incompatible`` (``hub migrate``); without it
    :class:`StoreSchemaError` names it, before any step runs. A store of a newer schema is left
    as it is (:func:`check_schema` refused it already if this hub cannot read it)."""
    schema = migrations[-1].version if migrations else 0
    record = await check_schema(store, schema=schema)
    pending = [m for m in migrations if m.version > record.version]
    blocked = [m for m in pending if not m.compatible]
    if blocked and shared and not allow_incompatible:
        first = blocked[0]
        raise StoreSchemaError(
            f"the store has schema {record.version}; migration {first.version} ({first.title}) "
            "cannot be read by hubs of older releases that may still serve this shared store: "
            "stop every replica (`hub migrate` refuses while one leads), run `hub migrate` "
            "once, then start the replicas of this release; nothing was changed"
        )
    hub = hub_version or installed_version()
    applied = []
    for step in pending:
        log.info("store migration", schema=step.version, title=step.title)
        await step.apply(store)
        new = SchemaRecord(
            step.version,
            _oldest_reader(migrations, step.version),
            hub,
            clock(),
        )
        try:
            await store.put(SCHEMA_KEY, new.to_json(), expect_mod_revision=record.mod_revision)
        except CompareFailed:  # another replica recorded a step meanwhile: read it again
            record = await read_schema(store)
            if record.version < step.version:
                raise StoreError(
                    f"{SCHEMA_KEY} changed while migration {step.version} ran, to schema "
                    f"{record.version}: run the hub again"
                ) from None
            continue
        record = await read_schema(store)
        applied.append(step.version)
    return applied


class SchemaWatch:
    """A component of a replica on a shared store (etcd): every ``period`` seconds it reads the
    schema key, and when another replica's ``hub migrate`` has made the store one this hub
    cannot read it stops the hub (``stop`` set; :attr:`refused` says why, and ``hub serve``
    exits with it) rather than serve a store it no longer understands."""

    name = "schema-watch"

    def __init__(self, store: Store, *, schema: int = SCHEMA, period: float = 5.0) -> None:
        self.store = store
        self.schema = schema
        self.period = period
        self.refused = ""

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await check_schema(self.store, schema=self.schema, where="the shared store")
            except StoreSchemaError as exc:
                log.error("store schema no longer readable: stopping", error=str(exc))
                self.refused = str(exc)
                stop.set()
                return
            except StoreError as exc:  # the store is unreachable: its users report it
                log.debug("store schema not read", error=str(exc))
            await wait_for_stop(stop, self.period)


async def stamp_schema(store: Store, *, clock: Callable[[], float] = time.time) -> None:
    """A new store (``hub init``) starts at :data:`SCHEMA`: nothing to migrate."""
    record = SchemaRecord(SCHEMA, _oldest_reader(MIGRATIONS, SCHEMA), installed_version(), clock())
    await store.put(SCHEMA_KEY, record.to_json(), expect_mod_revision=0)
