"""``edgectl config``: the contexts of admin.toml (several hubs in one file, like kubeconfig).

* ``config get-contexts``: every context, ``*`` at the current one;
* ``config current-context``; ``config use-context NAME``;
* ``config set-context NAME --from ADMIN_TOML``: adds (or replaces) a context with the hub and
  credentials of another admin.toml (as ``hub init`` writes it); the first one turns a
  one-hub file into the contexts form, its hub becoming context ``default``.

The file is rewritten atomically, with its mode kept (admin.toml is private: 0600), paths
written absolute.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from edgectl import printing
from edgectl.client import DEFAULT_CONTEXT, AdminConfig, AdminConfigFile, load_admin_file
from edgectl.commands import default_config
from edgectl.errors import EXIT_DONE, UsageError
from edgefleet.api.meta import dns_label
from edgefleet.persisting import write_atomic


def add_commands(sub: Any) -> None:
    config = sub.add_parser("config", help="contexts: several hubs in one admin.toml")
    csub = config.add_subparsers(dest="config_command", required=True, metavar="COMMAND")
    csub.add_parser("get-contexts", help="every context; * marks the current one")
    csub.add_parser("current-context", help="the name of the current context")
    use = csub.add_parser("use-context", help="make a context the current one")
    use.add_argument("name")
    set_ = csub.add_parser("set-context", help="add or replace a context from an admin.toml")
    set_.add_argument("name")
    set_.add_argument(
        "--from", dest="source", type=Path, required=True, metavar="ADMIN_TOML",
        help="an admin.toml (as hub init writes it) with the hub and credentials",
    )  # fmt: skip


def _quoted(value: str) -> str:
    return json.dumps(value)  # a TOML basic string is a JSON string for these characters


def render(contexts: dict[str, AdminConfig], current: str) -> str:
    """admin.toml in the contexts form."""
    lines = [
        "# edgectl's hubs (edgectl config get-contexts | use-context NAME | set-context NAME).",
        "# Keep it private: it points at admin credentials.",
        f"currentContext = {_quoted(current)}",
    ]
    for name, c in sorted(contexts.items()):
        lines += [
            "",
            f"[contexts.{_quoted(name)}]",
            "hub = "
            + ("[" + ", ".join(_quoted(h) for h in c.hubs) + "]" if c.hubs else _quoted(c.hub)),
            f"caCertificate = {_quoted(str(c.ca_certificate.absolute()))}",
            f"certificate = {_quoted(str(c.certificate.absolute()))}",
            f"key = {_quoted(str(c.key.absolute()))}",
        ]
        if c.publisher_key is not None or c.agent_key is not None:
            lines += ["", f"[contexts.{_quoted(name)}.publisher]"]
        if c.publisher_key is not None:
            lines.append(f"key = {_quoted(str(c.publisher_key.absolute()))}")
        if c.agent_key is not None:
            lines.append(f"agentKey = {_quoted(str(c.agent_key.absolute()))}")
    return "\n".join(lines) + "\n"


def _write(path: Path, contexts: dict[str, AdminConfig], current: str) -> None:
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o600
    write_atomic(path, render(contexts, current).encode(), mode=mode)


def _current(file: AdminConfigFile) -> str:
    return file.current or DEFAULT_CONTEXT


def run(args: argparse.Namespace) -> int | None:
    if args.command != "config":
        return None
    path: Path = args.config or default_config()
    if args.context:
        raise UsageError("config: --context does not apply (name the context as an argument)")
    if args.config_command == "set-context":
        try:
            dns_label(args.name)
        except ValueError as exc:
            raise UsageError(f"config set-context: name: {exc}") from None
        added = load_admin_file(args.source).select(None, source=str(args.source))
        if path.exists():
            file = load_admin_file(path)
            contexts, current = dict(file.contexts), _current(file)
        else:
            contexts, current = {}, args.name
        contexts[args.name] = added
        _write(path, contexts, current)
        print(f'context "{args.name}" set in {path}')
        return EXIT_DONE
    file = load_admin_file(path)
    if args.config_command == "current-context":
        print(_current(file))
    elif args.config_command == "get-contexts":
        rows = [
            ["*" if name == _current(file) else "", name, ",".join(c.addresses)]
            for name, c in sorted(file.contexts.items())
        ]
        print(printing.table(("CURRENT", "NAME", "HUB"), rows))
    else:
        file.select(args.name, source=str(path))
        if not file.current:
            raise UsageError(
                f"config use-context: {path} has one hub and no contexts "
                "(add one with edgectl config set-context NAME --from ADMIN_TOML)"
            )
        _write(path, dict(file.contexts), args.name)
        print(f'switched to context "{args.name}"')
    return EXIT_DONE
