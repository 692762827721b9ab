"""An enrolled edged attached to its hub (docs/edged.md, "The hub link"): the hub's
source of desired state and the link that feeds it, each built as edged.toml says.

:func:`hub_source` is None until the device is enrolled (``D/hub/link.json``). :func:`hub_link`
gives the link what it tells the hub (a report), how it answers an attestation challenge, and
what ``edgectl logs`` reads: edged's own recent records and its workers' stderr
(:class:`edged.runtime.output.RecentLogs`).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edged.config import EdgedConfig
from edged.hublink.devicereport import DeviceReport
from edged.hublink.downloading import Downloads
from edged.hublink.files import LinkFiles
from edged.runtime.output import RecentLogs
from edged.sources.hub import HubSource
from edged.state.modelconfigs import config_volumes
from edged.trust.admitting import ArtifactGate
from edged.trust.attesting import ChallengeAnswerer, MeasurementLog
from edged.trust.secrets import SecretVolumes
from edgefleet.artifacts.storing import ArtifactStore

if TYPE_CHECKING:
    from edged.hublink.linking import HubLink


def hub_source(
    files: LinkFiles,
    store: ArtifactStore,
    gate: ArtifactGate,
    *,
    config: EdgedConfig,
    secrets_root: Path,
) -> HubSource | None:
    """Where the hub's desired states go, once enrolled (None before): admitted through
    ``gate`` into ``store`` after TUF's checks, with the hub's Secrets under
    ``secrets_root``."""
    if not files.enrolled():
        return None
    from edged.trust.tufclient import TufClient

    data = Path(config.paths.data_dir)
    return HubSource(
        data,
        store,
        gate,
        Downloads(data / "downloads"),
        tuf=TufClient(data, required=config.trust.require_tuf),
        secrets=SecretVolumes(
            secrets_root,
            data_dir=data,
            device_name=files.load().device_name,
            allow_non_tmpfs=config.secrets.allow_non_tmpfs,
            tpm=config.trust.tpm,
            # workers of their own uid read them through a descriptor (security.md)
            worker_uids=os.geteuid() == 0,
        ),
        configs=config_volumes(data),
    )


def hub_link(
    files: LinkFiles,
    source: HubSource,
    *,
    config: EdgedConfig,
    config_path: Path | None,
    on_accepted: Callable[[], Awaitable[None]],
    syncing: Callable[[], AbstractContextManager[None]],
    report: Callable[[], DeviceReport],
    trust_root_path: Path,
    model_digests: Callable[[], Iterable[str]],
    measurement: MeasurementLog | None,
    worker_records: Callable[[str], list[list[tuple[float, str]]]],
    on_agent: Callable[[Any], None] | None = None,
) -> HubLink:
    """The link to the hub (:class:`HubLink`: its arguments), answering challenges with the
    config at ``config_path``, the trust root at ``trust_root_path``, the desired state's
    ``model_digests`` and edged's ``measurement`` log; ``worker_records(workload)``: each
    replica's stderr records (``WorkerPool.output_records``), for ``edgectl logs``."""
    from edged.hublink.linking import HubLink  # grpc: only once enrolled

    return HubLink(
        files,
        source=source,
        on_accepted=on_accepted,
        syncing=syncing,
        report=report,
        answer_challenge=ChallengeAnswerer(
            Path(config.paths.data_dir),
            config_path=config_path,
            trust_root_path=trust_root_path,
            model_digests=model_digests,
            tpm=config.trust.tpm,
            measurement=measurement,
        ),
        recent_logs=RecentLogs(worker_records),
        addresses=config.hub.addresses,
        on_agent=on_agent,
    )
