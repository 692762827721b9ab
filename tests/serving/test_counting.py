"""What edged counts of what it serves, read back from a real registry's exposition: a real
status board, desired state file and (empty) worker pool; no worker, no socket."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from metricstesting import series_value

from edged.reconcile.model import RevisionPhase, RevisionStatus, WorkloadStatus
from edged.runtime.httpserver import HttpServer
from edged.runtime.workerpool import WorkerPool
from edged.serving.counting import Counters
from edged.serving.measuring import RevisionMeters
from edged.state.desired import DesiredState
from edged.statusboard import StatusBoard
from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.api import ModelDeployment, parse_manifest
from edgefleet.metrics import Registry

CAMERA = WorkloadName("camera")


def camera() -> DesiredWorkload:
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": "camera"},
        "spec": {"model": {"name": "mlp", "version": "2.0", "path": "m.onnx"}},
    }
    dep = parse_manifest(doc)
    assert isinstance(dep, ModelDeployment)
    return DesiredWorkload(dep, "0" * 64)


def revision(name: str, version: str) -> RevisionStatus:
    return RevisionStatus(name, version, "0" * 64, RevisionPhase.READY, ready_replicas=1)


def test_refused_requests_count_against_the_revision_they_would_have_gone_to(
    tmp_path: Path,
) -> None:
    registry = Registry()
    meters = RevisionMeters(period=0.0, clock=lambda: 100.0)
    desired = DesiredState(tmp_path / "desired.json")
    desired.replace({CAMERA: camera()})
    pool = WorkerPool(
        notify=lambda _: None, on_serving_change=lambda *_: None, on_result=lambda *_: None
    )
    board = StatusBoard(
        tmp_path / "status.json",
        desired=desired,
        pool=pool,
        limits_mode="cgroup",
        allow_unsigned=False,
        manifests_dir=None,
    )
    counters = Counters(
        registry, meters=meters, board=board, desired=desired, replicas=pool.replicas
    )
    counters.watch_servers({"status": HttpServer(lambda req, resp: None)})

    counters.refused("camera", None)  # not planned yet: no revision to blame
    board.set_workload(
        CAMERA,
        WorkloadStatus(
            "Running", 1, 1, "r2", revisions=(revision("r2", "2.0"), revision("r1", "1.0"))
        ),
    )
    counters.refused("camera", None)  # the wanted revision's error
    counters.refused("camera", "1.0")  # the version asked for
    counters.refused("camera", "9.9")  # a version the device does not hold: the wanted one

    errors = {rev: m.errors for (w, rev), m in meters.snapshot().items() if w == "camera"}
    assert errors == {"": 1, "r2": 2, "r1": 1}
    text = registry.render()
    assert series_value(text, 'edged_inference_requests_total{workload="camera",code="503"}') == 4
    assert series_value(text, "edged_desired_generation") == desired.generation == 1
    assert series_value(text, "edged_workloads") == 1
    assert 'edged_http_connections{socket="status"} 0' in text


def test_uptime_is_not_moved_by_a_step_of_the_wall_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device's wall clock stepped back 30 minutes (NTP, ``date -s``; the soak's clock
    jumps): its uptime stays its time since start, never negative (it was wall-clock time)."""
    from edged import statusboard

    pool = WorkerPool(
        notify=lambda _: None, on_serving_change=lambda *_: None, on_result=lambda *_: None
    )
    board = StatusBoard(
        tmp_path / "status.json",
        desired=DesiredState(tmp_path / "desired.json"),
        pool=pool,
        limits_mode="cgroup",
        allow_unsigned=False,
        manifests_dir=None,
    )
    stepped = SimpleNamespace(time=lambda: time.time() - 1800, monotonic=time.monotonic)
    monkeypatch.setattr(statusboard, "time", stepped)
    device = board.document()["device"]
    assert 0 <= device["uptimeSeconds"] < 60
    assert device["startedAt"] > stepped.time()  # when it started, as its clock read then
