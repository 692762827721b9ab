"""A real edged whose data directory (its state, artifacts and sockets) is on a slow disk
(``slowfs.py``, a real FUSE mount): its loaded workers keep serving and its status socket
keeps answering while a write of its state is stuck in the disk, and it converges once the
disk is normal again."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from harness import UNSIGNED_CONFIG, Edged, wait_for, write_manifest
from slowfs import SlowFs

from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.inference import infer_path, infer_request_body

X = np.ones((1, 64), dtype=np.float32)
# a request that the event loop does not answer waits this long before the test fails: a hang
# detector, not a timing bound (a served request takes milliseconds)
HANG = 30.0

pytestmark = pytest.mark.scenario


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    d = tmp_path / "manifests"
    d.mkdir()
    build_mlp(d / "mlp.onnx", TINY_MLP, seed=1)
    build_mlp(d / "other.onnx", TINY_MLP, seed=2)
    write_manifest(d, name="mlp")
    return d


@pytest.fixture
def edged(tmp_path: Path, slow_dir: SlowFs, manifests: Path, request: pytest.FixtureRequest) -> Any:
    """edged on the slow disk; ``keepOnExit`` (its workers outlive it: each one's record is
    written in ``state/workers/`` as it starts and removed when it exits) as the test's
    parameter says, off by default."""
    keep = getattr(request, "param", False)
    config = UNSIGNED_CONFIG.format(absent=tmp_path / "no-trust-root.json")
    config += f"[workers]\nkeepOnExit = {'true' if keep else 'false'}\n"
    e = Edged(slow_dir.mountpoint, manifests, tmp_path / "edged.log", config=config)
    e.start()
    try:
        e.wait_ready()
        yield e
    finally:
        slow_dir.normal()
        if e.proc is not None and e.proc.poll() is None:
            code = e.terminate()
            assert code == 0, e.logs()


def _infer(e: Edged) -> int:
    body = infer_request_body({"input": X})
    status, _, _ = e.request("POST", infer_path("mlp"), body, timeout=HANG)
    return status


@pytest.mark.parametrize("edged", [False, True], indirect=True, ids=["no-records", "records"])
def test_a_write_stuck_in_the_disk_does_not_stop_serving(
    edged: Edged, slow_dir: SlowFs, manifests: Path
) -> None:
    """A second workload's worker is killed: edged records it (its status; with workers that
    outlive edged, the old worker's record removed and the new one's written); the disk holds
    those writes. The loaded worker of ``mlp`` must go on
    answering, and edged's status socket with it; once the disk is normal the second
    workload runs again."""
    write_manifest(manifests, name="other", path="other.onnx")
    wait_for(lambda: _ready(edged, "other"), 60, "the second workload to run")
    assert _infer(edged) == 200
    (victim,) = edged.worker_pids("other")
    slow_dir.hold()
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: slow_dir.stats()["waiting"] > 0, 90, "edged to write into the held disk")
    held = slow_dir.stats()["waiting_on"]
    assert any(" /state/" in op for op in held), held  # a state write, stuck in the disk
    for _ in range(5):
        assert _infer(edged) == 200
    assert "mlp" in {w["name"] for w in edged.status()["workloads"]}
    assert slow_dir.stats()["waiting"] > 0  # all that while a write was held
    slow_dir.normal()
    wait_for(lambda: _ready(edged, "other", not_pid=victim), 60, "the second workload again")
    assert _infer(edged) == 200


def test_a_new_desired_state_stuck_in_the_disk_does_not_stop_serving(
    edged: Edged, slow_dir: SlowFs, manifests: Path
) -> None:
    """A manifest changed (``mlp`` at two replicas): edged writes its new desired state before
    it acts on it, and the disk holds the write. The running replica goes on answering, and
    edged's status socket with it; once the disk is normal the second replica starts."""
    assert _infer(edged) == 200
    slow_dir.hold()
    write_manifest(manifests, name="mlp", replicas=2)

    def desired_held() -> bool:
        return any("desired.json" in op for op in slow_dir.stats()["waiting_on"])

    wait_for(desired_held, 90, "edged to write its desired state into the held disk")
    for _ in range(5):
        assert _infer(edged) == 200
    assert edged.status()["generation"] == 1  # not accepted before it is on disk
    assert desired_held()
    slow_dir.normal()

    def two_ready() -> bool:
        reps = edged.workload("mlp")["replicas"]
        return len(reps) == 2 and all(r["ready"] for r in reps)

    wait_for(two_ready, 60, "the second replica once the disk is normal")
    assert edged.status()["generation"] == 2


def _ready(e: Edged, name: str, not_pid: int | None = None) -> bool:
    w = {w["name"]: w for w in e.status()["workloads"]}.get(name)
    reps = (w or {}).get("replicas") or []
    return bool(reps) and all(r["ready"] and r["pid"] != not_pid for r in reps)


def test_a_slow_disk_costs_no_request_and_edged_converges_after(
    edged: Edged, slow_dir: SlowFs, manifests: Path
) -> None:
    """A window of slow I/O (0.3 s per operation) while the desired state changes twice and
    requests flow: none fails; after the window edged runs what was asked."""
    stop = threading.Event()
    results: list[int] = []
    failures: list[object] = []

    def client() -> None:
        while not stop.is_set():
            try:
                status = _infer(edged)
            except OSError as exc:
                failures.append(exc)
                continue
            (results if status == 200 else failures).append(status)

    thread = threading.Thread(target=client)
    thread.start()
    try:
        wait_for(lambda: len(results) > 10, 30, "traffic before the slow window")
        slow_dir.set_delay(0.3)
        write_manifest(manifests, name="other", path="other.onnx")
        wait_for(lambda: slow_dir.stats()["delayed"] >= 10, 60, "edged to write slowly")
        n = len(results)
        wait_for(lambda: len(results) > n + 20, HANG, "traffic during the slow window")
        slow_dir.normal()

        wait_for(
            lambda: _ready(edged, "other"), 60, "the new workload to run after the slow window"
        )
        n = len(results)
        wait_for(lambda: len(results) > n + 10, 30, "traffic after the slow window")
    finally:
        stop.set()
        thread.join(HANG + 5)
    assert not failures, failures[:5]
