"""The ``edgectl`` command: the operator's command line.

* ``edgectl quickstart``: the whole main job on one machine.
* The publisher's trust commands (``keys``, ``models sign``, ``trust root``, ``rollback
  allow``): :mod:`edgectl.trusting`.
* Hub commands (``apply``, ``get``, ``describe``, ``delete``, ``devices``, ``tokens``) talk
  to a hub's AdminService with the credentials ``--config`` names (default
  ``$EDGECTL_CONFIG``, else ``./admin.toml``): :mod:`edgectl.commands`.
"""

from __future__ import annotations

import argparse
import sys
from importlib.resources.abc import Traversable
from pathlib import Path

from edgectl import rollouts
from edgectl.commands import ADMIN_COMMANDS, add_admin_commands, run_admin_command
from edgefleet.versioning import version_text


def _add_quickstart(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def _parser() -> argparse.ArgumentParser:
    from edgectl import trusting

    p = argparse.ArgumentParser(prog="edgectl", description="edgefleet operator command line")
    p.add_argument("--version", action="version", version=version_text("edgectl"))
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="PATH",
        help="admin.toml of the hub to talk to (default: $EDGECTL_CONFIG, else ./admin.toml)",
    )
    sub = p.add_subparsers(dest="command")
    _add_quickstart(sub)
    _add_push_command(trusting.add_commands(sub))
    add_admin_commands(sub)
    rollouts.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from edgectl import trusting

    p = _parser()
    args = p.parse_args(argv)
    code = trusting.run(args)
    if code is None:
        code = _run_push_command(args)
    if code is not None:
        return code
    if args.command == "quickstart":
        from edgectl.quickstart import packaged_example

        example: Traversable
        if args.standalone:
            from edgectl.quickstart import run_quickstart

            example = args.example or packaged_example("deployment.yaml")
            return run_quickstart(args.dir, example, keep_running=args.keep_running)
        from edgectl.fleetdemo import run_fleet_quickstart

        example = args.example or packaged_example("fleet-deployment.yaml")
        return run_fleet_quickstart(args.dir, example, keep_running=args.keep_running)
    if args.command in ADMIN_COMMANDS:
        return run_admin_command(args)
    if args.command == "rollout":
        return rollouts.main(args)
    p.print_help()
    return 0 if argv is None and len(sys.argv) == 1 else 2


# -- edgectl models push (edgectl/pushing.py) ------------------------------------------------
def _add_push_command(models: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from edgectl import pushing

    pushing.add_command(models)


def _run_push_command(args: argparse.Namespace) -> int | None:
    from edgectl import pushing

    return pushing.run(args)
