"""The device report in protobuf (edgefleet.v1): Hello, Status and their parts.

The one place of edged, with ``linking.py``, that builds messages of the generated stubs.
"""

from __future__ import annotations

from typing import Any

import orjson
from google.protobuf import struct_pb2

from edged.hublink.reporting import DeviceReport, WorkloadReport
from edged.reconcile.model import RevisionStatus
from edgefleet.api.conditions import Condition
from edgefleet.v1 import common_pb2, device_pb2


def hello_message(
    report: DeviceReport, *, device_name: str, generation: int, edged_version: str
) -> device_pb2.Hello:
    return device_pb2.Hello(
        device_name=device_name,
        inventory=_struct(report.inventory),
        labels=report.labels,
        health=_health(report),
        applied_generation=generation,
        edged_version=edged_version,
    )


def status_message(report: DeviceReport, *, generation: int) -> device_pb2.Status:
    return device_pb2.Status(
        workloads=[_workload(w) for w in report.workloads],
        health=_health(report),
        observed_generation=generation,
    )


def _health(report: DeviceReport) -> common_pb2.Health:
    return common_pb2.Health(schedulable=report.schedulable, reasons=list(report.reasons))


def _workload(w: WorkloadReport) -> device_pb2.WorkloadStatus:
    return device_pb2.WorkloadStatus(
        name=w.name,
        revision=w.revision,
        ready_replicas=w.ready_replicas,
        desired_replicas=w.desired_replicas,
        model_version=w.model_version,
        conditions=[_condition(c) for c in w.conditions],
        revisions=[_revision(r) for r in w.revisions],
    )


def _revision(r: RevisionStatus) -> device_pb2.RevisionStatus:
    return device_pb2.RevisionStatus(
        revision=r.revision,
        model_version=r.model_version,
        sha256=r.sha256,
        phase=r.phase.value,
        ready_replicas=r.ready_replicas,
        reason=r.reason,
        message=r.message,
        wanted=r.wanted,
        bytes_done=r.bytes_done,
        bytes_total=r.bytes_total,
    )


def _condition(c: Condition) -> common_pb2.Condition:
    return common_pb2.Condition(
        type=c.type, status=c.status.value, reason=c.reason, message=c.message
    )


def _struct(doc: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    # Struct holds JSON values only: round-trip through JSON drops anything else safely.
    s.update(orjson.loads(orjson.dumps(doc, default=str)))
    return s
