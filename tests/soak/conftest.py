"""The soak harness (docs/soak.md) uses the end-to-end helpers (tests/e2e: fleet, harness,
rollouttesting...): their folder goes on sys.path as pytest's own does for tests/e2e.

Everything here is real: the slow-I/O tests mount a real FUSE filesystem (``slow_dir``) and
run real edged processes on it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

E2E = str(Path(__file__).resolve().parent.parent / "e2e")
if E2E not in sys.path:
    sys.path.append(E2E)


@pytest.fixture
def slow_dir(tmp_path: Path) -> Iterator[Any]:
    """A real FUSE mount (``slowfs.py``, libfuse 3) at ``tmp_path/slow`` mirroring
    ``tmp_path/slow.backing``, no delay yet; unmounted at the end, whatever the test did. Needs
    root and /dev/fuse: elsewhere the test is skipped with the reason; as root (CI) a mount that
    fails fails the test."""
    from slowfs import mount

    fs = mount(tmp_path / "slow.backing", tmp_path / "slow", tmp_path / "slowfs.sock",
               tmp_path / "slowfs.log")  # fmt: skip
    if isinstance(fs, str):
        if os.geteuid() != 0:
            pytest.skip(f"slowfs cannot mount here (not root): {fs}")
        pytest.fail(f"slowfs: {fs}")
    try:
        yield fs
    finally:
        fs.unmount()
