"""Does a file parse as ONNX: real models built with ``onnx`` pass, everything else is named."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgefleet.artifacts.onnxformat import check_onnx_model
from edgefleet.demo import MEDIUM_MLP, TINY_MLP, build_mlp
from edgefleet.errors import ArtifactError


@pytest.mark.parametrize("sizes", [TINY_MLP, (8, 4), MEDIUM_MLP[:2]])
def test_real_models_pass(tmp_path: Path, sizes: tuple[int, ...]) -> None:
    check_onnx_model(build_mlp(tmp_path / "m.onnx", sizes))


def _broken(tmp_path: Path) -> list[tuple[str, bytes, str]]:
    good = build_mlp(tmp_path / "good.onnx").read_bytes()
    return [
        ("empty", b"", "the file is empty"),
        ("half a model", good[: len(good) // 2], "runs past the end"),
        ("a text file", b"hello, world\n" * 100, "not an ONNX model"),
        ("a zip", b"PK\x03\x04" + b"\0" * 100, "not an ONNX model"),
        ("only an ir_version", b"\x08\x08", "0 graphs"),
    ]


def test_what_is_not_onnx_is_refused_with_the_reason(tmp_path: Path) -> None:
    for what, data, expected in _broken(tmp_path):
        path = tmp_path / "x.onnx"
        path.write_bytes(data)
        with pytest.raises(ArtifactError) as info:
            check_onnx_model(path)
        assert info.value.reason == "NotAnOnnxModel", what
        assert expected in str(info.value), (what, str(info.value))
        assert str(path) in str(info.value)


def test_random_bytes_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "random.onnx"
    for _ in range(200):
        path.write_bytes(os.urandom(50_000))
        with pytest.raises(ArtifactError):
            check_onnx_model(path)
