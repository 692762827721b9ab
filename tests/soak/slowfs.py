"""Slow I/O for the soak harness: a FUSE passthrough filesystem that mirrors a backing
directory and sleeps before each I/O operation while a delay is set, as a disk behind a
device-mapper ``delay`` target would (this machine has no device-mapper).

The filesystem runs in a process of its own (``python slowfs.py BACKING MOUNTPOINT CONTROL``,
libfuse 3 through ``mfusepy``'s ctypes binding); the harness sets and clears the delay at run time
through a Unix socket (``CONTROL``), one line per request, one JSON line per answer:

* ``delay SECONDS`` — from now on each delayed operation sleeps that long first (0: none);
  refused, the delay unchanged, unless ``0 <= SECONDS <= MAX_DELAY``.
* ``hold`` — each delayed operation waits until the next ``delay`` (a disk that stopped
  answering; tests use it to catch a process in the middle of a write).
* ``get`` — the delay, the operations waiting now, and what it has cost so far (operations
  delayed, seconds slept).

Delayed: what reaches the disk on a real filesystem — open, create, read, write, fsync (files
and directories), rename, unlink, mkdir, rmdir, truncate, mknod, symlink, link. Lookups and
``stat`` are not (a real disk serves them from the inode cache). Every operation edged's
atomic writes use (a temporary file, fsync, rename, fsync of the directory) and what else it
does in its data directory (symlinks, Unix sockets, ``flock``, which the kernel keeps for a FUSE
filesystem that has no lock operation of its own, read-only ``mmap``) is passed through.

Mounting needs root (or ``fusermount3``) and ``/dev/fuse``; where the harness cannot mount,
:func:`mount` says why and the run reports the fault kind as not run here."""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_DELAY = 10.0  # seconds per operation: bounds what the control socket accepts
MOUNT_TIMEOUT = 30.0


class ControlError(Exception):
    """The filesystem refused a control request (the message says why) or did not answer."""


# -- the harness's side -------------------------------------------------------------------------
@dataclass
class SlowFs:
    """A mounted slow filesystem: ``mountpoint`` mirrors ``backing``."""

    backing: Path
    mountpoint: Path
    control: Path
    process: subprocess.Popen[bytes]
    log: Path

    def request(self, line: str) -> dict[str, Any]:
        """One control request; its answer (``ControlError`` when refused)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            try:
                s.connect(str(self.control))
                s.sendall(line.encode() + b"\n")
                data = b""
                while not data.endswith(b"\n"):
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
            except OSError as exc:
                raise ControlError(f"slowfs control {self.control}: {exc}") from None
        try:
            answer: dict[str, Any] = json.loads(data)
        except ValueError:
            raise ControlError(f"slowfs control answered {data[:200]!r}") from None
        if not answer.get("ok"):
            raise ControlError(str(answer.get("error")))
        return answer

    def set_delay(self, seconds: float) -> None:
        self.request(f"delay {seconds!r}")

    def normal(self) -> None:
        self.set_delay(0.0)

    def hold(self) -> None:
        self.request("hold")

    def stats(self) -> dict[str, Any]:
        return self.request("get")

    def unmount(self) -> None:
        """Unmounted (lazily if busy) and its process gone; safe to call twice."""
        if self.process.poll() is None:
            with _quiet():
                self.request("delay 0")
        for cmd in (["fusermount3", "-u", "-z"], ["umount", "-l"]):
            if shutil.which(cmd[0]) is None:
                continue
            out = subprocess.run([*cmd, str(self.mountpoint)], capture_output=True, check=False)
            if out.returncode == 0:
                break
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], (ControlError, OSError))  # type: ignore[arg-type]


def mount(backing: Path, mountpoint: Path, control: Path, log: Path) -> SlowFs | str:
    """A slow filesystem mirroring ``backing`` at ``mountpoint`` (both made if absent), no delay
    yet; or why it could not be mounted."""
    if not Path("/dev/fuse").exists():
        return "no /dev/fuse"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"mfusepy (libfuse 3 through ctypes) cannot be loaded: {exc}"
    backing.mkdir(parents=True, exist_ok=True)
    mountpoint.mkdir(parents=True, exist_ok=True)
    control.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        str(backing),
        str(mountpoint),
        str(control),
    ]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    fs = SlowFs(backing, mountpoint, control, proc, log)
    deadline = time.monotonic() + MOUNT_TIMEOUT
    while True:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-500:].strip()
            return f"slowfs exited {proc.returncode} before mounting: {tail}"
        if os.path.ismount(mountpoint) and control.exists():
            try:
                fs.stats()
                return fs
            except ControlError:
                pass
        if time.monotonic() > deadline:
            fs.unmount()
            return f"slowfs did not mount {mountpoint} within {MOUNT_TIMEOUT:g}s"
        time.sleep(0.05)


# -- the filesystem's side ----------------------------------------------------------------------
class Delay:
    """The current delay and what it cost; shared by the FUSE threads and the control thread.
    A change of the delay applies to the operations already waiting too (``delay 0`` lets every
    one go at once)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.held = False  # every delayed operation waits until the next ``delay``
        self.waiting = 0  # operations sleeping or held now
        self.waiting_on: list[str] = []  # each one's name and path
        self.delayed = 0
        self.slept = 0.0
        self.cond = threading.Condition()

    def apply(self, what: str = "") -> None:
        """Waits as long as the delay says (``what``: the operation and its path, shown by
        ``get`` while it waits)."""
        with self.cond:
            if self.seconds <= 0 and not self.held:
                return
            self.waiting += 1
            self.waiting_on.append(what)
            began = time.monotonic()
            try:
                while True:
                    left = None if self.held else self.seconds - (time.monotonic() - began)
                    if left is not None and left <= 0:
                        return
                    self.cond.wait(left)
            finally:
                self.waiting -= 1
                self.waiting_on.remove(what)
                self.delayed += 1
                self.slept += time.monotonic() - began

    def answer(self, line: str) -> dict[str, Any]:
        """The answer to one control request; sets the delay when asked to."""
        words = line.split()
        with self.cond:
            if words == ["get"]:
                return {"ok": True, "delay": self.seconds, "held": self.held,
                        "waiting": self.waiting, "waiting_on": self.waiting_on[:20],
                        "delayed": self.delayed,
                        "slept": round(self.slept, 3)}  # fmt: skip
            if words == ["hold"]:
                self.held = True
                return {"ok": True, "held": True}
            if words[:1] == ["delay"] and len(words) == 2:
                try:
                    seconds = float(words[1])
                except ValueError:
                    seconds = math.nan
                if not 0.0 <= seconds <= MAX_DELAY:  # nan and inf too
                    return {"ok": False, "error": f"delay: must be seconds from 0 to "
                            f"{MAX_DELAY:g}, got {words[1]!r}; the delay stays "
                            f"{self.seconds:g}s"}  # fmt: skip
                self.seconds, self.held = seconds, False
                self.cond.notify_all()
                return {"ok": True, "delay": seconds}
        return {"ok": False, "error": f"unknown request {line.strip()[:80]!r}: "
                "'delay SECONDS', 'hold' or 'get'"}  # fmt: skip


def serve_control(delay: Delay, path: Path) -> None:
    """Answers control requests on the Unix socket ``path`` until the process ends."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = path.with_name(path.name + ".new")
    tmp.unlink(missing_ok=True)
    server.bind(str(tmp))
    server.listen(8)
    os.replace(tmp, path)  # present only once it listens

    def loop() -> None:
        while True:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(5)
                try:
                    data = conn.recv(256)
                    answer = delay.answer(data.decode(errors="replace"))
                    conn.sendall(json.dumps(answer).encode() + b"\n")
                except OSError:
                    continue

    threading.Thread(target=loop, daemon=True, name="control").start()


def make_operations(backing: Path, delay: Delay) -> Any:
    """The passthrough operations (an ``mfusepy.Operations``): paths under ``backing``."""
    import mfusepy

    root = os.fspath(backing)

    def real(path: str) -> str:
        return root + path if path != "/" else root

    def delayed(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any) -> Any:
            delay.apply(f"{fn.__name__} {args[1] if len(args) > 1 else ''}")
            return fn(*args)

        wrapper.__name__ = fn.__name__
        return wrapper

    class Passthrough(mfusepy.Operations):  # type: ignore[misc]
        use_ns = True

        def access(self, path: str, amode: int) -> int:
            if not os.access(real(path), amode):
                raise mfusepy.FuseOSError(errno.EACCES)
            return 0

        def chmod(self, path: str, mode: int) -> int:
            os.chmod(real(path), mode)
            return 0

        def chown(self, path: str, uid: int, gid: int) -> int:
            os.chown(real(path), uid, gid, follow_symlinks=False)
            return 0

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            st = os.lstat(real(path))
            keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks",
                    "st_atime_ns", "st_mtime_ns", "st_ctime_ns", "st_ino", "st_dev")  # fmt: skip
            out = {k.removesuffix("_ns"): getattr(st, k) for k in keys}
            return out

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *os.listdir(real(path))]

        def readlink(self, path: str) -> str:
            return os.readlink(real(path))

        def statfs(self, path: str) -> dict[str, int]:
            st = os.statvfs(real(path))
            keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
                    "f_files", "f_flag", "f_frsize", "f_namemax")  # fmt: skip
            return {k: getattr(st, k) for k in keys}

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
            if times is None:
                os.utime(real(path), follow_symlinks=False)
            else:
                os.utime(real(path), ns=times, follow_symlinks=False)
            return 0

        @delayed
        def open(self, path: str, flags: int) -> int:
            return os.open(real(path), flags)

        @delayed
        def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
            return os.open(real(path), flags | os.O_CREAT, mode)

        @delayed
        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            return os.pread(fh, size, offset)

        @delayed
        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            return os.pwrite(fh, data, offset)

        @delayed
        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            os.truncate(real(path), length)
            return 0

        def flush(self, path: str, fh: int) -> int:
            return 0  # each write went to the backing file already

        def release(self, path: str, fh: int) -> int:
            os.close(fh)
            return 0

        @delayed
        def fsync(self, path: str, datasync: int, fh: int) -> int:
            (os.fdatasync if datasync else os.fsync)(fh)
            return 0

        @delayed
        def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
            fd = os.open(real(path), os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            return 0

        @delayed
        def rename(self, old: str, new: str) -> int:
            os.rename(real(old), real(new))
            return 0

        @delayed
        def unlink(self, path: str) -> int:
            os.unlink(real(path))
            return 0

        @delayed
        def mkdir(self, path: str, mode: int) -> int:
            os.mkdir(real(path), mode)
            return 0

        @delayed
        def rmdir(self, path: str) -> int:
            os.rmdir(real(path))
            return 0

        @delayed
        def mknod(self, path: str, mode: int, dev: int) -> int:
            os.mknod(real(path), mode, dev)
            return 0

        @delayed
        def symlink(self, target: str, source: str) -> int:
            os.symlink(source, real(target))
            return 0

        @delayed
        def link(self, target: str, source: str) -> int:
            os.link(real(source), real(target))
            return 0

    return Passthrough()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: slowfs.py BACKING MOUNTPOINT CONTROL", file=sys.stderr)
        return 2
    import mfusepy

    backing, mountpoint, control = (Path(a).resolve() for a in argv)
    delay = Delay()
    serve_control(delay, control)
    ops = make_operations(backing, delay)
    # foreground, many threads (one slow operation does not hold the others up), the kernel
    # checks permissions as on the backing directory; root's processes and others may use it
    mfusepy.FUSE(ops, str(mountpoint), foreground=True, allow_other=True,
                 default_permissions=True, fsname=f"slowfs:{backing}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
