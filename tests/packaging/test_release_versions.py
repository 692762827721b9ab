"""One version everywhere a release names it: pyproject.toml (what the programs report),
debian/changelog (the packages' version), and the past releases in packaging/releases.toml
below it, each a commit whose pyproject.toml says so (skipped without git history, failed
where CI is set). The Yocto
recipes' names: test_yocto."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from releasetesting import unavailable

from edgefleet.trust.versions import version_key

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
RELEASES = tomllib.loads((REPO / "packaging" / "releases.toml").read_text())["releases"]


def test_changelog_names_the_version() -> None:
    first = (REPO / "debian" / "changelog").read_text().splitlines()[0]
    found = re.match(r"edgefleet \(([^)]+)\)", first)
    assert found and found.group(1) == VERSION, first


def test_past_releases_are_older_and_name_full_commits() -> None:
    assert RELEASES, "packaging/releases.toml lists no release"
    for version, release in RELEASES.items():
        assert version_key(version) < version_key(VERSION), version
        assert re.fullmatch(r"[0-9a-f]{40}", release["commit"]), release


def test_each_release_commit_says_its_version() -> None:
    for version, release in RELEASES.items():
        shown = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{release['commit']}:pyproject.toml"],
            capture_output=True,
            text=True,
            check=False,
        )
        if shown.returncode != 0:
            unavailable(f"no git history here for {release['commit']}: {shown.stderr.strip()}")
        assert tomllib.loads(shown.stdout)["project"]["version"] == version
