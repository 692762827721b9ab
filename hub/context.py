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
from hub.blobsharing import SharedBlobs
from hub.caching import Cache
from hub.config import HubConfig
from hub.dashboard.access import DashboardAccess
from hub.initializing import HubPaths
from hub.observing import HubMetrics
from hub.pki import CertifiedKey
from hub.placements import Scheduler
from hub.projecting import Projector
from hub.rollouts import RolloutController
from hub.secrets import SecretKeys
from hub.sessions import Sessions
from hub.staleness import ObservedSince
from hub.store import Store
from hub.store.electing import Elector
from hub.tufrelaying import RelayedTuf
from hub.tufrepo import TufRepository
from hub.writing import DeviceWriter

if TYPE_CHECKING:
    from hub.regions import Regions
    from hub.tufsharing import SharedRelay, SharedTuf
    from hub.waves import WaveController


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
    trust_root: bytes = b""  # the fleet trust root as signed (D/trust-root.json), if any
    rollouts: RolloutController | None = None  # hub.rollouts; None: no rollout controller
    scheduler: Scheduler | None = None  # hub.placements; None: replicas.total never placed
    clock: Callable[[], float] = field(default=time.time)
    metrics: HubMetrics = field(default_factory=HubMetrics)  # served by hub.observing
    elector: Elector | None = None  # hub replicas on etcd (hub.replicas); None: the only hub
    dashboard: DashboardAccess = field(default_factory=DashboardAccess)  # hub.dashboard
    # D/tuf/: the TUF repository, when the hub keeps one; at a regional hub, its root's
    # (D/tuf-relay/, hub.tufrelaying)
    tuf: TufRepository | RelayedTuf | None = None
    tuf_shared: SharedTuf | None = None  # hub replicas: the repository's versions in the store
    tuf_relay_shared: SharedRelay | None = None  # a region's replicas: the root's set in it
    # D/secrets.key (and a rotation's other key files): seal Secrets at rest (hub.secrets)
    secret_keys: SecretKeys = field(default_factory=SecretKeys)
    shared_blobs: SharedBlobs | None = None  # replicas: artifacts' bytes in etcd (blobsharing)
    regions: Regions | None = None  # hub.regions: the regional hubs below this one (a root)
    waves: WaveController | None = None  # hub.waves: rollouts across regions (not at a region)
    # when this hub began to observe devices: its start, its election (hub.staleness)
    observed_since: ObservedSince = field(default_factory=ObservedSince.now)

    @property
    def region(self) -> str:
        return self.config.region

    @property
    def blob_dir(self) -> Path:
        return self.paths.data_dir / "blobs"
