"""The embedded :class:`~hub.state.store.protocol.Store`: one SQLite file.

Durability: WAL journal with ``synchronous=FULL``, so a write is fsynced before its call
returns; every acknowledged write survives kill -9 and power loss. Every operation is one
``BEGIN IMMEDIATE`` transaction. One connection, used from one dedicated thread (a
single-worker executor), does all reads and writes, so the event loop never blocks on disk and
operations are totally ordered. Watch events are handed to the loop from that thread, in
commit order, before the operation returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from edgefleet.errors import Compacted, CompareFailed, LeaseNotFound, StoreError
from edgefleet.logs import get_logger
from hub.state.store.fanout import Broadcaster
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
    check_key,
    check_ops,
    check_past_revision,
    check_ttl,
    prefix_end,
    system_clock,
)

log = get_logger(__name__)

T = TypeVar("T")

SCHEMA_VERSION = 1
WAL_SIZE_LIMIT = 16 * 1024 * 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS kv (
  key TEXT PRIMARY KEY, value BLOB NOT NULL, create_revision INTEGER NOT NULL,
  mod_revision INTEGER NOT NULL, version INTEGER NOT NULL, lease INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS kv_lease ON kv (lease) WHERE lease != 0;
CREATE TABLE IF NOT EXISTS events (
  revision INTEGER NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL, key TEXT NOT NULL,
  value BLOB NOT NULL, create_revision INTEGER NOT NULL, version INTEGER NOT NULL,
  lease INTEGER NOT NULL,
  prev_value BLOB, prev_create_revision INTEGER, prev_mod_revision INTEGER,
  prev_version INTEGER, prev_lease INTEGER,
  PRIMARY KEY (revision, seq)
);
CREATE TABLE IF NOT EXISTS leases (
  id INTEGER PRIMARY KEY, ttl REAL NOT NULL, deadline REAL NOT NULL
);
"""

_KV_COLUMNS = "key, value, create_revision, mod_revision, version, lease"


def _kv(row: tuple[str, bytes, int, int, int, int]) -> KeyValue:
    return KeyValue(row[0], bytes(row[1]), row[2], row[3], row[4], LeaseId(row[5]))


class SqliteStore:
    """Open with ``await SqliteStore.open(path)``; ``await close()`` when done."""

    def __init__(self, path: Path, clock: Clock, loop: asyncio.AbstractEventLoop) -> None:
        self.path = path
        self._clock = clock
        self._loop = loop
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hub-store")
        self._db: sqlite3.Connection | None = None
        self._broadcaster = Broadcaster()

    @classmethod
    async def open(cls, path: Path, *, clock: Clock = system_clock) -> SqliteStore:
        store = cls(path, clock, asyncio.get_running_loop())
        try:
            await store._run(store._connect)
        except BaseException:
            store._executor.shutdown(wait=False)
            raise
        return store

    # Plumbing: everything touching the connection runs on the store thread.

    async def _run(self, fn: Callable[[], T]) -> T:
        return await self._loop.run_in_executor(self._executor, fn)

    def _connect(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                # 0600 from the start: SQLite gives its -wal and -shm files the same mode.
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=True)
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode != "wal":
                raise StoreError(f"{self.path}: cannot use WAL journal mode (got {mode})")
            db.execute("PRAGMA synchronous=FULL")
            # After a checkpoint the WAL file is cut back to this, instead of staying at the
            # largest it ever grew to (compaction frees pages in the database file for reuse).
            db.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
            db.execute("PRAGMA foreign_keys=ON")
            db.executescript(_SCHEMA)
            db.execute(
                "INSERT OR IGNORE INTO meta VALUES ('schema', ?), ('revision', 0), "
                "('compacted', 0)",
                (SCHEMA_VERSION,),
            )
            schema = db.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()[0]
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the store {self.path}: {exc}") from exc
        if schema != SCHEMA_VERSION:
            db.close()
            raise StoreError(f"{self.path}: store schema {schema}, this hub reads {SCHEMA_VERSION}")
        self._db = db

    @property
    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreError("the store is closed")
        return self._db

    @contextmanager
    def _transaction(self, *, write: bool = True) -> Iterator[sqlite3.Connection]:
        """One transaction; reads take a consistent snapshot, writes the write lock up front."""
        db = self._conn
        try:
            db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.Error as exc:
            raise StoreError(f"store {self.path}: {exc}") from exc
        try:
            yield db
            db.execute("COMMIT")
        except BaseException as exc:
            if db.in_transaction:  # SQLite ends it itself on some errors (disk I/O, full)
                db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise StoreError(f"store {self.path}: {exc}") from exc
            raise

    def _meta(self, db: sqlite3.Connection, name: str) -> int:
        value: int = db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()[0]
        return value

    def _get(self, db: sqlite3.Connection, key: str) -> KeyValue | None:
        row = db.execute(f"SELECT {_KV_COLUMNS} FROM kv WHERE key = ?", (key,)).fetchone()
        return _kv(row) if row else None

    # Reads

    async def get(self, key: str) -> KeyValue | None:
        check_key(key)
        return await self._run(lambda: self._get(self._conn, key))

    def _range(self, prefix: str) -> RangeResult:
        with self._transaction(write=False) as db:
            end = prefix_end(prefix)
            if end is None:
                rows = db.execute(
                    f"SELECT {_KV_COLUMNS} FROM kv WHERE key >= ? ORDER BY key", (prefix,)
                )
            else:
                rows = db.execute(
                    f"SELECT {_KV_COLUMNS} FROM kv WHERE key >= ? AND key < ? ORDER BY key",
                    (prefix, end),
                )
            kvs = tuple(_kv(row) for row in rows)
            return RangeResult(kvs, self._meta(db, "revision"))

    async def range(self, prefix: str) -> RangeResult:
        return await self._run(lambda: self._range(prefix))

    def _range_at(self, prefix: str, revision: int) -> RangeResult:
        """The current keys, each changed since ``revision`` replaced by the previous value
        of its first change after it (none: it did not exist then)."""
        end = prefix_end(prefix)
        bound = "" if end is None else " AND key < ?"
        keys = (prefix,) if end is None else (prefix, end)
        with self._transaction(write=False) as db:
            check_past_revision(revision, self._meta(db, "revision"), self._meta(db, "compacted"))
            rows = db.execute(f"SELECT {_KV_COLUMNS} FROM kv WHERE key >= ?{bound}", keys)
            state = {row[0]: _kv(row) for row in rows}
            changes = db.execute(
                "SELECT key, prev_value, prev_create_revision, prev_mod_revision, prev_version,"
                f" prev_lease FROM events WHERE revision > ? AND key >= ?{bound}"
                " ORDER BY revision, seq",
                (revision, *keys),
            )
            undone: set[str] = set()
            for key, value, create, mod, version, lease in changes:
                if key in undone:
                    continue  # only its first change after ``revision`` says what it was
                undone.add(key)
                if value is None:
                    state.pop(key, None)
                else:
                    state[key] = KeyValue(key, bytes(value), create, mod, version, LeaseId(lease))
        return RangeResult(tuple(state[k] for k in sorted(state)), revision)

    async def range_at(self, prefix: str, revision: int) -> RangeResult:
        return await self._run(lambda: self._range_at(prefix, revision))

    # Writes

    def _check(self, db: sqlite3.Connection, compares: Sequence[Compare]) -> None:
        failed: list[tuple[str, int, int]] = []
        for c in compares:
            check_key(c.key)
            kv = self._get(db, c.key)
            actual = kv.mod_revision if kv else 0
            if actual != c.mod_revision:
                failed.append((c.key, c.mod_revision, actual))
        if failed:
            raise CompareFailed(*failed[0], also=tuple(k for k, _, _ in failed[1:]))

    def _live_lease(self, db: sqlite3.Connection, lease: LeaseId) -> tuple[float, float]:
        row = db.execute("SELECT ttl, deadline FROM leases WHERE id = ?", (lease,)).fetchone()
        if row is None or row[1] <= self._clock():
            raise LeaseNotFound(lease)
        return row[0], row[1]

    def _apply(self, db: sqlite3.Connection, ops: Sequence[Op]) -> tuple[int, list[Event]]:
        """Apply ``ops`` as one revision inside the current transaction."""
        current = self._meta(db, "revision")
        revision = current + 1
        events: list[Event] = []
        for op in ops:
            prev = self._get(db, op.key)
            if isinstance(op, Put):
                kv = KeyValue(
                    op.key,
                    op.value,
                    prev.create_revision if prev else revision,
                    revision,
                    prev.version + 1 if prev else 1,
                    op.lease,
                )
                db.execute(
                    f"INSERT OR REPLACE INTO kv ({_KV_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                    (kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease),
                )
                events.append(Event(EventType.PUT, kv, prev))
            elif prev is not None:
                db.execute("DELETE FROM kv WHERE key = ?", (op.key,))
                events.append(Event(EventType.DELETE, KeyValue(op.key, b"", 0, revision, 0), prev))
        if not events:
            return current, []
        for seq, e in enumerate(events):
            p = e.prev_kv
            db.execute(
                "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    revision,
                    seq,
                    e.type.value,
                    e.kv.key,
                    e.kv.value,
                    e.kv.create_revision,
                    e.kv.version,
                    e.kv.lease,
                    p.value if p else None,
                    p.create_revision if p else None,
                    p.mod_revision if p else None,
                    p.version if p else None,
                    p.lease if p else None,
                ),
            )
        db.execute("UPDATE meta SET value = ? WHERE name = 'revision'", (revision,))
        return revision, events

    def _publish_later(self, events: list[Event]) -> None:
        """Hand events to the loop (from the store thread), in commit order."""
        if events:
            self._loop.call_soon_threadsafe(self._broadcaster.publish, events)

    def _txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
        with self._transaction() as db:
            self._check(db, compares)
            for op in ops:
                if isinstance(op, Put) and op.lease != NO_LEASE:
                    self._live_lease(db, op.lease)
            revision, events = self._apply(db, ops)
        self._publish_later(events)
        return revision

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
        check_ops(ops)
        compares = list(compares)
        ops = list(ops)
        return await self._run(lambda: self._txn(compares, ops))

    async def put(
        self,
        key: str,
        value: bytes,
        *,
        expect_mod_revision: int | None = None,
        lease: LeaseId = NO_LEASE,
    ) -> int:
        compares = [] if expect_mod_revision is None else [Compare(key, expect_mod_revision)]
        return await self.txn(compares, [Put(key, value, lease)])

    def _delete(self, key: str, compares: list[Compare]) -> int | None:
        with self._transaction() as db:
            self._check(db, compares)
            if self._get(db, key) is None:
                return None
            revision, events = self._apply(db, [Delete(key)])
        self._publish_later(events)
        return revision

    async def delete(self, key: str, *, expect_mod_revision: int | None = None) -> int | None:
        check_key(key)
        compares = [] if expect_mod_revision is None else [Compare(key, expect_mod_revision)]
        return await self._run(lambda: self._delete(key, compares))

    # Watch

    def _history(self, prefix: str, start: int) -> tuple[list[Event], int]:
        with self._transaction(write=False) as db:
            revision = self._meta(db, "revision")
            if start == 0:
                return [], revision
            compacted = self._meta(db, "compacted")
            if start < compacted:
                raise Compacted(start, compacted)
            end = prefix_end(prefix)
            rows = db.execute(
                "SELECT * FROM events WHERE revision >= ? AND key >= ? AND (? IS NULL OR key < ?) "
                "ORDER BY revision, seq",
                (start, prefix, end, end),
            ).fetchall()
        return [_event(row) for row in rows], revision

    async def _history_async(self, prefix: str, start: int) -> tuple[list[Event], int]:
        return await self._run(lambda: self._history(prefix, start))

    @property
    def watching(self) -> int:
        """How many watches are open (for metrics and tests)."""
        return self._broadcaster.watching

    def watch(self, prefix: str, start_revision: int = 0) -> AsyncIterator[Event]:
        if start_revision < 0:
            raise StoreError(f"a start revision must be 0 or more, got {start_revision}")
        return self._broadcaster.watch(prefix, start_revision, self._history_async)

    # Leases

    def _grant(self, ttl: float) -> LeaseId:
        with self._transaction() as db:
            cursor = db.execute(
                "INSERT INTO leases (ttl, deadline) VALUES (?, ?)", (ttl, self._clock() + ttl)
            )
            assert cursor.lastrowid is not None
            return LeaseId(cursor.lastrowid)

    async def grant(self, ttl: float) -> LeaseId:
        check_ttl(ttl)
        return await self._run(lambda: self._grant(ttl))

    def _keepalive(self, lease: LeaseId) -> None:
        with self._transaction() as db:
            ttl, _ = self._live_lease(db, lease)
            db.execute("UPDATE leases SET deadline = ? WHERE id = ?", (self._clock() + ttl, lease))

    async def keepalive(self, lease: LeaseId) -> None:
        await self._run(lambda: self._keepalive(lease))

    def _revoke_in(self, db: sqlite3.Connection, lease: LeaseId) -> tuple[int, list[Event]]:
        if db.execute("DELETE FROM leases WHERE id = ?", (lease,)).rowcount == 0:
            raise LeaseNotFound(lease)
        rows = db.execute("SELECT key FROM kv WHERE lease = ? ORDER BY key", (lease,))
        keys = [r[0] for r in rows]
        return self._apply(db, [Delete(k) for k in keys])

    def _revoke(self, lease: LeaseId) -> int:
        with self._transaction() as db:
            revision, events = self._revoke_in(db, lease)
        self._publish_later(events)
        return revision

    async def revoke(self, lease: LeaseId) -> int:
        return await self._run(lambda: self._revoke(lease))

    def _expire(self) -> list[LeaseId]:
        now = self._clock()
        expired = [
            LeaseId(r[0])
            for r in self._conn.execute(
                "SELECT id FROM leases WHERE deadline <= ? ORDER BY id", (now,)
            )
        ]
        for lease in expired:
            self._revoke(lease)
        return expired

    async def expire_leases(self) -> list[LeaseId]:
        expired = await self._run(self._expire)
        if expired:
            log.info("leases expired", leases=expired)
        return expired

    # Compaction

    def _compact(self, revision: int) -> None:
        with self._transaction() as db:
            current = self._meta(db, "revision")
            if revision > current:
                raise StoreError(f"cannot compact at {revision}: the revision is {current}")
            if revision > self._meta(db, "compacted"):
                db.execute("DELETE FROM events WHERE revision < ?", (revision,))
                db.execute("UPDATE meta SET value = ? WHERE name = 'compacted'", (revision,))

    async def compact(self, revision: int) -> None:
        await self._run(lambda: self._compact(revision))

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    async def close(self) -> None:
        await self._run(self._close)
        self._executor.shutdown(wait=True)


def _event(row: tuple[object, ...]) -> Event:
    (revision, _seq, type_, key, value, create, version, lease, *prev) = row
    assert isinstance(revision, int) and isinstance(key, str) and isinstance(value, bytes)
    assert isinstance(create, int) and isinstance(version, int) and isinstance(lease, int)
    kv = KeyValue(key, value, create, revision, version, LeaseId(lease))
    prev_kv = None
    p_value, p_create, p_mod, p_version, p_lease = prev
    if p_value is not None:
        assert isinstance(p_value, bytes)
        assert isinstance(p_create, int) and isinstance(p_mod, int)
        assert isinstance(p_version, int) and isinstance(p_lease, int)
        prev_kv = KeyValue(key, p_value, p_create, p_mod, p_version, LeaseId(p_lease))
    return Event(EventType(type_), kv, prev_kv)
