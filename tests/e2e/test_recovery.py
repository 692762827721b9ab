"""Recovery: crashed workers come back, edged itself survives kill -9, SIGTERM drains."""

from __future__ import annotations

import os
import re
import signal
import socket
from pathlib import Path

import numpy as np
from harness import Edged, wait_for, write_manifest

from edgefleet.demo import build_mlp
from edgefleet.inference import infer_request_body

X = np.zeros((1, 64), dtype=np.float32)


def test_killed_worker_is_replaced_and_serves_again(model_dir: Path, edged_factory) -> None:
    write_manifest(model_dir)
    e: Edged = edged_factory(model_dir).start()
    e.wait_ready()
    (old_pid,) = e.worker_pids("mlp")
    os.kill(old_pid, signal.SIGKILL)

    def replaced() -> bool:
        rep = e.workload("mlp")["replicas"][0]
        return bool(rep["ready"] and rep["pid"] not in (None, old_pid))

    wait_for(replaced, 30, "a new worker")
    rep = e.workload("mlp")["replicas"][0]
    assert rep["restarts"] == 1
    assert rep["lastExit"]["reason"] == "Killed"
    assert e.infer("mlp", X)[0] == 200
    assert e.terminate() == 0


def test_crash_loop_backs_off_and_is_reported(tmp_path: Path, edged_factory) -> None:
    d = tmp_path / "m"
    d.mkdir()
    (d / "broken.onnx").write_bytes(b"\x08\x07" + b"\x00" * 100)  # sniffs as ONNX, is not
    write_manifest(d, name="broken", path="broken.onnx")
    e: Edged = edged_factory(d).start()

    def looping() -> dict | None:
        w = e.workload("broken")
        conds = {c["type"]: c for c in w.get("conditions", [])}
        return conds.get("CrashLoopBackOff")

    cond = wait_for(looping, 30, "CrashLoopBackOff")
    assert cond["reason"] == "ModelLoadFailed"
    assert "onnxruntime cannot load the model" in cond["message"]
    rep = e.workload("broken")["replicas"][0]
    # Backoff 1 s, 2 s, 4 s...: after ~3 s there can only be a handful of restarts.
    assert rep["restarts"] <= 4
    assert e.status()["ready"] is False
    assert e.proc is not None and e.proc.poll() is None  # edged itself is fine
    assert e.terminate() == 0


def test_edged_kill9_restart_serves_from_persisted_state(model_dir: Path, edged_factory) -> None:
    write_manifest(model_dir)
    e: Edged = edged_factory(model_dir).start()
    e.wait_ready()
    sha = e.workload("mlp")["model"]["sha256"]
    e.kill9()
    # The workers die with edged (PDEATHSIG / EOF on their socket).
    for pid in list(e.all_pids):
        wait_for(lambda pid=pid: not _alive(pid), 10, f"worker {pid} to exit")
    # Start again with no manifests at all and the original model file gone: nothing to read
    # but edged's own persisted state, and no hub.
    (model_dir / "mlp.onnx").unlink()
    again: Edged = edged_factory(None, data=e.data).start()
    again.wait_ready()
    assert again.workload("mlp")["model"]["sha256"] == sha
    assert again.infer("mlp", X)[0] == 200
    assert again.terminate() == 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_sigterm_drains_in_flight_requests(tmp_path: Path, edged_factory) -> None:
    d = tmp_path / "m"
    d.mkdir()
    build_mlp(d / "mlp.onnx", (1024, 2048, 2048, 1000), seed=3)
    write_manifest(d, batch=1)
    e: Edged = edged_factory(d).start()
    e.wait_ready()
    body = infer_request_body({"input": np.zeros((1, 1024), dtype=np.float32)})
    request = (
        b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    ) + body
    socks = []
    for _ in range(12):
        s = socket.socket(socket.AF_UNIX)
        s.connect(e.infer_sock)
        socks.append(s)
    for s in socks:
        s.sendall(request)
    # Batch 1 at ~1-2 ms each: once the first answer is back, the others are queued in the
    # worker. Stop edged now; every request it accepted must still be answered.
    first = _read_response(socks[0])
    # and every connection accepted: on a loaded machine some may still wait in the listen
    # backlog, which closes with the listener (never accepted: reset, as it should be)
    wait_for(lambda: _inference_connections(e) == len(socks), 20, "every connection accepted")
    assert e.proc is not None
    e.proc.send_signal(signal.SIGTERM)
    statuses = [first] + [_read_response(s) for s in socks[1:]]
    assert e.proc.wait(30) == 0
    assert statuses == [200] * len(socks), statuses
    assert not os.path.exists(e.infer_sock)
    for s in socks:
        s.close()


def _inference_connections(e: Edged) -> float:
    """Connections accepted and open: held by edged, or handed to the model's worker."""
    _, metrics, _ = e.request("GET", "/metrics", sock=e.status_sock)
    total = 0.0
    for name in (rb"edged_http_connections", rb"edged_http_handed_connections"):
        found = re.search(name + rb'\{socket="inference"\} ([0-9.e+]+)', metrics)
        if found is None:
            return -1.0
        total += float(found.group(1))
    return total


def _read_response(sock: socket.socket) -> int:
    sock.settimeout(20)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return -1
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(head.split(b" ")[1])


def test_second_edged_on_the_same_data_dir_refuses(model_dir: Path, edged_factory) -> None:
    write_manifest(model_dir)
    e: Edged = edged_factory(model_dir).start()
    e.wait_ready()
    second: Edged = edged_factory(model_dir, data=e.data).start()
    assert second.proc is not None
    assert second.proc.wait(30) == 1
    assert "another edged is running" in second.logs()
    assert e.infer("mlp", X)[0] == 200
    assert os.path.exists(e.infer_sock)
    assert e.terminate() == 0
