"""DeviceHealthPolicy manifests: parsing with field paths; static directories with both kinds."""

from __future__ import annotations

from pathlib import Path

import pytest

from edged.discovery.doctor import read_policies
from edged.sources.static import StaticManifests
from edged.trust.admitting import ArtifactGate
from edgefleet.api import (
    API_VERSION,
    DeviceHealthPolicy,
    ModelDeployment,
    load_manifests,
    parse_manifest,
)
from edgefleet.artifacts.storing import ArtifactStore
from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.errors import ValidationError

POLICY = f"""\
apiVersion: {API_VERSION}
kind: DeviceHealthPolicy
metadata: {{name: warm-and-ready}}
spec:
  minUptime: 5m
  minAvailableMemory: 256Mi
  maxCpuTemperature: 85
  minDiskFree: 1Gi
  requiredAccelerators: [npu]
  requiredLabels: {{site: retail}}
  hysteresis: 10%
"""


def test_parse_and_round_trip() -> None:
    (p,) = load_manifests(POLICY, source="p.yaml")
    assert isinstance(p, DeviceHealthPolicy)
    s = p.spec
    assert s.min_uptime_s == 300
    assert s.min_available_memory_bytes == 256 << 20
    assert s.max_cpu_temperature_c == 85
    assert s.min_disk_free_bytes == 1 << 30
    assert s.required_accelerators == ("npu",)
    assert dict(s.required_labels) == {"site": "retail"}
    assert s.hysteresis_percent == 10
    assert parse_manifest(p.to_dict()) == p


def test_every_problem_with_its_path() -> None:
    doc = {
        "apiVersion": API_VERSION,
        "kind": "DeviceHealthPolicy",
        "metadata": {"name": "p"},
        "spec": {
            "minUptime": "soon",
            "maxCpuTemperature": "hot",
            "requiredAccelerators": ["n p u"],
            "requiredLabels": {"site": 3},
            "hysteresis": "80%",
            "maxTemp": 1,
        },
    }
    with pytest.raises(ValidationError) as exc:
        parse_manifest(doc)
    paths = sorted(p.path for p in exc.value.problems)
    assert paths == [
        "spec.hysteresis",
        "spec.maxCpuTemperature",
        "spec.maxTemp",
        "spec.minUptime",
        "spec.requiredAccelerators[0]",
        "spec.requiredLabels.site",
    ]


def test_a_static_directory_with_both_kinds(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    build_mlp(d / "mlp.onnx", TINY_MLP, seed=1)
    (d / "all.yaml").write_text(
        POLICY
        + f"""---
apiVersion: {API_VERSION}
kind: ModelDeployment
metadata: {{name: mlp}}
spec:
  model: {{name: mlp, version: "1", path: mlp.onnx}}
  replicas: {{perDevice: 1}}
"""
    )
    gate = ArtifactGate(tmp_path / "data", root_file=None, allow_unsigned=True)
    source = StaticManifests(
        d, ArtifactStore(tmp_path / "a"), max_artifact_bytes=1 << 20, gate=gate
    )
    result = source.sync({})
    assert result.problems == ()
    assert list(result.workloads) == ["mlp"]
    assert isinstance(result.workloads["mlp"].deployment, ModelDeployment)
    assert [p.name for p in result.policies] == ["warm-and-ready"]
    # an invalid edit keeps the policy it had
    (d / "all.yaml").write_text(POLICY.replace("85", "'hot'"))
    result = source.sync(result.workloads)
    assert [p.reason for p in result.problems] == ["InvalidManifest"]
    assert [p.name for p in result.policies] == ["warm-and-ready"]
    policies, problems = read_policies(d)
    assert policies == []
    assert problems and "maxCpuTemperature" in problems[0]
