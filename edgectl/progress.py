"""Progress of long transfers (``models push``), on stderr: on a terminal a bar redrawn in place
(bytes, rate, ETA), otherwise a plain line every :data:`LINE_EVERY_S` seconds, and a last
line when done. ``describe`` is pure (tested as a table); :class:`Progress` does the writing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

LINE_EVERY_S = 5.0
REDRAW_EVERY_S = 0.1
BAR_WIDTH = 24


def size(n: float) -> str:
    """``512 B``, ``1.5 KiB``, ``101.0 MiB``, ``2.3 GiB``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def duration(seconds: float) -> str:
    """``7s``, ``2m05s``, ``1h02m``."""
    s = max(0, round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def describe(done: int, total: int, elapsed: float, *, bar: bool) -> str:
    """One progress line: ``[#####.....] 45% 45.0 MiB/101.0 MiB 12.0 MiB/s ETA 5s``. Pure."""
    fraction = done / total if total else 1.0
    rate = done / elapsed if elapsed > 0 else 0.0
    parts = []
    if bar:
        filled = int(fraction * BAR_WIDTH)
        parts.append("[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]")
    parts += [f"{int(fraction * 100):3d}%", f"{size(done)}/{size(total)}", f"{size(rate)}/s"]
    if done < total:
        parts.append(f"ETA {duration((total - done) / rate)}" if rate > 0 else "ETA -")
    else:
        parts.append(f"in {duration(elapsed)}")
    return " ".join(parts)


class Progress:
    """``update(done)`` as bytes go out, ``finish()`` at the end."""

    def __init__(
        self,
        what: str,
        total: int,
        *,
        out: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        terminal: bool | None = None,
    ) -> None:
        self.what = what
        self.total = total
        self.out = out or sys.stderr
        self.clock = clock
        self.terminal = self.out.isatty() if terminal is None else terminal
        self.started = clock()
        self._last = self.started
        self._done = 0

    def _write(self, final: bool) -> None:
        line = f"{self.what} " + describe(
            self._done, self.total, self.clock() - self.started, bar=self.terminal
        )
        if self.terminal:
            self.out.write("\r\x1b[K" + line + ("\n" if final else ""))
        else:
            self.out.write(line + "\n")
        self.out.flush()

    def update(self, done: int) -> None:
        self._done = done
        now = self.clock()
        if now - self._last >= (REDRAW_EVERY_S if self.terminal else LINE_EVERY_S):
            self._last = now
            self._write(final=False)

    def finish(self) -> None:
        self._done = self.total
        self._write(final=True)
