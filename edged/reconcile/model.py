"""The data the reconciler plans with: what is observed of a workload's replicas, the actions a
plan holds, and the status it reports. Pure data (frozen dataclasses, enums); no I/O. The desired
side, a workload and its revision, is :mod:`edged.workloads`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from edged.workloads import ReplicaId, WorkloadName
from edgefleet.api.conditions import Condition


class Phase(StrEnum):
    STARTING = "Starting"  # process started, model not loaded/warmed up yet
    READY = "Ready"  # serving
    UNREADY = "Unready"  # alive but failing readiness: not routed to
    STOPPING = "Stopping"  # draining before exit
    EXITED = "Exited"  # process ended unexpectedly (crash, kill by a probe)


@dataclass(frozen=True, slots=True)
class ReplicaObservation:
    replica_id: ReplicaId
    revision: str
    slot: int
    phase: Phase
    pid: int | None
    started_at: float  # monotonic seconds of the current (or last) process start
    ready_since: float | None = None
    exited_at: float | None = None
    exit_reason: str = ""
    exit_message: str = ""
    restarts: int = 0  # total restarts of this slot
    # the last unasked-for end, kept across restarts: its exit status (negative: the signal)
    # and wall-clock time (None: none yet, or the process never started)
    exit_code: int | None = None
    finished_at: float | None = None
    crash_streak: int = 0  # consecutive failures, drives crash-loop backoff
    live: bool = True  # liveness probe verdict
    conditions: tuple[Condition, ...] = ()  # reported by the worker (e.g. ProviderFallback)
    model_version: str = ""  # what this replica's process loads
    sha256: str = ""  # the artifact it loads


@dataclass(frozen=True, slots=True)
class Termination:
    """How a replica's worker last ended when edged did not stop it on purpose (Kubernetes'
    ``lastState.terminated``): its reason (``OOMKilled``...), exit code or signal, when."""

    replica: str
    reason: str
    message: str = ""
    exit_code: int = 0  # the exit status of a worker that exited (0 when a signal ended it)
    signal: int = 0  # the signal that ended it (0 when it exited or never started)
    finished_at: float | None = None  # wall-clock seconds (time.time())

    def to_json(self) -> dict[str, object]:
        return {
            "replica": self.replica,
            "reason": self.reason,
            "message": self.message,
            "exitCode": self.exit_code,
            "signal": self.signal,
            "finishedAt": self.finished_at,
        }


@dataclass(frozen=True, slots=True)
class ProviderChoice:
    """The execution providers discovery chose for a workload (see discovery/providers.py).

    ``providers`` empty: no allowed provider is usable here, so no replica may run.
    ``fell_back``: the first preference is not usable; ``message`` says why.
    """

    providers: tuple[str, ...]
    fell_back: bool = False
    message: str = ""


@dataclass(frozen=True, slots=True)
class PrecisionChoice:
    """The precision variant a workload serves now (``reconcile/precision.py``)."""

    precision: str  # what is served
    sha256: str  # the file that holds it
    reason: str  # LowBattery | PowerWindow | Requested | Default
    message: str
    conditions: tuple[Condition, ...] = ()  # PrecisionAvailable=False when one is missing
    recheck_after: float | None = None  # seconds until the choice may change by the clock


@dataclass(frozen=True, slots=True)
class ObservedWorkload:
    replicas: tuple[ReplicaObservation, ...] = ()
    artifact_present: bool = True
    artifact_quarantined: bool = False  # a copy of it rotted on disk and was moved away
    providers: ProviderChoice | None = None  # None: discovery off, the spec's list as is
    # the replicas wanted now, from the autoscaler and eviction (None: the spec's count)
    wanted_replicas: int | None = None
    sizing_conditions: tuple[Condition, ...] = ()  # why (Evicted...)
    precision: PrecisionChoice | None = None  # None: the artifact's model file, no variants


# -- actions ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartReplica:
    """Start (or restart, after backoff) the process for a replica slot of a revision."""

    workload: WorkloadName
    replica_id: ReplicaId
    revision: str
    slot: int
    providers: tuple[str, ...] = ()  # chosen by discovery; empty: the spec's list
    sha256: str = ""  # the file to load (a precision variant); empty: the artifact's model


@dataclass(frozen=True, slots=True)
class StopReplica:
    """Take a replica out of serving, let it finish what it has, then end it."""

    workload: WorkloadName
    replica_id: ReplicaId
    reason: str


@dataclass(frozen=True, slots=True)
class KillReplica:
    """End a replica now (failed startup or liveness); it will be restarted with backoff."""

    workload: WorkloadName
    replica_id: ReplicaId
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class ForgetReplica:
    """Drop the record of an exited replica that is no longer wanted."""

    workload: WorkloadName
    replica_id: ReplicaId


@dataclass(frozen=True, slots=True)
class RefetchArtifact:
    """The artifact vanished from the store: ask the desired-state source to fetch it again."""

    workload: WorkloadName


Action = StartReplica | StopReplica | KillReplica | ForgetReplica | RefetchArtifact


class RevisionPhase(StrEnum):
    """Where one revision of a workload stands on this device (reported to the hub).

    Before it can run, the hub source moves it through Pending, Downloading and Verifying,
    or stops it at Refused; then the planner's view: Loading, Ready (serving), Failed
    (crash-looping with nothing ready), Draining (superseded, answering what it holds).
    """

    PENDING = "Pending"
    DOWNLOADING = "Downloading"
    VERIFYING = "Verifying"
    REFUSED = "Refused"
    LOADING = "Loading"
    READY = "Ready"
    FAILED = "Failed"
    DRAINING = "Draining"


@dataclass(frozen=True, slots=True)
class RevisionStatus:
    """One revision of a workload held on this device: what it runs and how far it got."""

    revision: str  # "" while the artifact is not admitted (no revision can be computed yet)
    model_version: str
    sha256: str
    phase: RevisionPhase
    ready_replicas: int = 0
    reason: str = ""  # why Refused or Failed
    message: str = ""
    wanted: bool = False  # the revision the accepted desired state asks for
    bytes_done: int = 0  # while Downloading: bytes on the device, of bytes_total
    bytes_total: int = 0

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "revision": self.revision,
            "modelVersion": self.model_version,
            "sha256": self.sha256,
            "phase": self.phase.value,
            "readyReplicas": self.ready_replicas,
            "reason": self.reason,
            "message": self.message,
            "wanted": self.wanted,
        }
        if self.bytes_total:
            out["download"] = {"bytesDone": self.bytes_done, "bytesTotal": self.bytes_total}
        return out


@dataclass(frozen=True, slots=True)
class WorkloadStatus:
    phase: str  # Pending | Progressing | Running | Degraded | Failed | Terminating
    ready_replicas: int
    desired_replicas: int
    revision: str
    conditions: tuple[Condition, ...] = ()
    providers: tuple[str, ...] = ()  # the planned execution providers (empty: discovery off)
    revisions: tuple[RevisionStatus, ...] = ()  # the wanted one first, then older ones
    precision: str = ""  # the precision variant served (empty: no variant chosen)
    last_termination: Termination | None = None  # the newest unasked-for end of a replica
    restarts: int = 0  # restarts of the replicas that exist now, summed


@dataclass(frozen=True, slots=True)
class Plan:
    actions: tuple[Action, ...] = ()
    status: WorkloadStatus | None = None
    requeue_after: float | None = None
    notes: tuple[str, ...] = field(default=())
