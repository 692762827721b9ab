"""What a device tells the hub about its sandboxes and its drift check: the report in, the
protobuf Status out, read back by the hub (its bounds, its record), all pure."""

from __future__ import annotations

from edged.hublink.devicereport import DeviceReport, SandboxReport, WorkloadReport
from edged.hublink.mapping import status_message
from edgefleet.v1 import device_pb2
from hub.api.deviceinput import check_status
from hub.api.devicesync import _compliance, _workload

SANDBOX = {
    "inForce": True, "mode": "landlock", "landlockAbi": 7, "filesystem": True, "network": True,
    "noNewPrivs": True, "seccomp": True, "scoped": True, "connectPorts": [8080], "uid": 61200,
    "gid": 61200, "separateUid": True, "problems": [],
}  # fmt: skip
COMPLIANCE = {
    "checked": True,
    "compliant": False,
    "action": "alert",
    "findings": [{"kind": "StrayProcess", "subject": "4242", "message": "process 4242 ..."}],
    "quarantined": None,
    "processesChecked": True,
    "opensWatched": False,
    "opensWatchReason": "fanotify needs CAP_SYS_ADMIN, which edged does not have",
}


def report() -> DeviceReport:
    workload = WorkloadReport(
        name="mlp", revision="abc", sandboxes=(SandboxReport.of("mlp-abc-0", "abc", SANDBOX),)
    )
    return DeviceReport({}, {}, True, (), (workload,), compliance=COMPLIANCE)


def test_the_hub_reads_back_what_the_device_reported() -> None:
    msg = status_message(report(), generation=3)
    assert check_status(msg) == []
    (sandbox,) = _workload(msg.workloads[0]).sandboxes
    assert sandbox == {
        "replica": "mlp-abc-0", "revision": "abc", "mode": "landlock", "landlockAbi": 7,
        "filesystem": True, "network": True, "noNewPrivs": True, "seccomp": True,
        "scoped": True, "connectPorts": [8080], "uid": 61200, "separateUid": True,
        "problems": [],
    }  # fmt: skip
    assert _compliance(msg.compliance) == COMPLIANCE
    older = device_pb2.DeviceCompliance(checked=True)  # an edged too old to say
    assert _compliance(older)["opensWatched"] is None


def test_a_report_over_the_bounds_is_refused_naming_the_field() -> None:
    msg = status_message(report(), generation=3)
    msg.compliance.findings.extend(
        device_pb2.ComplianceFinding(kind="X", subject="y", message="z") for _ in range(40)
    )
    msg.workloads[0].replica_sandboxes[0].problems.extend(["p"] * 9)
    problems = check_status(msg)
    assert "status.compliance.findings: at most 32, got 41" in problems
    assert "status.workloads[0].replica_sandboxes[0].problems: at most 8, got 9" in problems
