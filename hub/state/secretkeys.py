"""Rotating the hub's key for Secrets at rest (``hub secrets rotate-key``).

Every step leaves a state in which every stored Secret opens with a key file the hub reads
(:class:`hub.state.secrets.SecretKeys`: ``secrets.key``, ``secrets.key.next``, ``secrets.key.old``),
so a rotation killed at any point loses nothing, and running it again finishes it:

1. **The new key**: ``D/secrets.key.next`` (32 random bytes, 0600, written atomically), unless
   a rotation left one (then that one is used: nothing may be sealed under a key then lost).
   ``--prepare`` stops here, so that hub replicas can be given the file before anything is
   sealed under it.
2. **Re-seal** every stored Secret not sealed under the new key (same version, a new nonce,
   ``keyId`` the new key's), read once, in store transactions of at most
   :data:`BATCH_RECORDS` records and :data:`BATCH_BYTES` bytes (etcd's request limits), each
   conditional on the records it read (a concurrent apply makes it read those again). Nothing
   is written for a batch with a Secret that does not open.
3. **Swap the files**: the current key is written to ``secrets.key.old``, then
   ``secrets.key.next`` is renamed over ``secrets.key`` (``rename(2)``: atomic).
4. **Re-seal again**: what a running hub sealed under the old key between 2 and 3 (it reads
   the files again before each seal, so after 3 it seals under the new one).

The old key stays readable as ``secrets.key.old`` (backups made before the rotation are sealed
under it) until the next rotation replaces it. A running hub reads the changed files and keeps
every key it has read in memory, so it neither stops nor fails to open what it holds.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

from edgefleet.errors import CompareFailed
from edgefleet.logs import get_logger
from edgefleet.persisting import fsync_dir, write_atomic
from edgefleet.sealing import new_key, seal_at_rest
from hub.state import storekeys
from hub.state.secrets import (
    KEY_FILE,
    NEXT_KEY_FILE,
    OLD_KEY_FILE,
    SecretKeyError,
    SecretKeys,
    key_id,
    read_key,
    record_of,
)
from hub.state.store import Compare, KeyValue, Put, Store

log = get_logger(__name__)

BATCH_RECORDS = 64
BATCH_BYTES = 1024 * 1024
MAX_ATTEMPTS = 5  # re-reads of one batch that a concurrent change made fail

Step = Callable[[str], Awaitable[None]]


async def _no_step(name: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Rotation:
    """What a rotation did."""

    resealed: int  # records written under the new key
    new_key_id: str
    old_key_id: str
    prepared_only: bool = False


def prepare(data_dir: Path) -> bytes:
    """Step 1: ``secrets.key.next`` (made when missing), returned."""
    path = Path(data_dir) / NEXT_KEY_FILE
    if not path.exists():
        write_atomic(path, new_key(), mode=0o600)
        log.info("secrets key made", path=str(path), key=key_id(read_key(path)))
    return read_key(path)


async def reseal(store: Store, keys: SecretKeys, target: bytes) -> int:
    """Every stored Secret not sealed under ``target`` sealed under it (step 2); how many.
    The Secrets are read once; a batch whose compare fails (an apply meanwhile) reads its
    records again, at most :data:`MAX_ATTEMPTS` times."""
    target_id = key_id(target)
    pending = [
        kv
        for kv in (await store.range(storekeys.object_prefix("Secret"))).kvs
        if _needs(kv, target_id)
    ]
    done = 0
    while pending:
        batch = _batch(pending)
        pending = pending[len(batch) :]
        for _ in range(MAX_ATTEMPTS):
            ops = [_resealed(kv, keys, target, target_id) for kv in batch]
            try:
                await store.txn([Compare(kv.key, kv.mod_revision) for kv in batch], ops)
                break
            except CompareFailed:  # changed meanwhile: read those again
                fresh = [await store.get(kv.key) for kv in batch]
                batch = [kv for kv in fresh if kv is not None and _needs(kv, target_id)]
                if not batch:
                    break
        else:
            raise SecretKeyError(
                f"Secrets kept changing during the rotation ({MAX_ATTEMPTS} attempts): run it again"
            )
        done += len(batch)
    return done


def _needs(kv: KeyValue, target_id: str) -> bool:
    doc = storekeys.loads(kv.value)
    record = record_of(doc, str(doc["manifest"]["metadata"]["name"]))
    return record is not None and record.key_id != target_id


def _batch(pending: list[KeyValue]) -> list[KeyValue]:
    """The first records of ``pending`` within :data:`BATCH_RECORDS` and :data:`BATCH_BYTES`
    (at least one)."""
    out: list[KeyValue] = []
    size = 0
    for kv in pending:
        if out and (len(out) >= BATCH_RECORDS or size + len(kv.value) > BATCH_BYTES):
            break
        out.append(kv)
        size += len(kv.value)
    return out


def _resealed(kv: KeyValue, keys: SecretKeys, target: bytes, target_id: str) -> Put:
    doc = storekeys.loads(kv.value)
    name = str(doc["manifest"]["metadata"]["name"])
    record = record_of(doc, name)
    assert record is not None
    values = keys.open(record)  # SealError: nothing of this batch written, the rotation stops
    sealed = seal_at_rest(target, name, record.version, values)
    doc["secret"] = replace(record, sealed=sealed, key_id=target_id).to_json()
    return Put(kv.key, storekeys.dumps(doc))


async def rotate_key(
    store: Store, data_dir: Path, *, prepare_only: bool = False, step: Step = _no_step
) -> Rotation:
    """The rotation of the module doc. ``step(name)`` is awaited after each step (the crash
    tests stop there)."""
    d = Path(data_dir)
    current_path, next_path, old_path = d / KEY_FILE, d / NEXT_KEY_FILE, d / OLD_KEY_FILE
    current = read_key(current_path)
    target = prepare(d)
    await step("prepared")
    if prepare_only:
        return Rotation(0, key_id(target), key_id(current), prepared_only=True)
    resealed = await reseal(store, SecretKeys.load(d, create=False), target)
    await step("resealed")
    write_atomic(old_path, current, mode=0o600)
    await step("old kept")
    os.replace(next_path, current_path)
    fsync_dir(d)
    await step("swapped")
    resealed += await reseal(store, SecretKeys.load(d, create=False), target)
    log.info("secrets key rotated", key=key_id(target), previous=key_id(current), resealed=resealed)
    return Rotation(resealed, key_id(target), key_id(current))
