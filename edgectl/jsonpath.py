"""kubectl's JSONPath templates (``-o jsonpath=...``, ``--sort-by``), the part operators use.
Pure.

A template is text with ``{EXPRESSION}`` parts; an expression is a path from the current
object: ``.metadata.name``, ``.items[0]``, ``.items[*].metadata.name``,
``.metadata.labels['example.com/tier']``, ``.status.phase`` (``$`` or ``@`` may start it);
``{range EXPRESSION}...{end}`` repeats what it holds for every value; ``{"\\n"}`` and
``{'\\t'}`` are literal strings. Several values of one expression are joined by spaces;
strings print as they are, other values as JSON.

``render("{.items[*].metadata.name}", doc)``; ``values(".metadata.name", doc)``. A template
that does not parse raises ValueError naming what is wrong; a path that finds nothing prints
nothing (as kubectl's ``--allow-missing-template-keys`` default).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

_STEP = re.compile(
    r"""\.(?P<field>[A-Za-z0-9_\-]+)          # .field
      | \.?\[(?P<index>-?\d+)\]             # [0]
      | \.?\[(?P<all>\*)\]                  # [*]
      | \.?\[(?P<q>['"])(?P<key>[^'"]*)(?P=q)\]   # ['key']
      | \.(?P<star>\*)                      # .*
    """,
    re.VERBOSE,
)

Step = tuple[str, Any]


def _steps(path: str) -> list[Step]:
    text = path.strip()
    if text.startswith(("$", "@")):
        text = text[1:]
    if text in ("", "."):
        return []
    steps: list[Step] = []
    pos = 0
    while pos < len(text):
        found = _STEP.match(text, pos)
        if found is None:
            raise ValueError(f"jsonpath {path!r}: cannot read {text[pos:]!r}")
        if found["field"] is not None:
            steps.append(("key", found["field"]))
        elif found["index"] is not None:
            steps.append(("index", int(found["index"])))
        elif found["key"] is not None:
            steps.append(("key", found["key"]))
        else:
            steps.append(("all", None))
        pos = found.end()
    return steps


def _walk(values: list[Any], step: Step) -> list[Any]:
    out: list[Any] = []
    what, arg = step
    for value in values:
        if (what == "key" and isinstance(value, Mapping) and arg in value) or (
            what == "index" and isinstance(value, list) and -len(value) <= arg < len(value)
        ):
            out.append(value[arg])
        elif what == "all":
            if isinstance(value, list):
                out.extend(value)
            elif isinstance(value, Mapping):
                out.extend(value.values())
    return out


def values(path: str, doc: Any) -> list[Any]:
    """Every value ``path`` finds in ``doc`` (``[]`` when none)."""
    found = [doc]
    for step in _steps(path):
        found = _walk(found, step)
    return found


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


@dataclass(frozen=True, slots=True)
class _Node:
    kind: str  # "text", "path", "range"
    text: str = ""
    body: tuple[_Node, ...] = ()


_LITERAL = re.compile(r"""^(['"])(.*)\1$""", re.DOTALL)


def _parse(template: str) -> tuple[_Node, ...]:
    stack: list[list[_Node]] = [[]]
    ranges: list[str] = []
    pos = 0
    while pos < len(template):
        open_at = template.find("{", pos)
        if open_at < 0:
            stack[-1].append(_Node("text", template[pos:]))
            break
        if open_at > pos:
            stack[-1].append(_Node("text", template[pos:open_at]))
        close_at = template.find("}", open_at)
        if close_at < 0:
            raise ValueError(f"jsonpath {template!r}: a '{{' without its '}}'")
        expr = template[open_at + 1 : close_at].strip()
        pos = close_at + 1
        literal = _LITERAL.match(expr)
        if literal:
            text = literal[2].replace("\\n", "\n").replace("\\t", "\t")
            stack[-1].append(_Node("text", text))
        elif expr.startswith("range "):
            path = expr[len("range ") :]
            _steps(path)
            ranges.append(path)
            stack.append([])
        elif expr == "end":
            if not ranges:
                raise ValueError(f"jsonpath {template!r}: {{end}} without {{range}}")
            body = tuple(stack.pop())
            stack[-1].append(_Node("range", ranges.pop(), body))
        else:
            _steps(expr)
            stack[-1].append(_Node("path", expr))
    if ranges:
        raise ValueError(f"jsonpath {template!r}: {{range}} without {{end}}")
    return tuple(stack[0])


def _render(nodes: tuple[_Node, ...], doc: Any) -> str:
    out: list[str] = []
    for node in nodes:
        if node.kind == "text":
            out.append(node.text)
        elif node.kind == "path":
            out.append(" ".join(_text(v) for v in values(node.text, doc)))
        else:
            out.extend(_render(node.body, item) for item in values(node.text, doc))
    return "".join(out)


def check(template: str) -> None:
    """ValueError when ``template`` does not parse."""
    _parse(template)


def render(template: str, doc: Any) -> str:
    """The template filled in from ``doc``. A template without ``{`` is taken as one path
    (``.metadata.name``), as kubectl does."""
    if "{" not in template:
        template = "{" + template + "}"
    return _render(_parse(template), doc)
