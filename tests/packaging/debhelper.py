"""The debhelper packages (debian/) built once per test session: ``dpkg-buildpackage -b`` on
a copy of the tree (what git tracks or would, as CI checks it out). The build takes minutes,
so the tests that look into the packages (test_debhelper.py) and the one that installs them
into a Debian root (test_deb.py) share it: the first to ask builds, the other reuses it."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
PACKAGES = ("edgefleet-common", "edgefleet-edged", "edgefleet-hub", "edgefleet-edgectl")
TOOLS_REASON = (
    ""
    if shutil.which("dpkg-buildpackage") and shutil.which("dh") and shutil.which("lintian")
    else "needs dpkg-buildpackage, debhelper and lintian (scripts/install-system-deps)"
)


@dataclass(frozen=True)
class DebhelperBuild:
    directory: Path
    returncode: int
    output: str  # the end of dpkg-buildpackage's stdout and stderr
    debs: dict[str, Path]  # package name -> .deb


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=False)


def build_packages(directory: Path) -> DebhelperBuild:
    src = directory / "src"
    files = _run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=REPO)
    for name in filter(None, files.stdout.split("\0")):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    build = _run("dpkg-buildpackage", "-b", "-us", "-uc", cwd=src)
    debs = {p.name.split("_")[0]: p for p in directory.glob("*.deb")}
    return DebhelperBuild(
        directory, build.returncode, build.stdout[-4000:] + build.stderr[-4000:], debs
    )


BUILD_GROUP = pytest.mark.xdist_group("debhelper-build")
"""On every test of the debhelper build: one pytest-xdist worker runs them all (scripts/test
uses --dist loadgroup), so the session fixture builds the packages once, not once per worker.
A static mark: xdist reads the groups before directory hooks could add them.
Open: with pytest-xdist 3.8 here the grouping was seen not to take effect (the two tests ran
on two workers, each building: about 7 min of one core each); a build shared through a file
lock in the session's common temp directory is the way to build once."""
