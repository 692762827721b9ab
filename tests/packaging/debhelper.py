"""The debhelper packages (debian/) built once per test session: ``dpkg-buildpackage -b`` on
a copy of the tree (what git tracks or would, as CI checks it out). The build takes minutes,
so the tests that look into the packages (test_debhelper.py) and the one that installs them
into a Debian root (test_deb.py) share it: the first to ask builds, the other reuses it, on
the same pytest-xdist worker or another (:func:`shared_build`)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

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


# The packages the tests build are compressed with gzip -1 rather than dpkg-deb's default
# (xz -6, what a release build ships): their contents are what the tests check, and xz took
# about 50 of the build's 90 seconds on a quiet machine (and lintian and the install test
# unpack them again).
_FAST_DEB = {"DPKG_DEB_COMPRESSOR_TYPE": "gzip", "DPKG_DEB_COMPRESSOR_LEVEL": "1"}


def _run(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=False, env=env)


def build_packages(directory: Path) -> DebhelperBuild:
    src = directory / "src"
    files = _run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=REPO)
    for name in filter(None, files.stdout.split("\0")):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    build = _run("dpkg-buildpackage", "-b", "-us", "-uc", cwd=src, env={**os.environ, **_FAST_DEB})
    debs = {p.name.split("_")[0]: p for p in directory.glob("*.deb")}
    return DebhelperBuild(
        directory, build.returncode, build.stdout[-4000:] + build.stderr[-4000:], debs
    )


def shared_build(base: Path) -> DebhelperBuild:
    """The build in ``base`` (the session's temporary directory common to every pytest-xdist
    worker), made by whichever worker asks first while holding a lock on ``base/debhelper.lock``;
    the others wait on the lock and read the result it left. The result file is written last
    (temp file, rename), so a worker killed mid-build leaves no result and the next one builds."""
    directory = base / "debhelper-shared"
    result = directory / "result.json"
    with open(base / "debhelper.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if result.exists():
            doc = json.loads(result.read_text())
            return DebhelperBuild(
                directory,
                int(doc["returncode"]),
                str(doc["output"]),
                {k: Path(v) for k, v in doc["debs"].items()},
            )
        shutil.rmtree(directory, ignore_errors=True)  # a build killed halfway
        directory.mkdir()
        build = build_packages(directory)
        doc = {
            "returncode": build.returncode,
            "output": build.output,
            "debs": {k: str(v) for k, v in build.debs.items()},
        }
        tmp = result.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.rename(result)
        return build
