"""The device report: plain data from the device's state, then Hello and Status messages."""

from __future__ import annotations

import random

import pytest

from edged.hublink.devicereport import DeviceReport, WorkloadReport, build_device_report
from edged.hublink.linking import BACKOFF_BASE_S, BACKOFF_MAX_S, RECONNECT_BACKOFF
from edged.hublink.mapping import hello_message, status_message
from edged.reconcile.model import RevisionPhase, RevisionStatus, WorkloadStatus
from edged.sources.static import SourceProblem
from edged.state.merging import HUB_SOURCE
from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.api import API_VERSION, ModelDeployment, parse_manifest
from edgefleet.api.conditions import Condition, ConditionStatus

READY = Condition("Ready", ConditionStatus.TRUE, "AllReplicasReady", "2/2 replicas ready")


def workload(name: str, source: str) -> DesiredWorkload:
    dep = parse_manifest(
        {
            "apiVersion": API_VERSION,
            "kind": "ModelDeployment",
            "metadata": {"name": name},
            "spec": {"model": {"name": name, "version": "2.1"}},
        }
    )
    assert isinstance(dep, ModelDeployment)
    return DesiredWorkload(dep, "a" * 64, source)


DEVICE = {
    "facts": {"arch": "arm64", "cpus": 4},
    "accelerators": [{"kind": "hailo", "usable": True}],
    "executionProviders": {"available": ["CPUExecutionProvider"], "source": "config"},
    "labels": {"arch": "arm64", "site": "shop-12"},
    "health": {"schedulable": False, "reasons": ["CPU at 91 °C > 85 °C"], "sample": {}},
    "udevError": None,
}
DESIRED = {
    WorkloadName("camera"): workload("camera", "camera.yaml"),
    WorkloadName("shelf"): workload("shelf", HUB_SOURCE),
    WorkloadName("doors"): workload("doors", HUB_SOURCE),
}
STATUSES = {WorkloadName("shelf"): WorkloadStatus("Running", 2, 2, "rev1", (READY,))}
PROBLEMS = (
    SourceProblem(HUB_SOURCE, "tills", "MetadataRollback", "tills 1.0 is older than 2.0"),
    SourceProblem(HUB_SOURCE, "shelf", "ArtifactFetchFailed", "the hub went away"),
    SourceProblem(HUB_SOURCE, "", "InvalidManifest", "manifests[3]: bad"),
)
REPORT = DeviceReport(
    inventory={
        "facts": DEVICE["facts"],
        "accelerators": DEVICE["accelerators"],
        "executionProviders": DEVICE["executionProviders"],
    },
    labels={"arch": "arm64", "site": "shop-12"},
    schedulable=False,
    reasons=("CPU at 91 °C > 85 °C",),
    workloads=(
        WorkloadReport(  # not reconciled yet
            "doors",
            model_version="2.1",
            revisions=(RevisionStatus("", "2.1", "a" * 64, RevisionPhase.PENDING, wanted=True),),
        ),
        WorkloadReport(
            "shelf",
            "rev1",
            2,
            2,
            "2.1",
            (
                READY,
                Condition(
                    "Updated", ConditionStatus.FALSE, "ArtifactFetchFailed", "the hub went away"
                ),
            ),
        ),
        WorkloadReport(
            "tills",
            conditions=(
                Condition(
                    "Ready",
                    ConditionStatus.FALSE,
                    "MetadataRollback",
                    "tills 1.0 is older than 2.0",
                ),
            ),
        ),
    ),
)


def test_report_names_the_hub_workloads_and_the_refused_ones() -> None:
    report = build_device_report(DEVICE, DESIRED, STATUSES.get, PROBLEMS)
    assert report == REPORT


def test_revisions_the_hub_source_holds_come_first() -> None:
    """A new version still downloading, or refused, is the wanted revision; what runs is not."""
    serving = RevisionStatus("rev1", "2.1", "a" * 64, RevisionPhase.READY, 2, wanted=True)
    statuses = {
        WorkloadName("shelf"): WorkloadStatus("Running", 2, 2, "rev1", (READY,), (), (serving,))
    }
    downloading = RevisionStatus(
        "", "2.2", "b" * 64, RevisionPhase.DOWNLOADING, wanted=True,
        bytes_done=3 << 20, bytes_total=10 << 20,
    )  # fmt: skip
    refused = RevisionStatus(
        "", "1.0", "", RevisionPhase.REFUSED, 0, "MetadataRollback", "older", wanted=True
    )
    incoming = {WorkloadName("shelf"): downloading, WorkloadName("tills"): refused}
    report = build_device_report(DEVICE, DESIRED, statuses.get, PROBLEMS, incoming)
    by_name = {w.name: w for w in report.workloads}
    shelf = by_name["shelf"]
    assert shelf.model_version == "2.2"
    assert shelf.revisions == (
        downloading,
        RevisionStatus("rev1", "2.1", "a" * 64, RevisionPhase.READY, 2, wanted=False),
    )
    assert by_name["tills"].revisions == (refused,)
    assert by_name["tills"].model_version == "1.0"
    message = status_message(report, generation=3)
    (first, second) = message.workloads[1].revisions
    assert (first.phase, first.model_version, first.wanted) == ("Downloading", "2.2", True)
    assert (first.bytes_done, first.bytes_total) == (3 << 20, 10 << 20)
    assert (second.phase, second.ready_replicas, second.wanted) == ("Ready", 2, False)
    # labels travel with each status too: a hotplugged accelerator reaches the hub mid-stream
    assert dict(message.labels) == report.labels
    assert (second.bytes_done, second.bytes_total) == (0, 0)


def test_a_first_version_being_fetched_is_reported() -> None:
    verifying = RevisionStatus("", "3.0", "", RevisionPhase.VERIFYING, wanted=True)
    report = build_device_report({}, {}, STATUSES.get, (), {WorkloadName("new"): verifying})
    assert [(w.name, w.model_version, w.revisions) for w in report.workloads] == [
        ("new", "3.0", (verifying,))
    ]


def test_report_without_discovery() -> None:
    report = build_device_report({}, {}, STATUSES.get, ())
    assert report == DeviceReport(
        {"facts": None, "accelerators": [], "executionProviders": None}, {}, True, (), ()
    )


def test_hello_message() -> None:
    hello = hello_message(REPORT, device_name="shop-12-a", generation=7, edged_version="0.1.0")
    assert (hello.device_name, hello.applied_generation, hello.edged_version) == (
        "shop-12-a",
        7,
        "0.1.0",
    )
    assert dict(hello.labels) == REPORT.labels
    assert hello.inventory["facts"]["arch"] == "arm64"
    assert hello.inventory["executionProviders"]["source"] == "config"
    assert (hello.health.schedulable, list(hello.health.reasons)) == (False, list(REPORT.reasons))


def test_status_message() -> None:
    status = status_message(REPORT, generation=9)
    assert status.observed_generation == 9
    assert [w.name for w in status.workloads] == ["doors", "shelf", "tills"]
    shelf = status.workloads[1]
    assert (shelf.revision, shelf.ready_replicas, shelf.desired_replicas, shelf.model_version) == (
        "rev1",
        2,
        2,
        "2.1",
    )
    ((cond_type, cond_status, reason),) = [
        (c.type, c.status, c.reason) for c in status.workloads[2].conditions
    ]
    assert (cond_type, cond_status, reason) == ("Ready", "False", "MetadataRollback")
    assert not status.health.schedulable


@pytest.mark.parametrize("attempt", [0, 1, 3, 5, 6, 16, 40])
def test_reconnect_backoff_is_full_jitter_up_to_a_minute(attempt: int) -> None:
    """Uniform in [0, min(60 s, 2**attempt s)], draw for draw as the link always did it."""
    bound = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2.0**attempt)
    ours, reference = random.Random(attempt), random.Random(attempt)
    for _ in range(20):
        assert RECONNECT_BACKOFF.delay(attempt, ours) == reference.uniform(0.0, bound)


def test_sizing_is_reported_without_the_samples() -> None:
    sizing = {
        "scaling": {
            "minReplicas": 1,
            "maxReplicas": 4,
            "currentReplicas": 2,
            "desiredReplicas": 3,
            "inflightPerReplica": 7.5,
            "cpuPercent": 80.0,
            "lastDecision": {
                "from": 2,
                "to": 3,
                "reason": "QueueDepthHigh",
                "message": "15.0 requests in flight over 2 ready replica(s)",
                "at": 1700000000.25,
            },
        },
        "eviction": {"priority": -5, "evictedReplicas": 1, "replicaBytes": 1 << 20},
    }
    report = build_device_report(
        DEVICE,
        DESIRED,
        STATUSES.get,
        (),
        sizing_of=lambda name: sizing if name == "shelf" else None,
    )
    shelf = next(w for w in report.workloads if w.name == "shelf")
    assert shelf.sizing is not None
    assert "cpuPercent" not in shelf.sizing["scaling"]  # changes every second: not sent
    msg = status_message(report, generation=3)
    w = next(w for w in msg.workloads if w.name == "shelf")
    assert (w.sizing.current_replicas, w.sizing.desired_replicas) == (2, 3)
    assert (w.sizing.min_replicas, w.sizing.max_replicas) == (1, 4)
    assert (w.sizing.evicted_replicas, w.sizing.priority) == (1, -5)
    d = w.sizing.last_decision
    assert (d.from_replicas, d.to_replicas, d.reason) == (2, 3, "QueueDepthHigh")
    assert d.at.ToNanoseconds() == 1_700_000_000_250_000_000
    doors = next(w for w in msg.workloads if w.name == "doors")
    assert not doors.HasField("sizing")


def test_revision_figures_go_to_the_hub_within_its_bounds() -> None:
    """What a revision answered and its validation accuracy reach the Status message, and the
    hub's bounds (hub.api.deviceinput is the hub's; checked here on the real message) take it."""
    from edged.serving.measuring import BenchmarkResult, RevisionMeasures, ValidationResult

    rev = RevisionStatus("rev1", "2.1", "a" * 64, RevisionPhase.READY, 2, wanted=True)
    statuses = {
        WorkloadName("shelf"): WorkloadStatus("Running", 2, 2, "rev1", (), revisions=(rev,))
    }
    report = build_device_report(
        {},
        DESIRED,
        statuses.get,
        (),
        measures_of=lambda w, r: RevisionMeasures(120, 3, 0.012, 60.0, 40) if r == "rev1" else None,
        validation_of=lambda w, r: ValidationResult(0.9, 10, 9),
        benchmark_of=lambda w, r: BenchmarkResult(0.0042, 20) if r == "rev1" else None,
    )
    msg = status_message(report, generation=1)
    (shelf,) = [w for w in msg.workloads if w.name == "shelf"]
    got = shelf.revisions[0]
    assert (got.metrics.requests, got.metrics.errors, got.metrics.window_requests) == (120, 3, 40)
    assert got.metrics.latency_p95_seconds == 0.012
    assert (got.validation.accuracy, got.validation.samples, got.validation.correct) == (0.9, 10, 9)
    assert (got.benchmark.p95_seconds, got.benchmark.runs) == (0.0042, 20)
    doors = next(w for w in msg.workloads if w.name == "doors")
    assert not doors.revisions[0].HasField("metrics")  # nothing measured: nothing sent


def test_status_carries_the_agent_controllers_status_bounded() -> None:
    """Status.agent: what edged.agent.controller says, each field bounded; none without it."""
    from dataclasses import replace

    assert not status_message(REPORT, generation=1).HasField("agent")
    agent = {
        "version": "0.2.1", "slot": "a", "committedVersion": "0.2.0", "phase": "Trying",
        "reason": "WaitingForHealth", "message": "x" * 5000, "tries": 2, "launcher": True,
        "desiredVersion": "0.2.1", "upgrade": "edged-next", "upgradeRevision": 3,
        "bytesDone": 10, "bytesTotal": 20, "arch": "x86_64", "pythonAbi": "cp311",
    }  # fmt: skip
    msg = status_message(replace(REPORT, agent=agent), generation=1).agent
    assert (msg.version, msg.slot, msg.committed_version, msg.phase) == (
        "0.2.1", "a", "0.2.0", "Trying",
    )  # fmt: skip
    assert msg.reason == "WaitingForHealth" and len(msg.message) == 1024
    assert (msg.tries, msg.launcher, msg.upgrade, msg.upgrade_revision) == (
        2, True, "edged-next", 3,
    )  # fmt: skip
    assert (msg.bytes_done, msg.bytes_total, msg.arch, msg.python_abi) == (
        10, 20, "x86_64", "cp311",
    )  # fmt: skip
