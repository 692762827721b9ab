"""One version for every program: ``edgectl --version``, ``hub --version`` and ``edged
--version`` print the version of the tree they run from (edgefleet.versioning): a checkout's
pyproject.toml, else the installed distribution's. The console scripts of this venv, run as
real processes."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from edgefleet import versioning

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


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
    assert out.stdout.splitlines()[0] == f"{program} {VERSION}"


def test_a_checkout_reports_its_pyproject_version() -> None:
    """Run from this checkout (with PYTHONPATH, or an editable install of it), the version is
    its pyproject's, even while the venv's metadata is that of an older install."""
    assert versioning.installed_version() == VERSION
    assert versioning.version_text("hub") == f"hub {VERSION}"


def test_an_installed_tree_reports_its_distribution(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Outside a checkout (the Debian package's venv, an agent release's lib/), the
    distribution's metadata; none at all: UNKNOWN_VERSION."""
    monkeypatch.setattr(versioning, "source_tree_version", lambda tree=None: None)
    monkeypatch.setattr(metadata, "version", lambda name: "7.8.9")  # imported when needed
    assert versioning.installed_version() == "7.8.9"

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert versioning.installed_version() == versioning.UNKNOWN_VERSION


def test_only_an_edgefleet_pyproject_counts(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "other"\nversion = "9.0.0"\n')
    assert versioning.source_tree_version(tmp_path) is None
    (tmp_path / "pyproject.toml").write_text("not toml [")
    assert versioning.source_tree_version(tmp_path) is None
    assert versioning.source_tree_version(tmp_path / "missing") is None
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "edgefleet"\nversion = "0.9.1"\n')
    assert versioning.source_tree_version(tmp_path) == "0.9.1"
