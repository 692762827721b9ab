"""One TUF repository for every hub replica (docs/etcd.md): the versions of the snapshot and
the timestamp live in the shared store, so a device failing over from one replica to another
never sees them go down (python-tuf would rightly refuse that as a rollback).

Every replica holds the same ``D/tuf/`` (a replica is a copy of the data directory: the TUF
root, the top-level targets and the online key). What changes while the hub runs is in the
store under ``/tuf/``:

    /tuf/snapshot, /tuf/timestamp     the snapshot and timestamp, as the leader signed them
    /tuf/delegated/<role>             each publisher's delegated targets, as pushed

Only the **leader** signs (:meth:`SharedTuf.sign`, every :data:`SIGN_CHECK_S`, and at a push,
:meth:`SharedTuf.publish_delegated`): it first takes what the store holds, signs the next
versions, and writes them with a compare on the timestamp's revision through the fenced store,
so a deposed leader writes nothing and two signers cannot both win; its repository takes
them only once the store did. Every replica follows the prefix with a watch and serves what
the store holds (:meth:`hub.tufrepo.TufRepository.adopt_shared`, which checks each file's
signatures against its TUF root and targets first). A replica's repository never signs on
its own (``TufRepository.signing`` is False).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from edgefleet.errors import CompareFailed, StoreError, TrustError
from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop
from hub.store import Compare, Put
from hub.store.electing import Elector
from hub.store.protocol import KeyValue, Store
from hub.tufrelaying import RelayedTuf
from hub.tufrepo import TufRepository

log = get_logger(__name__)

PREFIX = "/tuf/"
SNAPSHOT_KEY = "/tuf/snapshot"
TIMESTAMP_KEY = "/tuf/timestamp"
DELEGATED_PREFIX = "/tuf/delegated/"
SIGN_CHECK_S = 5.0
MAX_SHARED_TARGETS_BYTES = 1024 * 1024  # within etcd's default 1.5 MiB request


class TufConflict(StoreError):
    """Another replica signed the TUF metadata meanwhile (push again)."""


class SharedTuf:
    """The component ``tuf-shared`` of a replicated hub with a TUF repository (module doc)."""

    name = "tuf-shared"

    def __init__(
        self,
        get_repo: Callable[[], TufRepository | RelayedTuf | None],
        store: Store,
        fenced: Store,
        elector: Elector,
        *,
        period_s: float = SIGN_CHECK_S,
    ) -> None:
        self._get_repo = get_repo  # () -> the hub's current repository (it may be replaced)
        self.store = store
        self.fenced = fenced
        self.elector = elector
        self._period = period_s
        self._lock = asyncio.Lock()

    def _repo(self) -> TufRepository | None:
        repo = self._get_repo()
        return repo if isinstance(repo, TufRepository) else None

    async def follow(self) -> int:
        """Serve what the store holds now; the revision read at."""
        result = await self.store.range(PREFIX)
        repo = self._repo()
        if repo is not None:
            self._adopt(repo, result.kvs)
        return result.revision

    @staticmethod
    def _adopt(repo: TufRepository, kvs: tuple[KeyValue, ...]) -> KeyValue | None:
        """Take the store's files into ``repo``; the timestamp's key (None: none stored)."""
        by_key = {kv.key: kv for kv in kvs}
        ts, snap = by_key.get(TIMESTAMP_KEY), by_key.get(SNAPSHOT_KEY)
        if ts is None or snap is None:
            return None
        delegated = {
            kv.key.removeprefix(DELEGATED_PREFIX): kv.value
            for kv in kvs
            if kv.key.startswith(DELEGATED_PREFIX)
        }
        try:
            if repo.adopt_shared(snap.value, ts.value, delegated):
                log.info("shared tuf metadata adopted", revision=ts.mod_revision)
        except TrustError as exc:  # a store someone else wrote into: serve what is held
            log.error("shared tuf metadata refused", reason=exc.reason, error=str(exc))
        return ts

    async def _signable(self) -> tuple[TufRepository, KeyValue | None] | None:
        repo = self._repo()
        if repo is None:
            return None
        kvs = (await self.store.range(PREFIX)).kvs
        return repo, self._adopt(repo, kvs)

    async def sign(self, *, force: bool = False) -> bool:
        """As the leader: sign the snapshot and timestamp when due (or the store holds none
        yet: the repository's own go in first). Whether the store changed."""
        async with self._lock:
            got = await self._signable()
            if got is None:
                return False
            repo, ts = got
            if ts is None:  # the first leader: what every replica's copy of D/tuf holds
                snapshot, timestamp, delegated = repo.shared_state()
                ops = [Put(SNAPSHOT_KEY, snapshot), Put(TIMESTAMP_KEY, timestamp)]
                ops += [Put(DELEGATED_PREFIX + r, d) for r, d in sorted(delegated.items())]
                await self.fenced.txn([Compare(TIMESTAMP_KEY, 0)], ops)
                return True
            signed = repo.plan_signing(force=force)
            if signed is None:
                return False
            await self.fenced.txn(
                [Compare(TIMESTAMP_KEY, ts.mod_revision)],
                [Put(SNAPSHOT_KEY, signed[0]), Put(TIMESTAMP_KEY, signed[1])],
            )
            repo.adopt_shared(signed[0], signed[1], {})
            log.info("tuf timestamp signed for the replicas")
            return True

    async def publish_delegated(self, role: str, data: bytes, version: int) -> None:
        """A push on the leader: the publisher's new delegated targets (checked by
        ``TufRepository.check_delegated``) with the snapshot and timestamp that list them, in
        one conditional write; TufConflict when another replica signed meanwhile."""
        if len(data) > MAX_SHARED_TARGETS_BYTES:
            raise TrustError(
                "MetadataTooLarge",
                f"delegated targets {role!r}: {len(data)} bytes; hub replicas share them in "
                f"the store, at most {MAX_SHARED_TARGETS_BYTES} bytes",
            )
        async with self._lock:
            got = await self._signable()
            if got is None:
                return
            repo, ts = got
            key = DELEGATED_PREFIX + role
            held = await self.store.get(key)
            signed = repo.plan_signing(delegated=(role, version))
            assert signed is not None  # a new delegated version always signs
            try:
                await self.fenced.txn(
                    [
                        Compare(TIMESTAMP_KEY, ts.mod_revision if ts is not None else 0),
                        Compare(key, held.mod_revision if held is not None else 0),
                    ],
                    [Put(key, data), Put(SNAPSHOT_KEY, signed[0]), Put(TIMESTAMP_KEY, signed[1])],
                )
            except CompareFailed as exc:
                raise TufConflict(
                    f"the TUF metadata changed on another replica meanwhile ({exc}): push again"
                ) from None
            repo.adopt_shared(signed[0], signed[1], {role: data})
        log.info("delegated targets stored for the replicas", role=role)

    async def run(self, stop: asyncio.Event) -> None:
        revision = await self.follow()
        watcher = asyncio.ensure_future(self._watch(revision))
        try:
            while not stop.is_set():
                if self.elector.leading:
                    try:
                        await self.sign()
                    except StoreError as exc:  # deposed meanwhile, or a race: next round
                        log.info("tuf signing skipped", error=str(exc))
                if await wait_for_stop(stop, self._period):
                    return
                if watcher.done():
                    watcher.result()  # a watch that failed reaches the supervisor
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _watch(self, revision: int) -> None:
        async for _ in self.store.watch(PREFIX, revision + 1):
            await self.follow()
