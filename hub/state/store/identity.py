"""The store's identity, and backups of it.

A store's existence is part of its identity. ``hub init`` gives the store a random id, kept in
two places: in the store itself (key ``/hub/identity``) and in a marker file next to it
(``D/store-id.json``). ``hub serve`` opens the store only when both agree, so that a lost,
truncated or swapped database is a clear refusal instead of a fresh, empty hub that silently
forgot every device, deployment, token and revocation:

* marker present, store file missing or empty: refused ("missing", how to restore);
* marker present, store without an identity, or with another one: refused ("foreign");
* marker missing, store with an identity: the marker is written again from the store (the
  store is the authority; the marker only guards against losing it);
* marker missing, store with data but no identity (made before identities existed): the
  store is stamped and the marker written, once;
* neither: refused (not a hub data directory, or everything lost).

Backups use SQLite's online backup API: ``backup_sqlite`` copies a consistent snapshot of a
store that a running hub keeps writing; ``restore_sqlite`` puts a checked backup in place of a
stopped hub's store (same store id only), removing the old write-ahead log first so that it
cannot be replayed onto the restored file.

Any other store (etcd) is backed up by ``backup_store``: every key at one revision, written
into a SQLite store file of the same format (so a backup is a backup, whatever the store, and
``restore_sqlite`` can move an etcd hub onto SQLite). Keys on a lease (the leader's) are left
out: they belong to running processes. ``restore_store`` writes a backup into a store whose
replicas are all stopped: the identity key first deleted and last written, so that a restore
cut short leaves a store every replica refuses, and is simply run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import sqlite3
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import orjson

from edgefleet.errors import CompareFailed, StoreError
from edgefleet.logs import get_logger
from edgefleet.persisting import write_atomic
from hub.state.store.protocol import NO_LEASE, Delete, Put, Store
from hub.state.store.sqlite import SCHEMA_VERSION, SqliteStore

log = get_logger(__name__)

MARKER_NAME = "store-id.json"
IDENTITY_KEY = "/hub/identity"
LOCK_NAME = "hub.lock"
LEADER_KEY = "/hub/leader"
"""Held (on a lease) by the replica that runs the controllers (hub/state/store/electing.py)."""
RESTORE_BATCH = 100
"""Operations per transaction when restoring into etcd (its default bound is 128)."""
RESTORE_BATCH_BYTES = 8 * 1024 * 1024
"""And bytes: shared artifacts' chunks are 1 MiB each (hub/state/sharedblobs.py), and etcd bounds
a request's size."""


class StoreIdentityError(StoreError):
    """The store is missing, empty, or of another hub; or a backup cannot be used."""


@dataclass(frozen=True, slots=True)
class StoreIdentity:
    store_id: str
    created_at: float
    region: str

    @classmethod
    def new(cls, *, region: str, now: float) -> StoreIdentity:
        return cls(uuid.uuid4().hex, now, region)

    def to_json(self) -> bytes:
        return orjson.dumps(
            {"storeId": self.store_id, "createdAt": self.created_at, "region": self.region},
            option=orjson.OPT_SORT_KEYS,
        )

    @classmethod
    def from_json(cls, data: bytes, *, source: str) -> StoreIdentity:
        try:
            doc = orjson.loads(data)
            return cls(str(doc["storeId"]), float(doc["createdAt"]), str(doc["region"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise StoreIdentityError(f"{source}: not a store identity ({exc})") from None


def marker_path(data_dir: Path) -> Path:
    return data_dir / MARKER_NAME


def read_marker(data_dir: Path) -> StoreIdentity | None:
    path = marker_path(data_dir)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return StoreIdentity.from_json(data, source=str(path))


def write_marker(data_dir: Path, identity: StoreIdentity) -> None:
    write_atomic(marker_path(data_dir), identity.to_json(), mode=0o600)


async def read_identity(store: Store) -> StoreIdentity | None:
    kv = await store.get(IDENTITY_KEY)
    return None if kv is None else StoreIdentity.from_json(kv.value, source=IDENTITY_KEY)


async def stamp(store: Store, identity: StoreIdentity) -> None:
    """Give a store without an identity this one (CompareFailed-safe: never overwrites)."""
    try:
        await store.put(IDENTITY_KEY, identity.to_json(), expect_mod_revision=0)
    except CompareFailed:
        raise StoreIdentityError("the store already has an identity") from None


def _restore_hint(data_dir: Path) -> str:
    return (
        f"restore it from a backup with `hub restore --data-dir {data_dir} --from FILE` "
        f"(backups: `hub backup`); if this hub is to start over empty, move {data_dir} away "
        "and run `hub init` (every device must then enroll again)"
    )


def check_store_file(path: Path, marker: StoreIdentity | None, data_dir: Path) -> None:
    """Before opening a SQLite store (which would create a missing file): it must be there."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        size = -1
    if size > 0:
        return
    what = "is missing" if size < 0 else "is empty"
    if marker is None:
        raise StoreIdentityError(
            f"the store {path} {what} and {marker_path(data_dir)} too: {data_dir} is not a hub "
            "data directory made by `hub init`, or its store was lost; " + _restore_hint(data_dir)
        )
    raise StoreIdentityError(
        f"the store {path} {what}, but this data directory's hub has store "
        f"{marker.store_id} (created by hub init at {_time(marker.created_at)}): refusing to "
        f"start an empty hub that would forget every device; " + _restore_hint(data_dir)
    )


async def check_identity(store: Store, data_dir: Path, *, where: str) -> StoreIdentity:
    """The store's identity, checked against the marker in ``data_dir`` (module doc)."""
    marker = read_marker(data_dir)
    found = await read_identity(store)
    if marker is not None:
        if found is None:
            raise StoreIdentityError(
                f"the store {where} has no store identity, but this data directory's hub has "
                f"store {marker.store_id}: it is not this hub's store; " + _restore_hint(data_dir)
            )
        if found.store_id != marker.store_id:
            raise StoreIdentityError(
                f"the store {where} is store {found.store_id} (region {found.region}, created "
                f"{_time(found.created_at)}), but this data directory's hub has store "
                f"{marker.store_id}: it is another hub's store; " + _restore_hint(data_dir)
            )
        return found
    if found is not None:
        write_marker(data_dir, found)
        log.warning("store marker rewritten", store=found.store_id, path=str(data_dir))
        return found
    if not (await store.range("/")).kvs:  # (etcd: a fresh cluster is at revision 1)
        raise StoreIdentityError(
            f"the store {where} is empty and {marker_path(data_dir)} is missing: "
            f"{data_dir} is not a hub data directory made by `hub init`; " + _restore_hint(data_dir)
        )
    # A store made before stores had identities: adopt it, once.
    identity = StoreIdentity.new(region="", now=time.time())
    await stamp(store, identity)
    write_marker(data_dir, identity)
    log.warning("store identity adopted", store=identity.store_id, path=str(data_dir))
    return identity


def _time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- the data directory lock -----------------------------------------------------------------


@contextlib.contextmanager
def data_dir_lock(data_dir: Path, *, purpose: str) -> Iterator[None]:
    """Hold ``D/hub.lock`` exclusively (``hub serve`` while serving, ``hub restore`` while
    restoring): a second holder is refused at once, saying who holds it."""
    path = data_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise StoreIdentityError(f"{data_dir} is in use ({holder}): stop it first") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{purpose}, pid {os.getpid()}".encode(), 0)
        yield
    finally:
        os.close(fd)


# -- backup and restore (SQLite) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BackupInfo:
    identity: StoreIdentity
    revision: int
    keys: int
    devices: int


def _inspect(db: sqlite3.Connection, source: str) -> BackupInfo:
    try:
        ok = db.execute("PRAGMA integrity_check").fetchone()[0]
        if ok != "ok":
            raise StoreIdentityError(f"{source}: the database is damaged ({ok})")
        schema = db.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
        if schema is None or schema[0] != SCHEMA_VERSION:
            raise StoreIdentityError(
                f"{source}: store schema {schema and schema[0]}, this hub reads {SCHEMA_VERSION}"
            )
        row = db.execute("SELECT value FROM kv WHERE key = ?", (IDENTITY_KEY,)).fetchone()
        revision = db.execute("SELECT value FROM meta WHERE name = 'revision'").fetchone()[0]
        keys = db.execute("SELECT count(*) FROM kv").fetchone()[0]
        devices = db.execute(
            "SELECT count(*) FROM kv WHERE key >= '/devices/' AND key < '/devices0'"
        ).fetchone()[0]
    except sqlite3.Error as exc:
        raise StoreIdentityError(f"{source}: not a hub store ({exc})") from None
    if row is None:
        raise StoreIdentityError(f"{source}: a store without an identity (not made by hub init)")
    identity = StoreIdentity.from_json(bytes(row[0]), source=f"{source} {IDENTITY_KEY}")
    return BackupInfo(identity, int(revision), int(keys), int(devices))


def _copy(source: sqlite3.Connection, target: Path) -> None:
    """Snapshot ``source`` into a new file ``target`` (0600, fsynced, one self-contained file)."""
    target.unlink(missing_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    dest = sqlite3.connect(target, isolation_level=None)
    try:
        source.backup(dest)  # one step: a consistent snapshot, even while a hub writes
        dest.execute("PRAGMA journal_mode=DELETE")
    finally:
        dest.close()
    fd = os.open(target, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _connect_existing(path: Path, what: str, *, read_only: bool) -> sqlite3.Connection:
    if not path.is_file() or path.stat().st_size == 0:
        raise StoreIdentityError(f"{what} {path} is missing or empty")
    try:
        # A live store is in WAL mode: its reader needs the shared-memory index, so it is
        # opened read-write (nothing is written). A backup file is a plain file.
        uri = f"file:{path}?mode={'ro' if read_only else 'rw'}"
        return sqlite3.connect(uri, uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise StoreIdentityError(f"cannot open {what} {path}: {exc}") from None


def backup_sqlite(store_path: Path, out: Path) -> BackupInfo:
    """Copy the store at ``store_path`` (a hub may be serving from it) to ``out``, atomically;
    the copy is checked before it is put in place."""
    source = _connect_existing(store_path, "the store", read_only=False)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        try:
            _copy(source, tmp)
        except sqlite3.Error as exc:
            raise StoreIdentityError(f"backup of {store_path} failed: {exc}") from None
        finally:
            source.close()
        check = sqlite3.connect(f"file:{tmp}?mode=ro", uri=True)
        try:
            info = _inspect(check, str(store_path))
        finally:
            check.close()
        os.replace(tmp, out)
        _fsync_dir(out.parent)
    finally:
        tmp.unlink(missing_ok=True)
    return info


def restore_sqlite(backup: Path, store_path: Path, data_dir: Path) -> BackupInfo:
    """Put ``backup`` in place of the store of the (stopped) hub in ``data_dir``.

    The backup must be a sound hub store with an identity; when the data directory has a
    marker it must be the same store (a backup of another hub is refused). The old store's
    write-ahead log is removed before the new file is renamed into place."""
    source = _connect_existing(backup, "the backup", read_only=True)
    try:
        info = _inspect(source, str(backup))
        marker = read_marker(data_dir)
        if marker is not None and marker.store_id != info.identity.store_id:
            raise StoreIdentityError(
                f"{backup} is a backup of store {info.identity.store_id} (region "
                f"{info.identity.region}), but {data_dir} belongs to store {marker.store_id}: "
                "refusing to give this hub another hub's fleet"
            )
        tmp = store_path.with_name(f".{store_path.name}.restore.tmp")
        try:
            _copy(source, tmp)
            for suffix in ("-wal", "-shm", "-journal"):
                Path(f"{store_path}{suffix}").unlink(missing_ok=True)
            os.replace(tmp, store_path)
            _fsync_dir(store_path.parent)
        except sqlite3.Error as exc:
            raise StoreIdentityError(f"restore of {backup} failed: {exc}") from None
        finally:
            tmp.unlink(missing_ok=True)
    finally:
        source.close()
    if marker is None:
        write_marker(data_dir, info.identity)
    return info


# -- backup and restore (any store: etcd) ----------------------------------------------------


async def backup_store(store: Store, out: Path) -> BackupInfo:
    """Copy every key of ``store`` (one revision; a hub may keep serving) into a new SQLite
    store file ``out``, atomically; the copy is checked before it is put in place."""
    snapshot = await store.range("")
    kvs = [kv for kv in snapshot.kvs if kv.lease == NO_LEASE]
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    await asyncio.to_thread(_remove_database, tmp)
    try:
        copy = await SqliteStore.open(tmp)
        try:
            if kvs:
                await copy.txn((), [Put(kv.key, kv.value) for kv in kvs])
        finally:
            await copy.close()
        info = await asyncio.to_thread(_finish_copy, tmp, out, snapshot.revision)
    finally:
        await asyncio.to_thread(_remove_database, tmp)
    return BackupInfo(info.identity, snapshot.revision, info.keys, info.devices)


def _remove_database(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _finish_copy(tmp: Path, out: Path, revision: int) -> BackupInfo:
    """Make the copy one self-contained file, check it, fsync it and move it into place."""
    check = sqlite3.connect(tmp, isolation_level=None)
    try:
        check.execute("PRAGMA journal_mode=DELETE")
        info = _inspect(check, f"the copy of the store at revision {revision}")
    finally:
        check.close()
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, out)
    _fsync_dir(out.parent)
    return info


def _read_backup(backup: Path, data_dir: Path) -> tuple[BackupInfo, list[tuple[str, bytes]]]:
    source = _connect_existing(backup, "the backup", read_only=True)
    try:
        info = _inspect(source, str(backup))
        rows = source.execute("SELECT key, value FROM kv ORDER BY key").fetchall()
    except sqlite3.Error as exc:
        raise StoreIdentityError(f"{backup}: not a hub store ({exc})") from None
    finally:
        source.close()
    marker = read_marker(data_dir)
    if marker is not None and marker.store_id != info.identity.store_id:
        raise StoreIdentityError(
            f"{backup} is a backup of store {info.identity.store_id} (region "
            f"{info.identity.region}), but {data_dir} belongs to store {marker.store_id}: "
            "refusing to give this hub another hub's fleet"
        )
    return info, [(str(k), bytes(v)) for k, v in rows]


async def restore_store(backup: Path, store: Store, data_dir: Path, *, where: str) -> BackupInfo:
    """Make ``store`` (etcd; every replica stopped) hold exactly what ``backup`` holds."""
    info, rows = await asyncio.to_thread(_read_backup, backup, data_dir)
    found = await read_identity(store)
    if found is not None and found.store_id != info.identity.store_id:
        raise StoreIdentityError(
            f"the store {where} is store {found.store_id}, but {backup} is a backup of store "
            f"{info.identity.store_id}: refusing to overwrite another hub's store"
        )
    leader = await store.get(LEADER_KEY)
    if leader is not None:
        raise StoreIdentityError(
            f"a hub replica is serving from {where} (it holds {LEADER_KEY}: "
            f"{leader.value.decode(errors='replace')}): stop every replica first"
        )
    await store.delete(IDENTITY_KEY)
    keep = {key for key, _ in rows}
    current = [kv.key for kv in (await store.range("")).kvs if kv.key not in keep]
    ops: list[Put | Delete] = [Delete(k) for k in current]
    ops += [Put(k, v) for k, v in rows if k != IDENTITY_KEY]
    batch: list[Put | Delete] = []
    size = 0
    for op in ops:  # at most RESTORE_BATCH keys and about RESTORE_BATCH_BYTES per transaction
        op_size = len(op.value) if isinstance(op, Put) else 0
        if batch and (len(batch) >= RESTORE_BATCH or size + op_size > RESTORE_BATCH_BYTES):
            await store.txn((), batch)
            batch, size = [], 0
        batch.append(op)
        size += op_size
    if batch:
        await store.txn((), batch)
    identity = dict(rows)[IDENTITY_KEY]
    await store.put(IDENTITY_KEY, identity, expect_mod_revision=0)
    if read_marker(data_dir) is None:
        write_marker(data_dir, info.identity)
    return info
