"""The ``edgectl`` command: ``quickstart``, and the publisher's trust commands (``keys``,
``models sign``, ``trust root``, ``rollback allow``; see ``edgectl/trusting.py``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="edgectl", description="edgefleet operator command line")
    sub = p.add_subparsers(dest="command")
    qs = sub.add_parser(
        "quickstart",
        help="run edged on the example ModelDeployment and send it an inference request",
    )
    qs.add_argument("--dir", type=Path, default=Path("quickstart-data"), help="working directory")
    qs.add_argument(
        "--example",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "examples" / "quickstart" / "deployment.yaml",
        help="the ModelDeployment to run",
    )
    qs.add_argument("--keep-running", action="store_true", help="leave edged running at the end")
    from edgectl import trusting

    _add_push_command(trusting.add_commands(sub))
    args = p.parse_args(argv)
    code = trusting.run(args)
    if code is None:
        code = _run_push_command(args)
    if code is not None:
        return code
    if args.command == "quickstart":
        from edgectl.quickstart import run_quickstart

        return run_quickstart(args.dir, args.example, keep_running=args.keep_running)
    p.print_help()
    return 0 if argv is None and len(sys.argv) == 1 else 2


# -- edgectl models push (edgectl/pushing.py) ------------------------------------------------
def _add_push_command(models: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from edgectl import pushing

    pushing.add_command(models)


def _run_push_command(args: argparse.Namespace) -> int | None:
    from edgectl import pushing

    return pushing.run(args)
