"""The ``PriorityClass`` kind: a named priority that ModelDeployments refer to.

Like Kubernetes' PriorityClass (its range and its preemption policies)::

    apiVersion: edgefleet.io/v1
    kind: PriorityClass
    metadata: {name: safety}
    spec:
      value: 50000                            # higher wins; -2147483648..1000000000
      preemptionPolicy: PreemptLowerPriority  # or Never: placed first, evicts nothing
      description: collision avoidance        # optional, for people

A deployment names it with ``spec.priorityClassName``; the hub refuses to apply a deployment
naming a class that is neither built in (:data:`PRIORITY_CLASSES`)
nor applied, and to delete a class a deployment names. The built-in names cannot be applied
as classes of one's own. The hub resolves the class when it schedules and sends each device
the deployment with the class's value as ``spec.priority`` (so edged, which knows no
classes, evicts by it too).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from edgefleet.api.meta import API_VERSION, ObjectMeta, SpecObject
from edgefleet.api.validating import Reader, int_in, one_of

KIND = "PriorityClass"

MIN_PRIORITY = -2_147_483_648
MAX_PRIORITY = 1_000_000_000  # Kubernetes' bound for user classes
MAX_DESCRIPTION = 1024


PRIORITY_CLASSES: Mapping[str, int] = {
    "system-critical": 1_000_000_000,
    "critical": 1_000_000,
    "high": 1000,
    "default": 0,
    "low": -1000,
}
"""The built-in ``spec.priorityClassName`` values and their priorities (a ``PriorityClass``
object of one's own, :mod:`edgefleet.api.priorities`, adds more; the hub resolves those)."""

BUILT_IN_LABEL = "edgefleet.io/built-in"
"""The label the built-in classes are shown with (``edgectl get priorityclasses``)."""


def built_in_class_manifests() -> list[dict[str, Any]]:
    """The built-in classes as ``PriorityClass`` objects, as the hub shows them beside the
    applied ones (read-only: not stored, never applied nor deleted)."""
    return [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name, "labels": {BUILT_IN_LABEL: "true"}},
            "spec": PriorityClassSpec(value=value, description="built in").to_dict(),
        }
        for name, value in PRIORITY_CLASSES.items()
    ]


class PreemptionPolicy(StrEnum):
    PREEMPT_LOWER_PRIORITY = "PreemptLowerPriority"
    NEVER = "Never"


@dataclass(frozen=True, slots=True, kw_only=True)
class PriorityClassSpec:
    value: int
    preemption_policy: PreemptionPolicy = PreemptionPolicy.PREEMPT_LOWER_PRIORITY
    description: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "value": self.value,
            "preemptionPolicy": self.preemption_policy.value,
        }
        if self.description:
            out["description"] = self.description
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class PriorityClass(SpecObject):
    KIND: ClassVar[str] = KIND

    metadata: ObjectMeta
    spec: PriorityClassSpec


def _description(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    if len(value) > MAX_DESCRIPTION:
        raise ValueError(f"must be at most {MAX_DESCRIPTION} characters, got {len(value)}")
    return value


def read_priority_class(metadata: ObjectMeta, r: Reader | None) -> PriorityClass:
    """The kind's reader for :func:`edgefleet.api.manifests.read_manifest`."""
    if r is None:  # the spec is required: read_manifest recorded the problem
        return PriorityClass(metadata=metadata, spec=PriorityClassSpec(value=0))
    if metadata.name in PRIORITY_CLASSES:
        r.problems.add(
            "metadata.name",
            f"{metadata.name!r} is a built-in class ({', '.join(PRIORITY_CLASSES)}): "
            "choose another name",
        )
    spec = PriorityClassSpec(
        value=r.required("value", int_in(MIN_PRIORITY, MAX_PRIORITY), 0),
        preemption_policy=r.optional(
            "preemptionPolicy",
            one_of(PreemptionPolicy),
            PreemptionPolicy.PREEMPT_LOWER_PRIORITY,
        ),
        description=r.optional("description", _description, ""),
    )
    return PriorityClass(metadata=metadata, spec=spec)
