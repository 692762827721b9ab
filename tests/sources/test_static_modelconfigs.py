"""A ModelConfig in a device's static manifests (standalone devices): merged for this
device's name and operator-set labels, written for the static workloads of its model; one
config per model; without a configs directory it is refused, never ignored."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path
from typing import Any

import pytest
from test_static import Dir, doc

from edged.sources.static import StaticManifests
from edged.state import modelconfigs
from edged.state.modelconfigs import ConfigVolumes, static_device_name
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


def test_the_device_name_is_the_enrolled_one_and_a_bad_link_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "cam-host")
    link = tmp_path / "hub" / "link.json"
    with caplog.at_level(logging.WARNING, logger=modelconfigs.__name__):
        assert static_device_name(tmp_path) == "cam-host"  # not enrolled: quietly
        assert caplog.records == []
        link.parent.mkdir()
        link.write_text(json.dumps({"hub": "h:1", "deviceName": "cam-7"}))
        assert static_device_name(tmp_path) == "cam-7"
        for bad in ("{not json", json.dumps({"hub": "h:1"})):
            link.write_text(bad)
            assert static_device_name(tmp_path) == "cam-host"  # falls back, but says so
        assert [r.fields["why"] for r in caplog.records] == [  # type: ignore[attr-defined]
            "link.json unreadable",
            "link.json names no deviceName",
        ]
