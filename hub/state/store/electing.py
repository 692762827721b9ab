"""Leader election among hub replicas on one store, and fencing of the leader's writes.

Several ``hub serve`` processes share one etcd store; each serves device streams and admin
calls, but the controllers (projection, rollouts, compaction: whatever writes on its own) run on
one of them, the leader:

* :class:`Elector` (a component) campaigns by creating ``/hub/leader`` on a lease of its own
  (``expect_mod_revision=0``: one creator wins); the winner keeps the lease alive every third
  of its TTL. The others watch the key and campaign again when it goes (the leader stopped,
  or its lease expired: it was killed, paused or cut off). A leader that cannot renew its
  lease steps down by itself once the lease would have expired by its own clock.
* Fencing: a leader's term is the mod revision at which it created the key. Every write of a
  controller goes through :class:`FencedStore`, which adds ``Compare(/hub/leader, term)`` to
  it, so a write by a deposed leader, or by one paused (SIGSTOP, a long GC, a VM stall) past
  its lease that has not noticed yet, fails in the store (:class:`NotLeader`) and changes
  nothing: the key was deleted with the lease, or another replica created it again.
* :class:`LeaderOnly` runs a controller component only while its replica leads, and stops it
  when the term ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from edgefleet.errors import CompareFailed, LeaseNotFound, StoreError
from edgefleet.logs import get_logger
from edgefleet.supervising import Component, wait_for_stop
from hub.state.store.identity import LEADER_KEY
from hub.state.store.protocol import (
    NO_LEASE,
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
)

log = get_logger(__name__)


class NotLeader(StoreError):
    """A controller write refused: this replica does not lead (or no longer does)."""


class Elector:
    """The ``leader-election`` component. ``identity`` says who leads (in the key's value)."""

    name = "leader-election"

    def __init__(
        self,
        store: Store,
        *,
        identity: str,
        ttl: float,
        on_elected: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.identity = identity
        self.ttl = ttl
        self.on_elected = on_elected
        """Run once elected, before the term starts (a replica reloads its cache)."""
        self.leader = ""
        """Who leads, as last seen (the leader key's value); empty: not known."""
        self.term = 0
        """The mod revision of our leader key while we lead; 0 when we do not."""
        self._changed = asyncio.Condition()
        self._lease: LeaseId = NO_LEASE

    @property
    def leading(self) -> bool:
        return self.term != 0

    async def _set_term(self, term: int) -> None:
        async with self._changed:
            self.term = term
            self._changed.notify_all()

    async def lost(self, term: int) -> None:
        """A fenced write found term ``term`` over: step down now (if it is still ours)."""
        if self.term == term and term != 0:
            log.warning("leadership lost", identity=self.identity, term=term, why="fenced")
            await self._set_term(0)

    async def wait_leading(self) -> int:
        """Wait until this replica leads; its term."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.term != 0)
            return self.term

    async def wait_term_over(self, term: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.term != term)

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                term = await self._campaign()
                if term:
                    await self._lead(term, stop)
                else:
                    await self._follow(stop)
        finally:
            await self._resign()

    async def _campaign(self) -> int:
        self._lease = await self.store.grant(self.ttl)
        try:
            term = await self.store.put(
                LEADER_KEY, self.identity.encode(), expect_mod_revision=0, lease=self._lease
            )
        except CompareFailed:
            await self.store.revoke(self._lease)
            self._lease = NO_LEASE
            return 0
        if self.on_elected is not None:
            try:
                await self.on_elected()
            except BaseException:
                await self._resign()
                raise
        log.info("leading", identity=self.identity, term=term, lease_ttl_s=self.ttl)
        self.leader = self.identity
        await self._set_term(term)
        return term

    async def _lead(self, term: int, stop: asyncio.Event) -> None:
        """Keep the lease alive; return when the term is over (or ``stop``)."""
        renewed = time.monotonic()
        while self.term == term:
            if await wait_for_stop(stop, self.ttl / 3):
                return
            if self.term != term:
                break
            try:
                await asyncio.wait_for(self.store.keepalive(self._lease), self.ttl / 3)
                renewed = time.monotonic()
            except LeaseNotFound:
                log.warning("leadership lost", identity=self.identity, term=term, why="lease")
                break
            except (StoreError, TimeoutError) as exc:
                if time.monotonic() - renewed >= self.ttl:
                    log.warning("leadership lost", identity=self.identity, term=term, why=str(exc))
                    break
        self._lease = NO_LEASE
        self.leader = ""
        await self._set_term(0)

    async def _follow(self, stop: asyncio.Event) -> None:
        """Wait until the leader key goes (or a while: then campaign again anyway)."""
        current = await self.store.get(LEADER_KEY)
        if current is None:
            self.leader = ""
            return
        leader = current.value.decode(errors="replace")
        if leader != self.leader:
            log.info("following", leader=leader)
        self.leader = leader
        watch = self.store.watch(LEADER_KEY, start_revision=current.mod_revision + 1)
        waiter = asyncio.ensure_future(_until_deleted(watch))
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({waiter, stopper}, timeout=self.ttl, return_when="FIRST_COMPLETED")
        finally:
            for task in (waiter, stopper):
                task.cancel()
            await asyncio.gather(waiter, stopper, return_exceptions=True)
            await watch.aclose()  # type: ignore[attr-defined]

    async def _resign(self) -> None:
        """Stopping: give the key up at once so another replica need not wait for the TTL."""
        lease, self._lease = self._lease, NO_LEASE
        await self._set_term(0)
        if lease != NO_LEASE:
            with contextlib.suppress(StoreError):
                await self.store.revoke(lease)
                log.info("leadership given up", identity=self.identity)


async def _until_deleted(watch: AsyncIterator[Event]) -> None:
    async for event in watch:
        if event.type is EventType.DELETE:
            return


class FencedStore:
    """``store`` for a controller: every write holds only while this replica leads the term it
    led when the write was made (see the module doc); reads and watches pass through."""

    def __init__(self, store: Store, elector: Elector) -> None:
        self.inner = store
        self.elector = elector

    def _fence(self) -> Compare:
        term = self.elector.term
        if term == 0:
            raise NotLeader(f"{self.elector.identity} does not lead: controller write refused")
        return Compare(LEADER_KEY, term)

    async def get(self, key: str) -> KeyValue | None:
        return await self.inner.get(key)

    async def range(self, prefix: str) -> RangeResult:
        return await self.inner.range(prefix)

    async def range_at(self, prefix: str, revision: int) -> RangeResult:
        return await self.inner.range_at(prefix, revision)

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
        fence = self._fence()
        try:
            return await self.inner.txn([*compares, fence], ops)
        except CompareFailed as exc:
            if exc.key != LEADER_KEY:
                raise
            await self.elector.lost(fence.mod_revision)
            raise NotLeader(
                f"{self.elector.identity} no longer leads (term {fence.mod_revision} is over): "
                "controller write refused"
            ) from None

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
        while True:
            kv = await self.inner.get(key)
            if kv is None:
                if expect_mod_revision:
                    raise CompareFailed(key, expect_mod_revision, 0)
                return None
            if expect_mod_revision is not None and kv.mod_revision != expect_mod_revision:
                raise CompareFailed(key, expect_mod_revision, kv.mod_revision)
            try:
                return await self.txn([Compare(key, kv.mod_revision)], [Delete(key)])
            except CompareFailed as exc:
                if exc.key != key or expect_mod_revision is not None:
                    raise  # changed since read: read again when no revision was asked for

    def watch(self, prefix: str, start_revision: int = 0) -> AsyncIterator[Event]:
        return self.inner.watch(prefix, start_revision)

    async def grant(self, ttl: float) -> LeaseId:
        self._fence()
        return await self.inner.grant(ttl)

    async def keepalive(self, lease: LeaseId) -> None:
        await self.inner.keepalive(lease)

    async def revoke(self, lease: LeaseId) -> int:
        self._fence()
        return await self.inner.revoke(lease)

    async def expire_leases(self) -> list[LeaseId]:
        self._fence()
        return await self.inner.expire_leases()

    async def compact(self, revision: int) -> None:
        self._fence()
        await self.inner.compact(revision)

    async def close(self) -> None:
        await self.inner.close()


class LeaderOnly:
    """Runs ``inner`` (a controller component) only while ``elector``'s replica leads."""

    def __init__(self, inner: Component, elector: Elector) -> None:
        self.inner = inner
        self.elector = elector

    @property
    def name(self) -> str:
        return self.inner.name

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            leading = asyncio.ensure_future(self.elector.wait_leading())
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({leading, stopping}, return_when="FIRST_COMPLETED")
            for task in (leading, stopping):
                task.cancel()
            await asyncio.gather(leading, stopping, return_exceptions=True)
            if stop.is_set():
                return
            term = self.elector.term
            if term == 0:
                continue
            await self._run_term(term, stop)

    async def _run_term(self, term: int, stop: asyncio.Event) -> None:
        inner_stop = asyncio.Event()
        runner = asyncio.ensure_future(self.inner.run(inner_stop))
        over = asyncio.ensure_future(self.elector.wait_term_over(term))
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({runner, over, stopping}, return_when="FIRST_COMPLETED")
        finally:
            inner_stop.set()
            for task in (over, stopping):
                task.cancel()
            await asyncio.gather(over, stopping, return_exceptions=True)
        try:
            await runner
        except Exception as exc:
            if self.elector.term == term:
                raise  # a failure of its own while leading: the supervisor restarts it
            log.info("controller stopped with its term", component=self.name, error=repr(exc))
        if self.elector.term != term:
            log.info("controller paused: not leading", component=self.name, term=term)
