"""``edgectl explain KIND[.field.path] [--recursive]``: what a field is, as kubectl explain.

Read from the API's own validation (:mod:`edgefleet.api.explaining`), in edgectl's copy of
the API: no hub is asked (a hub of the same version validates with the same code).
"""

from __future__ import annotations

import argparse
import textwrap
from typing import Any

from edgectl.errors import EXIT_DONE, UsageError
from edgectl.resources import PLURALS, kind_of
from edgefleet.api.explaining import EXPLAINED_KINDS, FieldSchema, explain
from edgefleet.api.meta import API_VERSION

WIDTH = 100


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "explain",
        help="the fields of a kind and what each must be (from the API's own validation)",
        description="Describe a kind or one of its fields: type, whether required, what the "
        "validation accepts, the default. Kinds: "
        + ", ".join(PLURALS[k] for k in EXPLAINED_KINDS)
        + ". Example: edgectl explain deployment.spec.runtime",
    )
    p.add_argument("what", metavar="KIND[.FIELD.PATH]")
    p.add_argument("--recursive", action="store_true", help="every field below, as a tree of names")


def _wrap(text: str, indent: int) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=" " * indent, subsequent_indent=" " * indent)


def _facts(node: FieldSchema) -> list[str]:
    """The description, then what the validation accepts and the default, as sentences."""
    out = [node.description] if node.description else []
    for accepted in node.accepts:
        out.append(accepted[:1].upper() + accepted[1:] + ".")
    if node.default not in (None, [], {}):
        default = node.default
        if isinstance(default, bool):
            default = str(default).lower()
        elif isinstance(default, list):
            default = ", ".join(map(str, default))
        out.append(f"Default: {default}.")
    return out


def _heading(node: FieldSchema) -> str:
    return f"{node.type} -required-" if node.required else node.type


def render(kind: str, node: FieldSchema, *, recursive: bool = False) -> str:
    """kubectl explain's page for ``node`` of ``kind`` (pure)."""
    lines = [f"KIND:     {kind}", f"VERSION:  {API_VERSION}", ""]
    if node.path:
        lines += [f"FIELD:    {node.name} {_heading(node)}", ""]
    lines.append("DESCRIPTION:")
    facts = _facts(node)
    for fact in facts or ["<empty>"]:
        lines += _wrap(fact, 5)
    if node.fields:
        lines += ["", "FIELDS:"]
        if recursive:
            lines += _tree(node, 3)
        else:
            for child in node.fields.values():
                lines.append(f"   {child.name}\t{_heading(child)}")
                for fact in _facts(child) or ["<empty>"]:
                    lines += _wrap(fact, 5)
                lines.append("")
            lines.pop()
    return "\n".join(lines) + "\n"


def _tree(node: FieldSchema, indent: int) -> list[str]:
    out = []
    for child in node.fields.values():
        out.append(f"{' ' * indent}{child.name}\t{_heading(child)}")
        out += _tree(child, indent + 3)
    return out


def run(args: argparse.Namespace) -> int | None:
    if args.command != "explain":
        return None
    for flag in ("config", "context"):
        if getattr(args, flag, None):
            raise UsageError(
                f"explain: --{flag} does not apply (explain reads edgectl's own copy of the "
                "API, no hub)"
            )
    word, _, path = args.what.partition(".")
    kind = kind_of(word, allow=EXPLAINED_KINDS)
    node = explain(kind, path)
    print(render(kind, node, recursive=args.recursive), end="", flush=True)
    return EXIT_DONE
