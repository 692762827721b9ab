"""An in-memory :class:`~hub.state.store.protocol.Store` for unit tests: same semantics, no disk."""

from __future__ import annotations

import bisect
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from edgefleet.errors import Compacted, CompareFailed, LeaseNotFound, StoreError
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


@dataclass
class _Lease:
    ttl: float
    deadline: float
    keys: set[str] = field(default_factory=set)


class MemoryStore:
    def __init__(self, *, clock: Clock = system_clock) -> None:
        self._clock = clock
        self._kv: dict[str, KeyValue] = {}
        self._keys: list[str] = []  # the keys of _kv, sorted: a range costs what it returns
        self._log: list[Event] = []
        self._revision = 0
        self._compacted = 0
        self._leases: dict[LeaseId, _Lease] = {}
        self._next_lease = 0
        self._broadcaster = Broadcaster()

    @property
    def revision(self) -> int:
        return self._revision

    async def get(self, key: str) -> KeyValue | None:
        check_key(key)
        return self._kv.get(key)

    async def range(self, prefix: str) -> RangeResult:
        lo = bisect.bisect_left(self._keys, prefix)
        end = prefix_end(prefix)
        hi = len(self._keys) if end is None else bisect.bisect_left(self._keys, end, lo=lo)
        kvs = tuple(self._kv[k] for k in self._keys[lo:hi])
        return RangeResult(kvs, self._revision)

    async def range_at(self, prefix: str, revision: int) -> RangeResult:
        check_past_revision(revision, self._revision, self._compacted)
        state = {k: kv for k, kv in self._kv.items() if k.startswith(prefix)}
        for event in reversed(self._log):  # undo what came after ``revision``
            if event.revision <= revision:
                break
            if not event.kv.key.startswith(prefix):
                continue
            if event.prev_kv is None:
                state.pop(event.kv.key, None)
            else:
                state[event.kv.key] = event.prev_kv
        return RangeResult(tuple(state[k] for k in sorted(state)), revision)

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

    async def delete(self, key: str, *, expect_mod_revision: int | None = None) -> int | None:
        check_key(key)
        compares = [] if expect_mod_revision is None else [Compare(key, expect_mod_revision)]
        if key not in self._kv:
            self._check(compares)
            return None
        return await self.txn(compares, [Delete(key)])

    def _check(self, compares: Sequence[Compare]) -> None:
        failed: list[tuple[str, int, int]] = []
        for c in compares:
            check_key(c.key)
            kv = self._kv.get(c.key)
            actual = kv.mod_revision if kv else 0
            if actual != c.mod_revision:
                failed.append((c.key, c.mod_revision, actual))
        if failed:
            raise CompareFailed(*failed[0], also=tuple(k for k, _, _ in failed[1:]))

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
        check_ops(ops)
        self._check(compares)
        for op in ops:
            if isinstance(op, Put) and op.lease != NO_LEASE:
                self._live_lease(op.lease)
        return self._apply(ops)

    def _apply(self, ops: Sequence[Op]) -> int:
        revision = self._revision + 1
        events: list[Event] = []
        for op in ops:
            prev = self._kv.get(op.key)
            if prev and prev.lease != NO_LEASE and prev.lease in self._leases:
                self._leases[prev.lease].keys.discard(op.key)
            if isinstance(op, Put):
                kv = KeyValue(
                    op.key,
                    op.value,
                    prev.create_revision if prev else revision,
                    revision,
                    prev.version + 1 if prev else 1,
                    op.lease,
                )
                if prev is None:
                    bisect.insort(self._keys, op.key)
                self._kv[op.key] = kv
                if op.lease != NO_LEASE:
                    self._leases[op.lease].keys.add(op.key)
                events.append(Event(EventType.PUT, kv, prev))
            elif prev is not None:
                del self._kv[op.key]
                del self._keys[bisect.bisect_left(self._keys, op.key)]
                gone = KeyValue(op.key, b"", 0, revision, 0)
                events.append(Event(EventType.DELETE, gone, prev))
        if not events:
            return self._revision
        self._revision = revision
        self._log.extend(events)
        self._broadcaster.publish(events)
        return revision

    async def _history(self, prefix: str, start: int) -> tuple[list[Event], int]:
        if start == 0:
            return [], self._revision
        if start < self._compacted:
            raise Compacted(start, self._compacted)
        past = [e for e in self._log if e.revision >= start and e.kv.key.startswith(prefix)]
        return past, self._revision

    @property
    def watching(self) -> int:
        """How many watches are open (for metrics and tests)."""
        return self._broadcaster.watching

    def watch(self, prefix: str, start_revision: int = 0) -> AsyncIterator[Event]:
        if start_revision < 0:
            raise StoreError(f"a start revision must be 0 or more, got {start_revision}")
        return self._broadcaster.watch(prefix, start_revision, self._history)

    def _live_lease(self, lease: LeaseId) -> _Lease:
        found = self._leases.get(lease)
        if found is None or found.deadline <= self._clock():
            raise LeaseNotFound(lease)
        return found

    async def grant(self, ttl: float) -> LeaseId:
        check_ttl(ttl)
        self._next_lease += 1
        lease = LeaseId(self._next_lease)
        self._leases[lease] = _Lease(ttl, self._clock() + ttl)
        return lease

    async def keepalive(self, lease: LeaseId) -> None:
        found = self._live_lease(lease)
        found.deadline = self._clock() + found.ttl

    async def revoke(self, lease: LeaseId) -> int:
        found = self._leases.pop(lease, None)
        if found is None:
            raise LeaseNotFound(lease)
        return self._apply([Delete(k) for k in sorted(found.keys)])

    async def expire_leases(self) -> list[LeaseId]:
        now = self._clock()
        expired = sorted(lease for lease, f in self._leases.items() if f.deadline <= now)
        for lease in expired:
            await self.revoke(lease)
        return expired

    async def compact(self, revision: int) -> None:
        if revision > self._revision:
            raise StoreError(f"cannot compact at {revision}: the revision is {self._revision}")
        if revision > self._compacted:
            self._compacted = revision
            self._log = [e for e in self._log if e.revision >= revision]

    async def close(self) -> None:
        return None
