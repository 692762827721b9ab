"""ModelConfig at the hub, decided before anything is written (pure): one config per model,
and what an apply of a config says it does (docs/model-config.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from edgefleet.api.modelconfigs import KIND

__all__ = ["DELIVERY_WARNING", "KIND", "model_conflicts"]

DELIVERY_WARNING = (
    "stored, not delivered: this hub does not send ModelConfigs to devices yet "
    "(docs/model-config.md, 'What is built'); no device runs this config"
)
"""Said by every apply of a ModelConfig until delivery is built: accepted is not applied."""


def model_conflicts(
    applied: Sequence[tuple[int, str, Mapping[str, Any]]],
    stored: Iterable[Mapping[str, Any]],
) -> list[str]:
    """Problems of an apply whose ModelConfigs (``(index, name, manifest)``) would leave two
    configs for one model (the stored ones: manifests), each naming its document."""
    owner: dict[str, str] = {}
    names = {name for _, name, _ in applied}
    for doc in stored:
        name = str(doc.get("metadata", {}).get("name", ""))
        if name not in names:  # a config applied now replaces its stored self
            owner[str(doc.get("spec", {}).get("model", ""))] = name
    problems = []
    for i, name, doc in applied:
        model = str(doc.get("spec", {}).get("model", ""))
        other = owner.get(model)
        if other is not None and other != name:
            problems.append(
                f"documents[{i}].spec.model: model {model!r} already has {KIND} {other!r}: "
                "one config per model (put overrides in it, or delete it first)"
            )
        owner.setdefault(model, name)
    return problems
