"""PriorityClasses resolved (pure): what priority a deployment has, and whether it preempts.

A deployment's ``spec.priority`` wins; else its ``spec.priorityClassName``: a built-in class
(:data:`edgefleet.api.PRIORITY_CLASSES`) or a ``PriorityClass`` object applied to the hub
(:mod:`edgefleet.api.priorities`); else 0. The hub refuses to apply a deployment that names
an unknown class (:func:`unknown_classes`) and to delete a class in use (:func:`users_of`),
unless forced: a deployment whose class was deleted by force gets priority 0 and preempts
nothing until the class is applied again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from edgefleet.api import (
    PRIORITY_CLASSES,
    ModelDeployment,
    PreemptionPolicy,
    PriorityClass,
    parse_manifest,
)


@dataclass(frozen=True, slots=True)
class ClassValue:
    value: int
    preempts: bool = True


def classes_of(manifests: Iterable[Mapping[str, object]]) -> dict[str, ClassValue]:
    """The PriorityClass objects (stored manifests) by name."""
    out: dict[str, ClassValue] = {}
    for manifest in manifests:
        pc = parse_manifest(dict(manifest))
        assert isinstance(pc, PriorityClass)
        out[pc.name] = ClassValue(
            pc.spec.value, pc.spec.preemption_policy is not PreemptionPolicy.NEVER
        )
    return out


def class_of(dep: ModelDeployment, classes: Mapping[str, ClassValue]) -> ClassValue:
    """The priority ``dep`` has and whether it may preempt."""
    spec = dep.spec
    applied = classes.get(spec.priority_class_name or "")
    if spec.priority is not None:
        return ClassValue(spec.priority, applied.preempts if applied else True)
    if applied is not None:
        return applied
    name = spec.priority_class_name or "default"
    if name in PRIORITY_CLASSES:
        return ClassValue(PRIORITY_CLASSES[name])
    return ClassValue(0, preempts=False)  # its class was deleted by force


def resolved(dep: ModelDeployment, classes: Mapping[str, ClassValue]) -> ModelDeployment:
    """``dep`` with its class's value as ``spec.priority`` (itself when nothing changes)."""
    name = dep.spec.priority_class_name
    if dep.spec.priority is not None or name is None or name in PRIORITY_CLASSES:
        return dep
    value = class_of(dep, classes).value
    return replace(dep, spec=replace(dep.spec, priority=value))


def unknown_classes(
    deployments: Iterable[ModelDeployment], classes: Iterable[str]
) -> list[tuple[str, str]]:
    """(deployment, class) for each deployment naming a class that is neither built in nor in
    ``classes``."""
    known = set(PRIORITY_CLASSES) | set(classes)
    return [
        (d.metadata.name, d.spec.priority_class_name)
        for d in deployments
        if d.spec.priority_class_name is not None and d.spec.priority_class_name not in known
    ]


def users_of(name: str, deployments: Iterable[ModelDeployment]) -> list[str]:
    """The deployments that name class ``name``."""
    return sorted(d.metadata.name for d in deployments if d.spec.priority_class_name == name)
