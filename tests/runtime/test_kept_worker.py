"""A kept worker (``LaunchSpec.attach_name``: it outlives edged) waiting for the next edged, as
a hostile local process would meet it: a real worker process and real ONNX Runtime, no edged.
Only edged's uid, saying the handshake, gets the worker; anything else is hung up on and the
worker keeps waiting; nobody at all within ``orphan_timeout_s``, and it exits by itself."""

from __future__ import annotations

import hashlib
import os
import socket
import time
from dataclasses import replace
from pathlib import Path

import orjson
import psutil
import pytest
from workerprocess import Worker, launch_spec

from edged.runtime.adopting import ATTACH_HELLO
from edged.runtime.framing import HEADER, HEADER_SIZE, FrameType, encode_frame
from edged.runtime.launching import LaunchSpec, SandboxSpec
from edgefleet.demo import TINY_MLP, build_mlp

NOBODY = 65534


def _spec(tmp_path: Path, orphan_s: float) -> LaunchSpec:
    model = build_mlp(tmp_path / "m.onnx", TINY_MLP, seed=1)
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    name = f"edgefleet-test/{os.getpid()}/{tmp_path.name}"
    return replace(
        launch_spec(model, sha, SandboxSpec(mode="off")),
        attach_name=name,
        orphan_timeout_s=orphan_s,
        supervisor_uid=os.geteuid(),
    )


def _connect(name: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect("\0" + name)
    return s


def _frame(s: socket.socket) -> tuple[int, bytes]:
    buf = b""
    while len(buf) < HEADER_SIZE:
        chunk = s.recv(HEADER_SIZE - len(buf))
        if not chunk:
            raise EOFError("hung up")
        buf += chunk
    length, ftype, _ = HEADER.unpack(buf)
    payload = b""
    while len(payload) < length:
        payload += s.recv(length - len(payload))
    return ftype, payload


def _hung_up(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def test_only_edged_gets_a_kept_worker(tmp_path: Path) -> None:
    spec = _spec(tmp_path, orphan_s=60)
    w = Worker(spec)
    try:
        kind, meta = w.first_frame()
        assert kind == "ready"
        w.sock.close()  # edged goes: the worker waits
        time.sleep(0.3)
        assert w.proc.poll() is None

        # the right uid but no handshake: hung up on
        s = _connect(spec.attach_name)
        s.sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert _hung_up(s)
        s.close()

        if os.geteuid() == 0:  # another uid (a worker of its own uid, or anyone): hung up on
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    os.setresgid(NOBODY, NOBODY, NOBODY)
                    os.setresuid(NOBODY, NOBODY, NOBODY)
                    c = _connect(spec.attach_name)
                    r, wr = os.pipe()
                    try:
                        socket.send_fds(c, [ATTACH_HELLO], [wr])
                    except OSError:
                        code = 0  # hung up on before it could even say it
                    else:
                        code = 0 if _hung_up(c) else 2
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0

        # edged: the handshake with its stderr pipe, then READY naming the same pid, PONG
        s = _connect(spec.attach_name)
        r, wr = os.pipe()
        socket.send_fds(s, [ATTACH_HELLO], [wr])
        os.close(wr)
        ftype, payload = _frame(s)
        assert ftype == FrameType.READY
        assert orjson.loads(payload)["pid"] == meta["pid"] == w.proc.pid
        s.sendall(encode_frame(FrameType.PING, 7))
        ftype, _ = _frame(s)
        assert ftype == FrameType.PONG
        assert os.fstat(r).st_ino == os.stat(f"/proc/{w.proc.pid}/fd/2").st_ino
        s.sendall(encode_frame(FrameType.DRAIN, 0))  # told to stop, it stops
        assert w.proc.wait(30) == 0
        s.close()
        os.close(r)
    finally:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait(10)


def test_a_kept_worker_nobody_comes_back_for_exits(tmp_path: Path) -> None:
    w = Worker(_spec(tmp_path, orphan_s=1.0))
    try:
        assert w.first_frame()[0] == "ready"
        w.sock.close()
        started = time.monotonic()
        assert w.proc.wait(30) == 0
        assert time.monotonic() - started >= 0.9
    finally:
        if w.proc.poll() is None:
            w.proc.kill()


@pytest.mark.parametrize("kept", [False, True])
def test_a_worker_dies_with_its_parent_unless_kept(tmp_path: Path, kept: bool) -> None:
    """PR_SET_PDEATHSIG: a worker that is not kept dies with the process that started it."""
    import subprocess
    import sys

    spec = _spec(tmp_path, orphan_s=30)
    if not kept:
        spec = replace(spec, attach_name="")
    program = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); from workerprocess import Worker; "
        "from edged.runtime.launching import LaunchSpec; import orjson; "
        "w = Worker(LaunchSpec.from_json(orjson.loads(sys.argv[2]))); w.first_frame(); "
        "print(w.proc.pid, flush=True); time.sleep(60)"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", program, str(Path(__file__).parent), orjson.dumps(spec.to_json())],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    time.sleep(1.0)
    try:
        alive = psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        alive = False
    try:
        assert alive == kept
    finally:
        if alive:
            os.kill(pid, 9)
