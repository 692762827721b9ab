"""The edgectl commands that talk to a hub's AdminService, in kubectl's forms:

* ``apply -f FILE|DIR|- [-R] [--dry-run]``, ``diff -f ...`` (what apply would change),
  ``delete TYPE NAME...|TYPE/NAME...|-f ...``;
* ``get TYPE [NAME...]|TYPE/NAME... [-o wide|name|json|yaml|jsonpath=T] [-l SELECTOR]
  [--no-headers] [--sort-by PATH] [--show-labels] [--chunk-size N] [-w]``,
  ``get events [--for TYPE/NAME]``, ``get placements|devices --for deployment/NAME``;
* ``describe TYPE NAME|TYPE/NAME``; ``label`` and ``annotate TYPE NAME KEY=VALUE... KEY-``
  (``logs``: :mod:`edgectl.logshowing`);
* ``devices cordon|uncordon|revoke NAME``, ``regions revoke REGION`` (at a root hub),
  ``get regions`` (at a root hub: read-only), ``tokens create``, ``get tokens``,
  ``delete token ID``.

``add_commands`` registers them on the top-level parser; ``run`` runs the one parsed (None when
it is not one of these). A flag that does not apply to what was asked is a usage error
(:class:`~edgectl.errors.UsageError`, exit 2), never ignored.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from edgectl import jsonpath, modelconfigs, placements, printing
from edgectl.client import DEFAULT_CHUNK_SIZE, AdminClient, ClientError, load_admin_config
from edgectl.errors import EXIT_DONE, EXIT_REFUSED, InputError, UsageError
from edgectl.resources import (
    ALL_KINDS,
    APPLIED_KINDS,
    EVENT,
    PLACEMENT,
    REGION,
    TOKEN,
    Ref,
    kind_of,
    parse_refs,
)
from edgefleet.api import Secret, load_documents, parse_manifest
from edgefleet.api.meta import label_key, label_value
from edgefleet.configfiles import duration_option
from edgefleet.errors import ValidationError
from edgefleet.tokenoptions import add_token_label_options
from edgefleet.v1 import admin_pb2

CONFIG_ENV = "EDGECTL_CONFIG"
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
HUB_METADATA = ("uid", "creationTimestamp", "resourceVersion")
"""metadata fields the hub adds; ``diff`` leaves them out."""


def default_config() -> Path:
    return Path(os.environ.get(CONFIG_ENV) or "admin.toml")


def _chunk_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (one call) or more, got {value}")
    return value


def _output(text: str) -> str:
    if text in ("", "wide", "name", "json", "yaml"):
        return text
    if text.startswith("jsonpath="):
        try:
            jsonpath.check(text.removeprefix("jsonpath="))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text
    raise argparse.ArgumentTypeError(
        f"unknown output format {text!r} (one of wide, name, json, yaml, jsonpath=TEMPLATE)"
    )


def _add_files(p: argparse.ArgumentParser, *, required: bool, what: str) -> None:
    p.add_argument(
        "-f", "--filename", action="append", required=required, default=[], metavar="FILE",
        help=f"a file of one or more documents, a directory of *.yaml|*.yml|*.json, or - for "
        f"stdin (repeatable; {what})",
    )  # fmt: skip
    p.add_argument(
        "-R", "--recursive", action="store_true", help="with -f DIR: its subdirectories too"
    )


def add_commands(sub: Any) -> None:
    """Register the hub commands on ``sub`` (the top-level subparsers)."""
    apply = sub.add_parser("apply", help="create or update objects from YAML or JSON files")
    _add_files(apply, required=True, what="one all-or-nothing apply, in order")
    apply.add_argument("--dry-run", action="store_true", help="validate only, write nothing")

    diff = sub.add_parser(
        "diff", help="what apply would change (exit 1 when there are differences)"
    )
    _add_files(diff, required=True, what="compared with the hub's objects")

    get = sub.add_parser("get", help="list objects, or show some")
    get.add_argument(
        "resource", nargs="+", metavar="RESOURCE",
        help="TYPE [NAME...] or TYPE/NAME...; TYPE: devices, deployments, models, baselines, "
        "policies, secrets, priorityclasses, tokens, regions (at a root hub), events; or all "
        "(devices, deployments, agentupgrades)",
    )  # fmt: skip
    get.add_argument(
        "-o", "--output", type=_output, default="", metavar="FORMAT",
        help="wide, name, json, yaml or jsonpath=TEMPLATE",
    )  # fmt: skip
    get.add_argument(
        "-l", "--selector", default="",
        help="label selector: site=retail, site!=lab, 'site in (a,b)', 'tier notin (x)', npu, !npu",
    )  # fmt: skip
    get.add_argument("-w", "--watch", action="store_true", help="then print every change")
    get.add_argument(
        "--for", dest="for_object", default="", metavar="TYPE/NAME",
        help="events of one object; with devices or placements: deployment/NAME's",
    )  # fmt: skip
    get.add_argument("--no-headers", action="store_true", help="tables without their header")
    get.add_argument(
        "--sort-by", default="", metavar="PATH", help="order by a field, e.g. .metadata.name"
    )
    get.add_argument("--show-labels", action="store_true", help="a LABELS column")
    get.add_argument(
        "--chunk-size", type=_chunk_size, default=None, metavar="N",
        help=f"read a list N objects per call (default {DEFAULT_CHUNK_SIZE}; 0: in one call)",
    )  # fmt: skip

    describe = sub.add_parser("describe", help="one object, readable: status, conditions, events")
    describe.add_argument("resource", nargs="+", metavar="RESOURCE", help="TYPE NAME or TYPE/NAME")
    describe.add_argument(
        "--device", default="", metavar="NAME",
        help="modelconfig: the merged config this device gets, each value with its source",
    )  # fmt: skip

    delete = sub.add_parser("delete", help="delete objects, devices or tokens")
    delete.add_argument(
        "resource", nargs="*", metavar="RESOURCE", help="TYPE NAME... or TYPE/NAME..."
    )
    _add_files(delete, required=False, what="the objects they define")
    delete.add_argument(
        "--force",
        action="store_true",
        help="delete a model even when deployments use it (they stop running everywhere)",
    )

    for verb, what in (("label", "labels"), ("annotate", "annotations")):
        p = sub.add_parser(verb, help=f"set or remove {what} of an applied object")
        p.add_argument(
            "resource",
            nargs="+",
            metavar="ARG",
            help="TYPE NAME or TYPE/NAME, then KEY=VALUE... KEY-",
        )
        p.add_argument(
            "--overwrite", action="store_true", help="allow changing a value already set"
        )

    devices = sub.add_parser("devices", help="device commands")
    dsub = devices.add_subparsers(dest="device_command", required=True, metavar="COMMAND")
    for name, text in (
        ("cordon", "keep new workloads off a device"),
        ("uncordon", "allow new workloads on a device again"),
        ("revoke", "revoke a device's certificate and close its connection"),
    ):
        dsub.add_parser(name, help=text).add_argument("name")

    regions = sub.add_parser("regions", help="regional hub commands (at a root hub)")
    rsub = regions.add_subparsers(dest="region_command", required=True, metavar="COMMAND")
    rsub.add_parser(
        "revoke", help="revoke a regional hub's federation certificate and close its stream"
    ).add_argument("region")

    tokens = sub.add_parser("tokens", help="bootstrap tokens for enrolling devices")
    tsub = tokens.add_subparsers(dest="token_command", required=True, metavar="COMMAND")
    create = tsub.add_parser("create", help="a new bootstrap token (printed once)")
    create.add_argument(
        "--ttl", type=duration_option, default=0.0, help='e.g. "24h" (default: the hub\'s)'
    )
    create.add_argument("--single-use", action="store_true")
    create.add_argument("--description", default="")
    create.add_argument(
        "--for-region", default="", metavar="REGION",
        help="a token that enrolls only the regional hub of REGION (hub init --parent), no "
        "device; at a root hub",
    )  # fmt: skip
    add_token_label_options(create)


COMMANDS = (
    "apply", "diff", "get", "describe", "delete", "label", "annotate", "devices", "regions",
    "tokens",
)  # fmt: skip


def _print(text: str) -> None:
    print(text, flush=True)


# -- reading files -----------------------------------------------------------------------------
def _manifest_files(name: str, *, recursive: bool) -> list[Path]:
    path = Path(name)
    if not path.is_dir():
        return [path]
    pattern = "**/*" if recursive else "*"
    found = sorted(
        p for p in path.glob(pattern) if p.is_file() and p.suffix.lower() in MANIFEST_SUFFIXES
    )
    if not found:
        raise InputError(f"{name}: no *.yaml, *.yml or *.json files" + ("" if recursive else
                         " (-R for subdirectories)"))  # fmt: skip
    return found


def read_documents(files: list[str], *, recursive: bool = False) -> list[dict[str, Any]]:
    """Every document of ``files`` (``-`` is stdin; a directory its manifest files, sorted)."""
    documents: list[dict[str, Any]] = []
    for name in files:
        for path in [Path("-")] if name == "-" else _manifest_files(name, recursive=recursive):
            if name == "-":
                data, source = sys.stdin.buffer.read(), "<stdin>"
            else:
                try:
                    data, source = path.read_bytes(), str(path)
                except OSError as exc:
                    raise InputError(f"{path}: cannot read: {exc.strerror}") from None
            documents.extend(load_documents(data, source=source))
    if not documents:
        raise InputError("no documents in " + ", ".join(files))
    return documents


def _check_recursive(args: argparse.Namespace) -> None:
    if args.recursive and not args.filename:
        raise UsageError(f"{args.command}: -R applies only with -f DIR")


# -- apply, diff ---------------------------------------------------------------------------------
def _apply(client: AdminClient, args: argparse.Namespace) -> int:
    docs = read_documents(args.filename, recursive=args.recursive)
    encoded = [orjson.dumps(d, option=orjson.OPT_NON_STR_KEYS) for d in docs]
    results = client.apply(encoded, dry_run=args.dry_run)
    suffix = " (dry run)" if args.dry_run else ""
    for r in results:
        outcome = admin_pb2.ApplyResult.Outcome.Name(r.outcome).lower()
        _print(f"{r.kind.lower()}/{r.name} {outcome}{suffix}")
        for warning in r.warnings:
            print(f"Warning: {r.kind.lower()}/{r.name}: {warning}", file=sys.stderr)
    return EXIT_DONE


def _canonical(doc: dict[str, Any], index: int) -> dict[str, Any]:
    try:
        manifest = parse_manifest(doc)
        if isinstance(manifest, Secret):  # values are never shown: the hub shows keys only
            return manifest.redacted()
        return manifest.to_dict()
    except ValidationError as exc:
        raise InputError(f"documents[{index}]: {exc}") from None


def _as_stored(doc: dict[str, Any]) -> dict[str, Any]:
    shown = {k: v for k, v in doc.items() if k != "status"}
    shown["metadata"] = {k: v for k, v in doc.get("metadata", {}).items() if k not in HUB_METADATA}
    return shown


def _diff(client: AdminClient, args: argparse.Namespace) -> int:
    docs = read_documents(args.filename, recursive=args.recursive)
    changed = False
    for i, doc in enumerate(docs):
        new = _canonical(doc, i)
        ref = Ref(str(new["kind"]), str(new["metadata"]["name"]))
        try:
            old = printing.dump(_as_stored(client.get(ref.kind, ref.name)), "yaml") + "\n"
        except ClientError as exc:
            if exc.code != "NOT_FOUND":
                raise
            old = ""
        text = printing.dump(new, "yaml") + "\n"
        lines = list(
            difflib.unified_diff(
                old.splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=f"hub/{ref}",
                tofile=f"file/{ref}",
            )
        )
        if lines:
            changed = True
            sys.stdout.write("".join(lines))
    sys.stdout.flush()
    return EXIT_REFUSED if changed else EXIT_DONE


# -- get ---------------------------------------------------------------------------------------
def _refuse(flag: str, why: str) -> None:
    raise UsageError(f"get: {flag} {why}")


def _check_get_flags(args: argparse.Namespace, kind: str, refs: list[Ref]) -> None:
    if kind == EVENT or any(r.kind == EVENT for r in refs):
        if args.watch and args.sort_by:
            _refuse("--sort-by", "does not apply with --watch")
        for flag, given in (
            ("-l/--selector", args.selector),
            ("--show-labels", args.show_labels),
            ("--chunk-size", args.chunk_size is not None),
            ("-o " + args.output, args.output in ("wide", "name")),
        ):
            if given:
                _refuse(flag, "does not apply to events")
        if refs:
            raise UsageError("get events: events have no names; use --for TYPE/NAME")
        return
    if args.for_object:
        placements.check_for(args, kind, refs)
    if refs and args.selector:
        _refuse("-l/--selector", "does not apply with names (give names or a selector)")
    if refs and args.chunk_size is not None:
        _refuse("--chunk-size", "applies to lists, not to names")
    if args.watch:
        if not kind:
            _refuse("-w/--watch", "needs one resource type (TYPE [NAME...], not TYPE/NAME)")
        if kind == TOKEN:
            _refuse("-w/--watch", "does not apply to tokens")
        if kind == REGION:
            _refuse("-w/--watch", "does not apply to regions (their status is not stored; get "
                    "them again)")  # fmt: skip
        if kind == PLACEMENT:
            _refuse("-w/--watch", "does not apply to placements yet (get them again, or watch "
                    "the deployment: get deployments NAME -w)")  # fmt: skip
        if args.sort_by:
            _refuse("--sort-by", "does not apply with --watch")
    if args.output in ("name", "json", "yaml") or args.output.startswith("jsonpath="):
        for flag, given in (("--no-headers", args.no_headers), ("--show-labels", args.show_labels)):
            if given:
                _refuse(flag, f"applies only to tables, not -o {args.output}")


def _render(
    kind: str, docs: list[dict[str, Any]], args: argparse.Namespace, *, single: bool
) -> str:
    output = args.output
    if output == "name":
        return "\n".join(printing.name_of(d) for d in docs)
    if output.startswith("jsonpath="):
        view: Any = docs[0] if single else printing.as_list(docs)
        return jsonpath.render(output.removeprefix("jsonpath="), view)
    if output in ("json", "yaml"):
        return printing.dump(docs[0] if single else printing.as_list(docs), output)
    if not kind:  # TYPE/NAME forms of several kinds: one table per kind, as kubectl
        kinds = list(dict.fromkeys(str(d.get("kind", "")) for d in docs))
        return "\n\n".join(
            _render(k, [d for d in docs if d.get("kind") == k], args, single=False) for k in kinds
        )
    return printing.objects_table(
        kind,
        docs,
        now=time.time(),
        wide=output == "wide",
        headers=not args.no_headers,
        show_labels=args.show_labels,
    )


def _watch(client: AdminClient, args: argparse.Namespace, kind: str, names: set[str],
           resource_version: int) -> None:  # fmt: skip
    for type_, doc in client.watch(kind, resource_version):
        if names and doc.get("metadata", {}).get("name") not in names:
            continue
        if args.output in ("json", "yaml"):
            event = {"type": type_, "object": doc}
            if args.output == "json":
                _print(orjson.dumps(event).decode())
            else:
                _print("---\n" + printing.dump(event, "yaml"))
        elif args.output == "name" or args.output.startswith("jsonpath="):
            _print(_render(kind, [doc], args, single=True))
        else:
            rows = printing.rows_of(kind, [doc], now=time.time(), wide=args.output == "wide")
            _print("   ".join(rows[0]) + ("   (deleted)" if type_ == "DELETED" else ""))


def _get_events(client: AdminClient, args: argparse.Namespace) -> int:
    kind = name = ""
    if args.for_object:
        kind_text, slash, name = args.for_object.partition("/")
        if not slash or not name:
            raise UsageError(f"--for must be TYPE/NAME, got {args.for_object!r}")
        kind = kind_of(kind_text)
    if args.watch:
        return _watch_events(client, args, kind, name)
    events = client.events(kind, name)
    if args.sort_by:
        events.sort(key=printing.sort_key(args.sort_by))
    if args.output == "" and events:
        table = printing.events_table(events, now=time.time())
        _print(table.split("\n", 1)[1] if args.no_headers else table)
    elif args.output == "":
        _print("No events found.")
    else:
        _print(_render(EVENT, events, args, single=False))
    return EXIT_DONE


def _watch_events(client: AdminClient, args: argparse.Namespace, kind: str, name: str) -> int:
    """``get events -w``: the newest events (as ``get events`` lists them), then each one as it
    is recorded, until interrupted."""
    header = args.output == "" and not args.no_headers
    try:
        for _type, ev in client.watch(EVENT, 0):
            obj = ev.get("object", {})
            if (kind and obj.get("kind") != kind) or (name and obj.get("name") != name):
                continue
            if args.output == "json":
                _print(orjson.dumps(ev).decode())
            elif args.output == "yaml":
                _print("---\n" + printing.dump(ev, "yaml"))
            elif args.output.startswith("jsonpath="):
                _print(jsonpath.render(args.output.removeprefix("jsonpath="), ev))
            else:
                table = printing.events_table([ev], now=time.time()).split("\n")
                if header:
                    _print(table[0])
                    header = False
                _print(table[1])
    except KeyboardInterrupt:
        return EXIT_DONE
    return EXIT_DONE


GET_ALL = ("Device", "ModelDeployment", "AgentUpgrade")
"""What ``get all`` lists (kubectl's ``all``: what runs), each kind its own table."""


def _check_get_all(args: argparse.Namespace) -> bool:
    """Whether this is ``get all``; UsageError for what does not apply to it."""
    if args.resource[0].lower() != "all":
        return False
    if len(args.resource) > 1:
        _refuse(" ".join(args.resource[1:]), "cannot follow all (get all lists every object)")
    for flag, given in (("-w/--watch", args.watch), ("--for", args.for_object)):
        if given:
            _refuse(flag, "does not apply to all")
    return True


def _get_all(client: AdminClient, args: argparse.Namespace) -> int:
    chunk = DEFAULT_CHUNK_SIZE if args.chunk_size is None else args.chunk_size
    found: dict[str, list[dict[str, Any]]] = {}
    for kind in GET_ALL:
        docs, _ = client.list_objects(kind, args.selector, chunk_size=chunk)
        if args.sort_by:
            docs.sort(key=printing.sort_key(args.sort_by))
        if docs:
            found[kind] = docs
    everything = [d for docs in found.values() for d in docs]
    if args.output in ("json", "yaml") or args.output.startswith("jsonpath="):
        _print(_render("", everything, args, single=False))
    elif args.output == "name":
        _print("\n".join(printing.name_of(d) for d in everything))
    elif not everything:
        _print("No resources found.")
    else:
        tables = []
        for kind, docs in found.items():
            shown = [{**d, "metadata": {**d.get("metadata", {}), "name": printing.name_of(d)}}
                     for d in docs]  # fmt: skip
            tables.append(_render(kind, shown, args, single=False))
        _print("\n\n".join(tables))
    return EXIT_DONE


def _get(client: AdminClient, args: argparse.Namespace) -> int:
    if _check_get_all(args):
        return _get_all(client, args)
    kind, refs = parse_refs(args.resource, allow=ALL_KINDS)
    _check_get_flags(args, kind, refs)
    if kind == EVENT:
        return _get_events(client, args)
    resource_version = 0
    if refs:
        docs = [client.get(r.kind, r.name) for r in refs]
    elif args.for_object:  # get devices|placements --for deployment/NAME
        docs = placements.listed_for(client, kind, args.for_object, args.selector, args.chunk_size)
    else:
        chunk = DEFAULT_CHUNK_SIZE if args.chunk_size is None else args.chunk_size
        docs, resource_version = client.list_objects(kind, args.selector, chunk_size=chunk)
    if args.sort_by:
        docs.sort(key=printing.sort_key(args.sort_by))
    single = len(refs) == 1
    text = _render(kind, docs, args, single=single)
    if text or not args.watch:
        _print(text)
    if args.watch:
        try:
            _watch(client, args, kind, {r.name for r in refs}, resource_version)
        except KeyboardInterrupt:
            return EXIT_DONE
    return EXIT_DONE


# -- describe, delete ----------------------------------------------------------------------------
def _one(words: list[str], verb: str, *, allow: tuple[str, ...] = ()) -> tuple[Ref, list[str]]:
    """``TYPE NAME rest...`` or ``TYPE/NAME rest...``: the object and the rest."""
    if words and "/" in words[0]:
        _, refs = parse_refs(words[:1], allow=allow)
        return refs[0], words[1:]
    if len(words) < 2:
        raise UsageError(f"{verb}: give TYPE NAME or TYPE/NAME")
    _kind, refs = parse_refs(words[:2], allow=allow)
    return refs[0], words[2:]


def _describe(client: AdminClient, args: argparse.Namespace) -> int:
    ref, rest = _one(args.resource, "describe")
    if rest:
        raise UsageError(f"describe: one object at a time (got {' '.join(rest)!r} too)")
    if getattr(args, "device", "") and ref.kind != "ModelConfig":
        raise UsageError("describe: --device goes with a modelconfig")
    doc = client.get(ref.kind, ref.name)
    if getattr(args, "device", ""):
        _print(modelconfigs.describe_for_device(doc, client.get("Device", args.device)))
        return EXIT_DONE
    events = client.events(ref.kind, ref.name)
    now = time.time()
    if ref.kind == "Device":
        _print(printing.describe_device(doc, events, now=now))
    elif ref.kind == "ModelDeployment":
        placed, more = placements.of_deployment(client, ref.name)
        _print(printing.describe_deployment(doc, events, now=now, placed=placed, more_placed=more))
    elif ref.kind == REGION:
        _print(printing.describe_region(doc, events, now=now))
    else:
        _print(printing.describe_object(doc, events, now=now))
    return EXIT_DONE


def _delete(client: AdminClient, args: argparse.Namespace) -> int:
    _check_recursive(args)
    if args.filename and args.resource:
        raise UsageError("delete: give -f FILE or TYPE NAME..., not both")
    if args.filename:
        docs = read_documents(args.filename, recursive=args.recursive)
        refs = [Ref(kind_of(str(d.get("kind", "")), allow=APPLIED_KINDS),
                    str(d.get("metadata", {}).get("name", ""))) for d in docs]  # fmt: skip
    else:
        _kind, refs = parse_refs(args.resource)
        if not refs:
            raise UsageError(f"delete: which {args.resource[0]}? give TYPE NAME... or TYPE/NAME")
    missing = []
    for ref in refs:
        if client.delete(ref.kind, ref.name, force=args.force):
            _print(f"{ref} deleted")
        else:
            missing.append(ref)
    if missing:
        names = ", ".join(f'{r.kind} "{r.name}"' for r in missing)
        raise ClientError("NOT_FOUND", f"{names} not found")
    return EXIT_DONE


# -- label, annotate -----------------------------------------------------------------------------
def _changes(words: list[str], check: Callable[[object], str]) -> tuple[dict[str, str], list[str]]:
    sets: dict[str, str] = {}
    removes: list[str] = []
    for word in words:
        try:
            if "=" in word:
                key, _, value = word.partition("=")
                sets[label_key(key)] = check(value)
            elif word.endswith("-"):
                removes.append(label_key(word[:-1]))
            else:
                raise ValueError("must be KEY=VALUE or KEY-")
        except ValueError as exc:
            raise UsageError(f"{word!r}: {exc}") from None
    if not sets and not removes:
        raise UsageError("give at least one KEY=VALUE or KEY-")
    return sets, removes


def _relabel(client: AdminClient, args: argparse.Namespace) -> int:
    field = "labels" if args.command == "label" else "annotations"
    ref, rest = _one(args.resource, args.command)
    if ref.kind not in APPLIED_KINDS:
        raise UsageError(
            f"{args.command}: {ref.kind} objects are not applied by operators; "
            f"{args.command} works on {', '.join(APPLIED_KINDS)}"
        )
    sets, removes = _changes(rest, label_value if field == "labels" else str)
    got = client.get(ref.kind, ref.name)
    version = got.get("metadata", {}).get("resourceVersion")
    doc = _as_stored(got)
    current: dict[str, str] = dict(doc["metadata"].get(field, {}))
    clashes = [k for k, v in sets.items() if k in current and current[k] != v]
    if clashes and not args.overwrite:
        raise ClientError(
            "ALREADY_EXISTS",
            f"{ref}: {', '.join(clashes)} already set (--overwrite to change)",
        )
    current.update(sets)
    for key in removes:
        current.pop(key, None)
    doc["metadata"][field] = current
    if version:  # a change made meanwhile is refused, not overwritten (ABORTED)
        doc["metadata"]["resourceVersion"] = version
    client.apply([orjson.dumps(doc)], check_resource_version=bool(version))
    _print(f"{ref} {'labeled' if field == 'labels' else 'annotated'}")
    return EXIT_DONE


# -- devices, tokens -----------------------------------------------------------------------------
def _regions(client: AdminClient, args: argparse.Namespace) -> int:
    serials = client.revoke_region(args.region)  # region_command: only "revoke"
    _print(f"region/{args.region} revoked (certificates: {', '.join(serials)})")
    return 0


def _devices(client: AdminClient, args: argparse.Namespace) -> int:
    if args.device_command == "revoke":
        serials = client.revoke(args.name)
        which = ", ".join(serials) or "none on record"
        _print(f"device/{args.name} revoked (certificates: {which})")
    else:
        client.cordon(args.name, cordoned=args.device_command == "cordon")
        _print(f"device/{args.name} {args.device_command}ed")
    return EXIT_DONE


def _tokens(client: AdminClient, args: argparse.Namespace) -> int:
    response = client.create_token(
        ttl_s=args.ttl,
        single_use=args.single_use,
        description=args.description,
        labels=dict(args.label),
        no_device_labels=args.no_device_labels,
        device_label_prefix=args.device_label_prefix,
        for_region=args.for_region,
    )
    expires = datetime.fromtimestamp(response.expires.ToSeconds(), UTC)
    _print(response.token)
    root = f"root hash {response.root_hash}; " if response.root_hash else ""
    print(
        f"expires {expires:%Y-%m-%dT%H:%M:%SZ}; {root}CA hash {response.ca_hash}",
        file=sys.stderr,
        flush=True,
    )
    if args.for_region:
        print(
            f"on the regional hub: hub init --parent HOST:PORT --region {args.for_region} "
            f"--token TOKEN --parent-ca-hash {response.ca_hash}",
            file=sys.stderr,
            flush=True,
        )
    return EXIT_DONE


_HANDLERS: dict[str, Callable[[AdminClient, argparse.Namespace], int]] = {
    "apply": _apply,
    "diff": _diff,
    "get": _get,
    "describe": _describe,
    "delete": _delete,
    "label": _relabel,
    "annotate": _relabel,
    "devices": _devices,
    "regions": _regions,
    "tokens": _tokens,
}


def _check_before_connecting(args: argparse.Namespace) -> None:
    """Usage errors that need no hub, so that they are reported even when it is down."""
    if args.command in ("apply", "diff"):
        _check_recursive(args)
    if args.command == "get" and not _check_get_all(args):
        kind, refs = parse_refs(args.resource, allow=ALL_KINDS)
        _check_get_flags(args, kind, refs)


def run(args: argparse.Namespace) -> int | None:
    """Run a parsed hub command; None when ``args`` is not one. Errors are raised
    (:class:`~edgectl.errors.EdgectlError`, ConfigError, ValidationError) for the CLI to print."""
    if args.command not in _HANDLERS:
        return None
    _check_before_connecting(args)
    config = load_admin_config(args.config or default_config(), args.context)
    with AdminClient(config) as client:
        return _HANDLERS[args.command](client, args)
