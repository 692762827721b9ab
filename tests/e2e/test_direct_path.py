"""The control process leaves the data path (issue 34, item 1; docs/edged.md, "The control
process and the data path"): a real edged hands a keep-alive infer connection to the worker
that serves its model, which answers it itself; whatever else comes on that connection
(another model, a version, health, metadata, a malformed request) is still routed by edged
and answered in order; the answers count as they did (per workload and code, from the
worker's reports); the connection's limits hold in the worker; a version switch under
keep-alive traffic fails no request; and the connection is closed, not left open, when
edged stops."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from harness import UNSIGNED_CONFIG, Edged, wait_for, write_manifest
from metricstesting import series_value

from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.inference import infer_path, infer_request_body

X = np.ones((1, TINY_MLP[0]), dtype=np.float32)


class KeepAlive:
    """One keep-alive HTTP/1.1 connection to infer.sock, one request at a time."""

    def __init__(self, path: str, timeout: float = 20.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def send(self, raw: bytes) -> None:
        self.sock.sendall(raw)

    def call(
        self, method: str, path: str, body: bytes = b"", headers: str = ""
    ) -> tuple[int, bytes, str]:
        head = f"{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}"
        self.send(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        return self.read()

    def read(self) -> tuple[int, bytes, str]:
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed; read so far {self.buf[:200]!r}")
            self.buf += chunk
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        text = head.decode("latin-1")
        length = 0
        for line in text.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        while len(rest) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed in a body")
            rest += chunk
        self.buf = rest[length:]
        return int(text[9:12]), rest[:length], text

    def infer(self, model: str, version: str | None = None) -> tuple[int, Any]:
        status, body, _ = self.call(
            "POST", infer_path(model, version), infer_request_body({"input": X})
        )
        return status, orjson.loads(body)


def _metric(e: Edged, series: str) -> float:
    text = e.request("GET", "/metrics", sock=e.status_sock)[1].decode()
    return series_value(text, series)


HANDED = 'edged_http_handed_connections_handed{socket="inference"}'
OPEN = 'edged_http_handed_connections{socket="inference"}'


def test_a_connection_goes_to_its_worker_and_everything_else_is_still_routed(
    model_dir: Path, edged_factory
) -> None:
    build_mlp(model_dir / "other.onnx", TINY_MLP, seed=3)
    write_manifest(model_dir, name="mlp")
    write_manifest(model_dir, name="other", path="other.onnx")
    e: Edged = edged_factory(model_dir).start()
    e.wait_ready()
    wait_for(lambda: e.workload("other")["readyReplicas"] == 1, 60, "other ready")
    c = KeepAlive(e.infer_sock)
    try:
        for _ in range(20):
            status, doc = c.infer("mlp")
            assert status == 200 and doc["model_name"] == "mlp", doc
        assert _metric(e, HANDED) >= 1, "the connection was not handed to the worker"
        assert _metric(e, OPEN) == 1
        # on the handed connection, everything else is edged's to route, answered in order
        assert c.call("GET", "/v2/health/live")[0] == 200
        status, body, _ = c.call("GET", "/v2/models/mlp")
        assert status == 200 and orjson.loads(body)["name"] == "mlp"
        status, doc = c.infer("other")
        assert status == 200 and doc["model_name"] == "other", doc
        status, doc = c.infer("mlp", "1.0.0")
        assert status == 200 and doc["model_version"] == "1.0.0", doc
        assert c.infer("mlp", "9.9.9")[0] == 404
        assert c.call("GET", "/v2/models/ghost")[0] == 404
        status, body, _ = c.call("POST", "/v2/models/mlp/infer", b'{"inputs": 3}')
        assert status == 400, body
        status, body, _ = c.call(
            "POST", "/v2/models/mlp/infer", b"{}", "Inference-Header-Content-Length: x\r\n"
        )
        assert status == 400 and b"Inference-Header-Content-Length" in body, body
        # pipelined: answers in order, across the worker's own and edged's
        c.send(
            b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
            + (
                f"POST {infer_path('mlp')} HTTP/1.1\r\nHost: x\r\nContent-Length: "
                f"{len(infer_request_body({'input': X}))}\r\n\r\n"
            ).encode()
            + infer_request_body({"input": X})
            + b"GET /v2/models/other HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        assert orjson.loads(c.read()[1]) == {"live": True}
        assert orjson.loads(c.read()[1])["model_name"] == "mlp"
        assert orjson.loads(c.read()[1])["name"] == "other"
        status, doc = c.infer("mlp")
        assert status == 200
        # a request naming a shared-memory region: edged's (proxied), and the connection goes
        # back to edged for good once idle; the next requests are served there, not handed
        handed = _metric(e, HANDED)
        shm = orjson.dumps(
            {
                "inputs": [
                    {
                        "name": "input",
                        "shape": [1, TINY_MLP[0]],
                        "datatype": "FP32",
                        "parameters": {
                            "shared_memory_region": "nowhere",
                            "shared_memory_byte_size": 4 * TINY_MLP[0],
                        },
                    }
                ]
            }
        )
        status, body, _ = c.call("POST", infer_path("mlp"), shm)
        assert status == 400 and b"nowhere" in body, body
        wait_for(lambda: _metric(e, OPEN) == 0, 20, "the connection back to edged")
        for _ in range(3):
            assert c.infer("mlp")[0] == 200
        assert _metric(e, HANDED) == handed and _metric(e, OPEN) == 0
    finally:
        c.close()
    # every answer counts as before, from the worker's reports: 20, the versioned one, the
    # pipelined one and the last ok (and the three served by edged after the shared-memory
    # one), the two malformed ones 400 (the shared-memory one is edged's own 400, uncounted
    # as before); "other"'s too
    code = 'edged_inference_requests_total{{workload="{w}",code="{c}"}}'
    ok = code.format(w="mlp", c="200")
    wait_for(lambda: _metric(e, ok) >= 26, 20, "mlp's 200s counted")
    assert _metric(e, ok) == 26
    assert _metric(e, code.format(w="mlp", c="400")) == 2
    assert _metric(e, code.format(w="other", c="200")) == 1
    wait_for(lambda: _metric(e, OPEN) == 0, 20, "the closed connection reported")
    assert e.terminate() == 0
    assert "worker direct answers not counted" not in e.log_path.read_text()


def test_limits_hold_on_a_handed_connection(model_dir: Path, edged_factory, tmp_path: Path) -> None:
    write_manifest(model_dir)
    config = UNSIGNED_CONFIG.format(absent=tmp_path / "none.json") + (
        '[inference]\nheaderTimeout = "1s"\nidleTimeout = "2s"\n'
    )
    e: Edged = edged_factory(model_dir, config=config).start()
    e.wait_ready()
    c = KeepAlive(e.infer_sock)
    try:
        assert c.infer("mlp")[0] == 200
        assert _metric(e, HANDED) >= 1
        # a body larger than the model takes: refused from its headers, by the worker
        c.send(
            b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n"
        )
        status, body, head = c.read()
        assert status == 413 and b"request body larger than" in body, body
        assert "connection: close" in head.lower()
    finally:
        c.close()
    # headers that never end: 408 from the worker after headerTimeout
    c = KeepAlive(e.infer_sock)
    try:
        assert c.infer("mlp")[0] == 200
        c.send(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        t0 = time.monotonic()
        status, body, _ = c.read()
        assert status == 408 and b"headers not complete" in body, body
        assert time.monotonic() - t0 < 10
    finally:
        c.close()
    # idle: closed by the worker after idleTimeout
    c = KeepAlive(e.infer_sock)
    try:
        assert c.infer("mlp")[0] == 200
        c.sock.settimeout(15)
        assert c.sock.recv(1) == b""  # the idle connection closed
    finally:
        c.close()
    wait_for(lambda: _metric(e, OPEN) == 0, 20, "the closed connections reported")
    assert e.terminate() == 0


def test_a_version_switch_fails_no_request_on_kept_alive_connections(
    model_dir: Path, edged_factory
) -> None:
    write_manifest(model_dir, version="1.0.0")
    e: Edged = edged_factory(model_dir).start()
    e.wait_ready()
    (old_pid,) = e.worker_pids("mlp")
    stop = threading.Event()
    seen: list[str] = []
    failures: list[object] = []

    def client() -> None:
        c = KeepAlive(e.infer_sock)
        try:
            while not stop.is_set():
                try:
                    status, doc = c.infer("mlp")
                except (OSError, ValueError) as exc:
                    failures.append(repr(exc))
                    return
                if status != 200:
                    failures.append((status, doc))
                else:
                    seen.append(doc["model_version"])
        finally:
            c.close()

    threads = [threading.Thread(target=client) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(seen) > 20, 20, "traffic before the switch")
        assert _metric(e, HANDED) >= 1
        build_mlp(model_dir / "mlp-v2.onnx", TINY_MLP, seed=2)
        write_manifest(model_dir, version="2.0.0", path="mlp-v2.onnx")
        wait_for(lambda: seen and seen[-1] == "2.0.0", 60, "the new version to serve")

        def switched() -> bool:
            reps = e.workload("mlp")["replicas"]
            return len(reps) == 1 and reps[0]["version"] == "2.0.0"

        wait_for(switched, 60, "the old replica to stop")
        n = len(seen)
        wait_for(lambda: len(seen) > n + 20, 20, "traffic after the switch")
    finally:
        stop.set()
        for t in threads:
            t.join(20)
    assert not failures, failures[:5]
    assert seen[0] == "1.0.0" and seen[-1] == "2.0.0"
    assert old_pid not in e.worker_pids("mlp")
    assert e.terminate() == 0
