"""The slow-I/O filesystem itself (``slowfs.py``): a real FUSE mount passes through what edged
does in its data directory, delays I/O while told to, stops delaying when told, and refuses a
wrong control request saying why. The waits are on the filesystem's own counters, never on
the clock."""

from __future__ import annotations

import fcntl
import os
import socket
import threading
from pathlib import Path

import pytest
from slowfs import MAX_DELAY, ControlError, Delay, SlowFs

from edgefleet.persisting import read_json, write_json_atomic


def test_the_atomic_write_pattern_works_through_it(slow_dir: SlowFs) -> None:
    state = slow_dir.mountpoint / "state" / "desired.json"
    write_json_atomic(state, {"generation": 1})
    write_json_atomic(state, {"generation": 2})  # the rename replaces the first
    assert read_json(state) == {"generation": 2}
    backing = slow_dir.backing / "state"
    assert os.listdir(backing) == ["desired.json"]  # no temporary file left
    assert read_json(backing / "desired.json") == {"generation": 2}
    assert os.stat(state).st_mode & 0o777 == 0o600


def test_sockets_locks_and_symlinks_pass_through(slow_dir: SlowFs) -> None:
    """What else edged does in its data directory: Unix sockets (edged.sock, infer.sock), an
    exclusive flock (edged.lock), symlinks (model configs, secrets)."""
    m = slow_dir.mountpoint
    path = str(m / "edged.sock")
    with socket.socket(socket.AF_UNIX) as server, socket.socket(socket.AF_UNIX) as client:
        server.bind(path)
        server.listen(1)
        client.connect(path)
        conn, _ = server.accept()
        with conn:
            client.sendall(b"ping")
            assert conn.recv(4) == b"ping"
    a = os.open(m / "edged.lock", os.O_RDWR | os.O_CREAT, 0o600)
    b = os.open(m / "edged.lock", os.O_RDWR)
    try:
        fcntl.flock(a, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(BlockingIOError):
            fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(a)
        os.close(b)
    (m / "v1").mkdir()
    (m / "v1" / "config.json").write_text("{}")
    os.symlink("v1", m / "current")
    assert os.readlink(m / "current") == "v1"
    assert (m / "current" / "config.json").read_text() == "{}"


def test_the_delay_is_applied_and_removed(slow_dir: SlowFs) -> None:
    path = slow_dir.mountpoint / "state.json"
    write_json_atomic(path, {"n": 0})
    assert slow_dir.stats()["delayed"] == 0  # no delay: nothing waited
    slow_dir.set_delay(0.05)
    write_json_atomic(path, {"n": 1})
    stats = slow_dir.stats()
    # create, write, fsync, rename, fsync of the directory: each waited
    assert stats["delay"] == 0.05 and stats["delayed"] >= 5
    assert stats["slept"] >= 5 * 0.05
    slow_dir.normal()
    before = slow_dir.stats()["delayed"]
    write_json_atomic(path, {"n": 2})
    assert slow_dir.stats()["delayed"] == before
    assert read_json(path) == {"n": 2}


def test_a_held_write_waits_until_the_delay_is_cleared(slow_dir: SlowFs) -> None:
    path = slow_dir.mountpoint / "state.json"
    slow_dir.hold()
    done = threading.Event()
    writer = threading.Thread(target=lambda: (write_json_atomic(path, {"n": 1}), done.set()))
    writer.start()
    try:
        poll = threading.Event()
        while slow_dir.stats()["waiting"] == 0:  # the write is in the filesystem, held
            poll.wait(0.02)
        assert not done.is_set()
        assert slow_dir.stats()["waiting_on"] == [f"create /.state.json.{os.getpid()}.tmp"]
        assert os.stat(slow_dir.mountpoint).st_ino  # a stat is not held
    finally:
        slow_dir.normal()
        writer.join(30)
    assert done.is_set() and read_json(path) == {"n": 1}


@pytest.mark.parametrize(
    "line, error",
    [
        ("delay abc", "delay: must be seconds from 0 to 10, got 'abc'; the delay stays 0.2s"),
        ("delay -1", "got '-1'"),
        (f"delay {MAX_DELAY + 1:g}", "got '11'"),
        ("delay nan", "got 'nan'"),
        ("delay inf", "got 'inf'"),
        ("speed 3", "unknown request 'speed 3': 'delay SECONDS', 'hold' or 'get'"),
        ("delay", "unknown request 'delay'"),
    ],
)
def test_a_wrong_control_request_is_refused_and_changes_nothing(
    slow_dir: SlowFs, line: str, error: str
) -> None:
    slow_dir.set_delay(0.2)
    with pytest.raises(ControlError, match=error.replace(".", r"\.").replace("(", r"\(")):
        slow_dir.request(line)
    assert slow_dir.stats()["delay"] == 0.2


def test_unmount_is_clean_and_safe_twice(tmp_path: Path, slow_dir: SlowFs) -> None:
    (slow_dir.mountpoint / "kept").write_text("x")
    slow_dir.unmount()
    assert not os.path.ismount(slow_dir.mountpoint)
    assert slow_dir.process.poll() is not None
    assert (slow_dir.backing / "kept").read_text() == "x"
    slow_dir.unmount()  # the fixture's teardown does it again


def test_the_control_answers_are_a_table() -> None:
    """The control protocol alone, no mount (pure but for the delay it sets)."""
    d = Delay()
    assert d.answer("get") == {"ok": True, "delay": 0.0, "held": False, "waiting": 0,
                               "waiting_on": [], "delayed": 0, "slept": 0.0}  # fmt: skip
    assert d.answer("delay 1.5") == {"ok": True, "delay": 1.5}
    assert d.answer("hold") == {"ok": True, "held": True}
    assert d.answer("delay 0") == {"ok": True, "delay": 0.0} and not d.held
    assert not d.answer("delay 1e9")["ok"] and d.seconds == 0.0
