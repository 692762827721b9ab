"""Kubernetes label selectors, the one parser the hub and edgectl share. Pure.

Requirements, joined by commas; every one must hold:

* equality-based: ``a=b``, ``a==b``, ``a!=b`` (also matches objects without ``a``);
* set-based: ``a in (x,y)``, ``a notin (x,y)`` (also matches objects without ``a``), ``a``
  (exists), ``!a`` (does not exist).

``parse_selector("site in (retail,depot),accelerator,tier!=canary")`` gives a
:class:`Selector`, or raises :class:`ValueError` saying which requirement is wrong and why.
``str(selector)`` writes it back in the canonical form.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from edgefleet.api.meta import label_key, label_value


class Operator(StrEnum):
    EQUALS = "="
    NOT_EQUALS = "!="
    IN = "in"
    NOT_IN = "notin"
    EXISTS = "exists"
    NOT_EXISTS = "!exists"


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    @property
    def value(self) -> str:
        """The value of an equality requirement."""
        return self.values[0] if self.values else ""

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.operator
        if op is Operator.EXISTS:
            return self.key in labels
        if op is Operator.NOT_EXISTS:
            return self.key not in labels
        if op in (Operator.EQUALS, Operator.IN):
            return self.key in labels and labels[self.key] in self.values
        # Kubernetes: "a!=b" and "a notin (b)" also match objects without label a
        return labels.get(self.key) not in self.values

    def __str__(self) -> str:
        op = self.operator
        if op is Operator.EXISTS:
            return self.key
        if op is Operator.NOT_EXISTS:
            return f"!{self.key}"
        if op in (Operator.IN, Operator.NOT_IN):
            return f"{self.key} {op.value} ({','.join(self.values)})"
        return f"{self.key}{op.value}{self.value}"


@dataclass(frozen=True, slots=True)
class Selector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)


_SET = re.compile(r"^(?P<key>[^\s!=()]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")


def _split(text: str) -> list[str]:
    """Split on the commas that are not inside parentheses."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
            if depth > 1:
                raise ValueError("nested parentheses")
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise ValueError("a ')' without its '('")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError("a '(' without its ')'")
    parts.append(text[start:])
    return parts


def _requirement(text: str) -> Requirement:
    found = _SET.match(text)
    if found:
        raw = [v.strip() for v in found["values"].split(",")]
        if raw == [""]:
            raise ValueError(f"{found['op']} needs at least one value")
        values = tuple(sorted({label_value(v) for v in raw}))
        return Requirement(label_key(found["key"]), Operator(found["op"]), values)
    if "(" in text or ")" in text:
        raise ValueError("must be KEY in (V1,V2) or KEY notin (V1,V2)")
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
        raise ValueError("has more than one operator")
    return Requirement(label_key(key.strip()), operator, (label_value(value),))


def parse_selector(text: str) -> Selector:
    """A selector from its text form; ``""`` selects everything. ValueError when invalid."""
    if not text.strip():
        return Selector()
    try:
        parts = _split(text)
    except ValueError as exc:
        raise ValueError(f"label selector {text!r}: {exc}") from None
    requirements: list[Requirement] = []
    for i, raw in enumerate(parts):
        part = raw.strip()
        if not part:
            raise ValueError(f"label selector {text!r}: requirement {i + 1} is empty")
        try:
            requirements.append(_requirement(part))
        except ValueError as exc:
            raise ValueError(f"label selector {text!r}: {part!r}: {exc}") from None
    return Selector(tuple(requirements))
