"""A load generator for scenario tests: threads that keep a window of pipelined inference
requests in flight on keep-alive connections to edged's inference socket (a deep queue with
little client CPU)."""

from __future__ import annotations

import socket
import threading

import numpy as np

from edgefleet.inference import infer_path, infer_request_body


def infer_bytes(model: str, n_in: int, seed: int = 0) -> bytes:
    x = np.random.default_rng(seed).standard_normal((1, n_in)).astype(np.float32)
    body = infer_request_body({"input": x})
    head = (
        f"POST {infer_path(model, None)} HTTP/1.1\r\nHost: localhost\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class Load:
    """``connections`` threads, each keeping ``window`` requests in flight, until stopped."""

    def __init__(self, sock_path: str, request: bytes, *, connections: int, window: int) -> None:
        self._path = sock_path
        self._request = request
        self._window = window
        self._stop = threading.Event()
        self.answered = 0
        self.failed = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, daemon=True) for _ in range(connections)
        ]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)

    def _run(self) -> None:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(30)
                s.connect(self._path)
                s.sendall(self._request * self._window)
                buf = b""
                outstanding = self._window
                while outstanding:
                    end = buf.find(b"\r\n\r\n")
                    if end < 0:
                        chunk = s.recv(65536)
                        if not chunk:
                            raise ConnectionError("edged closed the connection")
                        buf += chunk
                        continue
                    i = buf.lower().find(b"content-length:", 0, end) + 15
                    length = int(buf[i : buf.find(b"\r\n", i)])
                    total = end + 4 + length
                    while len(buf) < total:
                        buf += s.recv(65536)
                    ok = buf[9:12] == b"200"
                    buf = buf[total:]
                    with self._lock:
                        self.answered += ok
                        self.failed += not ok
                    outstanding -= 1
                    if not self._stop.is_set():
                        s.sendall(self._request)
                        outstanding += 1
        except Exception as exc:  # reported by the test
            with self._lock:
                self.errors.append(repr(exc))
