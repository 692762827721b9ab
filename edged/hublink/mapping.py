"""The device report in protobuf (edgefleet.v1): Hello, Status and their parts.

The one place of edged, with ``linking.py``, that builds messages of the generated stubs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from google.protobuf import struct_pb2, timestamp_pb2

from edged.hublink.devicereport import DeviceReport, SandboxReport, WorkloadReport
from edged.reconcile.model import RevisionStatus, Termination
from edged.serving.measuring import BenchmarkResult, RevisionMeasures, ValidationResult
from edgefleet.api.conditions import Condition
from edgefleet.sealing import SealedForDevice
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
        compliance=_compliance(report.compliance),
        labels=report.labels,
        agent=_agent(report.agent),
    )


def _agent(doc: Mapping[str, Any] | None) -> device_pb2.AgentStatus | None:
    """edged.agent.controller's status as AgentStatus (None: no agent controller)."""
    if doc is None:
        return None
    changed = timestamp_pb2.Timestamp()
    changed.FromNanoseconds(int(float(doc.get("changedAt", 0)) * 1e9))
    return device_pb2.AgentStatus(
        version=str(doc.get("version", ""))[:64],
        slot=str(doc.get("slot", ""))[:16],
        committed_version=str(doc.get("committedVersion", ""))[:64],
        phase=str(doc.get("phase", ""))[:32],
        desired_version=str(doc.get("desiredVersion", ""))[:64],
        reason=str(doc.get("reason", ""))[:64],
        message=str(doc.get("message", ""))[:1024],
        tries=int(doc.get("tries", 0)),
        changed_at=changed,
        arch=str(doc.get("arch", ""))[:32],
        python_abi=str(doc.get("pythonAbi", ""))[:16],
        launcher=bool(doc.get("launcher")),
        bytes_done=int(doc.get("bytesDone", 0)),
        bytes_total=int(doc.get("bytesTotal", 0)),
        upgrade=str(doc.get("upgrade", ""))[:256],
        upgrade_revision=int(doc.get("upgradeRevision", 0)),
    )


def _compliance(doc: Mapping[str, Any] | None) -> device_pb2.DeviceCompliance | None:
    if doc is None:
        return None
    return device_pb2.DeviceCompliance(
        checked=bool(doc.get("checked")),
        compliant=bool(doc.get("compliant")),
        action=str(doc.get("action", "")),
        findings=[
            device_pb2.ComplianceFinding(
                kind=str(f["kind"]),
                subject=str(f["subject"])[:128],
                message=str(f["message"])[:1024],
            )
            for f in doc.get("findings", [])[:32]
        ],
        quarantined=str(doc.get("quarantined") or ""),
        processes_checked=bool(doc.get("processesChecked")),
        opens_watched=bool(doc.get("opensWatched")),
        opens_watch_reason=str(doc.get("opensWatchReason") or "")[:512],
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
        revisions=[
            _revision(
                r,
                w.measures.get(r.revision),
                w.validations.get(r.revision),
                w.benchmarks.get(r.revision),
            )
            for r in w.revisions
        ],
        sizing=_sizing(w.sizing) if w.sizing else None,
        replica_sandboxes=[_sandbox(x) for x in w.sandboxes],
        last_termination=_termination(w.last_termination) if w.last_termination else None,
        restart_count=min(w.restart_count, MAX_UINT32),
        model_config=(
            device_pb2.ModelConfigStatus(digest=w.config_digest, error=w.config_error[:1024])
            if w.config_digest or w.config_error
            else None
        ),
    )


MAX_UINT32 = 2**32 - 1
MAX_REASON = 64  # the hub's bound (hub.api.deviceinput.MAX_TERMINATION_REASON)
MAX_MESSAGE = 1024


def _termination(t: Termination) -> device_pb2.ReplicaTermination:
    """Cut to what the hub accepts: a worker's own reason and message are its words."""
    out = device_pb2.ReplicaTermination(
        replica=t.replica[:128],
        reason=t.reason[:MAX_REASON],
        message=t.message[:MAX_MESSAGE],
        exit_code=max(0, min(t.exit_code, 255)),
        signal=max(0, min(t.signal, 64)),
    )
    if t.finished_at is not None:
        out.finished_at.FromMicroseconds(round(t.finished_at * 1e6))  # time.time()'s precision
    return out


def _sandbox(x: SandboxReport) -> device_pb2.ReplicaSandbox:
    return device_pb2.ReplicaSandbox(
        replica=x.replica,
        revision=x.revision,
        mode=x.mode,
        landlock_abi=x.landlock_abi,
        filesystem=x.filesystem,
        network=x.network,
        no_new_privs=x.no_new_privs,
        seccomp=x.seccomp,
        scoped=x.scoped,
        connect_ports=list(x.connect_ports),
        connect_to=list(x.connect_to),
        uid=x.uid,
        separate_uid=x.separate_uid,
        problems=list(x.problems),
    )


def _sizing(doc: Mapping[str, Any]) -> device_pb2.WorkloadSizing:
    """The ``scaling`` and ``eviction`` parts of a workload's status (reconcile/sizing.py)."""
    scaling = doc.get("scaling") or {}
    eviction = doc.get("eviction") or {}
    batching = doc.get("batching") or {}
    out = device_pb2.WorkloadSizing(
        current_replicas=int(scaling.get("currentReplicas") or 0),
        desired_replicas=int(scaling.get("desiredReplicas") or 0),
        min_replicas=int(scaling.get("minReplicas") or 0),
        max_replicas=int(scaling.get("maxReplicas") or 0),
        evicted_replicas=int(eviction.get("evictedReplicas") or 0),
        priority=int(eviction.get("priority") or 0),
        effective_max_batch_size=int(batching.get("effectiveMaxBatchSize") or 0),
    )
    reported = doc.get("reported") or {}
    if reported.get("queueDepth") is not None:
        out.queue_depth = float(reported["queueDepth"])
    if reported.get("cpu") is not None:
        out.cpu_percent = float(reported["cpu"])
    last = scaling.get("lastDecision")
    if last:
        decision = device_pb2.ScalingDecision(
            from_replicas=int(last["from"]),
            to_replicas=int(last["to"]),
            reason=str(last["reason"]),
            message=str(last["message"]),
        )
        if last.get("at") is not None:
            decision.at.FromMilliseconds(round(float(last["at"]) * 1000))
        out.last_decision.CopyFrom(decision)
    return out


def _revision(
    r: RevisionStatus,
    m: RevisionMeasures | None,
    v: ValidationResult | None,
    b: BenchmarkResult | None = None,
) -> device_pb2.RevisionStatus:
    msg = device_pb2.RevisionStatus(
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
    if m is not None:
        msg.metrics.CopyFrom(
            device_pb2.RevisionMetrics(
                requests=m.requests,
                errors=m.errors,
                latency_p95_seconds=m.latency_p95_s,
                latency_window_seconds=m.latency_window_s,
                window_requests=m.window_requests,
            )
        )
    if v is not None:
        msg.validation.CopyFrom(
            device_pb2.RevisionValidation(
                accuracy=v.accuracy,
                samples=v.samples,
                correct=v.correct,
                reason=v.reason,
                message=v.message,
            )
        )
    if b is not None:
        msg.benchmark.CopyFrom(device_pb2.RevisionBenchmark(p95_seconds=b.p95_s, runs=b.runs))
    return msg


def _condition(c: Condition) -> common_pb2.Condition:
    return common_pb2.Condition(
        type=c.type, status=c.status.value, reason=c.reason, message=c.message
    )


def _struct(doc: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    # Struct holds JSON values only: round-trip through JSON drops anything else safely.
    s.update(orjson.loads(orjson.dumps(doc, default=str)))
    return s


MAX_SECRETS_IN_STATE = 256


def sealed_secrets(state: device_pb2.DesiredState) -> list[SealedForDevice]:
    """The sealed secrets of a desired state (bounded: the hub holds at most 256)."""
    return [
        SealedForDevice(
            s.name,
            int(s.version),
            bytes(s.ephemeral_public_key),
            bytes(s.nonce),
            bytes(s.ciphertext),
            bool(s.require_tpm),
        )
        for s in list(state.secrets)[:MAX_SECRETS_IN_STATE]
    ]
