"""The hub's key-value store, modelled on etcd's semantics so that an etcd backend drops in.

* Keys are strings (``/devices/NAME``, ``/deployments/NAME``), values bytes.
* One global **revision** counts every change; each write operation (a put, a delete, a txn)
  bumps it by exactly one, and every key changed by that operation gets it as ``mod_revision``.
* Each key has ``create_revision`` (when it was last created), ``mod_revision`` (last change)
  and ``version`` (changes since creation, 1 after create); deleting resets it.
* **Compare-and-swap**: ``expect_mod_revision=N`` writes only if the key's ``mod_revision`` is
  N; ``0`` means "must not exist". A mismatch raises :class:`~edgefleet.errors.CompareFailed` and
  writes nothing.
* **Watch** from a revision replays the event log, then follows live changes, with no gap and
  no duplicate. Below the compaction point it raises :class:`~edgefleet.errors.Compacted`.
* **Leases**: keys put with a lease are deleted when the lease is revoked or expires.
  Expiry is judged by an injected wall clock (``Clock``) when :meth:`Store.expire_leases` runs
  (a component calls it periodically; tests call it after moving a fake clock).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import NewType, Protocol

from edgefleet.errors import Compacted, StoreError

LeaseId = NewType("LeaseId", int)
"""A lease, as granted by :meth:`Store.grant`; ``0`` is never a lease."""

NO_LEASE = LeaseId(0)

Clock = Callable[[], float]
"""Wall-clock seconds (``time.time``): lease deadlines outlive a restart of the hub."""

MAX_KEY_LENGTH = 1024


def system_clock() -> float:
    return time.time()


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: LeaseId = NO_LEASE


class EventType(Enum):
    PUT = "PUT"
    DELETE = "DELETE"


@dataclass(frozen=True, slots=True)
class Event:
    """One change. For DELETE, ``kv`` has the key, an empty value, version 0 and the deleting
    revision as ``mod_revision`` (like etcd); ``prev_kv`` is the key before the change."""

    type: EventType
    kv: KeyValue
    prev_kv: KeyValue | None

    @property
    def revision(self) -> int:
        return self.kv.mod_revision


@dataclass(frozen=True, slots=True)
class RangeResult:
    """The keys under a prefix, sorted, as of ``revision``."""

    kvs: tuple[KeyValue, ...]
    revision: int


@dataclass(frozen=True, slots=True)
class Compare:
    """Holds when ``key``'s mod revision is ``mod_revision`` (0: the key does not exist)."""

    key: str
    mod_revision: int


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes
    lease: LeaseId = NO_LEASE


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


Op = Put | Delete


class Store(Protocol):
    """What the hub needs from a store. Every method is safe to call from the event loop."""

    async def get(self, key: str) -> KeyValue | None:
        """The key's current value, or ``None``."""
        ...

    async def range(self, prefix: str) -> RangeResult:
        """Every key starting with ``prefix`` (``""``: all), sorted, with the revision read at."""
        ...

    async def range_at(self, prefix: str, revision: int) -> RangeResult:
        """The keys starting with ``prefix`` as they were at ``revision`` (a past revision, at
        or after the compaction point), sorted; the result's ``revision`` is ``revision``.

        Raises Compacted when history before ``revision`` is gone, StoreError for a revision
        after the current one (or below 1).
        """
        ...

    async def put(
        self,
        key: str,
        value: bytes,
        *,
        expect_mod_revision: int | None = None,
        lease: LeaseId = NO_LEASE,
    ) -> int:
        """Write ``key``; returns the new revision. ``lease`` attaches it (``NO_LEASE``: none).

        Raises CompareFailed (see module doc), LeaseNotFound for an unknown lease.
        """
        ...

    async def delete(self, key: str, *, expect_mod_revision: int | None = None) -> int | None:
        """Delete ``key``; the revision of the deletion, or ``None`` when it did not exist."""
        ...

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
        """If every compare holds, apply every op atomically, as one revision (returned).

        Raises CompareFailed for the first compare that does not hold (nothing written).
        A key may appear in at most one op. Deleting an absent key is a no-op; a txn that
        changes nothing does not bump the revision (it returns the current one).
        """
        ...

    def watch(self, prefix: str, start_revision: int = 0) -> AsyncIterator[Event]:
        """Changes to keys under ``prefix``: from ``start_revision`` on (history replayed),
        or, with 0, those after the current revision. Close the iterator to stop."""
        ...

    async def grant(self, ttl: float) -> LeaseId:
        """A new lease that expires ``ttl`` seconds from now unless kept alive."""
        ...

    async def keepalive(self, lease: LeaseId) -> None:
        """Move the lease's deadline to ``ttl`` seconds from now; LeaseNotFound if expired."""
        ...

    async def revoke(self, lease: LeaseId) -> int:
        """Delete the lease and its keys (one revision); returns the revision after it."""
        ...

    async def expire_leases(self) -> list[LeaseId]:
        """Revoke every lease whose deadline has passed; returns those revoked."""
        ...

    async def compact(self, revision: int) -> None:
        """Discard history before ``revision``: watches from earlier raise Compacted."""
        ...

    async def close(self) -> None: ...


# Helpers shared by the implementations.


def check_key(key: str) -> None:
    if not isinstance(key, str) or not key:
        raise StoreError(f"a key must be a non-empty string, got {key!r}")
    if len(key) > MAX_KEY_LENGTH:
        raise StoreError(f"a key must be at most {MAX_KEY_LENGTH} characters, got {len(key)}")
    if "\x00" in key:
        raise StoreError(f"a key must not contain NUL, got {key!r}")


def check_ops(ops: Sequence[Op]) -> None:
    seen: set[str] = set()
    for op in ops:
        check_key(op.key)
        if op.key in seen:
            raise StoreError(f"a txn may change each key once, {op.key!r} appears twice")
        seen.add(op.key)
        if isinstance(op, Put) and not isinstance(op.value, bytes):
            raise StoreError(f"a value must be bytes, got {type(op.value).__name__} for {op.key}")


def check_past_revision(revision: int, current: int, compacted: int) -> None:
    """Refuse a :meth:`Store.range_at` revision the store cannot read (see its doc)."""
    if revision < 1 or revision > current:
        raise StoreError(f"cannot read at revision {revision}: the revision is {current}")
    if revision < compacted:
        raise Compacted(revision, compacted)


def check_ttl(ttl: float) -> None:
    if not ttl > 0:
        raise StoreError(f"a lease TTL must be more than 0 seconds, got {ttl}")


def prefix_end(prefix: str) -> str | None:
    """The smallest string greater than every string starting with ``prefix`` (in code point
    order, which is SQLite's BINARY order of UTF-8); ``None`` when there is none."""
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if 0xD800 <= code <= 0xDFFF:  # surrogates cannot be encoded; skip over them
            code = 0xE000
        if code <= 0x10FFFF:
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None
