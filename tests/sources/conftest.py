"""Static manifests: a real directory of YAML/JSON files under ``tmp_path``, real (tiny) ONNX
models written by ``edgefleet.demo.build_mlp``, and a real ArtifactStore. Nothing is faked.
"""

from __future__ import annotations

import pytest

from edgefleet.demo import build_mlp


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    """The bytes of two different tiny ONNX models."""
    d = tmp_path_factory.mktemp("models")
    one = build_mlp(d / "one.onnx", (4, 8, 2), seed=1)
    two = build_mlp(d / "two.onnx", (4, 8, 2), seed=2)
    return one.read_bytes(), two.read_bytes()
