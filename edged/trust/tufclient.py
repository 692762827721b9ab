"""The device's TUF client: python-tuf's ``ngclient.Updater`` over the hub link.

``D/trust/tuf/`` holds the trusted TUF metadata (python-tuf's cache: root, timestamp,
snapshot, targets, the publishers' delegated targets). Its first root comes from the hub and
is trusted only when a threshold of the fleet trust root's root keys signed it
(:func:`edgefleet.trust.tufmeta.verify_by_fleet_root`); after that python-tuf follows root
rotations, and refuses older timestamps, snapshots and targets (rollback), expired ones
(freeze: the timestamp expires within the hour), a snapshot that does not list the targets
versions it gets (mix and match), and files longer than its bounds (endless data).

Once the device holds a TUF root, TUF is required from then on: every artifact the hub
assigns must be listed by a publisher's delegated targets (:func:`tufmeta.check_assigned`).
A device whose image sets ``trust.requireTuf`` requires it before its first TUF root.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

from edgefleet.errors import TemporaryError, TrustError
from edgefleet.logs import get_logger
from edgefleet.persisting import write_atomic
from edgefleet.trust import tufmeta
from edgefleet.trust.documents import ROLE_ROOT, ArtifactMetadata, RollbackAllowance, Root
from edgefleet.trust.publishers import DelegatedRole

log = get_logger(__name__)

FETCH_TIMEOUT_S = 60.0
BASE_URL = "hub:/tuf/"

FetchSync = Callable[[str, int], bytes | None]
"""``fetch(name, max_length)``: a metadata file from the hub, None when it has none."""
FetchAsync = Callable[[str, int], Coroutine[Any, Any, bytes | None]]


def sync_fetch(fetch: FetchAsync, loop: asyncio.AbstractEventLoop) -> FetchSync:
    """A blocking fetch for python-tuf (run in a thread) over an async one on ``loop``."""

    def call(name: str, max_length: int) -> bytes | None:
        future = asyncio.run_coroutine_threadsafe(fetch(name, max_length), loop)
        data: bytes | None = future.result(timeout=FETCH_TIMEOUT_S)
        return data

    return call


def _without_urllib3() -> None:
    """Keep python-tuf's default fetcher (urllib3, ~2 MiB RSS in edged's control process) out
    of this process: ``tuf.ngclient`` imports it at the top, though edged always passes its own
    fetcher (the hub link). A stand-in module is registered first, unless the real one is
    already imported; using its ``Urllib3Fetcher`` is an error, never a silent fallback."""
    import sys
    import types

    name = "tuf.ngclient.urllib3_fetcher"
    if name in sys.modules:
        return

    class Urllib3Fetcher:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("edged fetches TUF metadata over the hub link only")

    stand_in = types.ModuleType(name, "edged: python-tuf's urllib3 fetcher is not loaded")
    stand_in.Urllib3Fetcher = Urllib3Fetcher  # type: ignore[attr-defined]
    sys.modules[name] = stand_in


def _fetcher(fetch: FetchSync) -> Any:
    from tuf.api.exceptions import DownloadHTTPError

    _without_urllib3()
    from tuf.ngclient import FetcherInterface

    class HubLinkFetcher(FetcherInterface):
        """python-tuf's fetcher over the hub link: ``hub:/tuf/NAME`` -> ``fetch(NAME)``.
        python-tuf bounds each file (``download_bytes(url, max_length)``); the hub is told
        the bound too, so it never sends more."""

        def __init__(self) -> None:
            self.max_length = tufmeta.TARGETS_MAX_BYTES

        def download_bytes(self, url: str, max_length: int) -> bytes:
            self.max_length = max_length
            data: bytes = super().download_bytes(url, max_length)
            return data

        def _fetch(self, url: str) -> Iterator[bytes]:
            name = url.removeprefix(BASE_URL)
            data = fetch(name, self.max_length)
            if data is None:
                raise DownloadHTTPError(f"the hub has no {name}", 404)
            yield data

    return HubLinkFetcher()


_REASONS = {
    "ExpiredMetadataError": "TufMetadataExpired",
    "BadVersionNumberError": "TufRollback",
    "UnsignedMetadataError": "TufSignatureThresholdNotMet",
    "LengthOrHashMismatchError": "TufMetadataMismatch",
    "DownloadLengthMismatchError": "LengthExceeded",
    "EqualVersionNumberError": "TufRollback",
}


def _refusal(exc: Exception) -> TrustError:
    reason = _REASONS.get(type(exc).__name__, "TufRefused")
    return TrustError(reason, f"TUF metadata from the hub refused: {type(exc).__name__}: {exc}")


_refreshing: dict[Path, threading.RLock] = {}
_refreshing_lock = threading.Lock()


def _refresh_lock(directory: Path) -> threading.RLock:
    """One lock per TUF directory: the hub source and the agent release fetch update the
    same python-tuf cache, one at a time."""
    with _refreshing_lock:
        return _refreshing.setdefault(directory, threading.RLock())


class TufClient:
    def __init__(self, data_dir: Path, *, required: bool = False) -> None:
        self.dir = Path(data_dir) / "trust" / "tuf"
        self.required = required
        self.problem: tuple[str, str] | None = None

    @property
    def active(self) -> bool:
        """Whether TUF is required: the device holds a TUF root (or its image says so)."""
        return self.required or (self.dir / "root.json").exists()

    def root_version(self) -> int:
        """The version of the TUF root held (0: none)."""
        from tuf.api.metadata import Root as TufRoot

        try:
            data = (self.dir / "root.json").read_bytes()
        except FileNotFoundError:
            return 0
        root, _ = tufmeta.parse(data, TufRoot, what=str(self.dir / "root.json"))
        return int(root.version)

    def _bootstrap(self, fetch: FetchSync, fleet_root: Root | None) -> bool:
        if (self.dir / "root.json").exists():
            return True
        data = fetch("root.json", tufmeta.ROOT_MAX_BYTES)
        if data is None:
            return False
        if fleet_root is None:
            raise TrustError("NoTrustRoot", "no fleet trust root to check the TUF root with")
        role = fleet_root.role(ROLE_ROOT)
        tufmeta.verify_by_fleet_root(
            fleet_root.keys, role.keyids, role.threshold, data, what="the hub's TUF root"
        )
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(self.dir / "root.json", data, mode=0o644)
        log.info("tuf root accepted", origin="hub")
        return True

    def lock(self) -> threading.RLock:
        """Held while python-tuf updates ``D/trust/tuf/`` (:meth:`refresh`); hold it around a
        refresh and the lookups that follow it (they may fetch delegated targets)."""
        return _refresh_lock(self.dir.resolve())

    def refresh(self, fetch: FetchSync, fleet_root: Root | None, *, floor: int = 0) -> Any | None:
        """:meth:`_refresh` under :meth:`lock`."""
        with self.lock():
            return self._refresh(fetch, fleet_root, floor=floor)

    def _refresh(self, fetch: FetchSync, fleet_root: Root | None, *, floor: int = 0) -> Any | None:
        """Update the TUF metadata (root, timestamp, snapshot, top-level targets) from the
        hub; return the updater to look targets up with, or None when TUF is not in use
        (the hub keeps no repository and this device never held a TUF root). ``floor``: the
        TUF root version the trust state recorded; TUF metadata older than that, or gone, is
        ``TrustStateLost`` (its rollback protection was reset). TrustError when refused,
        TemporaryError when the hub could not be reached."""
        from tuf.api.exceptions import DownloadError, RepositoryError

        _without_urllib3()
        from tuf.ngclient import UpdaterConfig
        from tuf.ngclient.config import EnvelopeType

        from edgefleet.trust.tufcache import restore_root, updater_class

        try:
            # a cache an earlier edged left without root.json (python-tuf's own link, killed
            # between its remove and its symlink: edgefleet.trust.tufcache) gets its newest
            # verified root back before the floor is checked
            restored = restore_root(self.dir)
            if restored is not None:
                log.warning("tuf root restored", version=restored, source="root_history")
            held = self.root_version()
            if floor and held < floor:
                raise TrustError(
                    "TrustStateLost",
                    f"TUF root version {floor} was accepted, but {self.dir} holds "
                    f"{'none' if not held else f'version {held}'}: its rollback protection "
                    "was reset (remove the whole trust directory to start again from the "
                    "image's root)",
                )
            if not self._bootstrap(fetch, fleet_root):
                if self.required:
                    raise TrustError(
                        "NoTufRepository",
                        "trust.requireTuf is set and the hub keeps no TUF repository",
                    )
                return None
            config = UpdaterConfig(
                root_max_length=tufmeta.ROOT_MAX_BYTES,
                timestamp_max_length=tufmeta.TIMESTAMP_MAX_BYTES,
                snapshot_max_length=tufmeta.SNAPSHOT_MAX_BYTES,
                targets_max_length=tufmeta.TARGETS_MAX_BYTES,
                envelope_type=EnvelopeType.SIMPLE,
            )
            updater = updater_class()(
                str(self.dir),
                BASE_URL,
                target_base_url=BASE_URL,
                fetcher=_fetcher(fetch),
                config=config,
                bootstrap=None,  # the cached root.json, checked against the fleet root
            )
            updater.refresh()
        except TrustError as exc:
            self.problem = (exc.reason, str(exc))
            raise
        except RepositoryError as exc:
            refusal = _refusal(exc)
            self.problem = (refusal.reason, str(refusal))
            raise refusal from None
        except DownloadError as exc:
            if type(exc).__name__ == "DownloadLengthMismatchError":
                refusal = _refusal(exc)
                self.problem = (refusal.reason, str(refusal))
                raise refusal from None
            raise TemporaryError(f"TUF metadata could not be fetched: {exc}") from None
        except (TimeoutError, OSError) as exc:
            raise TemporaryError(f"TUF metadata could not be fetched: {exc}") from None
        self.problem = None
        return updater

    @staticmethod
    def check(updater: Any, meta: ArtifactMetadata) -> None:
        """Every file of ``meta`` is in a publisher's delegated targets (python-tuf walks the
        delegations, fetching the delegated targets it needs)."""
        from tuf.api.exceptions import DownloadError, RepositoryError

        try:
            tufmeta.check_assigned(updater.get_targetinfo, meta)
        except RepositoryError as exc:
            raise _refusal(exc) from None
        except DownloadError as exc:
            if type(exc).__name__ == "DownloadLengthMismatchError":
                raise _refusal(exc) from None
            raise TemporaryError(f"TUF metadata could not be fetched: {exc}") from None
        except (TimeoutError, OSError) as exc:
            raise TemporaryError(f"TUF metadata could not be fetched: {exc}") from None

    @staticmethod
    def rollback_grant(updater: Any, envelope: bytes) -> RollbackAllowance | None:
        """The rollback allowance the publisher's targets carry on the model target of the
        artifact ``envelope`` names (read before the envelope is verified only to find the
        target; the device then checks the allowance against the verified metadata). None
        when there is none, or when the targets cannot be read now (the TUF check that
        follows reports that)."""
        from tuf.api.exceptions import DownloadError, RepositoryError

        from edgefleet.trust.documents import parse_artifact
        from edgefleet.trust.envelopes import ARTIFACT_TYPE, decode_payload, parse_envelope_bytes

        try:
            env = parse_envelope_bytes(envelope, what="signed metadata")
            meta = parse_artifact(decode_payload(env, expected_type=ARTIFACT_TYPE, what="meta"))
            fname, _ = meta.model_file()
            path = tufmeta.target_path(meta.name, meta.version, fname)
            target = updater.get_targetinfo(path)
        except (TrustError, RepositoryError, DownloadError, TimeoutError, OSError):
            return None
        return tufmeta.rollback_grant(target, what=f"the TUF target {path}")

    def publisher_role(self, meta: ArtifactMetadata) -> DelegatedRole:
        """The TUF role whose targets list the model file of ``meta`` (call after
        :meth:`check` passed), with its keys: the artifact's envelope must be signed by them
        (:func:`~edgefleet.trust.publishers.check_signed_by_role`)."""
        fname, _ = meta.model_file()
        path = tufmeta.target_path(meta.name, meta.version, fname)
        role, _ = self.role_for_path(path, what=f"{meta.name} {meta.version}")
        return role

    def role_for_path(self, path: str, *, what: str) -> tuple[DelegatedRole, list[str] | None]:
        """The TUF role whose targets list ``path`` (a target python-tuf found), with its keys,
        and its delegated path patterns (None: the top-level targets). Read from the metadata
        python-tuf verified and keeps in ``D/trust/tuf/``, walked as python-tuf walks it (the
        top-level targets, then the delegations in order, a terminating one ending the walk)."""
        from tuf.api.metadata import Root as TufRoot
        from tuf.api.metadata import Targets

        def load(role: str) -> Any:
            data = (self.dir / tufmeta.role_file(role)).read_bytes()
            signed, _ = tufmeta.parse(data, Targets, what=f"{self.dir}/{role}.json")
            return signed

        try:
            top = load(tufmeta.TARGETS)
            if path in top.targets:
                root, _ = tufmeta.parse(
                    (self.dir / "root.json").read_bytes(), TufRoot, what="the TUF root"
                )
                r = root.roles[tufmeta.TARGETS]
                return DelegatedRole(
                    tufmeta.TARGETS,
                    frozenset(r.keyids),
                    r.threshold,
                    tufmeta.raw_keys(root.keys, r.keyids),
                ), None
            delegations = top.delegations
            if delegations is not None and delegations.roles is not None:
                for name, terminating in delegations.get_roles_for_target(path):
                    role_file = self.dir / tufmeta.role_file(name)
                    if role_file.exists() and path in load(name).targets:
                        r = delegations.roles[name]
                        return DelegatedRole(
                            name,
                            frozenset(r.keyids),
                            r.threshold,
                            tufmeta.raw_keys(delegations.keys or {}, r.keyids),
                        ), list(r.paths or [])
                    if terminating:
                        break
        except (OSError, TrustError) as exc:
            raise TrustError(
                "PublisherNotAllowed",
                f"{what}: cannot tell which TUF publisher role lists {path}: {exc}",
            ) from None
        raise TrustError(
            "PublisherNotAllowed",
            f"{what}: no TUF publisher role of the top-level targets lists "
            f"{path} directly (nested delegations are not supported yet)",
        )

    def status(self) -> dict[str, Any]:
        return {
            "tufRequired": self.active,
            "tufProblem": (
                {"reason": self.problem[0], "message": self.problem[1]} if self.problem else None
            ),
        }
