"""Directory change notification with inotify (Linux), no dependency and no polling.

``DirectoryWatcher(path, callback)`` calls ``callback()`` on the event loop whenever an entry of
``path`` is created, written, moved or deleted. Where inotify is not available it returns
``False`` from :meth:`start` and the caller relies on the periodic resync.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
from collections.abc import Callable
from pathlib import Path

from edgefleet.logs import get_logger

log = get_logger(__name__)

IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
MASK = (
    IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_ATTRIB
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_MODIFY
)


class DirectoryWatcher:
    def __init__(self, path: Path, callback: Callable[[], None]) -> None:
        self._path = path
        self._callback = callback
        self._fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> bool:
        libc_name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(libc_name, use_errno=True)
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (OSError, AttributeError):
            return False
        if fd < 0:
            return False
        wd = libc.inotify_add_watch(fd, os.fsencode(self._path), MASK)
        if wd < 0:
            os.close(fd)
            log.warning("cannot watch directory", path=str(self._path), errno=ctypes.get_errno())
            return False
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(fd, self._on_readable)
        return True

    def _on_readable(self) -> None:
        try:
            while os.read(self._fd, 65536):
                pass
        except BlockingIOError:
            pass
        except OSError:
            return
        self._callback()

    def stop(self) -> None:
        if self._fd >= 0 and self._loop is not None:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
