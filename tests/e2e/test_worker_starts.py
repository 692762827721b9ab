"""Worker processes never inherit gRPC state: a storm of worker starts while edged holds a live
Sync stream with a real hub sees no worker abort (gRPC's fork handlers used to abort about one
start in five: ``ev_epoll1_linux.cc ... Check failed: next_worker->state == KICKED``)."""

from __future__ import annotations

from pathlib import Path

from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import Edged, wait_for, write_manifest

from edgefleet.demo import TINY_MLP, build_mlp

REPLICAS = 6
ROUNDS = 4


def test_worker_start_storm_during_a_live_sync_stream(tmp_path: Path, edged_factory) -> None:
    hub = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init().start()
    try:
        data = tmp_path / "dev"
        out = enroll(hub, data, "storm-1", {"site": "lab"})
        assert out.returncode == 0, out.stdout + out.stderr
        manifests = tmp_path / "manifests"
        manifests.mkdir()
        build_mlp(manifests / "mlp.onnx", TINY_MLP, seed=1)
        config = _unsigned(SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "no-root"))
        e: Edged = edged_factory(manifests, data=data, config=config)
        e.start()
        wait_for(lambda: e.status()["hub"]["connected"], 60, "the Sync stream")
        started: set[int] = set()
        for round_ in range(ROUNDS):
            # a new version: REPLICAS new workers start while the stream stays open
            # probes every 5 s: on a loaded machine a late PONG must not kill a replica (this
            # test is about aborts at start, not liveness)
            write_manifest(manifests, version=f"1.0.{round_}", replicas=REPLICAS, period=5)

            def all_ready(version: str = f"1.0.{round_}") -> bool:
                w = e.workload("mlp")
                reps = [r for r in w["replicas"] if r["ready"] and r["version"] == version]
                return len(reps) == REPLICAS

            wait_for(all_ready, 120, f"round {round_}: {REPLICAS} ready replicas")
            assert e.status()["hub"]["connected"]
            for r in e.workload("mlp")["replicas"]:
                assert r["restarts"] == 0, r  # no start died (an abort would restart it)
                if r["version"] == f"1.0.{round_}":
                    started.add(r["pid"])
        assert len(started) == REPLICAS * ROUNDS
        logs = e.log_path.read_text()
        assert "replica exited" not in logs, logs[-3000:]
        assert "Check failed" not in logs
        assert e.terminate() == 0
    finally:
        hub.stop()


def _unsigned(config: str) -> str:
    """The device's config with unsigned static models allowed (this test is not about trust)."""
    lines = config.splitlines()
    out = []
    for line in lines:
        out.append(line)
        if line.strip() == "[trust]":
            out.append("allowUnsigned = true")
    return "\n".join(out) + "\n"
