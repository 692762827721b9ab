"""fanotify (fanotify(7)) through ctypes: the kernel tells edged each time a process opens a
file of the artifact store, so an open between two drift checks is seen, and a memory map too
(a map needs an open descriptor first). Notification only (``FAN_CLASS_NOTIF``): the kernel
never waits for edged, and no open of the store is slowed beyond the queueing of an event.

Only ``FAN_OPEN`` (and ``FAN_OPEN_EXEC``) on the store directory and its children: not
``FAN_ACCESS``, which would wake edged on every read of every worker. Needs
``CAP_SYS_ADMIN`` (an event that names the opener's pid and gives a descriptor of the file);
:func:`open_watch` says why it cannot be had instead of raising.

The kernel's queue is bounded (``/proc/sys/fs/fanotify/max_queued_events``, 16,384 by
default; ``FAN_UNLIMITED_QUEUE`` is not asked for); past it the kernel drops events and
queues one ``FAN_Q_OVERFLOW``, counted here.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

FAN_CLOEXEC = 0x1
FAN_NONBLOCK = 0x2
FAN_CLASS_NOTIF = 0x0
FAN_MARK_ADD = 0x1
FAN_OPEN = 0x20
FAN_OPEN_EXEC = 0x1000
FAN_Q_OVERFLOW = 0x4000
FAN_EVENT_ON_CHILD = 0x08000000
FANOTIFY_METADATA_VERSION = 3
AT_FDCWD = -100
_METADATA = struct.Struct("=IBBHQii")  # event_len, vers, reserved, metadata_len, mask, fd, pid
READ_SIZE = 4080  # at most 170 events per read


@dataclass(frozen=True, slots=True)
class OpenEvent:
    pid: int  # the process (thread group) that opened the file
    path: str  # the file opened, as /proc/self/fd showed it ("" when it could not be read)


@dataclass(slots=True)
class OpenWatch:
    """A fanotify group marking one directory for opens of its files."""

    fd: int
    overflows: int = 0

    def read(self, limit: int) -> Iterator[OpenEvent]:
        """The events queued now, at most ``limit``; every descriptor the kernel handed over
        is closed. Stops when nothing more is queued."""
        seen = 0
        while seen < limit:
            # events carry no information records here: each is one metadata struct, so
            # a read of that many bytes reads no more than asked
            size = min(READ_SIZE, max(1, limit - seen) * _METADATA.size)
            try:
                buf = os.read(self.fd, size)
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            if not buf:
                return
            for event in self._parse(buf):
                seen += 1
                yield event

    def _parse(self, buf: bytes) -> list[OpenEvent]:
        out = []
        offset = 0
        while offset + _METADATA.size <= len(buf):
            length, vers, _, _, mask, fd, pid = _METADATA.unpack_from(buf, offset)
            if length < _METADATA.size:
                break
            offset += length
            path = ""
            if fd >= 0:
                try:
                    path = os.readlink(f"/proc/self/fd/{fd}")
                except OSError:
                    pass
                finally:
                    os.close(fd)
            if vers != FANOTIFY_METADATA_VERSION:
                continue
            if mask & FAN_Q_OVERFLOW:
                self.overflows += 1
                continue
            if mask & (FAN_OPEN | FAN_OPEN_EXEC):
                out.append(OpenEvent(pid, path))
        return out

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
    libc.fanotify_init.restype = ctypes.c_int
    libc.fanotify_mark.argtypes = [
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_uint64,
        ctypes.c_int,
        ctypes.c_char_p,
    ]
    libc.fanotify_mark.restype = ctypes.c_int
    return libc


def open_watch(directory: Path) -> OpenWatch | str:
    """A watch of opens of ``directory``'s files, or why there can be none (no capability,
    no kernel support, no directory)."""
    try:
        libc = _libc()
    except (OSError, AttributeError) as exc:
        return f"the C library offers no fanotify ({exc})"
    fd = libc.fanotify_init(
        FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK,
        os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_LARGEFILE", 0),
    )
    if fd < 0:
        err = ctypes.get_errno()
        if err == errno.EPERM:
            return "fanotify needs CAP_SYS_ADMIN, which edged does not have"
        if err == errno.ENOSYS:
            return "this kernel has no fanotify (CONFIG_FANOTIFY)"
        return f"fanotify_init failed: {os.strerror(err)}"
    mask = FAN_OPEN | FAN_OPEN_EXEC | FAN_EVENT_ON_CHILD
    rc = libc.fanotify_mark(fd, FAN_MARK_ADD, mask, AT_FDCWD, os.fsencode(directory))
    if rc < 0 and ctypes.get_errno() == errno.EINVAL:  # FAN_OPEN_EXEC: Linux 5.0 and later
        mask &= ~FAN_OPEN_EXEC
        rc = libc.fanotify_mark(fd, FAN_MARK_ADD, mask, AT_FDCWD, os.fsencode(directory))
    if rc < 0:
        err = ctypes.get_errno()
        os.close(fd)
        return f"fanotify_mark {directory} failed: {os.strerror(err)}"
    return OpenWatch(fd)
