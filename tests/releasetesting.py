"""A previous release of edgefleet, built from git history for the version skew tests
(docs/agent-updates.md, "Version skew" and "Upgrading hubs").

``previous_release(tmp)`` extracts the commit ``packaging/releases.toml`` names for the newest
release before this one (``git archive``: CI clones main and tags may not travel) and runs its
programs as real processes: ``python -m edged|hub|edgectl`` of this interpreter, with
``PYTHONPATH`` the extracted tree (its own edgefleet, edged, hub, edgectl; the third-party
packages are this venv's) and a ``edgefleet-VERSION.dist-info`` written beside it, so that it
reports the version it was released as (its ``edgefleet.versioning`` reads the installed
distribution's metadata; the tree itself was never installed). The working directory is the
tree, never this checkout: ``python -m`` puts the working directory first on ``sys.path``.

:data:`CURRENT` runs this checkout's programs the same way (the test's own environment).

Without the git history (a source tarball, a shallow clone) the tests are skipped with the
reason; where ``CI`` is set they fail instead, as the VM lab's do.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from edgefleet.launching import program_command
from edgefleet.trust.versions import version_key
from edgefleet.versioning import installed_version

REPO = Path(__file__).resolve().parents[1]
RELEASES = REPO / "packaging" / "releases.toml"
SOURCES = ("edgefleet", "edged", "hub", "edgectl", "pyproject.toml")


@dataclass(frozen=True)
class Release:
    """The programs of one release: ``tree`` None is this checkout."""

    version: str
    tree: Path | None = None
    meta: Path | None = None  # the directory holding its dist-info

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {**os.environ, **(extra or {})}
        if self.tree is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(self.tree), str(self.meta)])
        return env

    @property
    def cwd(self) -> Path | None:
        return self.tree

    def command(self, program: str, *args: str | os.PathLike[str]) -> list[str]:
        return program_command(program, *args)

    def run(
        self,
        program: str,
        *args: str | os.PathLike[str],
        env: dict[str, str] | None = None,
        timeout: float = 120,
        **kwargs: Any,
    ) -> subprocess.CompletedProcess[str]:
        """``program ARGS`` of this release, its output captured (not checked)."""
        return subprocess.run(
            self.command(program, *args),
            env=self.env(env),
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            **kwargs,
        )


CURRENT = Release(installed_version())


def unavailable(reason: str) -> None:
    """Skip with ``reason``; fail where ``CI`` is set."""
    if os.environ.get("CI"):
        pytest.fail(f"CI runs the version skew tests: {reason}")
    pytest.skip(reason)


def past_releases() -> dict[str, str]:
    """Version -> commit of each release before this one (packaging/releases.toml)."""
    doc = tomllib.loads(RELEASES.read_text())
    return {str(v): str(r["commit"]) for v, r in doc["releases"].items()}


def previous_release(tmp: Path) -> Release:
    """The newest release before this one, extracted under ``tmp`` (once per ``tmp``)."""
    version, commit = max(past_releases().items(), key=lambda item: version_key(item[0]))
    tree, meta = tmp / f"edgefleet-{version}", tmp / f"edgefleet-{version}-meta"
    if not (tree / "edged").is_dir():
        found = subprocess.run(
            ["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
            capture_output=True,
            text=True,
            check=False,
        )
        if found.returncode != 0:
            unavailable(
                f"release {version} is commit {commit[:12]} of packaging/releases.toml, "
                f"not in this checkout's git history ({found.stderr.strip() or 'no git'}): "
                "clone with full history"
            )
        archive = tmp / f"edgefleet-{version}.tar"
        subprocess.run(
            ["git", "-C", str(REPO), "archive", "-o", str(archive), commit, "--", *SOURCES],
            check=True,
            capture_output=True,
        )
        tree.mkdir(parents=True)
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
        archive.unlink()
        _write_dist_info(meta, version)
    return Release(version, tree, meta)


def _write_dist_info(meta: Path, version: str) -> None:
    info = meta / f"edgefleet-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: edgefleet\nVersion: {version}\n")


def reporting(release: Release, version: str, tmp: Path) -> Release:
    """``release``'s code reporting ``version`` (an installed release's dist-info says it): an
    edged of a version outside a hub's window, without building one."""
    assert release.tree is not None, "this checkout reports its pyproject's version"
    meta = tmp / f"edgefleet-{version}-meta"
    if not meta.is_dir():
        _write_dist_info(meta, version)
    return Release(version, release.tree, meta)
