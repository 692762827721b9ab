"""``edgectl create secret NAME --from-file [KEY=]PATH --from-literal KEY=VALUE``: a Secret
applied from files and literals (kubectl's ``create secret generic``), checked here with the
API's own reader (keys, bounds) before the hub is asked. Values are never printed.

``--from-file`` is preferred: a literal is visible in the process list while edgectl runs.
"""

from __future__ import annotations

import argparse
import base64
from pathlib import Path
from typing import Any

import orjson

from edgectl.client import AdminClient, load_admin_config
from edgectl.errors import EXIT_DONE, InputError, UsageError
from edgefleet.api import API_VERSION, parse_manifest
from edgefleet.api.secrets import MAX_SECRET_BYTES
from edgefleet.errors import ValidationError
from edgefleet.v1 import admin_pb2


def add_commands(sub: Any) -> None:
    create = sub.add_parser("create", help="create or update an object from flags")
    csub = create.add_subparsers(dest="create_kind", required=True, metavar="KIND")
    secret = csub.add_parser(
        "secret", help="a Secret from files and literals (values are never printed)"
    )
    secret.add_argument("name", help="the Secret's name")
    secret.add_argument(
        "--from-file", action="append", default=[], metavar="[KEY=]PATH",
        help="a value from a file (key: the file's name unless given)",
    )  # fmt: skip
    secret.add_argument(
        "--from-literal", action="append", default=[], metavar="KEY=VALUE",
        help="a value given on the line (visible in the process list: prefer --from-file)",
    )  # fmt: skip
    secret.add_argument("--dry-run", action="store_true", help="validate only, write nothing")


def secret_document(name: str, from_file: list[str], from_literal: list[str]) -> dict[str, Any]:
    """The Secret manifest of the flags (values base64 in ``spec.data``); InputError/UsageError
    naming the flag that is wrong."""
    data: dict[str, str] = {}

    def put(key: str, value: bytes, flag: str) -> None:
        if key in data:
            raise UsageError(f"{flag}: key {key!r} is given twice")
        data[key] = base64.b64encode(value).decode()

    for item in from_file:
        key, sep, path = item.partition("=")
        if not sep:
            key, path = Path(item).name, item
        try:
            size = Path(path).stat().st_size
            if size > MAX_SECRET_BYTES:
                raise InputError(
                    f"--from-file {path}: {size} bytes, more than a Secret holds "
                    f"({MAX_SECRET_BYTES})"
                )
            value = Path(path).read_bytes()
        except OSError as exc:
            raise InputError(f"--from-file {path}: cannot read: {exc.strerror}") from None
        put(key, value, f"--from-file {item}")
    for item in from_literal:
        key, sep, value_text = item.partition("=")
        if not sep or not key:
            raise UsageError("--from-literal: must be KEY=VALUE")
        put(key, value_text.encode(), f"--from-literal {key}")
    if not data:
        raise UsageError("create secret: give at least one --from-file or --from-literal")
    doc = {
        "apiVersion": API_VERSION,
        "kind": "Secret",
        "metadata": {"name": name},
        "spec": {"data": data},
    }
    try:
        parse_manifest(doc)
    except ValidationError as exc:
        raise InputError(str(exc)) from None
    return doc


def run(args: argparse.Namespace) -> int | None:
    if args.command != "create":
        return None
    from edgectl.commands import default_config

    doc = secret_document(args.name, args.from_file, args.from_literal)
    config = load_admin_config(args.config or default_config(), getattr(args, "context", None))
    with AdminClient(config) as client:
        (result,) = client.apply([orjson.dumps(doc)], dry_run=args.dry_run)
    outcome = admin_pb2.ApplyResult.Outcome.Name(result.outcome).lower()
    print(f"secret/{result.name} {outcome}{' (dry run)' if args.dry_run else ''}", flush=True)
    return EXIT_DONE
