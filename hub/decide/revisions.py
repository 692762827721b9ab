"""A ModelDeployment's revisions and its rollout's record, plain data (how a rollout moves:
:mod:`hub.decide.rollout`): a revision's *template* (the manifest less :data:`LIVE_FIELDS`:
how it is placed, scaled and rolled out) and its hash, :class:`Revision` (stored at
``/revisions/NAME/NUMBER``), :class:`RolloutState` (at ``/rollouts/NAME``) with the revision it
sends each device and the outcome of each earlier revision (:class:`Outcome`), and
:func:`prune`, the revisions to delete."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

from edgefleet.api.deployments import RESTARTED_AT

MAX_REVISIONS = 10
"""Revisions kept per deployment (besides the stable and the current one), like Kubernetes'
revisionHistoryLimit."""


LIVE_FIELDS = ("placement", "rollout", "replicas", "scaling")
"""``spec`` fields outside a revision's template: where the deployment goes, how many replicas
(and their autoscaling bounds) and how it rolls out. Changing them restarts no worker, so it
is no new revision and no rollout: the scheduler and the projector act on the deployment's
current values (a device is sent its revision's template with the current ``replicas`` and
``scaling``: :func:`hub.decide.desired.manifest_for`), and ``rollout undo`` keeps them."""


MODEL_CONFIG = "edgefleet.io/model-config"
"""The annotation a revision's manifest carries its model's ModelConfig in (the whole object as
canonical JSON), so that a config change is a new revision, rolled out like a new version
(docs/model-config.md); the hub adds it (:func:`with_config`), never an operator, and strips it
from what devices are sent (they get the config merged for them)."""


def template_of(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a canonical ModelDeployment manifest whose change restarts workers (all
    but :data:`LIVE_FIELDS`), and its model's configuration (:data:`MODEL_CONFIG`)."""
    spec = {k: v for k, v in manifest.get("spec", {}).items() if k not in LIVE_FIELDS}
    meta = manifest.get("metadata", {})
    out = {"name": meta.get("name"), "labels": meta.get("labels", {}), "spec": spec}
    restarted = (meta.get("annotations") or {}).get(RESTARTED_AT)
    if restarted:  # only then: the templates of revisions made before stay as they were
        out["restartedAt"] = restarted
    config = (meta.get("annotations") or {}).get(MODEL_CONFIG)
    if config:  # likewise: a deployment without a config keeps its templates
        out["modelConfig"] = config
    return out


def with_config(manifest: Mapping[str, Any], config: str) -> Mapping[str, Any]:
    """``manifest`` with its model's ModelConfig (canonical JSON; ``""``: none, ``manifest``
    itself less any it carried) in :data:`MODEL_CONFIG`."""
    meta = dict(manifest.get("metadata", {}))
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != MODEL_CONFIG}
    if config:
        annotations[MODEL_CONFIG] = config
    elif MODEL_CONFIG not in (meta.get("annotations") or {}):
        return manifest
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    return {**manifest, "metadata": meta}


def config_of(manifest: Mapping[str, Any]) -> str:
    """The ModelConfig a revision's manifest carries (canonical JSON; ``""``: none)."""
    return str((manifest.get("metadata", {}).get("annotations") or {}).get(MODEL_CONFIG, ""))


def with_restart(manifest: Mapping[str, Any], restarted_at: str) -> Mapping[str, Any]:
    """``manifest`` with the :data:`RESTARTED_AT` annotation of the last ``rollout restart``
    (``""``: none, ``manifest`` itself)."""
    if not restarted_at:
        return manifest
    meta = dict(manifest.get("metadata", {}))
    meta["annotations"] = {**(meta.get("annotations") or {}), RESTARTED_AT: restarted_at}
    return {**manifest, "metadata": meta}


def template_hash(manifest: Mapping[str, Any]) -> str:
    data = orjson.dumps(template_of(manifest), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(data).hexdigest()[:16]


def with_live_fields(template: Mapping[str, Any], manifest: Mapping[str, Any]) -> dict[str, Any]:
    """``template``'s manifest (a revision's: model, runtime...) with ``manifest``'s
    :data:`LIVE_FIELDS` (the deployment's current ones; absent there, absent here): what
    ``rollout undo`` applies, what a region outside a wave is sent."""
    spec = dict(template.get("spec", {}))
    for key in LIVE_FIELDS:
        if key in manifest.get("spec", {}):
            spec[key] = manifest["spec"][key]
        else:
            spec.pop(key, None)
    return {**template, "spec": spec}


@dataclass(frozen=True, slots=True)
class Revision:
    """One revision of a deployment: the manifest devices are sent for it."""

    deployment: str
    number: int
    template: str  # template_hash of the manifest
    manifest: Mapping[str, Any]
    created_at: float
    source: int = 0  # the revision it was made from again (rollout undo), 0: none
    encoded: bytes = b""  # the manifest as sent to devices: encoded once

    def __post_init__(self) -> None:
        if not self.encoded:
            data = orjson.dumps(self.manifest, option=orjson.OPT_SORT_KEYS)
            object.__setattr__(self, "encoded", data)

    @property
    def model(self) -> tuple[str, str]:
        model = self.manifest["spec"]["model"]
        return str(model["name"]), str(model["version"])

    def to_json(self) -> dict[str, Any]:
        return {
            "deployment": self.deployment,
            "number": self.number,
            "template": self.template,
            "manifest": self.manifest,
            "createdAt": self.created_at,
            "source": self.source,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Revision:
        manifest = dict(doc["manifest"])
        return cls(
            str(doc["deployment"]),
            int(doc["number"]),
            # hashed again, not read: a revision stored when the template held more fields
            # (replicas, scaling) compares equal to the same template applied now
            template_hash(manifest),
            manifest,
            float(doc["createdAt"]),
            int(doc.get("source", 0)),
        )


class RolloutPhase(StrEnum):
    PROGRESSING = "Progressing"
    PAUSED = "Paused"
    COMPLETE = "Complete"
    ROLLED_BACK = "RolledBack"


OUTCOME_MESSAGE_CHARS = 512
"""The most of a rollout's message an :class:`Outcome` keeps (every outcome is in the rollout
record, which is written at each step)."""
ABORTED = "Aborted"
"""The outcome of a revision left before its rollout ended (a newer template, or the stable
one applied again)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How an earlier revision's rollout ended: ``phase`` Complete, RolledBack (``reason`` and
    ``message`` say why) or :data:`ABORTED`, at ``at``. ``rollout history`` shows it after
    later revisions."""

    phase: str
    reason: str = ""
    message: str = ""
    at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "reason": self.reason, "message": self.message, "at": self.at}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Outcome:
        return cls(
            str(doc.get("phase", "")),
            str(doc.get("reason", "")),
            str(doc.get("message", "")),
            float(doc.get("at", 0.0)),
        )


@dataclass(frozen=True, slots=True)
class RolloutState:
    """Where a deployment's rollout stands; stored at ``/rollouts/NAME``."""

    deployment: str
    revision: int  # the revision being rolled out (the current one)
    stable: int  # the revision the other devices keep, and go back to
    updated: frozenset[str] = frozenset()  # devices assigned ``revision``
    phase: RolloutPhase = RolloutPhase.PROGRESSING
    reason: str = ""
    message: str = ""
    started_at: float = 0.0
    changed_at: float = 0.0
    steps: int = 0  # how many times devices were assigned
    # canary: the index of the current step of spec.rollout.canary.steps (== len: past the
    # last), when it started, when its devices were all ready on the revision (0: not yet)
    step: int = 0
    step_at: float = 0.0
    step_ready_at: float = 0.0
    progress_at: float = 0.0  # the last step of any kind (progressDeadlineSeconds counts from it)
    # rolled back: the devices that made it so, and why (device -> reason; empty otherwise)
    failed: Mapping[str, str] = field(default_factory=dict)
    # the stable revision before ``stable`` with another model: what devices ran just before
    # the stable one (0: none known); ``rollout undo`` to it needs no rollback allowance
    previous: int = 0
    # ``rollout promote --full``: every remaining step skipped, the analysis no longer rolls it
    # back (a device that refuses or fails the revision still does)
    full: bool = False
    # the last ``rollout restart`` (RFC 3339; "": none): every revision made since carries it
    # (:func:`with_restart`), so applying the same manifest again restarts nothing
    restarted_at: str = ""
    # how each earlier revision's rollout ended, by number (the current one's is the state
    # itself): kept for the revisions kept (prune), so history shows "rolled back" and why
    outcomes: Mapping[int, Outcome] = field(default_factory=dict)
    # devices kept on the revision they run (device -> revision number) where a step would
    # switch them outside the budget (back to the stable revision all at once: a rollback,
    # the stable template applied again, a new template during a rollout), each released when
    # the budget has room or it does not serve that revision (:func:`hub.decide.rolloutholds.hold`)
    held: Mapping[str, int] = field(default_factory=dict)
    # devices released from ``held`` that have not yet settled on the revision they are sent
    # (its replicas all ready there): counted against the budget until they do
    returning: frozenset[str] = frozenset()

    def outcome_of(self, number: int) -> Outcome | None:
        """How revision ``number``'s rollout stands or ended (None: not known: made before
        outcomes were kept, or never rolled out)."""
        if number == self.revision:
            return Outcome(self.phase.value, self.reason, self.message, self.changed_at)
        return self.outcomes.get(number)

    def revision_for(self, device: str) -> int:
        """The revision ``device`` is sent."""
        held = self.held.get(device)
        if held is not None:
            return held
        return self.unheld_revision_for(device)

    def unheld_revision_for(self, device: str) -> int:
        """The revision ``device`` is sent once it is not held."""
        if self.phase is RolloutPhase.COMPLETE:
            return self.revision
        if self.phase is RolloutPhase.ROLLED_BACK:
            return self.stable
        return self.revision if device in self.updated else self.stable

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "deployment": self.deployment,
            "revision": self.revision,
            "stable": self.stable,
            "updated": sorted(self.updated),
            "phase": self.phase.value,
            "reason": self.reason,
            "message": self.message,
            "startedAt": self.started_at,
            "changedAt": self.changed_at,
            "steps": self.steps,
            "step": self.step,
            "stepAt": self.step_at,
            "stepReadyAt": self.step_ready_at,
            "progressAt": self.progress_at,
            "failed": dict(sorted(self.failed.items())),
            "previous": self.previous,
            "outcomes": {str(n): o.to_json() for n, o in sorted(self.outcomes.items())},
        }
        if self.full:
            out["full"] = True
        if self.restarted_at:
            out["restartedAt"] = self.restarted_at
        if self.held:
            out["held"] = dict(sorted(self.held.items()))
        if self.returning:
            out["returning"] = sorted(self.returning)
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RolloutState:
        return cls(
            str(doc["deployment"]),
            int(doc["revision"]),
            int(doc["stable"]),
            frozenset(doc.get("updated", ())),
            RolloutPhase(doc.get("phase", RolloutPhase.PROGRESSING.value)),
            str(doc.get("reason", "")),
            str(doc.get("message", "")),
            float(doc.get("startedAt", 0.0)),
            float(doc.get("changedAt", 0.0)),
            int(doc.get("steps", 0)),
            int(doc.get("step", 0)),
            float(doc.get("stepAt", 0.0)),
            float(doc.get("stepReadyAt", 0.0)),
            float(doc.get("progressAt", doc.get("changedAt", 0.0))),
            {str(k): str(v) for k, v in (doc.get("failed") or {}).items()},
            int(doc.get("previous", 0)),
            bool(doc.get("full", False)),
            str(doc.get("restartedAt", "")),
            {int(n): Outcome.from_json(o) for n, o in (doc.get("outcomes") or {}).items()},
            {str(k): int(v) for k, v in (doc.get("held") or {}).items()},
            frozenset(str(d) for d in doc.get("returning") or ()),
        )


def prune(revisions: Iterable[Revision], state: RolloutState) -> list[int]:
    """Revision numbers to delete: all but the newest :data:`MAX_REVISIONS`, never the stable
    or the current one, nor one a device is held on."""
    numbers = sorted((r.number for r in revisions), reverse=True)
    keep = set(numbers[:MAX_REVISIONS]) | {state.stable, state.revision, *state.held.values()}
    return sorted(n for n in numbers if n not in keep)
