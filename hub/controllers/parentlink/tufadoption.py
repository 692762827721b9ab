"""The root's TUF metadata at a region (docs/federation.md): the set the link receives is
checked and served to the region's devices (:mod:`hub.state.tufrelay`), and shared with the
region's other replicas through the store (:class:`hub.state.sharedtuf.SharedRelay`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from edgefleet.errors import StoreError, TrustError
from edgefleet.logs import get_logger
from edgefleet.v1 import federation_pb2
from hub.controllers.parentlink.regionenrollment import fleet_root_of
from hub.state import tufrelay
from hub.state.cache import Cache
from hub.state.heldtuf import HeldTuf
from hub.state.sharedtuf import SharedRelay
from hub.state.writer import DeviceWriter

log = get_logger(__name__)


class TufAdoption:
    """What the link (:class:`hub.controllers.parentlink.link.ParentLink`) does with each TUF
    set from the root; the last good set is kept when one is refused."""

    def __init__(
        self,
        *,
        data_dir: Path,
        cache: Cache,
        writer: DeviceWriter,
        tuf: HeldTuf,
        shared: SharedRelay | None,
    ) -> None:
        """``tuf``: what this region serves, replaced by the root's set; ``shared``: at a
        region's replicas."""
        self._data_dir = data_dir
        self._cache = cache
        self._writer = writer
        self._tuf = tuf
        self._shared = shared

    async def adopt(self, message: federation_pb2.TufMetadataSet) -> None:
        """The root's TUF metadata: served to this region's devices once it checked out
        (:mod:`hub.state.tufrelay`); else refused with an event, the last good one kept."""
        held = self._tuf.current
        if isinstance(held, tufrelay.RelayedTuf) and held.digest == message.digest:
            await self._share(held)  # e.g. adopted before a store write that failed
            return
        problems = tufrelay.check_set(message)
        try:
            if problems:
                raise TrustError("MalformedMetadata", "; ".join(problems[:5]))
            files = {f.name: bytes(f.data) for f in message.files}
            fleet_root = fleet_root_of(self._cache.trust_root)
            relayed = await asyncio.to_thread(
                tufrelay.adopt, self._data_dir, files, message.digest, fleet_root
            )
            versions = relayed.versions()
        except (TrustError, OSError) as exc:
            reason = exc.reason if isinstance(exc, TrustError) else "TufRelayFailed"
            log.error("tuf metadata refused", reason=reason, error=str(exc))
            self._writer.event(
                "TufRepository",
                "fleet",
                "Warning",
                "TufMetadataRefused",
                f"{reason}: the root hub's TUF metadata refused ({exc}); this region keeps "
                "serving the last it accepted",
            )
            return
        before = held.versions() if isinstance(held, tufrelay.RelayedTuf) else None
        self._tuf.current = relayed  # the feed is told below when it is news
        log.info("tuf metadata adopted", **versions)
        await self._share(relayed)
        if before is None or {k: v for k, v in before.items() if k != "timestamp"} != {
            k: v for k, v in versions.items() if k != "timestamp"
        }:  # a timestamp signed again alone is no news
            self._writer.event(
                "TufRepository",
                "fleet",
                "Normal",
                "TufMetadataRelayed",
                "the root hub's TUF metadata served: "
                + ", ".join(f"{k} version {v}" for k, v in versions.items()),
            )
            self._tuf.adopt(relayed)  # the change feed projects every device again

    async def _share(self, relayed: tufrelay.RelayedTuf) -> None:
        """A region's replicas: the set this replica adopted goes into the store, which the
        others follow (:class:`hub.state.sharedtuf.SharedRelay`); a failure is an event, and this
        replica keeps serving the set."""
        shared = self._shared
        if shared is None:
            return
        try:
            await shared.publish(*relayed.files())
        except (TrustError, StoreError) as exc:
            reason = exc.reason if isinstance(exc, TrustError) else "StoreError"
            log.error("relayed tuf metadata not shared", reason=reason, error=str(exc))
            self._writer.event(
                "TufRepository",
                "fleet",
                "Warning",
                "TufRelayNotShared",
                f"{reason}: the root hub's TUF metadata is served by this replica but not "
                f"shared with the region's other replicas ({exc})",
            )
