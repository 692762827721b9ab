"""The data the reconciler plans with: desired and observed state of one workload, and actions.

Pure data (frozen dataclasses, enums); no I/O. A *workload* is one ModelDeployment on this
device, keyed by its ``metadata.name``. A *revision* is a hash of everything that requires new
worker processes when it changes (artifact digest, runtime and resource settings): a change of
revision is a zero-downtime switch (new replicas become ready before old ones stop).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NewType

import orjson

from edgefleet.api import ModelDeployment
from edgefleet.api.conditions import Condition

WorkloadName = NewType("WorkloadName", str)
ReplicaId = NewType("ReplicaId", str)


@dataclass(frozen=True, slots=True)
class DesiredWorkload:
    """A deployment accepted into desired state, with its artifact resolved to a digest."""

    deployment: ModelDeployment
    sha256: str  # digest of the model artifact in the content-addressed store
    source: str = ""  # where it came from (manifest file, hub); for status only

    @property
    def name(self) -> WorkloadName:
        return WorkloadName(self.deployment.metadata.name)

    @property
    def revision(self) -> str:
        spec = self.deployment.spec
        doc = self.deployment.to_dict()["spec"]
        material = {
            "sha256": self.sha256,
            "model": {"name": spec.model.name, "version": spec.model.version},
            "runtime": doc.get("runtime"),
            "resources": doc.get("resources"),
        }
        return hashlib.sha256(orjson.dumps(material, option=orjson.OPT_SORT_KEYS)).hexdigest()[:10]

    def revision_with(self, providers: tuple[str, ...] | None) -> str:
        """The revision when running with ``providers`` (chosen by discovery).

        Equal to :attr:`revision` when ``providers`` is ``None`` or the spec's own list, so a
        fallback (and the way back) is a new revision: a zero-downtime switch.
        """
        if providers is None or providers == self.deployment.spec.runtime.execution_providers:
            return self.revision
        material = {"base": self.revision, "providers": list(providers)}
        return hashlib.sha256(orjson.dumps(material)).hexdigest()[:10]


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
    crash_streak: int = 0  # consecutive failures, drives crash-loop backoff
    live: bool = True  # liveness probe verdict
    conditions: tuple[Condition, ...] = ()  # reported by the worker (e.g. ProviderFallback)


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
class ObservedWorkload:
    replicas: tuple[ReplicaObservation, ...] = ()
    artifact_present: bool = True
    providers: ProviderChoice | None = None  # None: discovery off, the spec's list as is


# -- actions ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartReplica:
    """Start (or restart, after backoff) the process for a replica slot of a revision."""

    workload: WorkloadName
    replica_id: ReplicaId
    revision: str
    slot: int
    providers: tuple[str, ...] = ()  # chosen by discovery; empty: the spec's list


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


@dataclass(frozen=True, slots=True)
class WorkloadStatus:
    phase: str  # Pending | Progressing | Running | Degraded | Failed | Terminating
    ready_replicas: int
    desired_replicas: int
    revision: str
    conditions: tuple[Condition, ...] = ()
    providers: tuple[str, ...] = ()  # the planned execution providers (empty: discovery off)


@dataclass(frozen=True, slots=True)
class Plan:
    actions: tuple[Action, ...] = ()
    status: WorkloadStatus | None = None
    requeue_after: float | None = None
    notes: tuple[str, ...] = field(default=())
