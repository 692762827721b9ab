"""An AgentUpgrade's revisions and its rollout's record, plain data (how the rollout moves:
:mod:`hub.decide.agentupgrade`; what each device is sent: :mod:`hub.decide.agentdesired`;
its status: :mod:`hub.decide.agentupgradestatus`): :class:`AgentRevision`, :class:`SentAgent`,
:class:`AgentUpgradeState` (stored at ``/agentupgrades/NAME``), what the planner knows of a
device (:class:`AgentDeviceView`) and what it returns (:class:`AgentPlan`,
:class:`AgentProgress`, :class:`Event`), and :class:`DesiredAgentSpec`, what a device is sent."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hub.decide.agentreleases import AgentReleaseRecord
from hub.decide.devices import AgentReport
from hub.decide.revisions import RolloutPhase

AGENT_UPGRADES = "/agentupgrades/"
"""Store prefix of the rollout records: ``/agentupgrades/NAME`` (:class:`AgentUpgradeState`)."""

MAX_REVISIONS = 10
MAX_NAMED = 5  # devices a message names before "and N more"


def agent_upgrade_key(name: str) -> str:
    return f"{AGENT_UPGRADES}{name}"


@dataclass(frozen=True, slots=True)
class AgentRevision:
    """One revision of an upgrade: what its devices are sent."""

    number: int
    version: str
    deadline_s: int
    max_tries: int
    created_at: float
    source: int = 0  # the revision it retries or copies (resume, undo), 0: none
    # at a regional hub: the root's revision it was made for (the manifest's annotation,
    # hub.controllers.agentwaves), 0: none (a hub's own upgrade, or a record made before
    # records carried it)
    root_revision: int = 0

    @property
    def template(self) -> tuple[str, int, int]:
        return self.version, self.deadline_s, self.max_tries

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "number": self.number,
            "version": self.version,
            "deadlineSeconds": self.deadline_s,
            "maxTries": self.max_tries,
            "createdAt": self.created_at,
            "source": self.source,
        }
        if self.root_revision:
            out["rootRevision"] = self.root_revision
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> AgentRevision:
        return cls(
            int(doc["number"]),
            str(doc["version"]),
            int(doc["deadlineSeconds"]),
            int(doc["maxTries"]),
            float(doc["createdAt"]),
            int(doc.get("source", 0)),
            int(doc.get("rootRevision", 0)),
        )


@dataclass(frozen=True, slots=True)
class SentAgent:
    """A device sent the release: of which revision, when, what it had committed then, the
    workloads that served on it then (they must serve again for it to be done), and when the
    hub first saw it come back healthy (0: not yet; done from then on, away or not)."""

    revision: int
    sent_at: float
    from_version: str
    serving: tuple[str, ...] = ()
    done_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "revision": self.revision,
            "sentAt": self.sent_at,
            "fromVersion": self.from_version,
            "serving": list(self.serving),
        }
        if self.done_at:
            doc["doneAt"] = self.done_at
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> SentAgent:
        return cls(
            int(doc["revision"]),
            float(doc["sentAt"]),
            str(doc.get("fromVersion", "")),
            tuple(str(s) for s in doc.get("serving", ())),
            float(doc.get("doneAt", 0.0)),
        )


@dataclass(frozen=True, slots=True)
class AgentUpgradeState:
    """Where an upgrade's rollout stands; stored at ``/agentupgrades/NAME``."""

    upgrade: str
    revision: int
    revisions: tuple[AgentRevision, ...]
    phase: RolloutPhase = RolloutPhase.PROGRESSING
    reason: str = ""
    message: str = ""
    started_at: float = 0.0
    changed_at: float = 0.0
    step: int = 0  # index into spec.rollout.canary.steps (== len: past the last)
    sent: Mapping[str, SentAgent] = field(default_factory=dict)
    failed: Mapping[str, str] = field(default_factory=dict)  # device -> why
    rollback: Mapping[str, str] = field(default_factory=dict)  # device -> version sent back
    leaving: Mapping[str, str] = field(default_factory=dict)  # left the selector: held at
    held: Mapping[str, str] = field(default_factory=dict)  # rolled back uncommitted: held at

    @property
    def current(self) -> AgentRevision:
        return next(r for r in self.revisions if r.number == self.revision)

    def revision_of(self, number: int) -> AgentRevision | None:
        return next((r for r in self.revisions if r.number == number), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "upgrade": self.upgrade,
            "revision": self.revision,
            "revisions": [r.to_json() for r in self.revisions],
            "phase": self.phase.value,
            "reason": self.reason,
            "message": self.message,
            "startedAt": self.started_at,
            "changedAt": self.changed_at,
            "step": self.step,
            "sent": {d: s.to_json() for d, s in sorted(self.sent.items())},
            "failed": dict(sorted(self.failed.items())),
            "rollback": dict(sorted(self.rollback.items())),
            **({"leaving": dict(sorted(self.leaving.items()))} if self.leaving else {}),
            **({"held": dict(sorted(self.held.items()))} if self.held else {}),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> AgentUpgradeState:
        return cls(
            str(doc["upgrade"]),
            int(doc["revision"]),
            tuple(AgentRevision.from_json(r) for r in doc.get("revisions", ())),
            RolloutPhase(doc.get("phase", RolloutPhase.PROGRESSING.value)),
            str(doc.get("reason", "")),
            str(doc.get("message", "")),
            float(doc.get("startedAt", 0.0)),
            float(doc.get("changedAt", 0.0)),
            int(doc.get("step", 0)),
            {str(d): SentAgent.from_json(s) for d, s in (doc.get("sent") or {}).items()},
            {str(d): str(r) for d, r in (doc.get("failed") or {}).items()},
            {str(d): str(v) for d, v in (doc.get("rollback") or {}).items()},
            {str(d): str(v) for d, v in (doc.get("leaving") or {}).items()},
            {str(d): str(v) for d, v in (doc.get("held") or {}).items()},
        )


@dataclass(frozen=True, slots=True)
class AgentDeviceView:
    """What the planner knows of one selected device."""

    name: str
    connected: bool
    report: AgentReport | None
    serving: tuple[str, ...] = ()  # workloads serving now with every replica ready, sorted
    claimed_by: str = ""  # another AgentUpgrade drives this device (the first by name)
    agent_version: str = ""  # the edged version its Hello said ("" when unknown)


@dataclass(frozen=True, slots=True)
class DesiredAgentSpec:
    """What a device's desired state says of its edged (``DesiredState.agent``), plain."""

    version: str
    signed_metadata: bytes
    upgrade: str
    upgrade_revision: int
    commit_deadline_s: int
    max_tries: int


Releases = Mapping[str, AgentReleaseRecord]
"""The releases the hub holds, by :func:`hub.decide.agentreleases.agent_release_key`."""


@dataclass(frozen=True, slots=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class AgentProgress:
    """One upgrade's devices at one moment, by what the planner calls them."""

    selected: int = 0
    pool: int = 0
    done: tuple[str, ...] = ()
    updating: tuple[str, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)
    skipped: Mapping[str, str] = field(default_factory=dict)
    up_to_date: tuple[str, ...] = ()
    waiting: int = 0  # in the pool, not sent yet
    max_unavailable: int = 1
    threshold: int = 1
    step_target: int = 0  # devices the current step may have sent
    rollback_blocked: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "selectedDevices": self.selected,
            "poolDevices": self.pool,
            "doneDevices": len(self.done),
            "updatingDevices": len(self.updating),
            "failedCount": len(self.failed),
            "waitingDevices": self.waiting,
            "upToDateDevices": len(self.up_to_date),
            "updating": list(self.updating[:100]),
            "refused": dict(sorted(self.refused.items())[:100]),
            "skipped": dict(sorted(self.skipped.items())[:100]),
            "maxUnavailable": self.max_unavailable,
            "failureThreshold": self.threshold,
            "stepDevices": self.step_target,
            **({"rollbackBlocked": dict(self.rollback_blocked)} if self.rollback_blocked else {}),
        }


@dataclass(frozen=True, slots=True)
class AgentPlan:
    """What to write (None: nothing changes), the events, the devices' counts."""

    state: AgentUpgradeState | None = None
    events: tuple[Event, ...] = ()
    progress: AgentProgress = AgentProgress()


def named(items: Mapping[str, str] | Sequence[str], limit: int = MAX_NAMED) -> str:
    if isinstance(items, Mapping):
        parts = [f"{d} ({why})" for d, why in sorted(items.items())[:limit]]
    else:
        parts = list(sorted(items)[:limit])
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(parts) + more
