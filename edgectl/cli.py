"""The ``edgectl`` command: the operator's command line.

* ``edgectl quickstart``: the whole main job on one machine.
* The publisher's trust commands (``keys``, ``models sign``, ``trust root``, ``rollback
  allow``): :mod:`edgectl.trusting`; ``models push``: :mod:`edgectl.pushing`; ``models
  variants``: :mod:`edgectl.variants`; ``agent push|list`` (edged releases):
  :mod:`edgectl.agentpush`.
* Hub commands (``apply``, ``diff``, ``get``, ``describe``, ``delete``, ``label``,
  ``annotate``, ``devices``, ``tokens``) talk to a hub's AdminService with the credentials of
  ``--config`` (default ``$EDGECTL_CONFIG``, else ``./admin.toml``) and ``--context``:
  :mod:`edgectl.commands`.
* ``config`` (contexts), ``completion bash|zsh``, ``explain``: :mod:`edgectl.configuring`,
  :mod:`edgectl.completing`, :mod:`edgectl.explaining`.

Global flags (``--config``, ``--context``) are accepted anywhere on the line, as kubectl's.
Errors are one line, ``error: ...``, with the exit codes of :mod:`edgectl.errors`.

Adding a command module: give it ``add_commands(sub)`` and ``run(args) -> int | None`` (None
when ``args`` is not its command) and list it in :data:`MODULES`.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import sys
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, NoReturn

from edgectl.errors import EXIT_REFUSED, EXIT_USAGE, EdgectlError
from edgefleet.errors import ConfigError, EdgefleetError, ValidationError
from edgefleet.versioning import version_text

MODULES = (
    "edgectl.commands",
    "edgectl.changing",
    "edgectl.logshowing",
    "edgectl.agentpush",
    "edgectl.configuring",
    "edgectl.completing",
    "edgectl.rollouts",
    "edgectl.secrets",
    "edgectl.dashboards",
    "edgectl.explaining",
)
"""Modules of subcommands, each with ``add_commands(sub)`` and ``run(args)``."""


_INVALID_CHOICE = re.compile(r"argument [^:]+: invalid choice: '([^']*)' \(choose from (.*)\)$")


def did_you_mean(word: str, choices: list[str]) -> str:
    """``; did you mean 'get'?`` for a mistyped ``word`` (difflib), or ``""``."""
    close = difflib.get_close_matches(word, choices, n=2, cutoff=0.6)
    if not close:
        return ""
    return "; did you mean " + " or ".join(f"'{c}'" for c in close) + "?"


class Parser(argparse.ArgumentParser):
    """argparse with edgectl's error style: ``error: PROG: MESSAGE``, exit 2; a mistyped
    command says which it may have been (kubectl's "Did you mean this?")."""

    def error(self, message: str) -> NoReturn:
        found = _INVALID_CHOICE.match(message)
        if found is not None:
            choices = re.findall(r"'([^']*)'", found.group(2))
            hint = did_you_mean(found.group(1), choices)
            if hint:
                message = f"unknown command '{found.group(1)}'{hint}"
        self.exit(EXIT_USAGE, f"error: {self.prog}: {message} (see '{self.prog} --help')\n")


def add_global_flags(p: argparse.ArgumentParser, *, top: bool) -> None:
    """``--config`` and ``--context``; on subcommands with SUPPRESS defaults, so that a value
    given before the subcommand is not reset by it."""
    default: Any = None if top else argparse.SUPPRESS
    p.add_argument(
        "--config", type=Path, default=default, metavar="PATH",
        help="admin.toml of the hub(s) to talk to (default: $EDGECTL_CONFIG, else ./admin.toml)",
    )  # fmt: skip
    p.add_argument(
        "--context", default=default, metavar="NAME",
        help="the context of admin.toml to use (default: its currentContext)",
    )  # fmt: skip


def subparsers(p: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    """The subcommands of ``p`` (one level), by name, without aliases."""
    found: list[tuple[str, argparse.ArgumentParser]] = []
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, child in action.choices.items():
                if id(child) not in seen:
                    seen.add(id(child))
                    found.append((name, child))
    return found


def _add_global_flags_everywhere(p: argparse.ArgumentParser) -> None:
    for _, child in subparsers(p):
        add_global_flags(child, top=False)
        _add_global_flags_everywhere(child)


def _add_quickstart(sub: Any) -> None:
    qs = sub.add_parser(
        "quickstart",
        help="the whole main job on this machine: a hub, three devices, a signed model, "
        "a deployment, an inference",
    )
    qs.add_argument("--dir", type=Path, default=Path("quickstart-data"), help="working directory")
    qs.add_argument(
        "--example",
        type=Path,
        help="the ModelDeployment to apply (default: edgectl's fleet-deployment.yaml, shipped "
        "with it; with --standalone, deployment.yaml)",
    )
    qs.add_argument(
        "--standalone",
        action="store_true",
        help="one edged on a static manifests directory, no hub",
    )
    qs.add_argument("--keep-running", action="store_true", help="leave everything running")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (also what completion and man pages are made from)."""
    from edgectl import pushing, trusting, variants

    p = Parser(prog="edgectl", description="edgefleet operator command line")
    p.add_argument("--version", action="version", version=version_text("edgectl"))
    add_global_flags(p, top=True)
    sub: Any = p.add_subparsers(dest="command", metavar="COMMAND")
    _add_quickstart(sub)
    models = trusting.add_commands(sub)
    pushing.add_command(models)
    variants.add_command(models)
    for module in MODULES:
        importlib.import_module(module).add_commands(sub)
    _add_global_flags_everywhere(p)
    return p


def _run_quickstart(args: argparse.Namespace) -> int:
    from edgectl.quickstart import packaged_example

    example: Traversable
    if args.standalone:
        from edgectl.quickstart import run_quickstart

        example = args.example or packaged_example("deployment.yaml")
        return run_quickstart(args.dir, example, keep_running=args.keep_running)
    from edgectl.fleetdemo import run_fleet_quickstart

    example = args.example or packaged_example("fleet-deployment.yaml")
    return run_fleet_quickstart(args.dir, example, keep_running=args.keep_running)


def _dispatch(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from edgectl import pushing, trusting, variants

    if args.command == "quickstart":
        return _run_quickstart(args)
    for run in (trusting.run, pushing.run, variants.run):
        code = run(args)
        if code is not None:
            return code
    for module in MODULES:
        code = importlib.import_module(module).run(args)
        if code is not None:
            return int(code)
    p.print_help(sys.stderr)
    return EXIT_USAGE


def fail(message: str, code: int) -> int:
    """Print ``error: MESSAGE`` (the one error style) and return ``code``."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    return code


EXIT_SIGPIPE = 128 + 13
"""What a shell shows for a program ended by SIGPIPE, as kubectl is when its reader goes."""


def _reader_gone() -> int:
    """stdout's reader went away (``edgectl get ... | head``): exit quietly, as kubectl does,
    with nothing more written there (stdout now points at /dev/null, so the interpreter's own
    flush at exit fails on nothing)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_SIGPIPE


def main(argv: list[str] | None = None) -> int:
    # gRPC's C core logs to stderr (glog lines) unless told otherwise before it is imported
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    p = build_parser()
    args = p.parse_args(argv)
    if args.command is None:
        p.print_help()
        return 0 if argv is None and len(sys.argv) == 1 else EXIT_USAGE
    try:
        return _dispatch(p, args)
    except BrokenPipeError:
        return _reader_gone()
    except EdgectlError as exc:
        return fail(str(exc), exc.exit_code)
    except ConfigError as exc:
        return fail(str(exc), EXIT_USAGE)
    except (ValidationError, EdgefleetError, OSError) as exc:
        return fail(str(exc), EXIT_REFUSED)
