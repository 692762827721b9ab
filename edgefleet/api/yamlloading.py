"""The YAML half of :mod:`edgefleet.api.loading`: the bounded, duplicate-refusing safe loader.

Kept apart so that importing the API types (which an enrolled edged does: the hub sends its
manifests as JSON) does not import PyYAML, about 1.5 MiB of an idle edged's RSS
(docs/edged.md, "Footprint"); :func:`edgefleet.api.loading._parse` imports it on the first
YAML document.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import yaml

from edgefleet.api.loading import INT_MAX, INT_MIN, MAX_EXPANDED_NODES, MAX_INT_DIGITS
from edgefleet.api.quantities import describe
from edgefleet.errors import Problem, ValidationError

if TYPE_CHECKING:
    _BaseLoader = yaml.SafeLoader
else:
    _BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_MERGE_TAG = "tag:yaml.org,2002:merge"
_TAG = "tag:yaml.org,2002:"
_STR, _INT, _FLOAT, _TIMESTAMP = _TAG + "str", _TAG + "int", _TAG + "float", _TAG + "timestamp"
_PLAIN_TAGS = frozenset(
    _TAG + t for t in ("str", "int", "float", "bool", "null", "map", "seq", "merge")
)


class _BoundError(yaml.YAMLError):
    """A document exceeds a bound or uses a refused feature, at ``line`` (1-based)."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(reason)
        self.line = line
        self.reason = reason


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


class _UniqueKeyLoader(_BaseLoader):
    """The safe loader (libyaml's when available) that rejects duplicate mapping keys and
    checks the bounds of the module doc before constructing anything."""

    def construct_document(self, node: yaml.Node) -> Any:
        self._check_tree(node)
        return super().construct_document(node)

    def _check_tree(self, root: yaml.Node) -> None:
        """Expanded size, self-reference, tags and scalar bounds (iterative: no recursion)."""
        sizes: dict[int, int] = {}
        in_progress: set[int] = set()
        stack: list[tuple[yaml.Node, bool]] = [(root, False)]
        while stack:
            node, done = stack.pop()
            key = id(node)
            if done:
                in_progress.discard(key)
                total = 1 + sum(sizes[id(c)] for c in _children(node))
                if total > MAX_EXPANDED_NODES:
                    raise _BoundError(
                        node.start_mark.line + 1,
                        f"more than {MAX_EXPANDED_NODES} values once aliases are expanded",
                    )
                sizes[key] = total
                continue
            if key in sizes:
                continue
            if key in in_progress:
                raise _BoundError(node.start_mark.line + 1, "an alias refers to itself")
            in_progress.add(key)
            self._check_scalar(node)
            stack.append((node, True))
            stack.extend((c, False) for c in _children(node) if id(c) not in sizes)

    def _check_scalar(self, node: yaml.Node) -> None:
        line = node.start_mark.line + 1
        if node.tag == _TIMESTAMP:
            node.tag = _STR  # an unquoted date stays the text it is
        if node.tag not in _PLAIN_TAGS:
            raise _BoundError(
                line,
                f"the tag {node.tag.replace(_TAG, '!!')} is not allowed (plain data only: "
                "strings, numbers, booleans, null, lists and mappings)",
            )
        if not isinstance(node, yaml.ScalarNode):
            return
        if node.tag == _INT:
            digits = str(node.value).lstrip("+-").replace("_", "")
            value = None
            if len(digits) <= MAX_INT_DIGITS:
                try:
                    value = self.construct_yaml_int(node)
                except ValueError:
                    value = None
            if value is None or not INT_MIN <= value <= INT_MAX:
                raise _BoundError(
                    line,
                    f"the integer {describe(str(node.value)[:24])}"
                    f"{'...' if len(str(node.value)) > 24 else ''} does not fit in 64 bits",
                )
        elif node.tag == _FLOAT and not math.isfinite(self.construct_yaml_float(node)):
            raise _BoundError(
                line, f"{node.value} is not allowed (manifests are JSON: finite numbers only)"
            )

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable: the base constructor reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {describe(key)}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        text = f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
        if exc.context and exc.context_mark is not None:
            text += f" ({exc.context} at line {exc.context_mark.line + 1})"
        return text
    return f"invalid YAML: {exc}"


def load_all(text: str, source: str) -> list[object]:
    """The YAML documents of ``text``; ValidationError naming the line or reason."""
    try:
        return list(yaml.load_all(text, Loader=_UniqueKeyLoader))
    except _BoundError as exc:
        raise ValidationError([Problem("", exc.reason)], source=f"{source}:{exc.line}") from exc
    except yaml.YAMLError as exc:
        raise ValidationError([Problem("", _yaml_problem(exc))], source=source) from exc
    except RecursionError as exc:
        raise ValidationError([Problem("", "is nested too deeply")], source=source) from exc
    except (ValueError, OverflowError, TypeError) as exc:
        # what a YAML constructor raises on a value it cannot build: an integer of more than
        # 4300 digits (Python's limit), a date out of range, an unhashable key...
        raise ValidationError([Problem("", f"invalid YAML: {exc}")], source=source) from exc
