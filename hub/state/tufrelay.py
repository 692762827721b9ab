"""TUF metadata through the hierarchy: a regional hub serves its devices the root hub's TUF
repository, byte for byte, and holds no TUF key of its own (docs/federation.md).

The root sends every file of its repository (:meth:`hub.state.tufrepo.TufRepository.files`) over the
Federate stream (a ``TufMetadataSet``) before the first slice and whenever it changes: a push,
a new TUF root or targets, a timestamp signed again. The region checks the set as a device
would before it serves it (:func:`verify_files`): its first TUF root signed by a threshold of
the fleet trust root's root keys, then python-tuf's client over the set (root rotations,
timestamp, snapshot and top-level targets: signatures, versions never lower than the region
saw, expiry, the snapshot's hashes), each publisher's delegated targets signed by the keys the
targets delegate to it, with the snapshot's version and unexpired; and the bytes served must be
the very bytes checked. A set that fails is refused (an event ``TufMetadataRefused``) and the
region keeps serving the last good one.

Files (``D/tuf-relay/``)::

    current -> set-<digest>        the set served (a symlink, swapped atomically)
    set-<digest>/files/            the root's files, exactly as received
    set-<digest>/trusted/          python-tuf's trusted metadata of the region (its rollback
                                   and freeze state), as after checking that set

A regional hub with replicas shares the set through the store
(:class:`hub.state.sharedtuf.SharedRelay`):
the replica holding the root link writes it there after adopting it, and every replica adopts
it from there (checked here, against its own ``trusted/``) before serving it.

A regional hub's devices still check everything themselves (edged's TUF client): a region
that changes a file is refused by them (``TufSignatureThresholdNotMet``...).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefleet.errors import TrustError
from edgefleet.persisting import write_atomic
from edgefleet.trust import tufmeta
from edgefleet.trust.agentreleases import AgentReleaseMetadata
from edgefleet.trust.documents import ArtifactMetadata
from edgefleet.trust.envelopes import Envelope
from edgefleet.v1 import federation_pb2

if TYPE_CHECKING:
    from tuf.api.metadata import Root as TufRoot
    from tuf.api.metadata import Targets

    from edgefleet.trust.documents import Root

RELAY_DIR = "tuf-relay"
CURRENT = "current"
FILES = "files"
TRUSTED = "trusted"
MAX_SET_BYTES = 4 * 1024 * 1024 - 64 * 1024  # within gRPC's 4 MiB, as a slice
MAX_FILES = tufmeta.MAX_DELEGATIONS + 64 + 4
BASE_URL = "relay:/tuf/"
_VERSIONED_ROOT = re.compile(r"^([1-9][0-9]{0,8})\.root\.json$")
TOP_FILES = ("root.json", "targets.json", "snapshot.json", "timestamp.json")


def file_bound(name: str) -> int | None:
    """The largest a file of that name may be, None for a name no set may hold."""
    if name == "root.json" or _VERSIONED_ROOT.match(name):
        return tufmeta.ROOT_MAX_BYTES
    if name == "timestamp.json":
        return tufmeta.TIMESTAMP_MAX_BYTES
    if name == "snapshot.json":
        return tufmeta.SNAPSHOT_MAX_BYTES
    if name == "targets.json":
        return tufmeta.TARGETS_MAX_BYTES
    role = name.removesuffix(".json")
    if name.endswith(".json") and tufmeta.valid_role_name(role):
        return tufmeta.TARGETS_MAX_BYTES
    return None


def digest_files(files: Mapping[str, bytes]) -> str:
    """sha256 over the names and contents, the same for the same files."""
    h = hashlib.sha256()
    for name in sorted(files):
        data = files[name]
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def set_message(files: Mapping[str, bytes], digest: str) -> federation_pb2.TufMetadataSet:
    return federation_pb2.TufMetadataSet(
        files=[federation_pb2.TufMetadataFile(name=n, data=files[n]) for n in sorted(files)],
        digest=digest,
    )


def check_set(message: federation_pb2.TufMetadataSet) -> list[str]:
    """What is wrong with the shape of a set (names, sizes, count), field by field; its
    signatures are :func:`verify_files`'s."""
    problems: list[str] = []
    if len(message.files) > MAX_FILES:
        problems.append(f"tuf.files: {len(message.files)} files, at most {MAX_FILES}")
        return problems
    seen: set[str] = set()
    total = 0
    for i, f in enumerate(message.files):
        bound = file_bound(f.name)
        if bound is None:
            problems.append(f"tuf.files[{i}].name: {f.name[:80]!r} is not a TUF metadata file")
        elif len(f.data) > bound:
            problems.append(
                f"tuf.files[{i}].data: {f.name} is {len(f.data)} bytes, at most {bound}"
            )
        if f.name in seen:
            problems.append(f"tuf.files[{i}].name: {f.name} twice")
        seen.add(f.name)
        total += len(f.data)
    if total > MAX_SET_BYTES:
        problems.append(f"tuf.files: {total} bytes in all, at most {MAX_SET_BYTES}")
    missing = [n for n in TOP_FILES if n not in seen]
    if missing:
        problems.append(f"tuf.files: {', '.join(missing)} missing")
    if not problems and message.digest != digest_files({f.name: f.data for f in message.files}):
        problems.append("tuf.digest: not the digest of the files")
    return problems


_REASONS = {
    "ExpiredMetadataError": "TufMetadataExpired",
    "BadVersionNumberError": "TufRollback",
    "EqualVersionNumberError": "TufRollback",
    "UnsignedMetadataError": "TufSignatureThresholdNotMet",
    "LengthOrHashMismatchError": "TufMetadataMismatch",
    "DownloadLengthMismatchError": "LengthExceeded",
}


def _refusal(exc: Exception) -> TrustError:
    reason = _REASONS.get(type(exc).__name__, "TufRefused")
    return TrustError(reason, f"{type(exc).__name__}: {exc}")


def _fetcher(files: Mapping[str, bytes]) -> Any:
    from tuf.api.exceptions import DownloadHTTPError
    from tuf.ngclient import FetcherInterface

    class SetFetcher(FetcherInterface):
        """python-tuf's fetcher over the received set (nothing else is read)."""

        def _fetch(self, url: str) -> Iterator[bytes]:
            name = url.removeprefix(BASE_URL)
            data = files.get(name)
            if data is None:
                raise DownloadHTTPError(f"the set has no {name}", 404)
            yield data

    return SetFetcher()


def verify_files(files: Mapping[str, bytes], trusted: Path, fleet_root: Root | None) -> None:
    """Check a set of the root's TUF files against the region's trusted metadata in
    ``trusted`` (python-tuf's cache, updated in place: give a copy), as a device checks what
    its hub serves (module doc). TrustError naming the reason otherwise."""
    from tuf.api.exceptions import DownloadError, RepositoryError
    from tuf.api.metadata import Root as TufRoot
    from tuf.api.metadata import Snapshot, Targets
    from tuf.ngclient import UpdaterConfig
    from tuf.ngclient.config import EnvelopeType

    from edgefleet.trust.documents import ROLE_ROOT
    from edgefleet.trust.tufcache import updater_class

    held = trusted / "root.json"
    if not held.exists():
        if fleet_root is None:
            raise TrustError("NoTrustRoot", "this hub holds no fleet trust root to check with")
        spec = fleet_root.role(ROLE_ROOT)
        tufmeta.verify_by_fleet_root(
            fleet_root.keys, spec.keyids, spec.threshold, files["root.json"],
            what="the root hub's TUF root",
        )  # fmt: skip
        trusted.mkdir(parents=True, exist_ok=True)
        write_atomic(held, files["root.json"], mode=0o644)
    config = UpdaterConfig(
        root_max_length=tufmeta.ROOT_MAX_BYTES,
        timestamp_max_length=tufmeta.TIMESTAMP_MAX_BYTES,
        snapshot_max_length=tufmeta.SNAPSHOT_MAX_BYTES,
        targets_max_length=tufmeta.TARGETS_MAX_BYTES,
        envelope_type=EnvelopeType.SIMPLE,
    )
    try:
        updater = updater_class()(str(trusted), BASE_URL, target_base_url=BASE_URL,
                          fetcher=_fetcher(files), config=config, bootstrap=None)  # fmt: skip
        updater.refresh()
    except (RepositoryError, DownloadError) as exc:
        raise _refusal(exc) from None
    # python-tuf keeps what it verified; a file it did not take (an equal version with other
    # bytes, a local copy it preferred) must not be served in its place
    for name in TOP_FILES:
        if (trusted / name).read_bytes() != files[name]:
            raise TrustError(
                "TufRollback",
                f"{name}: not the bytes of the metadata held at the same version "
                "(metadata changed without a new version)",
            )
    root, _ = tufmeta.parse(files["root.json"], TufRoot, what="root.json")
    for name, data in files.items():
        m = _VERSIONED_ROOT.match(name)
        if m and int(m.group(1)) > root.version:
            raise TrustError("TufRefused", f"{name}: newer than root.json ({root.version})")
        if m and int(m.group(1)) == root.version and data != files["root.json"]:
            raise TrustError("TufRefused", f"{name}: not the bytes of root.json")
    snapshot, _ = tufmeta.parse(files["snapshot.json"], Snapshot, what="snapshot.json")
    targets, _ = tufmeta.parse(files["targets.json"], Targets, what="targets.json")
    delegations = targets.delegations
    roles = delegations.roles if delegations is not None and delegations.roles else {}
    listed = {n for n in snapshot.meta if n != "targets.json"}
    given = {n for n in files if n not in TOP_FILES and not _VERSIONED_ROOT.match(n)}
    if given != listed:
        raise TrustError(
            "TufMetadataMismatch",
            "the delegated targets sent are not those the snapshot lists "
            f"(sent: {', '.join(sorted(given)) or 'none'}; "
            f"listed: {', '.join(sorted(listed)) or 'none'})",
        )
    for name in sorted(given):
        role = name.removesuffix(".json")
        what = f"delegated targets {role!r}"
        if role not in roles:
            raise TrustError("UnknownRole", f"{what}: the top-level targets delegate no such role")
        tufmeta.verify_delegate(targets, role, files[name], what=what)
        signed, _ = tufmeta.parse(files[name], Targets, what=what)
        if signed.version != snapshot.meta[name].version:
            raise TrustError(
                "TufRollback",
                f"{what}: version {signed.version}, the snapshot lists "
                f"{snapshot.meta[name].version}",
            )
        if signed.is_expired():
            raise TrustError("TufMetadataExpired", f"{what}: expired at {signed.expires}")


@dataclass(frozen=True, slots=True)
class RelayedTuf:
    """The TUF metadata a regional hub serves: its root's, as received and checked (held in
    :class:`hub.state.heldtuf.HeldTuf`: DeviceService and AdminService ``FetchTufMetadata``,
    the publishers SecurityBaseline knows); a regional hub below this one gets the same
    files."""

    files_by_name: Mapping[str, bytes]
    digest: str

    @classmethod
    def load(cls, data_dir: Path) -> RelayedTuf | None:
        """The set last adopted in ``D/tuf-relay/``, None when none was."""
        current = Path(data_dir) / RELAY_DIR / CURRENT / FILES
        if not current.is_dir():
            return None
        files: dict[str, bytes] = {}
        for p in current.iterdir():
            bound = file_bound(p.name)
            if bound is not None and p.stat().st_size <= bound:
                files[p.name] = p.read_bytes()
        return cls(files, digest_files(files))

    def read(self, name: str) -> bytes | None:
        return self.files_by_name.get(name)

    def files(self) -> tuple[Mapping[str, bytes], str]:
        return self.files_by_name, self.digest

    @property
    def root(self) -> TufRoot:
        from tuf.api.metadata import Root as TufRoot

        signed, _ = tufmeta.parse(self.files_by_name["root.json"], TufRoot, what="root.json")
        return signed  # type: ignore[no-any-return]

    @property
    def targets(self) -> Targets:
        from tuf.api.metadata import Targets

        signed, _ = tufmeta.parse(self.files_by_name["targets.json"], Targets, what="targets")
        return signed  # type: ignore[no-any-return]

    def versions(self) -> dict[str, int]:
        """Root, targets, snapshot and timestamp versions (for events and logs)."""
        from tuf.api.metadata import Root as TufRoot
        from tuf.api.metadata import Snapshot, Targets, Timestamp

        out: dict[str, int] = {}
        for name, kind in (("root.json", TufRoot), ("targets.json", Targets),
                           ("snapshot.json", Snapshot), ("timestamp.json", Timestamp)):  # fmt: skip
            signed, _ = tufmeta.parse(self.files_by_name[name], kind, what=name)
            out[name.removesuffix(".json")] = int(signed.version)
        return out

    def check_delegated(
        self,
        role: str,
        data: bytes,
        meta: ArtifactMetadata,
        *,
        now: float,
        envelope: Envelope | None = None,
    ) -> int:
        raise TrustError(
            "TufRelayed",
            "this regional hub serves its root hub's TUF metadata and cannot add targets to "
            "it: push the model at the root hub (it reaches this region with its deployment)",
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
        raise TrustError(
            "TufRelayed",
            "this regional hub serves its root hub's TUF metadata and cannot add targets to "
            "it: push the edged release at the root hub",
        )

    def store_delegated(self, role: str, data: bytes, version: int) -> None:
        raise TrustError("TufRelayed", "this regional hub's TUF metadata is its root hub's")

    def check_relayed_release(
        self, meta: AgentReleaseMetadata, *, now: float, envelope: Envelope
    ) -> str:
        """An edged release fetched from the root (hub.controllers.parentlink.agentrelay),
        checked as a push checks one (:meth:`hub.state.tufrepo.TufRepository
        .check_delegated_release`) against the agent role's targets this region relays (the
        root's, checked from the fleet's trust root when adopted): an agent-release role of the
        top-level targets lists the file with the signed length and sha256 (``NotInTargets``,
        ``TargetMismatch``), its targets are signed by a threshold of its keys and not expired,
        and a threshold of its keys signed ``envelope`` (``SignerNotDelegated``). The role's
        name."""
        from tuf.api.metadata import Targets

        from edgefleet.trust import agentreleases
        from edgefleet.trust.publishers import DelegatedRole

        targets = self.targets
        delegations = targets.delegations
        roles = delegations.roles if delegations is not None and delegations.roles else {}
        agent_roles = [r for r in sorted(roles) if agentreleases.is_agent_role(roles[r].paths)]
        for role in agent_roles:
            data = self.files_by_name.get(tufmeta.role_file(role))
            if data is None:
                continue
            what = f"delegated targets {role!r}"
            tufmeta.verify_delegate(targets, role, data, what=what)
            signed, _ = tufmeta.parse(data, Targets, what=what)
            if signed.targets.get(meta.target) is None:
                continue
            if signed.expires.timestamp() <= now:
                raise TrustError(
                    "MetadataExpired", f"{what}: expired at {signed.expires.isoformat()}"
                )
            assert delegations is not None
            delegated = roles[role]
            agentreleases.check_agent_role(
                envelope,
                DelegatedRole(
                    role,
                    frozenset(delegated.keyids),
                    delegated.threshold,
                    tufmeta.raw_keys(delegations.keys, delegated.keyids),
                ),
                delegated.paths,
            )
            agentreleases.check_listed(signed.targets.get, meta)
            return role
        raise TrustError(
            "NotInTargets",
            f"{meta.what}: {meta.target} is in no agent role's targets of the root's TUF "
            f"metadata this region holds (agent roles: {', '.join(agent_roles) or 'none'})",
        )


_adopting: dict[Path, threading.Lock] = {}
_adopting_lock = threading.Lock()


def adopt(
    data_dir: Path, files: Mapping[str, bytes], digest: str, fleet_root: Root | None
) -> RelayedTuf:
    """Check ``files`` (:func:`verify_files`) against the region's trusted metadata and, when
    they pass, make them the set served (``D/tuf-relay/current`` swapped atomically). A
    TrustError leaves the set served as it was. Blocking: run it in a thread; one at a time
    per data directory (the root link and, on replicas, the store's set may both adopt)."""
    relay = Path(data_dir).absolute() / RELAY_DIR
    with _adopting_lock:
        lock = _adopting.setdefault(relay, threading.Lock())
    with lock:
        return _adopt(relay, files, digest, fleet_root)


def _adopt(
    relay: Path, files: Mapping[str, bytes], digest: str, fleet_root: Root | None
) -> RelayedTuf:
    relay.mkdir(mode=0o700, parents=True, exist_ok=True)
    name = f"set-{digest[:32]}"
    staging = relay / f".{name}.new"
    shutil.rmtree(staging, ignore_errors=True)
    held = relay / CURRENT / TRUSTED
    if held.is_dir():
        shutil.copytree(held, staging / TRUSTED)
    else:
        (staging / TRUSTED).mkdir(parents=True)
    try:
        verify_files(files, staging / TRUSTED, fleet_root)
        for fname, data in files.items():
            write_atomic(staging / FILES / fname, data, mode=0o644)
        final = relay / name
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    link = relay / ".current.new"
    link.unlink(missing_ok=True)
    os.symlink(name, link)
    os.replace(link, relay / CURRENT)
    fd = os.open(relay, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    for old in relay.glob("set-*"):
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return RelayedTuf(dict(files), digest)
