"""The content-addressed artifact store on a real directory under ``tmp_path``.

Real: files, hashing, permissions, renames; the ONNX model is a real (tiny) file written by
``edgefleet.demo.build_mlp``. In-test stand-ins: byte streams that never end, verifiers that record.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edgefleet.demo import build_mlp


@pytest.fixture(scope="session")
def onnx_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_mlp(tmp_path_factory.mktemp("models") / "tiny.onnx", (4, 8, 2))
