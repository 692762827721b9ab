"""What the device tells the hub about itself (Hello and Status), as plain data.

:func:`build_device_report` is pure: discovery's view of the device, the accepted desired
state, the planned status of each workload and the hub source's problems in, a
:class:`DeviceReport` out. Only workloads the hub gave are reported (static ones are the
device's own business); a hub workload that was refused before it ever ran is reported with
``Ready=False`` and the refusal's reason.

Each workload lists the revisions the device holds (``revisions``): first the one the hub asks
for, which is either still with the hub source (``incoming``: Verifying, Downloading, Refused)
or the planner's current revision (Loading, Ready, Failed), then older ones still serving or
draining. ``model_version`` is the version the hub asks for; whether it *serves* is only in
``revisions``, each with what its inference path answered and its validation accuracy when
known; ``last_termination`` and ``restart_count`` come from the planned status (the newest
unasked-for end of a replica, ``OOMKilled`` included). ``mapping.py`` turns the report into
protobuf, so
nothing outside the hub link touches the generated stubs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from edged.reconcile.model import RevisionPhase, RevisionStatus, Termination, WorkloadStatus
from edged.serving.measuring import BenchmarkResult, RevisionMeasures, ValidationResult
from edged.sources.static import SourceProblem
from edged.state.merging import HUB_SOURCE
from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.api.conditions import Condition, ConditionStatus


@dataclass(frozen=True, slots=True)
class SandboxReport:
    """What confines one replica's worker (its READY report; ``sandboxing.Protections``)."""

    replica: str
    revision: str
    mode: str = "off"
    landlock_abi: int = 0
    filesystem: bool = False
    network: bool = False
    no_new_privs: bool = False
    seccomp: bool = False
    scoped: bool = False
    connect_ports: tuple[int, ...] = ()
    connect_to: tuple[str, ...] = ()
    uid: int = 0
    separate_uid: bool = False
    problems: tuple[str, ...] = ()

    @classmethod
    def of(cls, replica: str, revision: str, doc: Mapping[str, Any]) -> SandboxReport:
        """From the worker's own report (``Replica.sandbox_status()``; pure)."""
        return cls(
            replica=replica,
            revision=revision,
            mode=str(doc.get("mode", "off")),
            landlock_abi=int(doc.get("landlockAbi", 0)),
            filesystem=bool(doc.get("filesystem")),
            network=bool(doc.get("network")),
            no_new_privs=bool(doc.get("noNewPrivs")),
            seccomp=bool(doc.get("seccomp")),
            scoped=bool(doc.get("scoped")),
            connect_ports=tuple(int(p) for p in doc.get("connectPorts", ())),
            connect_to=tuple(str(p) for p in doc.get("connectTo", ())),
            uid=int(doc.get("uid", 0)),
            separate_uid=bool(doc.get("separateUid")),
            problems=tuple(str(p) for p in doc.get("problems", ())),
        )


@dataclass(frozen=True, slots=True)
class WorkloadReport:
    name: str
    revision: str = ""
    ready_replicas: int = 0
    desired_replicas: int = 0
    model_version: str = ""
    conditions: tuple[Condition, ...] = ()
    revisions: tuple[RevisionStatus, ...] = ()
    # autoscaling and eviction, as in /v1/status ({"scaling": ..., "eviction": ...}); None:
    # neither applies
    sizing: Mapping[str, Any] | None = None
    # per revision (hash): what its inference path answered, its validation accuracy
    measures: Mapping[str, RevisionMeasures] = field(default_factory=dict)
    validations: Mapping[str, ValidationResult] = field(default_factory=dict)
    benchmarks: Mapping[str, BenchmarkResult] = field(default_factory=dict)
    sandboxes: tuple[SandboxReport, ...] = ()
    last_termination: Termination | None = None
    restart_count: int = 0
    # its model configuration: the digest its replicas read ("": none), why the one the hub
    # sent is not applied ("": it is)
    config_digest: str = ""
    config_error: str = ""


def _config_fields(
    config_of: Callable[[WorkloadName], tuple[str, str]] | None, name: WorkloadName
) -> dict[str, str]:
    if config_of is None:
        return {}
    digest, error = config_of(name)
    return {"config_digest": digest, "config_error": error}


@dataclass(frozen=True, slots=True)
class DeviceReport:
    inventory: dict[str, Any]  # facts, accelerators, execution providers
    labels: dict[str, str]
    schedulable: bool
    reasons: tuple[str, ...]
    workloads: tuple[WorkloadReport, ...]
    compliance: Mapping[str, Any] | None = None  # device.compliance of the status (drift)
    agent: Mapping[str, Any] | None = None  # edged.agent.controller's status


def build_device_report(
    device: Mapping[str, Any],
    desired: Mapping[WorkloadName, DesiredWorkload],
    status_of: Callable[[WorkloadName], WorkloadStatus | None],
    problems: Sequence[SourceProblem],
    incoming: Mapping[WorkloadName, RevisionStatus] | None = None,
    sizing_of: Callable[[WorkloadName], Mapping[str, Any] | None] | None = None,
    measures_of: Callable[[WorkloadName, str], RevisionMeasures | None] | None = None,
    validation_of: Callable[[WorkloadName, str], ValidationResult | None] | None = None,
    benchmark_of: Callable[[WorkloadName, str], BenchmarkResult | None] | None = None,
    sandboxes_of: Callable[[WorkloadName], tuple[SandboxReport, ...]] | None = None,
    compliance: Mapping[str, Any] | None = None,
    config_of: Callable[[WorkloadName], tuple[str, str]] | None = None,
) -> DeviceReport:
    """``sandboxes_of``: what confines each replica of a workload whose worker reported it.
    ``device``: discovery's status (``{}`` when discovery is off); ``status_of``: the
    status the reconciler planned for a workload (None: not reconciled yet); ``incoming``:
    the hub source's revisions not accepted (yet), by workload; ``sizing_of``: autoscaling
    and eviction of a workload (None: not reported); ``measures_of`` and ``validation_of``:
    a revision's figures (serving/measuring.py), by workload and hash; ``benchmark_of``: a
    revision's self-benchmark (the slowest replica's); ``config_of``: a workload's model
    configuration, its digest and error (edged.sources.hub.HubSource.config_status)."""
    health = device.get("health") or {}
    incoming = incoming or {}
    workloads = []
    for name, w in sorted(desired.items()):
        if w.source != HUB_SOURCE:
            continue
        st = status_of(name)
        revisions = st.revisions if st else ()
        version = w.deployment.spec.model.version
        new = incoming.get(name)
        if new is not None and (new.sha256 != w.sha256 or new.model_version != version):
            # The hub asks for something this device does not run (yet, or ever: refused).
            revisions = (new, *(replace(r, wanted=False) for r in revisions))
            version = new.model_version
        elif st is None:
            revisions = (RevisionStatus("", version, w.sha256, RevisionPhase.PENDING, wanted=True),)
        measures = {}
        validations = {}
        benchmarks = {}
        for r in revisions:
            if not r.revision:
                continue
            m = measures_of(name, r.revision) if measures_of is not None else None
            if m is not None:
                measures[r.revision] = m
            v = validation_of(name, r.revision) if validation_of is not None else None
            if v is not None:
                validations[r.revision] = v
            b = benchmark_of(name, r.revision) if benchmark_of is not None else None
            if b is not None:
                benchmarks[r.revision] = b
        workloads.append(
            WorkloadReport(
                name=name,
                revision=st.revision if st else "",
                ready_replicas=st.ready_replicas if st else 0,
                desired_replicas=st.desired_replicas if st else 0,
                model_version=version,
                conditions=st.conditions if st else (),
                revisions=revisions,
                sizing=_steady(sizing_of(name)) if sizing_of is not None else None,
                measures=measures,
                validations=validations,
                benchmarks=benchmarks,
                sandboxes=sandboxes_of(name) if sandboxes_of is not None else (),
                last_termination=st.last_termination if st else None,
                restart_count=st.restarts if st else 0,
                **_config_fields(config_of, name),
            )
        )
    reported = {x.name for x in workloads}
    for p in problems:
        if not p.workload:
            continue
        kept = next((i for i, x in enumerate(workloads) if x.name == p.workload), None)
        if kept is None:
            reported.add(p.workload)
            refused = Condition("Ready", ConditionStatus.FALSE, p.reason, p.message)
            new = incoming.get(WorkloadName(p.workload))
            workloads.append(
                WorkloadReport(
                    name=p.workload,
                    model_version=new.model_version if new else "",
                    conditions=(refused,),
                    revisions=(new,) if new else (),
                )
            )
        else:
            # the previous version keeps serving; the hub still learns why the new one is
            # not taken (InsufficientDisk, a refused signature...)
            not_updated = Condition("Updated", ConditionStatus.FALSE, p.reason, p.message)
            old = workloads[kept]
            workloads[kept] = replace(old, conditions=(*old.conditions, not_updated))
    for name, new in sorted(incoming.items()):
        if name not in reported:  # a first version still being checked or fetched
            workloads.append(
                WorkloadReport(name=name, model_version=new.model_version, revisions=(new,))
            )
    return DeviceReport(
        inventory={
            "facts": device.get("facts"),
            "accelerators": device.get("accelerators", []),
            "executionProviders": device.get("executionProviders"),
        },
        labels=dict(device.get("labels") or {}),
        schedulable=bool(health.get("schedulable", True)),
        reasons=tuple(health.get("reasons", ())),
        workloads=tuple(workloads),
        compliance=compliance,
    )


def _steady(sizing: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """Sizing without the figures that move with every sample (the report is sent on change):
    requests in flight, CPU, memory seen per replica and per batch row."""
    if not sizing:
        return None
    drop = {"inflightPerReplica", "cpuPercent", "replicaBytes", "rowBytes"}
    return {
        part: {k: v for k, v in doc.items() if k not in drop} if isinstance(doc, Mapping) else doc
        for part, doc in sizing.items()
    }
