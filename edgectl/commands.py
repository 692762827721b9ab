"""The edgectl commands that talk to a hub's AdminService: apply, get, describe, delete,
devices cordon|uncordon|revoke, tokens create. ``add_admin_commands`` registers them on the
top-level parser; ``run_admin_command`` runs the one parsed (see :mod:`edgectl.client` for
the config file and the exit codes)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from edgectl import printing
from edgectl.client import (
    EXIT_REFUSED,
    EXIT_USAGE,
    AdminClient,
    ClientError,
    load_admin_config,
)
from edgefleet.api import load_documents
from edgefleet.configfiles import duration_option
from edgefleet.errors import ConfigError, ValidationError
from edgefleet.v1 import admin_pb2

CONFIG_ENV = "EDGECTL_CONFIG"

KINDS: dict[str, str] = {}
for _canonical, _aliases in {
    "Device": ("devices", "device", "dev"),
    "ModelDeployment": ("deployments", "deployment", "deploy", "modeldeployments", "md"),
    "Model": ("models", "model"),
    "SecurityBaseline": ("baselines", "baseline", "securitybaselines"),
    "DeviceHealthPolicy": ("policies", "policy", "devicehealthpolicies"),
}.items():
    for _alias in (_canonical.lower(), *_aliases):
        KINDS[_alias] = _canonical


def default_config() -> Path:
    return Path(os.environ.get(CONFIG_ENV) or "admin.toml")


def _kind(text: str) -> str:
    kind = KINDS.get(text.lower())
    if kind is None:
        choices = "devices, deployments, models, baselines, policies, events"
        raise argparse.ArgumentTypeError(f"unknown resource type {text!r} (one of {choices})")
    return kind


def _kind_or_events(text: str) -> str:
    return "Event" if text.lower() in ("events", "event", "ev") else _kind(text)


def _label(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"must be KEY=VALUE, got {text!r}")
    return key, value


def add_admin_commands(sub: Any) -> None:
    """Register the hub commands on ``sub`` (the top-level subparsers)."""
    apply = sub.add_parser("apply", help="create or update objects from YAML or JSON files")
    apply.add_argument(
        "-f", "--filename", action="append", required=True, metavar="FILE",
        help="a file of one or more documents; - for stdin (repeatable: one all-or-nothing "
        "apply, documents numbered across files in order)",
    )  # fmt: skip
    apply.add_argument("--dry-run", action="store_true", help="validate only, write nothing")

    get = sub.add_parser("get", help="list objects, or show one")
    get.add_argument(
        "resource", type=_kind_or_events, help="devices|deployments|models|baselines|events"
    )
    get.add_argument("name", nargs="?", default="")
    get.add_argument("-o", "--output", choices=["wide", "json", "yaml"], default="")
    get.add_argument("-l", "--selector", default="", help="label selector, e.g. site=retail,npu")
    get.add_argument("-w", "--watch", action="store_true", help="then print every change")
    get.add_argument(
        "--for", dest="for_object", default="", metavar="KIND/NAME", help="events of one object"
    )

    describe = sub.add_parser("describe", help="one object, readable: status, conditions, events")
    describe.add_argument("resource", type=_kind, help="device|deployment")
    describe.add_argument("name")

    delete = sub.add_parser("delete", help="delete an object or a device")
    delete.add_argument("resource", type=_kind)
    delete.add_argument("name")
    delete.add_argument(
        "--force",
        action="store_true",
        help="delete a model even when deployments use it (they stop running everywhere)",
    )

    devices = sub.add_parser("devices", help="device commands")
    dsub = devices.add_subparsers(dest="device_command", required=True, metavar="COMMAND")
    for name, text in (
        ("cordon", "keep new workloads off a device"),
        ("uncordon", "allow new workloads on a device again"),
        ("revoke", "revoke a device's certificate and close its connection"),
    ):
        dsub.add_parser(name, help=text).add_argument("name")

    tokens = sub.add_parser("tokens", help="bootstrap tokens for enrolling devices")
    tsub = tokens.add_subparsers(dest="token_command", required=True, metavar="COMMAND")
    create = tsub.add_parser("create", help="a new bootstrap token (printed once)")
    create.add_argument(
        "--ttl", type=duration_option, default=0.0, help='e.g. "24h" (default: the hub\'s)'
    )
    create.add_argument("--single-use", action="store_true")
    create.add_argument("--description", default="")
    create.add_argument(
        "--label", type=_label, action="append", default=[], metavar="KEY=VALUE",
        help="a label every device enrolled with the token starts with (repeatable)",
    )  # fmt: skip


ADMIN_COMMANDS = ("apply", "get", "describe", "delete", "devices", "tokens")


def _print(text: str) -> None:
    print(text, flush=True)


def _read_documents(files: list[str]) -> list[bytes]:
    documents: list[bytes] = []
    for name in files:
        if name == "-":
            data, source = sys.stdin.buffer.read(), "<stdin>"
        else:
            try:
                data, source = Path(name).read_bytes(), name
            except OSError as exc:
                raise ClientError("INPUT", f"{name}: cannot read: {exc.strerror}") from None
        for doc in load_documents(data, source=source):
            documents.append(orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS))
    if not documents:
        raise ClientError("INPUT", "no documents to apply")
    return documents


def _apply(client: AdminClient, args: argparse.Namespace) -> int:
    results = client.apply(_read_documents(args.filename), dry_run=args.dry_run)
    suffix = " (dry run)" if args.dry_run else ""
    for r in results:
        outcome = admin_pb2.ApplyResult.Outcome.Name(r.outcome).lower()
        _print(f"{r.kind.lower()}/{r.name} {outcome}{suffix}")
        for warning in r.warnings:
            print(f"Warning: {r.kind.lower()}/{r.name}: {warning}", file=sys.stderr)
    return 0


def _show(kind: str, docs: list[dict[str, Any]], output: str, *, single: bool) -> None:
    if output in ("json", "yaml"):
        _print(printing.dump(docs[0] if single else printing.as_list(docs), output))
    else:
        _print(printing.objects_table(kind, docs, now=time.time(), wide=output == "wide"))


def _watch(client: AdminClient, args: argparse.Namespace, resource_version: int) -> None:
    wide = args.output == "wide"
    for type_, doc in client.watch(args.resource, resource_version):
        if args.name and doc.get("metadata", {}).get("name") != args.name:
            continue
        if args.output in ("json", "yaml"):
            event = {"type": type_, "object": doc}
            if args.output == "json":
                _print(orjson.dumps(event).decode())
            else:
                _print("---\n" + printing.dump(event, "yaml"))
        else:
            rows = printing.rows_of(args.resource, [doc], now=time.time(), wide=wide)
            _print("   ".join(rows[0]) + ("   (deleted)" if type_ == "DELETED" else ""))


def _get_events(client: AdminClient, args: argparse.Namespace) -> int:
    kind = name = ""
    if args.for_object:
        kind_text, slash, name = args.for_object.partition("/")
        if not slash or not name:
            raise ClientError("INPUT", f"--for must be KIND/NAME, got {args.for_object!r}")
        try:
            kind = _kind(kind_text)
        except argparse.ArgumentTypeError as exc:
            raise ClientError("INPUT", f"--for: {exc}") from None
    events = client.events(kind, name)
    if args.output in ("json", "yaml"):
        _print(printing.dump(printing.as_list(events), args.output))
    else:
        _print(printing.events_table(events, now=time.time()))
    return 0


def _get(client: AdminClient, args: argparse.Namespace) -> int:
    if args.resource == "Event":
        return _get_events(client, args)
    if args.name and args.selector:
        raise ClientError("INPUT", "give a NAME or a --selector, not both")
    if args.name:
        docs = [client.get(args.resource, args.name)]
        resource_version = 0
    else:
        docs, resource_version = client.list_objects(args.resource, args.selector)
    _show(args.resource, docs, args.output, single=bool(args.name))
    if args.watch:
        try:
            _watch(client, args, resource_version)
        except KeyboardInterrupt:
            return 0
    return 0


def _describe(client: AdminClient, args: argparse.Namespace) -> int:
    doc = client.get(args.resource, args.name)
    events = client.events(args.resource, args.name)
    now = time.time()
    if args.resource == "Device":
        _print(printing.describe_device(doc, events, now=now))
    elif args.resource == "ModelDeployment":
        _print(printing.describe_deployment(doc, events, now=now))
    else:
        _print(printing.dump(doc, "yaml"))
        _print("\n".join(printing.events_section(events, now)))
    return 0


def _delete(client: AdminClient, args: argparse.Namespace) -> int:
    if not client.delete(args.resource, args.name, force=args.force):
        raise ClientError("NOT_FOUND", f'{args.resource} "{args.name}" not found')
    _print(f"{args.resource.lower()}/{args.name} deleted")
    return 0


def _devices(client: AdminClient, args: argparse.Namespace) -> int:
    if args.device_command == "revoke":
        serials = client.revoke(args.name)
        which = ", ".join(serials) or "none on record"
        _print(f"device/{args.name} revoked (certificates: {which})")
    else:
        client.cordon(args.name, cordoned=args.device_command == "cordon")
        _print(f"device/{args.name} {args.device_command}ed")
    return 0


def _tokens(client: AdminClient, args: argparse.Namespace) -> int:
    response = client.create_token(
        ttl_s=args.ttl,
        single_use=args.single_use,
        description=args.description,
        labels=dict(args.label),
    )
    expires = datetime.fromtimestamp(response.expires.ToSeconds(), UTC)
    _print(response.token)
    root = f"root hash {response.root_hash}; " if response.root_hash else ""
    print(
        f"expires {expires:%Y-%m-%dT%H:%M:%SZ}; {root}CA hash {response.ca_hash}",
        file=sys.stderr,
        flush=True,
    )
    return 0


_HANDLERS: dict[str, Callable[[AdminClient, argparse.Namespace], int]] = {
    "apply": _apply,
    "get": _get,
    "describe": _describe,
    "delete": _delete,
    "devices": _devices,
    "tokens": _tokens,
}


def run_admin_command(args: argparse.Namespace) -> int:
    """Run a parsed hub command; errors are printed as one ``error: ...`` line."""
    try:
        config = load_admin_config(args.config or default_config())
        with AdminClient(config) as client:
            return _HANDLERS[args.command](client, args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValidationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except ClientError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
