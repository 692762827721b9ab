"""A workload's last termination and restart count, as tables: the planner's pure choice among
its replicas' observations (edged/reconcile/planning.py), the hub report built from the planned
status (edged/hublink/devicereport.py) and its protobuf (edged/hublink/mapping.py), and how
``edged status`` prints it. No clock, no processes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from edged.hublink.devicereport import WorkloadReport, build_device_report
from edged.hublink.mapping import status_message
from edged.reconcile.model import (
    ObservedWorkload,
    Phase,
    ReplicaObservation,
    Termination,
    WorkloadStatus,
)
from edged.reconcile.planning import last_termination, plan, replica_id
from edged.state.merging import HUB_SOURCE
from edged.workloads import DesiredWorkload, ReplicaId, WorkloadName
from edgefleet.api import API_VERSION, parse_manifest
from edgefleet.devicestatus import render_status, termination_text

OOM = "worker killed by the kernel's OOM killer: it reached its cgroup's memory.max"


def rep(
    slot: int,
    *,
    reason: str = "",
    code: int | None = None,
    at: float | None = None,
    restarts: int = 0,
    phase: Phase = Phase.READY,
) -> ReplicaObservation:
    return ReplicaObservation(
        ReplicaId(f"w-r-{slot}"),
        "r",
        slot,
        phase,
        pid=100 + slot,
        started_at=0.0,
        exit_reason=reason,
        exit_message=f"{reason} message" if reason else "",
        exit_code=code,
        finished_at=at,
        restarts=restarts,
    )


@pytest.mark.parametrize(
    ("replicas", "expected"),
    [
        pytest.param((), None, id="no replica"),
        pytest.param((rep(0), rep(1)), None, id="none ended"),
        pytest.param(
            (rep(0, reason="OOMKilled", code=-9, at=50.0),),
            Termination("w-r-0", "OOMKilled", "OOMKilled message", 0, 9, 50.0),
            id="an OOM kill: signal 9, no exit code",
        ),
        pytest.param(
            (rep(0, reason="Error", code=3, at=50.0),),
            Termination("w-r-0", "Error", "Error message", 3, 0, 50.0),
            id="an exit code: no signal",
        ),
        pytest.param(
            (rep(0, reason="LaunchFailed", code=None, at=50.0),),
            Termination("w-r-0", "LaunchFailed", "LaunchFailed message", 0, 0, 50.0),
            id="never started: neither",
        ),
        pytest.param(
            (
                rep(0, reason="OOMKilled", code=-9, at=50.0),
                rep(1, reason="Error", code=1, at=70.0),
                rep(2, reason="Killed", code=-9, at=60.0),
            ),
            Termination("w-r-1", "Error", "Error message", 1, 0, 70.0),
            id="the newest of several",
        ),
        pytest.param(
            (rep(0, reason="OOMKilled", code=-9, at=None),),
            None,
            id="an end without a time is not one (kept from before)",
        ),
    ],
)
def test_last_termination_table(
    replicas: tuple[ReplicaObservation, ...], expected: Termination | None
) -> None:
    assert last_termination(replicas) == expected


def desired(name: str = "w") -> DesiredWorkload:
    dep = parse_manifest(
        {
            "apiVersion": API_VERSION,
            "kind": "ModelDeployment",
            "metadata": {"name": name},
            "spec": {"model": {"name": name, "version": "1.0"}, "replicas": {"perDevice": 2}},
        }
    )
    return DesiredWorkload(dep, "a" * 64, HUB_SOURCE)


def test_the_planned_status_keeps_an_oom_kill_after_the_replica_serves_again() -> None:
    """One OOM kill, then stable serving: the status still says it (and the restarts)."""
    want = desired()
    other = ReplicaObservation(want_id(want, 1), want.revision, 1, Phase.READY, 200, 0.0)
    again = ReplicaObservation(
        want_id(want, 0),
        want.revision,
        0,
        Phase.READY,
        101,
        0.0,
        exit_reason="OOMKilled",
        exit_message=OOM,
        exit_code=-9,
        finished_at=50.0,
        restarts=1,
    )
    status = plan(WorkloadName("w"), want, ObservedWorkload((again, other)), now=1000.0).status
    assert status is not None and status.phase == "Running"
    assert status.last_termination == Termination(
        str(again.replica_id), "OOMKilled", OOM, 0, 9, 50.0
    )
    assert status.restarts == 1


def want_id(want: DesiredWorkload, slot: int) -> ReplicaId:
    return replica_id(WorkloadName("w"), want.revision, slot)


def test_the_report_carries_it_to_the_hub_and_an_old_status_carries_nothing() -> None:
    ended = Termination("w-r-0", "OOMKilled", OOM, 0, 9, 1_765_000_000.25)
    st = WorkloadStatus("Running", 2, 2, "r", last_termination=ended, restarts=3)
    report = build_device_report({}, {WorkloadName("w"): desired()}, {"w": st}.get, ())
    (w,) = report.workloads
    assert (w.last_termination, w.restart_count) == (ended, 3)
    (pb,) = status_message(report, generation=1).workloads
    assert (pb.last_termination.reason, pb.last_termination.signal) == ("OOMKilled", 9)
    assert pb.last_termination.exit_code == 0 and pb.restart_count == 3
    assert pb.last_termination.finished_at.ToNanoseconds() == 1_765_000_000_250_000_000
    assert pb.last_termination.message == OOM and pb.last_termination.replica == "w-r-0"

    plain = status_message(
        replace(report, workloads=(WorkloadReport(name="w", revision="r"),)), generation=1
    )
    assert not plain.workloads[0].HasField("last_termination")
    assert plain.workloads[0].restart_count == 0


def test_a_workers_long_reason_and_message_are_cut_to_what_the_hub_accepts() -> None:
    ended = Termination("w-r-0", "R" * 500, "m" * 5000, 300, 0, None)
    report = build_device_report(
        {},
        {WorkloadName("w"): desired()},
        {"w": WorkloadStatus("Running", 1, 1, "r", last_termination=ended)}.get,
        (),
    )
    (pb,) = status_message(report, generation=1).workloads
    t = pb.last_termination
    assert (len(t.reason), len(t.message), t.exit_code) == (64, 1024, 255)
    assert not t.HasField("finished_at")


@pytest.mark.parametrize(
    ("doc", "text"),
    [
        (
            {"reason": "OOMKilled", "signal": 9, "exitCode": 0, "finishedAt": 0.0,
             "replica": "w-r-0", "message": "m"},
            "OOMKilled (signal 9) at 1970-01-01T00:00:00Z, replica w-r-0: m",
        ),
        ({"reason": "Error", "signal": 0, "exitCode": 3}, "Error (exit code 3)"),
    ],
)  # fmt: skip
def test_termination_text_table(doc: dict[str, object], text: str) -> None:
    assert termination_text(doc) == text


def test_edged_status_prints_each_workloads_last_termination() -> None:
    last = {"reason": "OOMKilled", "signal": 9, "exitCode": 0, "finishedAt": 0.0, "replica": "h-0"}
    doc = {
        "device": {"name": "d"},
        "workloads": [
            {"name": "hog", "lastTermination": last, "restartCount": 1},
            {"name": "det", "lastTermination": None, "restartCount": 0},
        ],
    }
    text = render_status(doc)
    assert (
        "  hog: last termination OOMKilled (signal 9) at 1970-01-01T00:00:00Z, replica h-0" in text
    )
    assert "det: last termination" not in text
