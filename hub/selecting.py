"""Kubernetes label selectors, equality-based: ``a=b``, ``a==b``, ``a!=b``, ``a`` (exists),
``!a`` (does not exist), joined by commas; every requirement must hold. Pure.

``parse_selector("site=retail,accelerator,tier!=canary")`` gives a :class:`Selector`, or raises
:class:`ValueError` saying which requirement is wrong and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from edgefleet.api.meta import label_key, label_value


class Operator(StrEnum):
    EQUALS = "="
    NOT_EQUALS = "!="
    EXISTS = "exists"
    NOT_EXISTS = "!exists"


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: Operator
    value: str = ""

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator is Operator.EXISTS:
            return self.key in labels
        if self.operator is Operator.NOT_EXISTS:
            return self.key not in labels
        if self.operator is Operator.EQUALS:
            return labels.get(self.key) == self.value
        # Kubernetes: "a!=b" also matches objects without label a
        return labels.get(self.key) != self.value


@dataclass(frozen=True, slots=True)
class Selector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)


def _requirement(text: str) -> Requirement:
    if "!=" in text:
        key, _, value = text.partition("!=")
        operator = Operator.NOT_EQUALS
    elif "==" in text:
        key, _, value = text.partition("==")
        operator = Operator.EQUALS
    elif "=" in text:
        key, _, value = text.partition("=")
        operator = Operator.EQUALS
    elif text.startswith("!"):
        return Requirement(label_key(text[1:].strip()), Operator.NOT_EXISTS)
    else:
        return Requirement(label_key(text), Operator.EXISTS)
    value = value.strip()
    if "=" in value or "!" in value:
        raise ValueError(f"has more than one operator: {text!r}")
    return Requirement(label_key(key.strip()), operator, label_value(value))


def parse_selector(text: str) -> Selector:
    """A selector from its text form; ``""`` selects everything. ValueError when invalid."""
    if not text.strip():
        return Selector()
    requirements: list[Requirement] = []
    for i, raw in enumerate(text.split(",")):
        part = raw.strip()
        if not part:
            raise ValueError(f"label selector {text!r}: requirement {i + 1} is empty")
        if " in " in part or " notin " in part or "(" in part:
            raise ValueError(
                f"label selector {text!r}: set-based requirements ({part!r}) are not "
                "supported; use key=value, key!=value, key or !key"
            )
        try:
            requirements.append(_requirement(part))
        except ValueError as exc:
            raise ValueError(f"label selector {text!r}: {part!r}: {exc}") from None
    return Selector(tuple(requirements))
