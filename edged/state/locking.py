"""One edged per data directory: an exclusive ``flock`` on ``D/edged.lock``, held for the
process's lifetime (the descriptor is close-on-exec, so workers do not inherit it)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from edgefleet.errors import EdgefleetError


class AlreadyRunning(EdgefleetError):
    """Another edged holds the data directory."""


def lock_data_dir(data: Path) -> int:
    """The descriptor holding the lock; :class:`AlreadyRunning` when another process has it."""
    fd = os.open(data / "edged.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AlreadyRunning(f"another edged is running on {data}") from None
    return fd
