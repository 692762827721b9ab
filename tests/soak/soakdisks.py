"""Full disks for the soak harness: a small tmpfs the harness mounts where a process keeps its
state (a device's data directory, the root hub's — its SQLite store included), filled to the
last byte by a fault and emptied when it ends.

Mounting needs root (CAP_SYS_ADMIN) where the harness runs; where it cannot, :func:`mount`
says why and the run reports the fault kind as not run here, naming the reason."""

from __future__ import annotations

import errno
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

FILLER = ".soak-fill"
SIZE_MIB = 64  # each mount, by default: the state, the models, the logs written there


@dataclass
class Disk:
    """A tmpfs mounted at ``path``; ``fill`` writes a file until the filesystem is full."""

    path: Path

    def fill(self) -> None:
        block = b"\0" * (1 << 20)
        with open(self.path / FILLER, "ab", buffering=0) as f:
            while True:
                try:
                    f.write(block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    if len(block) == 1:
                        return
                    block = block[: len(block) // 2]  # down to the last byte

    def empty(self) -> None:
        (self.path / FILLER).unlink(missing_ok=True)

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)


def mount(path: Path, size_mib: int = SIZE_MIB) -> Disk | str:
    """A tmpfs of ``size_mib`` MiB at ``path`` (made empty first); or why it could not be
    made."""
    path.mkdir(parents=True, exist_ok=True)
    if any(path.iterdir()):
        return f"{path} is not empty"
    try:
        out = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0755", "tmpfs", str(path)],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"mount: {exc}"
    if out.returncode != 0:
        return f"mount -t tmpfs: {out.stderr.strip() or out.returncode}"
    return Disk(path)
