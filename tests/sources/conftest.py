"""Static manifests: a real directory of YAML/JSON files under ``tmp_path``, real (tiny) ONNX
models written by ``edgefleet.demo.build_mlp``, and a real ArtifactStore. Nothing is faked; a
full disk is a real small tmpfs (``small_disk``).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.demo import build_mlp

SMALL_DISK_BYTES = 20 << 20


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    """The bytes of two different tiny ONNX models."""
    d = tmp_path_factory.mktemp("models")
    one = build_mlp(d / "one.onnx", (4, 8, 2), seed=1)
    two = build_mlp(d / "two.onnx", (4, 8, 2), seed=2)
    return one.read_bytes(), two.read_bytes()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 20 MiB filesystem (tmpfs, mounted here; needs root, else the test is skipped)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    d = tmp_path / "small-disk"
    d.mkdir()
    out = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SMALL_DISK_BYTES}", "tmpfs", str(d)],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {out.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)
