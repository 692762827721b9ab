"""One TUF repository for every hub replica (docs/etcd.md): the versions of the snapshot and
the timestamp live in the shared store, so a device failing over from one replica to another
never sees them go down (python-tuf would rightly refuse that as a rollback).

Every replica holds the same ``D/tuf/`` (a replica is a copy of the data directory: the TUF
root, the top-level targets and the online key). What changes while the hub runs is in the
store under ``/tuf/``:

    /tuf/snapshot, /tuf/timestamp     the snapshot and timestamp, as the leader signed them
    /tuf/delegated/<role>             each publisher's delegated targets, as pushed
    /tuf/roots/<N>, /tuf/targets      the TUF roots and top-level targets ``hub tuf install``
                                      installed (:func:`share_installed`), once for all

Only the **leader** signs (:meth:`SharedTuf.sign`, every :data:`SIGN_CHECK_S`, and at a push,
:meth:`SharedTuf.publish_delegated`): it first takes what the store holds, signs the next
versions, and writes them with a compare on the timestamp's revision through the fenced store,
so a deposed leader writes nothing and two signers cannot both win; its repository takes
them only once the store did. Every replica follows the prefix with a watch and serves what
the store holds (:meth:`hub.state.tufrepo.TufRepository.adopt_shared`, which checks each file's
signatures against its TUF root and targets first). A replica's repository never signs on
its own (``TufRepository.signing`` is False).

``hub tuf install`` on one replica installs the new TUF root or top-level targets in its own
``D/tuf/`` and then in the store (:func:`share_installed`); every replica installs what the
store holds into its ``D/tuf/`` (:func:`hub.state.tufrepo.install_roles`: the same checks, the
root versions in turn, targets never lower), where its ``tuf-repository`` watcher adopts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from edgefleet.errors import CompareFailed, HubDirError, StoreError, TrustError
from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop
from edgefleet.trust import tufmeta
from hub.state import tufrelay
from hub.state.store import Compare, Delete, Put
from hub.state.store.electing import Elector
from hub.state.store.protocol import KeyValue, Store
from hub.state.tufrelay import RelayedTuf
from hub.state.tufrepo import TufRepository, install_roles, installed_roles

if TYPE_CHECKING:
    from edgefleet.trust.documents import Root

log = get_logger(__name__)

PREFIX = "/tuf/"
SNAPSHOT_KEY = "/tuf/snapshot"
TIMESTAMP_KEY = "/tuf/timestamp"
DELEGATED_PREFIX = "/tuf/delegated/"
ROOTS_PREFIX = "/tuf/roots/"  # + the version: each TUF root installed (hub tuf install)
TARGETS_KEY = "/tuf/targets"  # the top-level targets installed
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
        self._installed_seen: tuple[int, int] = (0, 0)

    def _repo(self) -> TufRepository | None:
        repo = self._get_repo()
        return repo if isinstance(repo, TufRepository) else None

    async def follow(self) -> int:
        """Serve what the store holds now; the revision read at."""
        result = await self.store.range(PREFIX)
        repo = self._repo()
        if repo is not None:
            await self._install(repo, result.kvs)
            self._adopt(repo, result.kvs)
        return result.revision

    async def _install(self, repo: TufRepository, kvs: tuple[KeyValue, ...]) -> None:
        """The TUF roots and top-level targets installed on a replica (:func:`share_installed`)
        into this replica's ``D/tuf/`` when they are new here (its watcher then adopts them);
        refused ones are logged, once per stored revision."""
        roots = [kv for kv in kvs if kv.key.startswith(ROOTS_PREFIX)]
        targets = next((kv for kv in kvs if kv.key == TARGETS_KEY), None)
        if targets is None and not roots:
            return
        seen = (
            targets.mod_revision if targets else 0,
            max((k.mod_revision for k in roots), default=0),
        )
        if seen == self._installed_seen:
            return
        self._installed_seen = seen
        try:
            by_version = {int(kv.key.removeprefix(ROOTS_PREFIX)): kv.value for kv in roots}
            changed = await asyncio.to_thread(
                _install_stored, repo.dir, by_version, targets.value if targets else None
            )
        except (HubDirError, ValueError, OSError) as exc:
            log.error("shared tuf roles refused", error=str(exc))
            return
        if changed:
            log.info("shared tuf roles installed", directory=str(repo.dir))

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
                first = None
                if not timestamp:  # none signed yet (hub tuf install with replicas signs none)
                    first = repo.plan_signing(force=True)
                    assert first is not None  # forced
                    snapshot, timestamp = first
                ops = [Put(SNAPSHOT_KEY, snapshot), Put(TIMESTAMP_KEY, timestamp)]
                ops += [Put(DELEGATED_PREFIX + r, d) for r, d in sorted(delegated.items())]
                await self.fenced.txn([Compare(TIMESTAMP_KEY, 0)], ops)
                if first is not None:
                    repo.adopt_shared(snapshot, timestamp, {})
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


def _install_stored(d: Path, roots: dict[int, bytes], targets: bytes | None) -> bool:
    if targets is None:
        targets = (d / "targets.json").read_bytes()
    return install_roles(d, roots, targets, signing=False)


async def share_installed(store: Store, d: Path) -> bool:
    """``hub tuf install`` with replicas: the TUF roots and top-level targets just installed
    in the repository ``d`` (``D/tuf``) go into the store, for every replica to install
    (:meth:`SharedTuf.follow`). Each root version not stored yet, then the targets with a
    compare on the revision read. HubDirError when the store already holds other bytes for a
    root version, or higher targets (installed on another replica), or a file is above
    :data:`MAX_SHARED_TARGETS_BYTES`. Whether the store changed."""
    from tuf.api.metadata import Targets

    roots, targets = await asyncio.to_thread(installed_roles, d)
    for name, data in [
        ("targets.json", targets),
        *((f"{v}.root.json", b) for v, b in roots.items()),
    ]:
        if len(data) > MAX_SHARED_TARGETS_BYTES:
            raise HubDirError(
                f"hub tuf install: {name} is {len(data)} bytes; hub replicas share it in the "
                f"store, at most {MAX_SHARED_TARGETS_BYTES} bytes"
            )
    result = await store.range(PREFIX)
    by_key = {kv.key: kv for kv in result.kvs}
    changed = False
    for version, data in sorted(roots.items()):
        held = by_key.get(f"{ROOTS_PREFIX}{version}")
        if held is not None and held.value != data:
            raise HubDirError(
                f"hub tuf install: the replicas share another TUF root version {version} "
                "(installed on another replica): install theirs, then the next version"
            )
        if held is None:
            try:
                await store.txn([Compare(f"{ROOTS_PREFIX}{version}", 0)],
                                [Put(f"{ROOTS_PREFIX}{version}", data)])  # fmt: skip
            except CompareFailed:
                raise HubDirError(
                    f"hub tuf install: TUF root version {version} installed on another replica "
                    "meanwhile: run it again"
                ) from None
            changed = True
    held_targets = by_key.get(TARGETS_KEY)
    if held_targets is not None and held_targets.value == targets:
        return changed
    if held_targets is not None:
        old, _ = tufmeta.parse(held_targets.value, Targets, what="shared targets")
        new, _ = tufmeta.parse(targets, Targets, what="targets.json")
        if old.version >= new.version:
            raise HubDirError(
                f"hub tuf install: the replicas share targets version {old.version} (installed "
                f"on another replica), not lower than this one's {new.version}"
            )
    try:
        await store.txn(
            [Compare(TARGETS_KEY, held_targets.mod_revision if held_targets else 0)],
            [Put(TARGETS_KEY, targets)],
        )
    except CompareFailed:
        raise HubDirError(
            "hub tuf install: targets installed on another replica meanwhile: run it again"
        ) from None
    return True


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
        bound = tufrelay.file_bound(name) if isinstance(name, str) else None
        data = by_key.get(RELAY_FILES_PREFIX + sha) if isinstance(sha, str) else None
        if bound is None or data is None or len(data) > bound:
            raise TrustError(
                "MalformedMetadata", f"{RELAY_CURRENT_KEY}: {str(name)[:80]!r}: no such file"
            )
        if hashlib.sha256(data).hexdigest() != sha:
            raise TrustError("TufMetadataMismatch", f"{name}: not the sha256 the store names")
        files[name] = data
    if tufrelay.digest_files(files) != digest:
        raise TrustError("TufMetadataMismatch", f"{RELAY_CURRENT_KEY}: not the files' digest")
    return files, digest


class SharedRelay:
    """The component ``tuf-relay-shared`` of a regional hub with replicas: the root's TUF set
    that the replica holding the root link (the leader) verified and adopted
    (:func:`hub.state.tufrelay.adopt`) goes into the store (:meth:`publish`); every replica
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
        self._held = held  # () -> what the hub serves now (hub.state.heldtuf)
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
                tufrelay.adopt, self.data_dir, files, digest, self._fleet_root()
            )
        except (TrustError, OSError) as exc:
            reason = exc.reason if isinstance(exc, TrustError) else "TufRelayFailed"
            retry = not isinstance(exc, TrustError) or exc.reason == "NoTrustRoot"
            self._refused = None if retry else digest
            log.error(
                "shared relayed tuf metadata refused",
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
