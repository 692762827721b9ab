"""A ModelConfig in a device's static manifests (standalone devices): merged for this
device's name and operator-set labels, written for the static workloads of its model; one
config per model; without a configs directory it is refused, never ignored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_static import Dir, doc

from edged.sources.static import StaticManifests
from edged.state.modelconfigs import ConfigVolumes
from edged.trust.admitting import ArtifactGate
from edgefleet.api import API_VERSION


def config(name: str = "det", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ModelConfig",
        "metadata": {"name": name},
        "spec": {
            "model": "mnist",
            "data": {"threshold": 0.5},
            "overrides": [
                {"selector": {"site": "a"}, "data": {"threshold": 0.6}},
                {"devices": ["cam-1"], "data": {"zones": [1, 2]}},
            ],
            **spec,
        },
    }


def with_configs(root: Path, models: tuple[bytes, bytes], volumes: ConfigVolumes | None) -> Dir:
    d = Dir(root, models)
    gate = ArtifactGate(root / "data", root_file=None, allow_unsigned=True)
    d.source = StaticManifests(
        d.path, d.store, max_artifact_bytes=1 << 20, gate=gate, configs=volumes,
        device_name="cam-1", labels={"site": "a"},
    )  # fmt: skip
    return d


def test_merged_for_this_device_and_written(tmp_path: Path, models: tuple[bytes, bytes]) -> None:
    volumes = ConfigVolumes(tmp_path / "configs")
    d = with_configs(tmp_path, models, volumes)
    d.model("mnist")
    d.write("mnist.yaml", doc("mnist"), config())
    result = d.sync()
    assert result.problems == ()
    written = json.loads(volumes.config_path("mnist").read_text())
    assert written == {"data": {"threshold": 0.6, "zones": [1, 2]}, "files": {}}

    # gone from the manifests: the workload has no config (its directory stays)
    d.write("mnist.yaml", doc("mnist"))
    assert d.sync().problems == ()
    assert volumes.digest("mnist") is None and (tmp_path / "configs" / "mnist").is_dir()

    # two for one model: the second is a problem, the first applies
    d.write("mnist.yaml", doc("mnist"), config(), config("other"))
    (problem,) = d.sync().problems
    assert problem.reason == "DuplicateModelConfig" and "one config per model" in problem.message
    assert volumes.digest("mnist") is not None


def test_refused_without_a_configs_directory(tmp_path: Path, models: tuple[bytes, bytes]) -> None:
    d = with_configs(tmp_path, models, None)
    d.model("mnist")
    d.write("mnist.yaml", doc("mnist"), config())
    (problem,) = d.sync().problems
    assert problem.reason == "UnsupportedKind" and "not applied" in problem.message
