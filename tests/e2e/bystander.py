"""A second client on the same device: while an attack runs against one model, it keeps asking
another model over its own keep-alive connection and checks every answer against ONNX Runtime
called directly. Tests assert that it saw no error and made progress during the attack.

It is a lean raw-HTTP client on a thread (no HTTP library): a closed idle keep-alive
connection is reopened and the request sent again, as any HTTP client does; any other
failure, a non-200 answer or a wrong answer is an error."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import orjson

from edgefleet.inference import infer_request_body


class Bystander:
    def __init__(self, sock_path: str, model: str, onnx_path: Path) -> None:
        self.sock_path = sock_path
        self.model = model
        rng = np.random.default_rng(11)
        self.x = rng.standard_normal((1, 64)).astype(np.float32)
        sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        self.expected = sess.run(None, {"input": self.x})[0].ravel()
        body = infer_request_body({"input": self.x})
        self.request = (
            f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: edged\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self.ok = 0
        self.errors: list[str] = []
        self.latencies: list[float] = []
        self.reconnects = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._sock: socket.socket | None = None
        self._buf = b""

    def __enter__(self) -> Bystander:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        if self._sock is not None:
            self._sock.close()

    def wait_for_answers(self, n: int, timeout: float = 30.0) -> None:
        """Wait until ``n`` more answers came back (progress, not a rate)."""
        target = self.ok + n
        deadline = time.monotonic() + timeout
        while self.ok < target:
            assert not self.errors, self.errors[:3]
            assert time.monotonic() < deadline, f"bystander stalled at {self.ok} answers"
            time.sleep(0.01)

    def _connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(self.sock_path)
        self._buf = b""
        return s

    def _read_reply(self, s: socket.socket) -> tuple[int, bytes]:
        while b"\r\n\r\n" not in self._buf:
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionResetError("closed")
            self._buf += chunk
        head, _, rest = self._buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.lower() == "content-length":
                length = int(value)
        while len(rest) < length:
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionResetError("closed mid-answer")
            rest += chunk
        self._buf = rest[length:]
        return status, rest[:length]

    def _one(self) -> None:
        for attempt in range(2):
            if self._sock is None:
                self._sock = self._connect()
                if attempt:
                    self.reconnects += 1
            try:
                t0 = time.perf_counter()
                self._sock.sendall(self.request)
                status, body = self._read_reply(self._sock)
            except (ConnectionResetError, BrokenPipeError) as exc:
                self._sock.close()
                self._sock = None
                if attempt:
                    raise OSError(f"connection lost twice: {exc}") from None
                continue  # an idle keep-alive connection closed by the server: reopen
            self.latencies.append(time.perf_counter() - t0)
            if status != 200:
                raise ValueError(f"status {status}: {body[:200]!r}")
            got = np.asarray(orjson.loads(body)["outputs"][0]["data"], dtype=np.float32)
            if not np.allclose(got, self.expected, rtol=1e-4, atol=1e-5):
                raise ValueError("wrong answer")
            self.ok += 1
            return

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._one()
            except (OSError, ValueError) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                if self._sock is not None:
                    self._sock.close()
                    self._sock = None
                time.sleep(0.05)
            time.sleep(0.002)  # a steady client, not a load generator

    def p99(self) -> float:
        return float(np.percentile(self.latencies, 99)) if self.latencies else 0.0
