"""Changes to the manifests directory: zero-downtime switches, bad files, removals."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
from harness import Edged, wait_for, write_manifest

from edgefleet.demo import TINY_MLP, build_mlp

X = np.ones((1, 64), dtype=np.float32)


def test_version_change_has_no_failed_request(model_dir: Path, edged_factory) -> None:
    write_manifest(model_dir, version="1.0.0")
    e: Edged = edged_factory(model_dir).start()
    e.wait_ready()
    (old_pid,) = e.worker_pids("mlp")
    stop = threading.Event()
    seen: list[tuple[int, str]] = []
    failures: list[object] = []

    def client() -> None:
        while not stop.is_set():
            try:
                status, doc = e.infer("mlp", X)
            except OSError as exc:
                failures.append(exc)
                continue
            if status != 200:
                failures.append((status, doc))
            else:
                seen.append((status, doc["model_version"]))

    threads = [threading.Thread(target=client) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(seen) > 20, 10, "traffic before the switch")
        build_mlp(model_dir / "mlp-v2.onnx", TINY_MLP, seed=2)
        write_manifest(model_dir, version="2.0.0", path="mlp-v2.onnx")
        wait_for(lambda: seen and seen[-1][1] == "2.0.0", 30, "the new version to serve")

        def switched() -> bool:
            reps = e.workload("mlp")["replicas"]
            return len(reps) == 1 and reps[0]["version"] == "2.0.0"

        wait_for(switched, 30, "the old replica to stop")
        n = len(seen)
        wait_for(lambda: len(seen) > n + 20, 10, "traffic after the switch")
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not failures, failures[:5]
    versions = [v for _, v in seen]
    assert versions[0] == "1.0.0" and versions[-1] == "2.0.0"
    assert old_pid not in e.worker_pids("mlp")
    assert e.status()["generation"] == 2
    assert e.terminate() == 0


def test_invalid_manifest_keeps_the_last_valid_state(model_dir: Path, edged_factory) -> None:
    write_manifest(model_dir)
    e: Edged = edged_factory(model_dir).start()
    e.wait_ready()
    pids = e.worker_pids("mlp")
    (model_dir / "mlp.yaml").write_text(
        "apiVersion: edgefleet.io/v1\nkind: ModelDeployment\nmetadata: {name: mlp}\n"
        "spec:\n  model: {name: mlp, version: 2.0, path: mlp.onnx}\n"
        "  runtime: {maxBatchSize: ten, maxBatchSise: 3}\n"
    )

    def problems() -> list[dict]:
        return e.status()["source"]["problems"]

    found = wait_for(problems, 10, "the manifest problem in status")
    assert found[0]["file"] == "mlp.yaml" and found[0]["reason"] == "InvalidManifest"
    message = found[0]["message"]
    assert "spec.model.version" in message
    assert "spec.runtime.maxBatchSize" in message
    assert "spec.runtime.maxBatchSise: unknown field" in message
    assert e.worker_pids("mlp") == pids
    assert e.infer("mlp", X)[0] == 200
    assert e.status()["generation"] == 1
    # Fixing the file clears the problem.
    write_manifest(model_dir)
    wait_for(lambda: not problems(), 10, "the problem to clear")
    assert e.terminate() == 0


def test_missing_and_non_onnx_model_files_are_conditions(model_dir: Path, edged_factory) -> None:
    write_manifest(model_dir)
    write_manifest(model_dir, name="ghost", path="does-not-exist.onnx")
    (model_dir / "notes.onnx").write_text("this is not a model")
    write_manifest(model_dir, name="text", path="notes.onnx")
    e: Edged = edged_factory(model_dir).start()

    def reasons() -> dict[str, str]:
        return {p["workload"]: p["reason"] for p in e.status()["source"]["problems"]}

    wait_for(lambda: len(reasons()) == 2, 15, "two problems")
    assert reasons() == {"ghost": "ArtifactNotFound", "text": "NotAnOnnxModel"}
    wait_for(lambda: e.request("GET", "/v2/models/mlp/ready")[0] == 200, 30, "mlp ready")
    assert e.infer("mlp", X)[0] == 200
    assert e.request("POST", "/v2/models/ghost/infer", b"{}")[0] == 404
    # The missing file appears later: picked up without a restart.
    build_mlp(model_dir / "does-not-exist.onnx", TINY_MLP, seed=4)
    wait_for(lambda: e.request("GET", "/v2/models/ghost/ready")[0] == 200, 30, "ghost ready")
    assert e.proc is not None and e.proc.poll() is None
    assert e.terminate() == 0


def test_scale_and_remove(model_dir: Path, edged_factory) -> None:
    write_manifest(model_dir, replicas=1)
    e: Edged = edged_factory(model_dir).start()
    e.wait_ready()
    write_manifest(model_dir, replicas=2)

    def ready_count() -> int:
        return int(e.workload("mlp").get("readyReplicas", 0))

    wait_for(lambda: ready_count() == 2, 30, "two ready replicas")
    pids = e.worker_pids("mlp")
    assert len(set(pids)) == 2
    for _ in range(10):
        assert e.infer("mlp", X)[0] == 200
    (model_dir / "mlp.yaml").unlink()

    def gone() -> bool:
        return all(w["name"] != "mlp" for w in e.status()["workloads"])

    wait_for(gone, 30, "the workload to be removed")
    assert e.request("POST", "/v2/models/mlp/infer", b"{}")[0] == 404
    assert e.terminate() == 0
