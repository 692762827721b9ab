"""A ModelDeployment's revisions and its rollout's record, plain data (how a rollout moves:
:mod:`hub.decide.rollout`): a revision's *template* (the manifest less how it is placed and
rolled out) and its hash, :class:`Revision` (stored at ``/revisions/NAME/NUMBER``),
:class:`RolloutState` (at ``/rollouts/NAME``) with the revision it sends each device, and
:func:`prune`, the revisions to delete."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

MAX_REVISIONS = 10
"""Revisions kept per deployment (besides the stable and the current one), like Kubernetes'
revisionHistoryLimit."""


RESTARTED_AT = "edgefleet.io/restartedAt"
"""The annotation ``edgectl rollout restart`` puts on the revisions it makes (kubectl's
``kubectl.kubernetes.io/restartedAt``): part of the template, and of the revision edged
computes, so the same model and settings start new workers (:mod:`hub.decide.rolloutactions`)."""


def template_of(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a canonical ModelDeployment manifest that devices act on."""
    spec = {k: v for k, v in manifest.get("spec", {}).items() if k not in ("placement", "rollout")}
    meta = manifest.get("metadata", {})
    out = {"name": meta.get("name"), "labels": meta.get("labels", {}), "spec": spec}
    restarted = (meta.get("annotations") or {}).get(RESTARTED_AT)
    if restarted:  # only then: the templates of revisions made before stay as they were
        out["restartedAt"] = restarted
    return out


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
        return cls(
            str(doc["deployment"]),
            int(doc["number"]),
            str(doc["template"]),
            dict(doc["manifest"]),
            float(doc["createdAt"]),
            int(doc.get("source", 0)),
        )


class RolloutPhase(StrEnum):
    PROGRESSING = "Progressing"
    PAUSED = "Paused"
    COMPLETE = "Complete"
    ROLLED_BACK = "RolledBack"


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

    def revision_for(self, device: str) -> int:
        """The revision ``device`` is sent."""
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
        }
        if self.full:
            out["full"] = True
        if self.restarted_at:
            out["restartedAt"] = self.restarted_at
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
        )


def prune(revisions: Iterable[Revision], state: RolloutState) -> list[int]:
    """Revision numbers to delete: all but the newest :data:`MAX_REVISIONS`, never the stable
    or the current one."""
    numbers = sorted((r.number for r in revisions), reverse=True)
    keep = set(numbers[:MAX_REVISIONS]) | {state.stable, state.revision}
    return sorted(n for n in numbers if n not in keep)
