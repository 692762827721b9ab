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
import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from edgefleet.errors import CompareFailed, StoreError, TrustError
from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop
from hub import tufrelaying
from hub.store import Compare, Delete, Put
from hub.store.electing import Elector
from hub.store.protocol import KeyValue, Store
from hub.tufrelaying import RelayedTuf
from hub.tufrepo import TufRepository

if TYPE_CHECKING:
    from edgefleet.trust.documents import Root

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


# -- a regional hub's replicas: the root's relayed set in the store ---------------------------

RELAY_PREFIX = "/tuf-relay/"
RELAY_CURRENT_KEY = "/tuf-relay/current"
RELAY_FILES_PREFIX = "/tuf-relay/files/"


def _relay_current(names: Mapping[str, str], digest: str) -> bytes:
    return json.dumps({"digest": digest, "files": dict(sorted(names.items()))}).encode()


def read_relayed(kvs: tuple[KeyValue, ...]) -> tuple[dict[str, bytes], str] | None:
    """The set the store holds under :data:`RELAY_PREFIX` (files by name, digest), None when
    it holds none; TrustError when what it holds does not hold together (a name no set may
    hold, a file missing or not of its sha256, files not of the digest)."""
    by_key = {kv.key: kv.value for kv in kvs}
    raw = by_key.get(RELAY_CURRENT_KEY)
    if raw is None:
        return None
    try:
        current = json.loads(raw)
        digest, names = current["digest"], current["files"]
        if not isinstance(digest, str) or not isinstance(names, dict):
            raise TypeError("digest and files")
    except (ValueError, KeyError, TypeError) as exc:
        raise TrustError("MalformedMetadata", f"{RELAY_CURRENT_KEY}: {exc}") from None
    files: dict[str, bytes] = {}
    for name, sha in names.items():
        bound = tufrelaying.file_bound(name) if isinstance(name, str) else None
        data = by_key.get(RELAY_FILES_PREFIX + sha) if isinstance(sha, str) else None
        if bound is None or data is None or len(data) > bound:
            raise TrustError(
                "MalformedMetadata", f"{RELAY_CURRENT_KEY}: {str(name)[:80]!r}: no such file"
            )
        if hashlib.sha256(data).hexdigest() != sha:
            raise TrustError("TufMetadataMismatch", f"{name}: not the sha256 the store names")
        files[name] = data
    if tufrelaying.digest_files(files) != digest:
        raise TrustError("TufMetadataMismatch", f"{RELAY_CURRENT_KEY}: not the files' digest")
    return files, digest


class SharedRelay:
    """The component ``tuf-relay-shared`` of a regional hub with replicas: the root's TUF set
    that the replica holding the root link (the leader) verified and adopted
    (:func:`hub.tufrelaying.adopt`) goes into the store (:meth:`publish`); every replica
    follows it with a watch and serves it only once it verified it itself against its own
    ``D/tuf-relay/`` trusted state (python-tuf: signatures, versions never lower than it saw,
    expiry), so a replica never serves what it did not check and never rolls back.

    Store keys::

        /tuf-relay/files/<sha256>   a file's bytes (content-addressed: unchanged files of
                                    the next set are not written again)
        /tuf-relay/current          {"digest": ..., "files": {name: sha256}}, the set
    """

    name = "tuf-relay-shared"

    def __init__(
        self,
        data_dir: Path,
        store: Store,
        fenced: Store,
        *,
        held: Callable[[], TufRepository | RelayedTuf | None],
        fleet_root: Callable[[], Root | None],
        adopted: Callable[[RelayedTuf], None],
    ) -> None:
        self.data_dir = Path(data_dir)
        self.store = store
        self.fenced = fenced
        self._held = held  # () -> what the hub serves now (ctx.tuf)
        self._fleet_root = fleet_root
        self._adopted = adopted  # serve a set adopted from the store
        self._refused: str | None = None  # the digest of the set last refused: not again
        self._lock = asyncio.Lock()

    async def publish(self, files: Mapping[str, bytes], digest: str) -> bool:
        """As the replica holding the root link, after it adopted ``files``: make them the
        set the store holds (each new file first, then ``current`` with a compare on its
        revision, through the fenced store: a deposed leader writes nothing). Whether the
        store changed. TrustError ``MetadataTooLarge`` for a file above
        :data:`MAX_SHARED_TARGETS_BYTES` (etcd's request bound)."""
        for name, data in files.items():
            if len(data) > MAX_SHARED_TARGETS_BYTES:
                raise TrustError(
                    "MetadataTooLarge",
                    f"{name}: {len(data)} bytes; a region's replicas share the root's TUF "
                    f"files in the store, at most {MAX_SHARED_TARGETS_BYTES} bytes each",
                )
        async with self._lock:
            result = await self.store.range(RELAY_PREFIX)
            by_key = {kv.key: kv for kv in result.kvs}
            current = by_key.get(RELAY_CURRENT_KEY)
            if current is not None:
                try:
                    if json.loads(current.value).get("digest") == digest:
                        return False
                except (ValueError, AttributeError):
                    pass  # malformed: written over below
            names = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
            for sha, name in sorted({sha: name for name, sha in names.items()}.items()):
                if RELAY_FILES_PREFIX + sha not in by_key:
                    await self.fenced.put(RELAY_FILES_PREFIX + sha, files[name])
            wanted = {RELAY_FILES_PREFIX + sha for sha in names.values()}
            ops: list[Put | Delete] = [Put(RELAY_CURRENT_KEY, _relay_current(names, digest))]
            ops += [
                Delete(kv.key)
                for kv in result.kvs
                if kv.key.startswith(RELAY_FILES_PREFIX) and kv.key not in wanted
            ]
            await self.fenced.txn(
                [Compare(RELAY_CURRENT_KEY, current.mod_revision if current else 0)], ops
            )
        log.info("relayed tuf metadata stored for the replicas", digest=digest[:16])
        return True

    async def follow(self) -> int:
        """Serve the set the store holds now, once verified here; the revision read at."""
        result = await self.store.range(RELAY_PREFIX)
        try:
            got = read_relayed(result.kvs)
        except TrustError as exc:
            log.error("shared relayed tuf metadata refused", reason=exc.reason, error=str(exc))
            return result.revision
        if got is None:
            return result.revision
        files, digest = got
        held = self._held()
        if (isinstance(held, RelayedTuf) and held.digest == digest) or digest == self._refused:
            return result.revision
        try:
            relayed = await asyncio.to_thread(
                tufrelaying.adopt, self.data_dir, files, digest, self._fleet_root()
            )
        except (TrustError, OSError) as exc:
            reason = exc.reason if isinstance(exc, TrustError) else "TufRelayFailed"
            retry = not isinstance(exc, TrustError) or exc.reason == "NoTrustRoot"
            self._refused = None if retry else digest
            log.error(
                "shared relayed tuf metadata refused; serving the last accepted",
                reason=reason,
                error=str(exc),
            )
            return result.revision
        self._adopted(relayed)
        log.info("shared relayed tuf metadata adopted", **relayed.versions())
        return result.revision

    async def run(self, stop: asyncio.Event) -> None:
        revision = await self.follow()
        watcher = asyncio.ensure_future(self._watch(revision))
        try:
            await stop.wait()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _watch(self, revision: int) -> None:
        # the files are written before ``current``, which names them: a set changes with it
        async for _ in self.store.watch(RELAY_CURRENT_KEY, revision + 1):
            await self.follow()
