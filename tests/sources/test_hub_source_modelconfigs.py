"""The hub source and model configurations (edged.sources.hub): a config the hub sends is
checked before it is written; a hostile or broken one (not JSON, not an object, too large, a
file name that climbs out) is refused with its error and the previous config stays; one for a
workload the state does not hold is never written; a workload the hub stops sending one for
has none."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from test_hub_source import Hub, deployment

from edged.hublink.downloading import Downloads
from edged.sources.hub import HubSource
from edged.state.modelconfigs import ConfigVolumes
from edged.trust.admitting import ArtifactGate
from edged.workloads import WorkloadName
from edgefleet.api.modelconfigs import canonical_json, config_digest
from edgefleet.artifacts.storing import ArtifactStore


def test_configs_checked_written_and_refused(tmp_path: Path) -> None:
    hub = Hub(tmp_path)
    data = tmp_path / "device"
    gate = ArtifactGate(data, root_file=tmp_path / "root.json", allow_unsigned=False)
    volumes = ConfigVolumes(data / "configs")
    source = HubSource(
        data, ArtifactStore(data / "artifacts"), gate, Downloads(data / "downloads"),
        configs=volumes,
    )  # fmt: skip
    meta, _ = hub.model("1.0.0")
    det = WorkloadName("det")

    def apply(gen: int, configs: list[tuple[str, bytes, str]]) -> None:
        result = asyncio.run(
            source.apply(gen, [deployment("1.0.0")], [meta], [], hub.fetch, model_configs=configs)
        )
        assert not result.retry, result.problems

    good = {"data": {"threshold": 0.5}, "files": {"labels.txt": "a\n"}}
    apply(1, [("det", canonical_json(good), config_digest(good))])
    assert source.config_status(det) == (config_digest(good), "")
    assert json.loads(volumes.config_path("det").read_text()) == good

    for gen, raw, error in (
        (2, b"{not json", "unexpected"),
        (3, b"[1, 2]", "a config is a JSON object"),
        (4, canonical_json({"data": {}, "files": {"../x": "y"}}), "not a plain file name"),
        (5, canonical_json({"data": {"x": "y" * 600_000}, "files": {}}), "bytes"),
        (6, canonical_json({"data": {}}), "data and files"),
    ):
        apply(gen, [("det", raw, "sha256:" + "0" * 64)])
        digest, why = source.config_status(det)
        assert digest == config_digest(good), raw[:40]  # the previous one stays
        assert error in why.lower() or error in why, (raw[:40], why)

    # one for a workload this state does not hold: never written
    apply(7, [("ghost", canonical_json(good), config_digest(good))])
    assert not (data / "configs" / "ghost").exists()
    # none sent for det any more: it has none, its directory stays
    assert source.config_status(det) == ("", "")
    assert (data / "configs" / "det").is_dir()
