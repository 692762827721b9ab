"""One version for every program: ``edgectl --version``, ``hub --version`` and ``edged
--version`` print the installed distribution's version (edgefleet.versioning). The console
scripts of this venv, run as real processes."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from edgefleet import versioning

BIN = Path(sys.executable).parent


@pytest.mark.parametrize("program", ["edgectl", "hub", "edged"])
def test_version_option(program: str, tmp_path: Path) -> None:
    out = subprocess.run(
        [str(BIN / program), "--version"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == f"{program} {metadata.version('edgefleet')}"


def test_the_version_comes_from_the_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    assert versioning.installed_version() == metadata.version("edgefleet")
    assert versioning.version_text("hub") == f"hub {metadata.version('edgefleet')}"

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(versioning.metadata, "version", missing)
    assert versioning.installed_version() == versioning.UNKNOWN_VERSION
