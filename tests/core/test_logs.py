"""Logs: RFC 3339 timestamps, the journald form (syslog priority prefixes when stderr is the
journal, as systemd says with $JOURNAL_STREAM), gRPC's glog lines kept out, and one naming
scheme for every event in the tree. Real subprocesses, real file descriptors; no journald in
the test machine, so the stream protocol (``<N>`` then the line) is parsed as journald does."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[2]
RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")

PROGRAM = """
import logging, sys
from edgefleet.logs import configure_logging, get_logger
configure_logging("debug", json_output=True)
log = get_logger("test")
log.debug("debugging", n=1)
log.info("worker started", model="m", pid=3)
log.warning("hub link broken", code="UNAVAILABLE")
log.error("component failed", token="abcdef.0123456789abcdef")
"""


def _run(tmp_path: Path, program: str, *, journal: bool) -> list[str]:
    err = tmp_path / "stderr"
    with open(err, "wb") as f:
        st = os.fstat(f.fileno())
        env = {k: v for k, v in os.environ.items() if k not in ("JOURNAL_STREAM", "GRPC_VERBOSITY")}
        if journal:
            env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        subprocess.run([sys.executable, "-c", program], stderr=f, env=env, check=True, timeout=60)
    return err.read_text().splitlines()


def _journal_entries(lines: list[str]) -> list[tuple[int, dict[str, object]]]:
    """What journald makes of the lines: (priority, message), the ``<N>`` prefix read."""
    entries = []
    for line in lines:
        found = re.fullmatch(r"<([0-7])>(.*)", line)
        assert found, f"no priority prefix: {line!r}"
        entries.append((int(found[1]), orjson.loads(found[2])))
    return entries


def test_json_lines_have_rfc3339_times_and_no_prefix_off_the_journal(tmp_path: Path) -> None:
    lines = _run(tmp_path, PROGRAM, journal=False)
    docs = [orjson.loads(line) for line in lines]
    assert [d["event"] for d in docs] == [
        "debugging", "worker started", "hub link broken", "component failed",
    ]  # fmt: skip
    assert all(RFC3339.fullmatch(str(d["ts"])) for d in docs)
    assert docs[3]["token"] == "<redacted>"


def test_the_journald_form_carries_syslog_priorities(tmp_path: Path) -> None:
    entries = _journal_entries(_run(tmp_path, PROGRAM, journal=True))
    assert [(p, m["event"]) for p, m in entries] == [
        (7, "debugging"), (6, "worker started"), (4, "hub link broken"), (3, "component failed"),
    ]  # fmt: skip
    assert entries[1][1]["model"] == "m" and RFC3339.fullmatch(str(entries[1][1]["ts"]))


UNCAUGHT = """
import warnings
from edgefleet.logs import configure_logging, get_logger
configure_logging("info", json_output=True)
warnings.warn("a deprecated thing", DeprecationWarning, stacklevel=1)
get_logger("test").info("worker started")
raise RuntimeError("boom")
"""


def test_warnings_and_a_crash_carry_priorities_on_the_journal(tmp_path: Path) -> None:
    """Nothing edged's Python writes reaches the journal unprefixed (where it would take the
    unit's default priority): warnings are warning records, a crash one critical record."""
    err = tmp_path / "stderr"
    with open(err, "wb") as f:
        st = os.fstat(f.fileno())
        env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
        env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        env["PYTHONWARNINGS"] = "always"
        done = subprocess.run(
            [sys.executable, "-c", UNCAUGHT], check=False, stderr=f, env=env, timeout=60
        )
    assert done.returncode == 1
    lines = err.read_text().splitlines()
    assert all(re.match(r"<[0-7]>", line) for line in lines), lines
    heads = [(int(line[1]), orjson.loads(line[3:])) for line in lines if line[3:].startswith("{")]
    assert [(p, d["event"].split(":")[0] if p == 4 else d["event"]) for p, d in heads] == [
        (4, "<string>"),  # py.warnings: "<string>:3: DeprecationWarning: a deprecated thing"
        (6, "worker started"),
        (2, "uncaught exception"),
    ]
    assert "RuntimeError: boom" in heads[2][1]["exc"]


def test_a_journal_stream_that_is_not_stderr_is_ignored(tmp_path: Path) -> None:
    program = PROGRAM.replace(
        "import logging, sys", "import os\nos.environ['JOURNAL_STREAM'] = '1:2'"
    )
    assert _run(tmp_path, program, journal=False)[0].startswith("{")


def test_grpc_glog_lines_stay_out(tmp_path: Path) -> None:
    program = """
import os, subprocess
from concurrent import futures
from edgefleet.logs import configure_logging
configure_logging("info")
import grpc
server = grpc.server(futures.ThreadPoolExecutor(2))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
channel = grpc.insecure_channel(f"127.0.0.1:{port}")
grpc.channel_ready_future(channel).result(timeout=10)
for _ in range(3):  # a worker start: fork while gRPC has threads
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
server.stop(None)
"""
    lines = _run(tmp_path, program, journal=False)
    assert not [line for line in lines if re.match(r"[IWE]\d{4} ", line)], lines


def _events() -> list[tuple[str, int, str]]:
    found = []
    for package in ("edged", "hub", "edgectl", "edgefleet"):
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "log"
                    and node.func.attr in ("debug", "info", "warning", "error", "exception")
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)
                ):
                    found.append((str(path.relative_to(ROOT)), node.lineno, node.args[0].value))
    return found


def test_event_names_follow_one_scheme() -> None:
    events = _events()
    assert len(events) > 50
    words = re.compile(r"[a-z][a-zA-Z0-9_.-]*( [a-zA-Z0-9_.,():/%-]+)*")  # no double spaces
    kebab = re.compile(r"[a-z0-9]+(-[a-z0-9]+)+")  # hub-serving: the other scheme
    wrong = [e for e in events if not words.fullmatch(e[2]) or kebab.fullmatch(e[2])]
    assert not wrong, "event names are lowercase words separated by spaces: " + repr(wrong)


@pytest.mark.parametrize("level", ["debug", "info", "warning", "error"])
def test_priorities(level: str) -> None:
    import logging

    from edgefleet.logs import syslog_priority

    assert syslog_priority(getattr(logging, level.upper())) == {
        "debug": 7, "info": 6, "warning": 4, "error": 3,
    }[level]  # fmt: skip


def test_recent_lines_are_bounded_cut_and_filtered_by_workload() -> None:
    """The ring edgectl logs reads (through the hub): the newest records as JSON lines, at most
    ``capacity`` of them, each at most MAX_RECENT_LINE characters, by workload if asked."""
    import logging as std_logging

    from edgefleet.logs import MAX_RECENT_LINE, RecentLines, get_logger

    ring = RecentLines(capacity=5)
    logger = std_logging.getLogger("test.recent")
    logger.setLevel(std_logging.INFO)
    logger.addHandler(ring)
    try:
        log = get_logger("test.recent")
        for i in range(4):
            log.info("worker started", workload="det" if i % 2 else "cls", slot=i)
        log.info("replica ready", replica="det-3f2a9c-0")
        log.warning("artifact refused", workload="det", message="x" * 5000)
        log.info("hub connected")
    finally:
        logger.removeHandler(ring)
    every = ring.tail(100)
    assert len(every) == 5  # the oldest went
    assert json.loads(every[-1])["event"] == "hub connected"
    det = ring.tail(100, "det")
    assert [json.loads(line).get("slot") for line in det[:2]] == [3, None]
    assert json.loads(det[1])["event"] == "replica ready"
    assert len(det[-1]) == MAX_RECENT_LINE and det[-1].endswith(" [cut short]")
    assert ring.tail(1, "det") == det[-1:] and ring.tail(0) == []


def test_a_log_request_is_answered_with_the_newest_lines() -> None:
    from edged.hublink.linking import answer_log_request
    from edgefleet.v1 import device_pb2

    lines = [f"line {i}" for i in range(5000)]
    asked: list[tuple[int, str]] = []

    def recent(tail: int, workload: str) -> list[str]:
        asked.append((tail, workload))
        return lines[-tail:]

    request = device_pb2.DeviceLogRequest(request_id=7, workload="det", tail=5000)
    answer = answer_log_request(request, recent).log_lines
    assert (answer.request_id, len(answer.lines), answer.lines[-1]) == (7, 1000, "line 4999")
    assert asked == [(1000, "det")]  # bounded before asking
    default = answer_log_request(device_pb2.DeviceLogRequest(request_id=8), recent).log_lines
    assert len(default.lines) == 100
    assert list(answer_log_request(request, None).log_lines.lines) == []
