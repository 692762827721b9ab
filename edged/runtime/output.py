"""What workers write to stderr: read by edged from a pipe per process, kept per replica slot.

Each worker process gets a pipe for its stderr (``processes.py``); edged reads it with an
asyncio read-pipe protocol (one fd on the loop: nothing runs while a worker is silent) and
splits it into lines:

* a line longer than :data:`MAX_LINE` bytes is cut (and says so); the rest of it, up to its
  newline, is dropped without being buffered, so a worker that writes without newlines costs
  edged at most ``MAX_LINE`` bytes;
* each line goes into its slot's :class:`OutputRing` (the newest :data:`RING_LINES`, oldest
  dropped), which ``edgectl logs device/NAME [WORKLOAD]`` reads through the hub, and is
  forwarded to edged's own log (event ``worker output``, with the replica and workload named)
  so it reaches journald as before — at most :data:`FORWARD_PER_S` lines per second per
  replica; beyond that the ring still keeps them and edged logs how many it did not forward.
  A line is forwarded at the level it states of itself (:func:`worker_line_level`: an
  onnxruntime severity letter, a JSON record's ``level``, a traceback), else at warning, so
  ``journalctl -u edged -p warning`` leaves out a worker's informational chatter.

The ring belongs to the replica slot, not to the process, so the last lines of a worker that
crashed are still there after it restarted.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from edgefleet.logs import MAX_RECENT_LINE, get_logger, timestamp

log = get_logger(__name__)

MAX_LINE = 1024
"""Bytes of one line kept; a longer line is cut and ends with :data:`CUT_MARK`."""
CUT_MARK = " [cut short]"
RING_LINES = 200
"""Lines kept per replica slot."""
FORWARD_PER_S = 50
"""Lines per second per replica forwarded to edged's own log (journald); the rest are counted."""
WORKER_OUTPUT_EVENT = "worker output"
_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colours (onnxruntime's warnings)
# onnxruntime's own log lines: "2026-12-06 02:44:53.1 [W:onnxruntime:Default, ...] ..."
_ORT_SEVERITY = re.compile(r"\[([VIWEF]):onnxruntime:")
_ORT_LEVELS = {
    "V": logging.DEBUG,
    "I": logging.INFO,
    "W": logging.WARNING,
    "E": logging.ERROR,
    "F": logging.CRITICAL,
}
_JSON_LEVEL = re.compile(r'^\{.*"level":\s*"(debug|info|warning|error|critical)"')
_NAMED_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


def worker_line_level(text: str) -> int:
    """Pure: the logging level a worker's stderr line is forwarded at: what the line states of
    itself, else warning (a worker's stderr is out of band: unknown text is worth seeing)."""
    found = _ORT_SEVERITY.search(text[:160])
    if found is not None:
        return _ORT_LEVELS[found[1]]
    found = _JSON_LEVEL.match(text)
    if found is not None:
        return _NAMED_LEVELS[found[1]]
    if text.startswith("Traceback (most recent call last)"):
        return logging.ERROR
    return logging.WARNING


@dataclass(frozen=True, slots=True)
class OutputLine:
    at: float  # wall-clock time edged read it (time.time())
    text: str


class OutputRing:
    """The newest lines one replica slot's processes wrote to stderr."""

    __slots__ = ("_forward_left", "_forward_window", "_suppressed", "lines", "replica", "workload")

    def __init__(self, replica: str, workload: str, capacity: int = RING_LINES) -> None:
        self.replica = replica
        self.workload = workload
        self.lines: deque[OutputLine] = deque(maxlen=capacity)
        self._forward_window = 0
        self._forward_left = FORWARD_PER_S
        self._suppressed = 0

    def add(self, text: str, now: float) -> None:
        self.lines.append(OutputLine(now, text))
        second = int(now)
        if second != self._forward_window:
            if self._suppressed:
                log.warning(
                    "worker output not forwarded",
                    replica=self.replica,
                    workload=self.workload,
                    lines=self._suppressed,
                    limit_per_s=FORWARD_PER_S,
                )
                self._suppressed = 0
            self._forward_window = second
            self._forward_left = FORWARD_PER_S
        if self._forward_left > 0:
            self._forward_left -= 1
            log.at(  # at the level the line states, else warning (worker_line_level)
                worker_line_level(text),
                WORKER_OUTPUT_EVENT,
                replica=self.replica,
                workload=self.workload,
                stream="stderr",
                line=text,
            )
        else:
            self._suppressed += 1

    def records(self) -> list[tuple[float, str]]:
        """Each line as ``(time, JSON log record)``, oldest first, in the shape of edged's own
        records (event ``worker output``), each at most :data:`MAX_RECENT_LINE` characters
        (what the hub accepts per line)."""
        return [(line.at, self._record(line)) for line in self.lines]

    def _record(self, line: OutputLine) -> str:
        text = line.text
        level = logging.getLevelName(worker_line_level(text)).lower()
        while True:
            record = orjson.dumps(
                {
                    "ts": timestamp(line.at),
                    "level": level,
                    "logger": "worker",
                    "event": WORKER_OUTPUT_EVENT,
                    "replica": self.replica,
                    "workload": self.workload,
                    "stream": "stderr",
                    "line": text,
                }
            ).decode()
            if len(record) <= MAX_RECENT_LINE:
                return record
            # JSON escapes (quotes, control characters) made it longer: cut the text further
            over = len(record) - MAX_RECENT_LINE
            keep = len(text) - len(CUT_MARK) - over if over < len(text) // 2 else len(text) // 2
            text = text[:keep].removesuffix(CUT_MARK) + CUT_MARK


class OutputReader(asyncio.Protocol):
    """Reads one worker process's stderr pipe into its slot's ring, line by line."""

    def __init__(self, ring: OutputRing, clock: Callable[[], float] = time.time) -> None:
        self._ring = ring
        self._clock = clock
        self._partial = bytearray()
        self._cut = False  # the current line was cut: drop bytes up to its newline
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        start = 0
        n = len(data)
        while start < n:
            end = data.find(b"\n", start)
            if end < 0:
                self._more(data, start, n)
                return
            self._more(data, start, end)
            self._line_done()
            start = end + 1

    def _more(self, data: bytes, start: int, stop: int) -> None:
        if self._cut:
            return
        room = MAX_LINE - len(self._partial)
        if stop - start > room:
            self._partial += data[start : start + room]
            self._emit(self._partial.decode("utf-8", "replace") + CUT_MARK)
            self._partial.clear()
            self._cut = True
        else:
            self._partial += data[start:stop]

    def _line_done(self) -> None:
        if self._cut:
            self._cut = False
            return
        self._emit(self._partial.decode("utf-8", "replace"))
        self._partial.clear()

    def _emit(self, text: str) -> None:
        text = _TERMINAL_CODES.sub("", text.rstrip("\r"))
        if text:
            self._ring.add(text, self._clock())

    def eof_received(self) -> bool | None:
        if self._partial and not self._cut:
            self._emit(self._partial.decode("utf-8", "replace"))
        self._partial.clear()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._partial and not self._cut:
            self._emit(self._partial.decode("utf-8", "replace"))
        self._partial.clear()
        if not self.closed.done():
            self.closed.set_result(None)


def merge_records(sources: list[list[tuple[float, str]]], count: int) -> list[str]:
    """The newest ``count`` records of several time-ordered sources, oldest first."""
    import heapq

    merged = list(heapq.merge(*sources, key=lambda r: r[0]))
    return [text for _, text in merged[-count:]] if count > 0 else []
