"""Clock jumps on a device for the soak harness: its wall clock stepped forward or back while
its monotonic clock runs on, as ``date -s`` or an NTP step does on a real device.

``clockshim.c`` (beside this file) is an LD_PRELOAD library compiled here at run time (``cc``)
that adds the offset in a small file (a native int64 of nanoseconds) to every read of the
wall clock. The device's edged is started with it in its environment, and its workers inherit
it: the whole device's clock jumps. Hubs and etcd keep the true time. :class:`DeviceClock`
rewrites the offset in place (one aligned 8-byte store into a shared mapping, which the
processes read on each clock read).

Where the library cannot be built, :func:`build_shim` says why and the run reports the fault
kind as not run here, naming the reason."""

from __future__ import annotations

import hashlib
import mmap
import os
import shutil
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SOURCE = Path(__file__).with_name("clockshim.c")
OFFSET_ENV = "SOAK_CLOCK_OFFSET_FILE"
_OFFSET = struct.Struct("q")  # native, aligned: packed with one 8-byte store, as the shim loads


def build_shim(directory: Path) -> Path | str:
    """The shim compiled into ``directory`` (once per source: its name holds the source's
    hash); or why it could not be built."""
    source = SOURCE.read_bytes()
    out = directory / f"clockshim-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if out.exists():
        return out
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return "no C compiler (cc) to build tests/soak/clockshim.c"
    directory.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    cmd = [cc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(tmp), str(SOURCE), "-ldl"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cc: {exc}"
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        return f"cc clockshim.c: {done.stderr.strip()[-400:] or done.returncode}"
    tmp.replace(out)
    return out


@dataclass
class DeviceClock:
    """One device's wall clock: ``jump(seconds)`` steps it (from the true time), ``correct()``
    steps it back, as NTP would. ``env()`` is what its processes are started with."""

    shim: Path
    path: Path
    offset: float = 0.0
    _map: mmap.mmap | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, _OFFSET.pack(0))
            self._map = mmap.mmap(fd, _OFFSET.size, mmap.MAP_SHARED, mmap.PROT_WRITE)
        finally:
            os.close(fd)

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        preload = [str(self.shim), *filter(None, env.get("LD_PRELOAD", "").split(":"))]
        env["LD_PRELOAD"] = ":".join(preload)
        env[OFFSET_ENV] = str(self.path)
        return env

    def jump(self, seconds: float) -> None:
        """The wall clock reads ``seconds`` from the true time from now on."""
        assert self._map is not None
        _OFFSET.pack_into(self._map, 0, round(seconds * 1e9))  # one aligned 8-byte store
        self.offset = seconds

    def correct(self) -> None:
        self.jump(0.0)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None


def make(directory: Path, name: str) -> DeviceClock | str:
    """A clock for device ``name`` (its offset file in ``directory``); or why there is none."""
    shim = build_shim(directory / "clockshim")
    if isinstance(shim, str):
        return shim
    return DeviceClock(shim, directory / f"{name}.clock")
