"""A real worker process (``python -m edged.runtime.worker``) started without edged: its end
of a socket pair, its LaunchSpec, and the frames it answers with. Real kernel, real ONNX
Runtime; nothing faked."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from edged.runtime.framing import HEADER, HEADER_SIZE, FrameType
from edged.runtime.launching import LaunchSpec, LimitsSpec, SandboxSpec

REPO = Path(__file__).resolve().parents[2]


def launch_spec(artifact: Path, sha256: str, sandbox: SandboxSpec) -> LaunchSpec:
    return LaunchSpec(
        replica_id="w-0",
        workload="w",
        model_name="mlp",
        model_version="1",
        artifact_path=str(artifact),
        artifact_sha256=sha256,
        providers=("CPUExecutionProvider",),
        intra_op_threads=1,
        max_batch_size=8,
        max_queue_delay_s=0.002,
        limits=LimitsSpec(),
        sandbox=sandbox,
    )


class Worker:
    """One started worker; :meth:`first_frame` is READY (metadata) or FAILED (reason)."""

    def __init__(self, spec: LaunchSpec, *, env: dict[str, str] | None = None) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        environ = dict(os.environ)
        environ["PYTHONPATH"] = str(REPO)
        environ.setdefault("OMP_NUM_THREADS", "1")
        environ.update(env or {})
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edged.runtime.worker", str(child.fileno()),
             orjson.dumps(spec.to_json()).decode()],
            pass_fds=(child.fileno(),), env=environ, cwd="/", stdin=subprocess.DEVNULL,
        )  # fmt: skip
        child.close()
        self.sock = parent
        self._buf = b""

    def read_frame(self, timeout: float = 120.0) -> tuple[int, int, bytes]:
        self.sock.settimeout(timeout)
        while True:
            if len(self._buf) >= HEADER_SIZE:
                length, ftype, req_id = HEADER.unpack_from(self._buf, 0)
                if len(self._buf) >= HEADER_SIZE + length:
                    payload = self._buf[HEADER_SIZE : HEADER_SIZE + length]
                    self._buf = self._buf[HEADER_SIZE + length :]
                    return ftype, req_id, payload
            data = self.sock.recv(1 << 16)
            if not data:
                raise EOFError(f"worker exited with {self.proc.wait(10)}")
            self._buf += data

    def first_frame(self) -> tuple[str, dict[str, Any]]:
        ftype, _, payload = self.read_frame()
        kind = {FrameType.READY: "ready", FrameType.FAILED: "failed"}[FrameType(ftype)]
        return kind, orjson.loads(payload)

    def close(self) -> int:
        self.sock.close()
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)


def with_sandbox(spec: LaunchSpec, sandbox: SandboxSpec) -> LaunchSpec:
    return replace(spec, sandbox=sandbox)
