"""Workers' stderr: a real pipe read by the asyncio protocol edged uses, split into bounded
lines, kept in a bounded ring per replica slot, forwarded to edged's log at a bounded rate,
and merged with edged's own records by time for ``edgectl logs``."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import orjson
import pytest

from edged.runtime import output
from edged.runtime.output import (
    CUT_MARK,
    FORWARD_PER_S,
    MAX_LINE,
    OutputReader,
    OutputRing,
    merge_records,
    worker_line_level,
)
from edgefleet.logs import MAX_RECENT_LINE, RecentLines


async def _read_from_process(ring: OutputRing, program: str) -> None:
    """Run ``program`` with its stderr on a pipe read as edged reads a worker's."""
    loop = asyncio.get_running_loop()
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", program, stderr=write_fd)
    os.close(write_fd)
    transport, reader = await loop.connect_read_pipe(
        lambda: OutputReader(ring), os.fdopen(read_fd, "rb", buffering=0)
    )
    await asyncio.wait_for(reader.closed, 30)
    transport.close()
    assert await asyncio.wait_for(proc.wait(), 30) == 0


def lines(ring: OutputRing) -> list[str]:
    return [line.text for line in ring.lines]


def test_lines_from_a_real_process_pipe() -> None:
    ring = OutputRing("det-abc-0", "det")
    program = (
        "import sys\n"
        "sys.stderr.write('first line\\nsecond ')\n"
        "sys.stderr.flush()\n"
        "sys.stderr.write('line\\r\\n\\n' + 'x' * 5000 + '\\nafter the long one\\nno newline')\n"
    )
    asyncio.run(_read_from_process(ring, program))
    got = lines(ring)
    assert got[:2] == ["first line", "second line"]
    assert got[2] == "x" * MAX_LINE + CUT_MARK  # cut, and the rest up to its newline dropped
    assert got[3:] == ["after the long one", "no newline"]


def test_a_line_without_newlines_costs_at_most_one_line_of_memory() -> None:
    async def run() -> OutputReader:
        reader = OutputReader(ring)
        for _ in range(1000):
            reader.data_received(b"y" * 4096)
            assert len(reader._partial) <= MAX_LINE
        reader.data_received(b"\nend\n")
        return reader

    ring = OutputRing("r", "w")
    asyncio.run(run())
    assert lines(ring) == ["y" * MAX_LINE + CUT_MARK, "end"]


def test_bad_utf8_is_replaced_and_colours_removed() -> None:
    async def run() -> None:
        reader = OutputReader(ring)
        reader.data_received(b"caf\xe9\n")
        reader.data_received(b"\x1b[0;93m2026 [W:onnxruntime:Default] warned\x1b[m\n")

    ring = OutputRing("r", "w")
    asyncio.run(run())
    assert lines(ring) == ["caf\ufffd", "2026 [W:onnxruntime:Default] warned"]


def test_the_ring_keeps_the_newest_lines() -> None:
    ring = OutputRing("r", "w", capacity=3)
    for i in range(10):
        ring.add(f"line {i}", 1000.0 + i)
    assert lines(ring) == ["line 7", "line 8", "line 9"]
    records = [orjson.loads(text) for _, text in ring.records()]
    assert [r["line"] for r in records] == ["line 7", "line 8", "line 9"]
    assert records[0]["replica"] == "r" and records[0]["workload"] == "w"
    assert records[0]["event"] == "worker output" and records[0]["stream"] == "stderr"


@pytest.mark.parametrize("char", ['"', "\x01", "\\", "é", "x"])
def test_every_record_fits_the_hubs_bound_on_a_line(char: str) -> None:
    """JSON escapes can make a 1 KiB line six times longer: the record is cut to fit what the
    hub accepts (else it would refuse the whole answer)."""
    ring = OutputRing("det-abc-0", "det")
    ring.add(char * MAX_LINE + CUT_MARK, 1000.0)
    ((_, record),) = ring.records()
    assert len(record) <= MAX_RECENT_LINE
    doc = orjson.loads(record)
    assert doc["line"].startswith(char) and doc["replica"] == "det-abc-0"


def test_forwarding_to_edgeds_log_is_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    ring = OutputRing("det-abc-0", "det")
    with caplog.at_level(logging.INFO, logger=output.__name__):
        for i in range(FORWARD_PER_S + 30):
            ring.add(f"line {i}", 5000.2)
        ring.add("next second", 5001.1)
    forwarded = [r for r in caplog.records if r.msg == "worker output"]
    assert len(forwarded) == FORWARD_PER_S + 1  # the first second's share, then the next
    assert forwarded[-1].fields["line"] == "next second"  # type: ignore[attr-defined]
    assert forwarded[0].fields["replica"] == "det-abc-0"  # type: ignore[attr-defined]
    (dropped,) = [r for r in caplog.records if r.msg == "worker output not forwarded"]
    assert dropped.fields["lines"] == 30  # type: ignore[attr-defined]
    assert len(ring.lines) == FORWARD_PER_S + 31  # the ring kept every line


def test_edgeds_records_and_worker_lines_merge_by_time() -> None:
    edged = [(1.0, "e1"), (3.0, "e3"), (5.0, "e5")]
    rep_a = [(2.0, "a2"), (6.0, "a6")]
    rep_b = [(4.0, "b4")]
    assert merge_records([edged, rep_a, rep_b], 100) == ["e1", "a2", "e3", "b4", "e5", "a6"]
    assert merge_records([edged, rep_a, rep_b], 2) == ["e5", "a6"]
    assert merge_records([edged], 0) == []


def test_recent_lines_skip_what_is_kept_per_replica() -> None:
    recent = RecentLines(10, skip_events=frozenset({"worker output"}))
    log = logging.getLogger("test-recent")
    log.addHandler(recent)
    log.setLevel(logging.INFO)
    try:
        log.info("worker output", extra={"fields": {"replica": "det-abc-0", "line": "x"}})
        log.info("replica ready", extra={"fields": {"replica": "det-abc-0"}})
    finally:
        log.removeHandler(recent)
    records = recent.records("det")
    assert [orjson.loads(text)["event"] for _, text in records] == ["replica ready"]
    assert recent.tail(5, "det") == [records[0][1]]


LINE_LEVELS = {
    "onnxruntime warning": (
        "2026-12-06 02:44:53.100 [W:onnxruntime:Default, graph.cc:3490 CleanUnusedInitializers]"
        " Removing initializer 'x'",
        logging.WARNING,
    ),
    "onnxruntime info": ("2026-12-06 02:44:53 [I:onnxruntime:, session.cc:1] x", logging.INFO),
    "onnxruntime verbose": ("2026-12-06 [V:onnxruntime:, x.cc:1] y", logging.DEBUG),
    "onnxruntime error": ("2026-12-06 [E:onnxruntime:, x.cc:1] y", logging.ERROR),
    "onnxruntime fatal": ("2026-12-06 [F:onnxruntime:, x.cc:1] y", logging.CRITICAL),
    "a JSON record at info": (
        '{"ts": "x", "level": "info", "event": "model loaded"}',
        logging.INFO,
    ),
    "a JSON record at error": ('{"level":"error","event":"x"}', logging.ERROR),
    "a traceback": ("Traceback (most recent call last):", logging.ERROR),
    "anything else: warning": ("numpy/core.py:12: RuntimeWarning: overflow", logging.WARNING),
    "text that merely mentions a level: warning": ('says "level": "info" later', logging.WARNING),
}


@pytest.mark.parametrize(("text", "level"), LINE_LEVELS.values(), ids=LINE_LEVELS)
def test_worker_line_level(text: str, level: int) -> None:
    assert worker_line_level(text) == level


def test_worker_lines_are_forwarded_at_their_own_level(caplog: pytest.LogCaptureFixture) -> None:
    ring = OutputRing("det-abc-0", "det")
    with caplog.at_level(logging.DEBUG, logger=output.__name__):
        ring.add("2026-12-06 [I:onnxruntime:, session.cc:1] loaded", 7000.0)
        ring.add("Traceback (most recent call last):", 7000.1)
    forwarded = [(r.levelno, r.msg) for r in caplog.records]
    assert forwarded == [(logging.INFO, "worker output"), (logging.ERROR, "worker output")]
    assert [orjson.loads(rec)["level"] for _, rec in ring.records()] == ["info", "error"]
