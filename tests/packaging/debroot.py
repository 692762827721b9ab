"""A clean Debian bookworm root in a temp folder, for installing the package into.

Making one with debootstrap takes minutes, so the finished root is kept as a tarball under
``$EDGEFLEET_CACHE`` (default ``~/.cache/edgefleet``): the first run debootstraps (from the
machine's apt mirror, or from the downloaded-packages tarball ``--make-tarball`` left there), the
later ones unpack it in seconds. The root has python3.11 and adduser, the package's Depends, so
installing needs no network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SUITE = "bookworm"
INCLUDE = "python3.11,adduser"
BASE = ["debootstrap", "--variant=minbase", f"--include={INCLUDE}"]
CACHE = Path(os.environ.get("EDGEFLEET_CACHE", Path.home() / ".cache" / "edgefleet"))
DEBS_TARBALL = CACHE / "debootstrap" / f"{SUITE}-minbase.tgz"
ROOT_TARBALL = CACHE / "debootstrap" / f"{SUITE}-minbase-root.tar"

ROOT_REASON = (
    "needs root (chroot, dpkg)"
    if os.geteuid() != 0
    else "needs debootstrap (scripts/install-system-deps)"
    if shutil.which("debootstrap") is None
    else ""
)


def apt_mirror() -> str:
    """The machine's Debian mirror (deb822 sources or sources.list), else deb.debian.org."""
    candidates = [Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")]
    for path in candidates:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            words = line.split()
            if words[:1] == ["URIs:"] and not words[1].endswith("-security"):
                return words[1]
            if words[:1] == ["deb"] and "security" not in words[1]:
                return words[1]
    return "http://deb.debian.org/debian"


def _debootstrap(target: Path) -> None:
    DEBS_TARBALL.parent.mkdir(parents=True, exist_ok=True)
    if not DEBS_TARBALL.exists():
        subprocess.run(
            [*BASE, f"--make-tarball={DEBS_TARBALL}", SUITE, str(target / "tmp"), apt_mirror()],
            check=True,
            capture_output=True,
        )
    subprocess.run(
        [*BASE, f"--unpack-tarball={DEBS_TARBALL}", SUITE, str(target), apt_mirror()],
        check=True,
        capture_output=True,
    )


@contextmanager
def debian_root(parent: Path) -> Iterator[Path]:
    """A fresh root under ``parent`` with /proc mounted; unmounted afterwards."""
    root = parent / "root"
    if ROOT_TARBALL.exists():
        root.mkdir()
        subprocess.run(["tar", "-xpf", str(ROOT_TARBALL), "-C", str(root)], check=True)
    else:
        made = parent / "made"
        made.mkdir()
        _debootstrap(made)
        partial = ROOT_TARBALL.with_suffix(".partial")
        subprocess.run(["tar", "-cpf", str(partial), "-C", str(made), "."], check=True)
        partial.rename(ROOT_TARBALL)
        made.rename(root)
    subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")], check=True)
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root / "proc")], check=False)


def chroot(root: Path, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}
    return subprocess.run(
        ["chroot", str(root), *cmd], env=env, capture_output=True, text=True, check=check
    )


def snapshot(root: Path) -> set[str]:
    """Every path in the root but those dpkg, adduser and logs rewrite on their own, and root's
    home (running edged as root there leaves onnxruntime's own ~/.cache, not the package's)."""
    skip = ("/proc", "/tmp", "/var/lib/dpkg", "/var/log", "/var/cache", "/run", "/root")
    skip_files = {"/etc/passwd-", "/etc/group-", "/etc/shadow-", "/etc/gshadow-"}
    paths = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = "/" + os.path.relpath(dirpath, root).lstrip(".")
        rel = rel.rstrip("/") or "/"
        if rel.startswith(skip):
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            path = f"{rel.rstrip('/')}/{name}"
            if path not in skip_files and not path.startswith(skip):
                paths.add(path)
    return paths


__all__ = ["ROOT_REASON", "chroot", "debian_root", "snapshot"]
