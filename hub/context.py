"""What every hub service and controller shares: one object, passed in (no globals).

Built by :mod:`hub.server` at start: config and paths, the CA, the store and the in-memory
cache over it, the coalescing device writer, the projector, the device sessions and the
content-addressed blob store for artifacts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from edgefleet.artifacts.storing import ArtifactStore
from hub.api.dashboard.access import DashboardAccess
from hub.config import HubConfig
from hub.controllers.placement import Scheduler
from hub.controllers.rollout import RolloutController
from hub.decide.staleness import ObservedSince
from hub.initializing import HubPaths
from hub.pki import CertifiedKey
from hub.state.cache import Cache
from hub.state.heldtuf import HeldTuf
from hub.state.metrics import HubMetrics
from hub.state.projector import Projector
from hub.state.secrets import SecretKeys
from hub.state.sessions import Sessions
from hub.state.sharedblobs import SharedBlobs
from hub.state.store import Store
from hub.state.store.electing import Elector
from hub.state.tufrelay import RelayedTuf
from hub.state.tufrepo import TufRepository
from hub.state.writer import DeviceWriter

if TYPE_CHECKING:
    from hub.controllers.wave import WaveController
    from hub.state.regions import Regions
    from hub.state.sharedtuf import SharedRelay, SharedTuf


@dataclass(slots=True)
class HubContext:
    paths: HubPaths
    config: HubConfig
    ca: CertifiedKey
    store: Store
    cache: Cache
    writer: DeviceWriter
    projector: Projector
    sessions: Sessions
    blobs: ArtifactStore
    # D/tuf/: the TUF repository, when the hub keeps one; at a regional hub, its root's
    # (D/tuf-relay/, hub.state.tufrelay); replaced while the hub runs (hub.state.heldtuf)
    held_tuf: HeldTuf
    rollouts: RolloutController | None = (
        None  # hub.controllers.rollout; None: no rollout controller
    )
    scheduler: Scheduler | None = (
        None  # hub.controllers.placement; None: replicas.total never placed
    )
    clock: Callable[[], float] = field(default=time.time)
    metrics: HubMetrics = field(default_factory=HubMetrics)  # served by hub.api.observability
    elector: Elector | None = (
        None  # hub replicas on etcd (hub.controllers.replicas); None: the only hub
    )
    dashboard: DashboardAccess = field(default_factory=DashboardAccess)  # hub.api.dashboard
    tuf_shared: SharedTuf | None = None  # hub replicas: the repository's versions in the store
    tuf_relay_shared: SharedRelay | None = None  # a region's replicas: the root's set in it
    # D/secrets.key (and a rotation's other key files): seal Secrets at rest (hub.state.secrets)
    secret_keys: SecretKeys = field(default_factory=SecretKeys)
    shared_blobs: SharedBlobs | None = None  # replicas: artifacts' bytes in etcd (blobsharing)
    regions: Regions | None = None  # hub.state.regions: the regional hubs below this one (a root)
    waves: WaveController | None = (
        None  # hub.controllers.wave: rollouts across regions (not at a region)
    )
    # when this hub began to observe devices: its start, its election (hub.decide.staleness)
    observed_since: ObservedSince = field(default_factory=ObservedSince.now)

    @property
    def tuf(self) -> TufRepository | RelayedTuf | None:
        """The TUF metadata served now (:attr:`held_tuf`'s)."""
        return self.held_tuf.current

    @property
    def trust_root(self) -> bytes:
        """The fleet trust root as signed (D/trust-root.json), if any: the cache's newest."""
        return self.cache.trust_root

    @trust_root.setter
    def trust_root(self, value: bytes) -> None:
        self.cache.set_trust_roots((value,) if value else ())

    @property
    def region(self) -> str:
        return self.config.region

    @property
    def blob_dir(self) -> Path:
        return self.paths.data_dir / "blobs"
