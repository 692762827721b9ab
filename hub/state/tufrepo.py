"""The hub's TUF repository: offline-signed root, targets and publishers' delegated targets,
and the snapshot and timestamp the hub signs with its online key.

Files (``D/tuf/``)::

    root.json, <N>.root.json     the current TUF root and every version (devices follow them)
    targets.json                 top-level targets: the delegations to publishers (offline)
    delegated/<role>.json        each publisher's targets, exactly as the publisher signed them
    snapshot.json                the signed current set: every targets file and its version
    timestamp.json               the freeze bound: the snapshot's version, length and sha256
    online.key                   the hub's Ed25519 key for snapshot and timestamp (0600)

The hub cannot author targets: it holds no targets or publisher key. A push carries the
publisher's new delegated targets; the hub checks them like a device would (signed by the
delegation's keys, a higher version, every path within the delegation's model-name patterns,
listing the pushed artifact), stores them, and signs a new snapshot and timestamp. The
timestamp expires :data:`TIMESTAMP_LIFETIME_S` after it is signed and is signed again when
half of that has passed, when a device asks for it; the snapshot is signed again when the
targets change or half of its lifetime has passed. Both lifetimes are the hub's ``[tuf]``
settings (hub/config.py): the timestamp's is the freeze-attack window a device accepts, and,
since regional hubs relay a root's timestamp unchanged (hub/state/tufrelay.py), how long a region
cut off from its root can still give its devices new artifacts.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefleet.errors import HubDirError, TrustError
from edgefleet.logs import get_logger
from edgefleet.persisting import write_atomic
from edgefleet.trust import tufmeta
from edgefleet.trust.agentreleases import AgentReleaseMetadata
from edgefleet.trust.documents import ArtifactMetadata
from edgefleet.trust.envelopes import Envelope
from edgefleet.trust.publishers import DelegatedRole, check_signed_by_role

if TYPE_CHECKING:
    from tuf.api.metadata import Root, Snapshot, Targets, Timestamp

    from hub.state.tufrelay import RelayedTuf

log = get_logger(__name__)

TUF_DIR = "tuf"
DELEGATED_DIR = "delegated"
ONLINE_KEY = "online.key"
TIMESTAMP_LIFETIME_S = 3600.0  # a device's freeze bound: an hour, not the months of metadata
SNAPSHOT_LIFETIME_S = 7 * 86400.0
RELAY_CHECK_S = 5.0  # how often files() looks whether the timestamp is due to be signed again
_VERSIONED_ROOT = re.compile(r"^([1-9][0-9]{0,8})\.root\.json$")


def _read_bounded(path: Path, limit: int) -> bytes:
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise TrustError("MalformedMetadata", f"{path}: larger than {limit} bytes")
    return data


class TufRepository:
    """The repository in ``directory`` (:meth:`load` checks it). Thread-safe."""

    def __init__(
        self,
        directory: Path,
        *,
        clock: Callable[[], float] = time.time,
        timestamp_lifetime_s: float = TIMESTAMP_LIFETIME_S,
        snapshot_lifetime_s: float = SNAPSHOT_LIFETIME_S,
        signing: bool = True,
    ) -> None:
        self.dir = Path(directory)
        # False on hub replicas (hub.state.sharedtuf): only the leader signs, through the store
        self.signing = signing
        self._clock = clock
        self._ts_life = timestamp_lifetime_s
        self._snap_life = snapshot_lifetime_s
        self._lock = threading.Lock()
        self._roots: dict[int, bytes] = {}
        self._targets_bytes = b""
        self._delegated: dict[str, bytes] = {}
        self._versions: dict[str, int] = {}  # delegated role -> version (the snapshot's meta)
        self._targets_version = 0
        self._snapshot_bytes = b""
        self._timestamp_bytes = b""
        self._signer: Any = None
        self._relayed: tuple[bytes, dict[str, bytes], str] | None = None  # files() of a timestamp
        self._relay_checked = float("-inf")
        self._load()

    @staticmethod
    def exists(data_dir: Path) -> bool:
        return (Path(data_dir) / TUF_DIR / "root.json").exists()

    @classmethod
    def load(cls, data_dir: Path, **kwargs: Any) -> TufRepository | None:
        """The repository of a hub data directory, None when it keeps none; HubDirError when
        its files do not hold together."""
        if not cls.exists(data_dir):
            return None
        try:
            return cls(Path(data_dir) / TUF_DIR, **kwargs)
        except (TrustError, OSError) as exc:
            raise HubDirError(f"the hub's TUF repository ({data_dir}/{TUF_DIR}): {exc}") from None

    # -- reading the files ---------------------------------------------------------------
    @property
    def root(self) -> Root:
        from tuf.api.metadata import Root

        signed, _ = tufmeta.parse(self._roots[max(self._roots)], Root, what="root.json")
        return signed  # type: ignore[no-any-return]

    @property
    def targets(self) -> Targets:
        from tuf.api.metadata import Targets

        signed, _ = tufmeta.parse(self._targets_bytes, Targets, what="targets.json")
        return signed  # type: ignore[no-any-return]

    def _load(self) -> None:
        from tuf.api.metadata import Root, Targets

        for p in self.dir.glob("*.root.json"):
            m = _VERSIONED_ROOT.match(p.name)
            if m:
                self._roots[int(m.group(1))] = _read_bounded(p, tufmeta.ROOT_MAX_BYTES)
        current = _read_bounded(self.dir / "root.json", tufmeta.ROOT_MAX_BYTES)
        root, _ = tufmeta.parse(current, Root, what="root.json")
        self._roots[root.version] = current
        prev: Any = None
        for version in sorted(self._roots):
            r, _ = tufmeta.parse(self._roots[version], Root, what=f"{version}.root.json")
            if r.version != version:
                raise TrustError(
                    "MalformedMetadata", f"{version}.root.json has version {r.version}"
                )
            if prev is not None and version == prev.version + 1:
                tufmeta.verify_delegate(
                    prev, tufmeta.ROOT, self._roots[version], what=f"root {version}"
                )
            tufmeta.verify_delegate(r, tufmeta.ROOT, self._roots[version], what=f"root {version}")
            prev = r
        self._targets_bytes = _read_bounded(self.dir / "targets.json", tufmeta.TARGETS_MAX_BYTES)
        tufmeta.verify_delegate(
            self.root, tufmeta.TARGETS, self._targets_bytes, what="targets.json"
        )
        targets = self.targets
        self._targets_version = int(targets.version)
        delegated = self.dir / DELEGATED_DIR
        if delegated.is_dir() and targets.delegations and targets.delegations.roles:
            for role in targets.delegations.roles:
                p = delegated / tufmeta.role_file(role)
                if p.exists():
                    data = _read_bounded(p, tufmeta.TARGETS_MAX_BYTES)
                    signed, _ = tufmeta.parse(data, Targets, what=str(p))
                    self._delegated[role] = data
                    self._versions[role] = signed.version
        self._signer = tufmeta.tuf_signer(self.dir / ONLINE_KEY)
        online = self._signer.public_key.keyid
        for role in (tufmeta.SNAPSHOT, tufmeta.TIMESTAMP):
            if online not in root.roles[role].keyids:
                raise TrustError(
                    "UnknownKey",
                    f"the hub's online key {online} is not a {role} key of the TUF root",
                )
        for name in ("snapshot.json", "timestamp.json"):
            p = self.dir / name
            if p.exists():
                data = _read_bounded(p, tufmeta.SNAPSHOT_MAX_BYTES)
                if name == "snapshot.json":
                    self._snapshot_bytes = data
                else:
                    self._timestamp_bytes = data
        if self.signing:
            with self._lock:
                self._refresh(force=False)

    def read(self, name: str) -> bytes | None:
        """A metadata file by the name python-tuf's client asks for (``timestamp.json``,
        ``3.root.json``, ``vision.json``...); None when there is none."""
        with self._lock:
            if name == "timestamp.json":
                if self.signing:
                    self._refresh(force=False)
                return self._timestamp_bytes
            if name == "snapshot.json":
                return self._snapshot_bytes
            if name in ("targets.json",):
                return self._targets_bytes
            if name == "root.json":
                return self._roots[max(self._roots)]
            m = _VERSIONED_ROOT.match(name)
            if m:
                return self._roots.get(int(m.group(1)))
            role = name.removesuffix(".json")
            if name.endswith(".json") and tufmeta.valid_role_name(role):
                return self._delegated.get(role)
            return None

    def files(self) -> tuple[dict[str, bytes], str]:
        """Every metadata file by name, exactly as signed, and their digest
        (:func:`hub.state.tufrelay.digest_files`): what a root hub relays to its regions. The
        timestamp is signed again first when half its life has passed (looked at every
        :data:`RELAY_CHECK_S` at most), so a region gets a fresh one well before it expires."""
        from hub.state.tufrelay import digest_files

        with self._lock:
            now = self._clock()
            if self.signing and now - self._relay_checked >= RELAY_CHECK_S:
                self._refresh(force=False)
                self._relay_checked = now
            cached = self._relayed
            if cached is not None and cached[0] is self._timestamp_bytes:
                return cached[1], cached[2]
            out = {f"{v}.root.json": data for v, data in self._roots.items()}
            out["root.json"] = self._roots[max(self._roots)]
            out["targets.json"] = self._targets_bytes
            for role, data in self._delegated.items():
                out[tufmeta.role_file(role)] = data
            out["snapshot.json"] = self._snapshot_bytes
            out["timestamp.json"] = self._timestamp_bytes
            digest = digest_files(out)
            self._relayed = (self._timestamp_bytes, out, digest)
            return out, digest

    # -- snapshot and timestamp (online) --------------------------------------------------
    def _snapshot_meta(self) -> dict[str, int]:
        meta = {"targets.json": self._targets_version}
        for role, version in sorted(self._versions.items()):
            meta[tufmeta.role_file(role)] = version
        return meta

    def _refresh(self, *, force: bool) -> None:
        """Sign a new snapshot when the targets changed (or ``force``) or it is half way to
        its expiry, and a new timestamp when the snapshot changed or it is half way."""
        signed = self._next(self._snapshot_meta(), force=force)
        if signed is not None:
            self._commit(*signed)

    def _next(self, want: dict[str, int], *, force: bool) -> tuple[bytes, bytes] | None:
        """The snapshot and timestamp to sign for the targets versions ``want`` (the held
        snapshot when it still holds), or None when neither is due. Changes nothing."""
        from tuf.api.metadata import MetaFile, Snapshot, Timestamp

        now = self._clock()
        snap: Snapshot | None = None
        snapshot_bytes = self._snapshot_bytes
        if snapshot_bytes:
            snap, _ = tufmeta.parse(snapshot_bytes, Snapshot, what="snapshot.json")
        new_snapshot = (
            force
            or snap is None
            or {k: v.version for k, v in snap.meta.items()} != want
            or snap.expires.timestamp() - now < self._snap_life / 2
        )
        if new_snapshot:
            snap = Snapshot(
                version=(snap.version + 1) if snap is not None else 1,
                expires=tufmeta._expiry(now + self._snap_life),
                meta={k: MetaFile(v) for k, v in want.items()},
            )
            snapshot_bytes = tufmeta.sign(snap, [self._signer])
        assert snap is not None
        ts: Timestamp | None = None
        if self._timestamp_bytes:
            ts, _ = tufmeta.parse(self._timestamp_bytes, Timestamp, what="timestamp.json")
        if not (
            new_snapshot
            or ts is None
            or ts.snapshot_meta.version != snap.version
            or ts.expires.timestamp() - now < self._ts_life / 2
        ):
            return None
        ts = Timestamp(
            version=(ts.version + 1) if ts is not None else 1,
            expires=tufmeta._expiry(now + self._ts_life),
            snapshot_meta=MetaFile(
                snap.version, len(snapshot_bytes), {"sha256": tufmeta.digest(snapshot_bytes)}
            ),
        )
        return snapshot_bytes, tufmeta.sign(ts, [self._signer])

    def _commit(self, snapshot: bytes, timestamp: bytes) -> None:
        if snapshot != self._snapshot_bytes:
            self._snapshot_bytes = snapshot
            write_atomic(self.dir / "snapshot.json", snapshot, mode=0o644)
        self._timestamp_bytes = timestamp
        write_atomic(self.dir / "timestamp.json", timestamp, mode=0o644)

    # -- shared between hub replicas (hub.state.sharedtuf) -------------------------------------
    def shared_state(self) -> tuple[bytes, bytes, dict[str, bytes]]:
        """``(snapshot, timestamp, delegated targets by role)`` as held."""
        with self._lock:
            return self._snapshot_bytes, self._timestamp_bytes, dict(self._delegated)

    def plan_signing(
        self, *, force: bool = False, delegated: tuple[str, int] | None = None
    ) -> tuple[bytes, bytes] | None:
        """The snapshot and timestamp the leader of hub replicas should sign now (nothing
        committed: :meth:`adopt_shared` once the store took them), with ``delegated``
        (role, version) counted in; None when none is due."""
        with self._lock:
            want = self._snapshot_meta()
            if delegated is not None:
                want[tufmeta.role_file(delegated[0])] = delegated[1]
            return self._next(want, force=force or delegated is not None)

    def adopt_shared(
        self, snapshot: bytes, timestamp: bytes, delegated: Mapping[str, bytes]
    ) -> bool:
        """Serve the snapshot, timestamp and delegated targets the replicas share in the
        store (signed by the leader): each checked against this repository's TUF root and
        top-level targets (TrustError otherwise, nothing changed), written to ``D/tuf/``.
        Whether anything changed; a timestamp older than the one held changes nothing."""
        from tuf.api.metadata import Snapshot, Targets, Timestamp

        root, targets = self.root, self.targets
        ts, _ = tufmeta.parse(timestamp, Timestamp, what="shared timestamp")
        snap, _ = tufmeta.parse(snapshot, Snapshot, what="shared snapshot")
        tufmeta.verify_delegate(root, tufmeta.TIMESTAMP, timestamp, what="shared timestamp")
        tufmeta.verify_delegate(root, tufmeta.SNAPSHOT, snapshot, what="shared snapshot")
        if ts.snapshot_meta.version != snap.version:
            raise TrustError(
                "TufMetadataMismatch",
                f"shared timestamp names snapshot {ts.snapshot_meta.version}, not {snap.version}",
            )
        roles = targets.delegations.roles if targets.delegations is not None else None
        versions: dict[str, int] = {}
        for role, data in delegated.items():
            if not roles or role not in roles:
                raise TrustError("UnknownRole", f"shared delegated targets {role!r}: not delegated")
            signed, _ = tufmeta.parse(data, Targets, what=role)
            tufmeta.verify_delegate(targets, role, data, what=f"shared delegated targets {role!r}")
            versions[role] = int(signed.version)
        with self._lock:
            if self._timestamp_bytes:
                held, _ = tufmeta.parse(self._timestamp_bytes, Timestamp, what="timestamp.json")
                if ts.version < held.version or timestamp == self._timestamp_bytes:
                    return False
            for role, data in delegated.items():
                if self._delegated.get(role) != data:
                    path = self.dir / DELEGATED_DIR / tufmeta.role_file(role)
                    write_atomic(path, data, mode=0o644)
                    self._delegated[role] = data
                    self._versions[role] = versions[role]
            self._commit(snapshot, timestamp)
        return True

    # -- a publisher's delegated targets (with a push) ------------------------------------
    def check_delegated(
        self,
        role: str,
        data: bytes,
        meta: ArtifactMetadata,
        *,
        now: float,
        envelope: Envelope | None = None,
    ) -> int:
        """Check a publisher's new delegated targets that come with a push of ``meta``
        (TrustError otherwise): the top-level targets delegate ``role``; a threshold of its
        keys signed it; its version is higher than the one held (the same bytes again are
        fine: 0, nothing to store, but they must list ``meta`` too); not expired; every
        target path is within the role's model-name patterns; it lists every file of
        ``meta`` with the signed length and sha256; and ``envelope`` (the artifact's, when
        given) is signed by a threshold of ``role``'s own keys, as a device requires
        (``SignerNotDelegated``). Its version when it is new, else 0."""
        what = f"{meta.name} {meta.version}"

        def check_role(delegated: DelegatedRole, paths: list[str] | None) -> None:
            if envelope is not None:
                check_signed_by_role(envelope, delegated, what=what)

        return self._check_delegated(
            role,
            data,
            now=now,
            check_role=check_role,
            check_listed=lambda lookup: tufmeta.check_assigned(lookup, meta),
            scope="the model names this publisher may sign",
        )

    def check_delegated_release(
        self,
        role: str,
        data: bytes,
        meta: AgentReleaseMetadata,
        *,
        now: float,
        envelope: Envelope,
    ) -> int:
        """:meth:`check_delegated` for an edged release (edgefleet.trust.agentreleases):
        ``role`` must be an agent-release role (its only path ``agent/edged/*/*``:
        ``NotAnAgentRole``) whose keys signed ``envelope``, and its targets must list the
        release file with the signed length and sha256."""
        from edgefleet.trust import agentreleases

        return self._check_delegated(
            role,
            data,
            now=now,
            check_role=lambda delegated, paths: agentreleases.check_agent_role(
                envelope, delegated, paths
            ),
            check_listed=lambda lookup: agentreleases.check_listed(lookup, meta),
            scope="the agent releases this role signs",
        )

    def _check_delegated(
        self,
        role: str,
        data: bytes,
        *,
        now: float,
        check_role: Callable[[DelegatedRole, list[str] | None], None],
        check_listed: Callable[[Callable[[str], Any]], None],
        scope: str,
    ) -> int:
        from tuf.api.metadata import Targets

        what = f"delegated targets {role!r}"
        if len(data) > tufmeta.TARGETS_MAX_BYTES:
            raise TrustError(
                "MalformedMetadata", f"{what}: larger than {tufmeta.TARGETS_MAX_BYTES}"
            )
        targets = self.targets
        delegations = targets.delegations
        roles = delegations.roles if delegations is not None and delegations.roles else {}
        if delegations is None or role not in roles:
            raise TrustError(
                "UnknownRole",
                f"{what}: the top-level targets delegate no such role "
                f"(delegated: {', '.join(sorted(roles)) or 'none'})",
            )
        delegated = roles[role]
        check_role(
            DelegatedRole(
                role,
                frozenset(delegated.keyids),
                delegated.threshold,
                tufmeta.raw_keys(delegations.keys, delegated.keyids),
            ),
            delegated.paths,
        )
        with self._lock:
            held = self._delegated.get(role)
        if held == data:
            held_targets, _ = tufmeta.parse(held, Targets, what=what)
            check_listed(held_targets.targets.get)
            return 0
        tufmeta.verify_delegate(targets, role, data, what=what)
        signed, _ = tufmeta.parse(data, Targets, what=what)
        if held is not None:
            old, _ = tufmeta.parse(held, Targets, what=what)
            if signed.version <= old.version:
                raise TrustError(
                    "MetadataRollback",
                    f"{what}: version {signed.version} is not higher than {old.version}, "
                    "the version the hub holds: sign it again with the next version",
                )
        if signed.expires.timestamp() <= now:
            raise TrustError("MetadataExpired", f"{what}: expired at {signed.expires.isoformat()}")
        outside = [p for p in signed.targets if not delegated.is_delegated_path(p)]
        if outside:
            raise TrustError(
                "PathNotDelegated",
                f"{what}: {', '.join(sorted(outside)[:5])} outside {scope} "
                f"({', '.join(delegated.paths or [])})",
            )
        check_listed(signed.targets.get)
        return int(signed.version)

    def store_delegated(self, role: str, data: bytes, version: int) -> None:
        """Keep checked delegated targets (:meth:`check_delegated`, which returned
        ``version``) and sign a new snapshot and timestamp. ``MetadataRollback`` when another
        push stored that version or a higher one meanwhile."""
        from tuf.api.metadata import Targets

        with self._lock:
            held = self._delegated.get(role)
            if held == data:
                return
            if held is not None:
                old, _ = tufmeta.parse(held, Targets, what=role)
                if old.version >= version:
                    raise TrustError(
                        "MetadataRollback",
                        f"delegated targets {role!r}: version {old.version} was stored by "
                        "another push meanwhile; push again",
                    )
            write_atomic(self.dir / DELEGATED_DIR / tufmeta.role_file(role), data, mode=0o644)
            self._delegated[role] = data
            self._versions[role] = version
            if self.signing:
                self._refresh(force=True)
        log.info("delegated targets stored", role=role)


def create_repository(
    data_dir: Path,
    *,
    root_keys: list[Path],
    targets_key: Path,
    delegations: list[tufmeta.Delegation],
    now: float,
    root_lifetime_s: float,
    targets_lifetime_s: float,
) -> Path:
    """Make ``D/tuf/`` with a new online key, a TUF root signed by ``root_keys`` (the fleet
    root's keys) and top-level targets signed by ``targets_key``. For a quickstart or a lab:
    production signs the root and the targets offline (docs/trust.md)."""
    from edgefleet.trust import signing

    d = Path(data_dir) / TUF_DIR
    (d / DELEGATED_DIR).mkdir(parents=True, exist_ok=True)
    signing.generate_key_pair(d / "online")
    (d / "online.pub").unlink(missing_ok=True)
    root_raw = [signing.load_public_key_raw(k) for k in root_keys]
    root = tufmeta.build_root(
        root_keys=root_raw,
        root_threshold=len(root_raw),
        targets_keys=[signing.load_public_key_raw(targets_key)],
        targets_threshold=1,
        online_keys=[signing.load_public_key_raw(d / ONLINE_KEY)],
        version=1,
        expires=now + root_lifetime_s,
    )
    data = tufmeta.sign(root, [tufmeta.tuf_signer(k) for k in root_keys])
    write_atomic(d / "1.root.json", data, mode=0o644)
    write_atomic(d / "root.json", data, mode=0o644)
    targets = tufmeta.build_targets(delegations, version=1, expires=now + targets_lifetime_s)
    write_atomic(
        d / "targets.json", tufmeta.sign(targets, [tufmeta.tuf_signer(targets_key)]), mode=0o644
    )
    return d


async def serve_metadata(tuf: TufRepository | RelayedTuf | None, request: Any, context: Any) -> Any:
    """``FetchTufMetadata`` (DeviceService and AdminService): one file, bounded."""
    import grpc

    from edgefleet.v1 import common_pb2

    name = str(request.name)
    data = tuf.read(name) if tuf is not None and len(name) <= 80 else None
    if data is None:
        what = "keeps no TUF repository" if tuf is None else f"has no TUF metadata {name!r}"
        await context.abort(grpc.StatusCode.NOT_FOUND, f"this hub {what}")
        raise AssertionError("unreachable: context.abort raises")
    if request.max_length and len(data) > request.max_length:
        await context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{name} is {len(data)} bytes, more than the {request.max_length} asked for",
        )
    return common_pb2.TufMetadataResponse(data=data)


def online_key(data_dir: Path) -> Path:
    """Make the hub's online key ``D/tuf/online.key`` unless it exists; its public key."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from edgefleet.trust import signing

    d = Path(data_dir) / TUF_DIR
    d.mkdir(parents=True, exist_ok=True)
    if not (d / ONLINE_KEY).exists():
        signing.generate_key_pair(d / "online")
    pub = d / "online.pub"
    key = signing.load_private_key(d / ONLINE_KEY)
    pem = key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    write_atomic(pub, pem, mode=0o644)
    return pub


def install_repository(
    data_dir: Path,
    root: Path,
    targets: Path,
    *,
    timestamp_lifetime_s: float = TIMESTAMP_LIFETIME_S,
    snapshot_lifetime_s: float = SNAPSHOT_LIFETIME_S,
    signing: bool = True,
) -> Path:
    """Install an operator's offline-signed TUF root (version 1, or the next of the one held:
    rotations keep every version) and top-level targets into ``D/tuf/``, after checking that
    the result holds together (:func:`install_roles`; HubDirError otherwise)."""
    from tuf.api.metadata import Root as TufRoot

    d = Path(data_dir) / TUF_DIR
    if not (d / ONLINE_KEY).exists():
        raise HubDirError(f"{d / ONLINE_KEY} is missing: run hub tuf online-key first")
    try:
        root_bytes = _read_bounded(root, tufmeta.ROOT_MAX_BYTES)
        targets_bytes = _read_bounded(targets, tufmeta.TARGETS_MAX_BYTES)
        new_root, _ = tufmeta.parse(root_bytes, TufRoot, what=str(root))
    except (TrustError, OSError) as exc:
        raise HubDirError(f"hub tuf install: {exc}") from None
    install_roles(
        d,
        {int(new_root.version): root_bytes},
        targets_bytes,
        timestamp_lifetime_s=timestamp_lifetime_s,
        snapshot_lifetime_s=snapshot_lifetime_s,
        signing=signing,
    )
    return d


def installed_roles(d: Path) -> tuple[dict[int, bytes], bytes]:
    """Every TUF root version in the repository ``d`` (``D/tuf``) and its top-level targets,
    as installed (what hub replicas share, hub.state.sharedtuf)."""
    roots: dict[int, bytes] = {}
    for p in d.glob("*.root.json"):
        m = _VERSIONED_ROOT.match(p.name)
        if m:
            roots[int(m.group(1))] = _read_bounded(p, tufmeta.ROOT_MAX_BYTES)
    return roots, _read_bounded(d / "targets.json", tufmeta.TARGETS_MAX_BYTES)


def install_roles(
    d: Path,
    roots: Mapping[int, bytes],
    targets: bytes,
    *,
    timestamp_lifetime_s: float = TIMESTAMP_LIFETIME_S,
    snapshot_lifetime_s: float = SNAPSHOT_LIFETIME_S,
    signing: bool = True,
) -> bool:
    """Install TUF root versions and top-level targets into the repository ``d``
    (``D/tuf``): the roots held again (the same bytes) or the next versions, one after the
    other; targets whose version is higher than the one held (or the same bytes). The result
    is checked as at start in a copy first (:class:`TufRepository`: the root chain, each
    signed by its own root keys and the previous root's, the online key its snapshot and
    timestamp key, the targets by its targets keys); HubDirError otherwise, nothing changed.
    With ``signing`` the copy signs a snapshot and timestamp for the new targets, installed
    too (hub replicas: False, their leader signs, hub.state.sharedtuf). Whether anything changed."""
    import shutil

    from tuf.api.metadata import Root as TufRoot
    from tuf.api.metadata import Targets

    try:
        held_version = 0  # a first install: version 1 only
        if (d / "root.json").exists():
            held, _ = tufmeta.parse((d / "root.json").read_bytes(), TufRoot, what="root.json")
            held_version = int(held.version)
        versions = sorted(roots)
        for v in versions:
            r, _ = tufmeta.parse(roots[v], TufRoot, what=f"{v}.root.json")
            if r.version != v:
                raise TrustError("MalformedMetadata", f"{v}.root.json has version {r.version}")
            if v <= held_version:
                held_bytes = (d / f"{v}.root.json").read_bytes() if v < held_version else None
                if v == held_version:
                    held_bytes = (d / "root.json").read_bytes()
                if held_bytes != roots[v]:
                    raise TrustError(
                        "RootVersionNotNext",
                        f"TUF root version {v}: not the root the hub holds at that version "
                        f"(it holds version {held_version}; install the next)",
                    )
        new = [v for v in versions if v > held_version]
        if new != list(range(held_version + 1, held_version + 1 + len(new))):
            raise TrustError(
                "RootVersionNotNext",
                f"TUF root version {new[0]}: the hub holds {held_version}; install "
                f"{held_version + 1} first (every version in turn)",
            )
        new_targets, _ = tufmeta.parse(targets, Targets, what="targets")
        held_targets = (d / "targets.json").read_bytes() if (d / "targets.json").exists() else b""
        old_version = 0
        if held_targets:
            old, _ = tufmeta.parse(held_targets, Targets, what="targets.json")
            old_version = int(old.version)
        if new_targets.version <= old_version and held_targets != targets:
            raise TrustError(
                "MetadataRollback",
                f"targets: version {new_targets.version} is not higher than "
                f"{old_version}, the targets the hub holds",
            )
    except (TrustError, OSError) as exc:
        raise HubDirError(f"hub tuf install: {exc}") from None
    if not new and held_targets == targets:
        return False
    staging = d.with_name(d.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(d, staging)
    top = max([held_version, *new])
    for v in new:
        write_atomic(staging / f"{v}.root.json", roots[v], mode=0o644)
    if new:
        write_atomic(staging / "root.json", roots[top], mode=0o644)
    write_atomic(staging / "targets.json", targets, mode=0o644)
    try:
        TufRepository(
            staging,
            timestamp_lifetime_s=timestamp_lifetime_s,
            snapshot_lifetime_s=snapshot_lifetime_s,
            signing=signing,
        )
    except (TrustError, OSError) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise HubDirError(f"hub tuf install: {exc}") from None
    names = [f"{v}.root.json" for v in new] + (["root.json"] if new else []) + ["targets.json"]
    if signing:
        names += ["snapshot.json", "timestamp.json"]
    for name in names:
        if (staging / name).exists():
            write_atomic(d / name, (staging / name).read_bytes(), mode=0o644)
    shutil.rmtree(staging, ignore_errors=True)
    return True
