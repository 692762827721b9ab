"""``edgectl scale``, ``patch`` and ``edit``: an applied object changed in place, as kubectl
changes one. Each reads the object, changes it here and applies it with its
``metadata.resourceVersion`` checked (``ApplyRequest.check_resource_version``): a change made
by someone else in between is refused (``error: ... changed since resourceVersion N``), never
overwritten; a result equal to what the hub holds writes nothing.

* ``scale deployment/NAME --replicas N [--current-replicas M]``: a deployment's
  ``spec.replicas.total`` (the replicas across the fleet, what kubectl's replicas are). A
  ``replicas.perDevice`` deployment runs that many on every matching device (like a
  DaemonSet) and an autoscaled one (``spec.scaling``) is sized by the hub's autoscaler: both are
  refused with the patch that would do what was meant.
* ``patch TYPE/NAME -p PATCH|--patch-file FILE [--type strategic|merge|json]``: the patch
  (JSON or YAML) of :mod:`edgectl.patching`; default ``strategic``, as kubectl.
* ``edit TYPE/NAME``: the object as YAML in ``$KUBE_EDITOR``, ``$EDITOR`` or ``vi``; saved
  unchanged (or emptied): nothing is applied (``Edit cancelled, no changes made.``). A copy
  that cannot be applied is kept, and its path printed.

Secrets are refused: the hub never shows their values, so what it shows cannot be applied back.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import orjson
import yaml

from edgectl import patching, printing
from edgectl.client import AdminClient, ClientError, load_admin_config
from edgectl.errors import EXIT_DONE, InputError, UsageError
from edgectl.resources import APPLIED_KINDS, Ref, parse_refs
from edgefleet.api import parse_manifest
from edgefleet.errors import ValidationError

MAX_PATCH_BYTES = 1 << 20
SHOWN_ONLY = ("uid", "creationTimestamp")  # hub metadata left out of what is changed


def add_commands(sub: Any) -> None:
    scale = sub.add_parser("scale", help="set a deployment's replicas.total")
    scale.add_argument("resource", nargs="+", metavar="RESOURCE", help="deployment/NAME")
    scale.add_argument("--replicas", type=_count, required=True, metavar="N", help="0-100000")
    scale.add_argument(
        "--current-replicas", type=_count, default=None, metavar="M",
        help="only if replicas.total is M now (a precondition)",
    )  # fmt: skip
    patch = sub.add_parser("patch", help="change an applied object by a patch")
    patch.add_argument("resource", nargs="+", metavar="RESOURCE", help="TYPE NAME or TYPE/NAME")
    patch.add_argument("-p", "--patch", default=None, metavar="PATCH", help="JSON or YAML")
    patch.add_argument("--patch-file", type=Path, default=None, metavar="FILE")
    patch.add_argument(
        "--type", choices=patching.TYPES, default="strategic",
        help="strategic (lists of named items merge by name), merge (RFC 7386) or json "
        "(RFC 6902); default strategic",
    )  # fmt: skip
    patch.add_argument("--dry-run", action="store_true", help="validate only, write nothing")
    edit = sub.add_parser("edit", help="change an applied object in $EDITOR")
    edit.add_argument("resource", nargs="+", metavar="RESOURCE", help="TYPE NAME or TYPE/NAME")


def _count(text: str) -> int:
    if not text.isdigit() or int(text) > 100_000:
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to 100000, got {text!r}")
    return int(text)


def run(args: argparse.Namespace) -> int | None:
    if args.command not in ("scale", "patch", "edit"):
        return None
    ref = _ref(args.resource, args.command)
    patch = _read_patch(args) if args.command == "patch" else None
    from edgectl.commands import default_config

    config = load_admin_config(args.config or default_config(), args.context)
    with AdminClient(config) as client:
        if args.command == "scale":
            return _scale(client, ref, args.replicas, args.current_replicas)
        if args.command == "patch":
            return _patch(client, ref, patch, args.type, dry_run=args.dry_run)
        return _edit(client, ref)


def _ref(words: list[str], verb: str) -> Ref:
    _kind, refs = parse_refs(words[:2] if "/" not in words[0] else words[:1])
    rest = words[1:] if "/" in words[0] else words[2:]
    if not refs:
        raise UsageError(f"{verb}: give TYPE NAME or TYPE/NAME")
    if rest:
        raise UsageError(f"{verb}: one object at a time (got {' '.join(rest)!r} too)")
    ref = refs[0]
    if verb == "scale" and ref.kind != "ModelDeployment":
        raise UsageError(f"scale: {ref} cannot be scaled (scale applies to deployments)")
    if ref.kind == "Secret":
        raise UsageError(
            f"{verb}: a Secret's values are never shown, so it cannot be changed in place: "
            "apply its file again"
        )
    if ref.kind not in APPLIED_KINDS:
        raise UsageError(
            f"{verb}: {ref.kind} objects are not applied by operators; {verb} works on "
            f"{', '.join(k for k in APPLIED_KINDS if k != 'Secret')}"
        )
    return ref


def _editable(doc: dict[str, Any]) -> dict[str, Any]:
    """The object as it is changed: no status, the resourceVersion kept for the check."""
    shown = {k: v for k, v in doc.items() if k != "status"}
    shown["metadata"] = {k: v for k, v in doc.get("metadata", {}).items() if k not in SHOWN_ONLY}
    return shown


def _canonical(doc: dict[str, Any]) -> dict[str, Any]:
    """What the hub would store of ``doc`` (ValidationError when it is not a valid object)."""
    return parse_manifest(doc).to_dict()


def _write(client: AdminClient, ref: Ref, before: dict[str, Any], after: Any, *,
           verb: str, dry_run: bool = False) -> bool:  # fmt: skip
    """Apply ``after`` (a changed copy of ``before``) with its resourceVersion checked;
    whether anything changed."""
    if not isinstance(after, dict):
        raise InputError(f"{verb}: the object must be a mapping, not {type(after).__name__}")
    meta = after.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    for field, old, new in (
        ("kind", before.get("kind"), after.get("kind")),
        ("metadata.name", before["metadata"]["name"], name),
    ):
        if old != new:
            raise InputError(f"{verb}: {field} cannot change ({old!r} to {new!r}): {ref} stays")
    try:
        changed = _canonical(after) != _canonical(before)
    except ValidationError as exc:
        raise InputError(f"{verb}: {ref}: {exc}") from None
    if not changed:
        return False
    after["metadata"]["resourceVersion"] = before["metadata"].get("resourceVersion", "")
    client.apply([orjson.dumps(after)], dry_run=dry_run, check_resource_version=True)
    return True


# -- scale -----------------------------------------------------------------------------------
def _scale(client: AdminClient, ref: Ref, replicas: int, current: int | None) -> int:
    doc = _editable(client.get(ref.kind, ref.name))
    spec = doc.get("spec", {})
    now = spec.get("replicas", {})
    if "perDevice" in now:
        raise ClientError(
            "FAILED_PRECONDITION",
            f"{ref} runs replicas.perDevice ({now['perDevice']} on every matching device): scale "
            "sets replicas.total, the replicas across the fleet; to change the replicas per "
            f"device: edgectl patch {ref} --type merge -p "
            f'\'{{"spec":{{"replicas":{{"perDevice":{replicas}}}}}}}\'',
        )
    if spec.get("scaling") is not None:
        scaling = spec["scaling"]
        raise ClientError(
            "FAILED_PRECONDITION",
            f"{ref} is autoscaled (spec.scaling: minReplicas {scaling.get('minReplicas')}, "
            f"maxReplicas {scaling.get('maxReplicas')}): the hub's autoscaler sets its "
            "replicas; change spec.scaling (edgectl patch) instead",
        )
    total = now.get("total")
    if current is not None and total != current:
        raise ClientError(
            "FAILED_PRECONDITION",
            f"{ref}: replicas.total is {total}, not {current} (--current-replicas): not scaled",
        )
    after = _editable(doc)
    after["spec"] = {**spec, "replicas": {"total": replicas}}
    changed = _write(client, ref, doc, after, verb="scale")
    _say(f"{ref} scaled" + (f" (replicas.total {total} to {replicas})" if changed else
                            " (no change)"))  # fmt: skip
    return EXIT_DONE


# -- patch -----------------------------------------------------------------------------------
def _read_patch(args: argparse.Namespace) -> Any:
    if (args.patch is None) == (args.patch_file is None):
        raise UsageError("patch: give the patch with -p PATCH or --patch-file FILE (one of them)")
    if args.patch_file is not None:
        try:
            data = args.patch_file.read_bytes()[: MAX_PATCH_BYTES + 1]
        except OSError as exc:
            raise InputError(f"{args.patch_file}: cannot read: {exc.strerror}") from None
        text = data.decode("utf-8", errors="replace")
    else:
        text = args.patch
    if len(text) > MAX_PATCH_BYTES:
        raise InputError(f"patch: larger than {MAX_PATCH_BYTES} bytes")
    try:
        return yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as exc:
        raise InputError(f"patch: neither JSON nor YAML: {exc}") from None


def _patch(client: AdminClient, ref: Ref, patch: Any, kind: str, *, dry_run: bool) -> int:
    doc = _editable(client.get(ref.kind, ref.name))
    try:
        after = patching.apply_patch(doc, patch, kind)
    except patching.PatchError as exc:
        raise InputError(f"patch ({kind}): {exc}") from None
    changed = _write(client, ref, doc, after, verb="patch", dry_run=dry_run)
    _say(f"{ref} patched" + ("" if changed else " (no change)") + (" (dry run)" if dry_run else ""))
    return EXIT_DONE


# -- edit ------------------------------------------------------------------------------------
HEADER = """\
# Edit the object below; lines beginning with '#' are ignored. Save and quit to apply it.
# Saved unchanged or empty, nothing is applied. If someone changes it meanwhile, the edit is
# refused (resourceVersion) and this file kept.
"""


def editor_command() -> list[str]:
    """``$KUBE_EDITOR``, ``$EDITOR`` or ``vi``, split as a shell would."""
    text = os.environ.get("KUBE_EDITOR") or os.environ.get("EDITOR") or "vi"
    return shlex.split(text)


def _edit(client: AdminClient, ref: Ref) -> int:
    doc = _editable(client.get(ref.kind, ref.name))
    text = HEADER + printing.dump(doc, "yaml") + "\n"
    fd, name = tempfile.mkstemp(prefix=f"edgectl-edit-{ref.name}-", suffix=".yaml")
    path = Path(name)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    try:
        done = subprocess.run([*editor_command(), str(path)], check=False)
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise InputError(f"edit: cannot run the editor {editor_command()[0]!r}: {exc}") from None
    if done.returncode != 0:
        path.unlink(missing_ok=True)
        raise InputError(f"edit: the editor exited with {done.returncode}: nothing applied")
    edited = path.read_text(errors="replace")
    body = "\n".join(line for line in edited.splitlines() if not line.lstrip().startswith("#"))
    if edited == text or not body.strip():
        path.unlink(missing_ok=True)
        _say("Edit cancelled, no changes made." if body.strip() else
             "Edit cancelled, saved file was empty.")  # fmt: skip
        return EXIT_DONE
    try:
        after = yaml.safe_load(body)
        changed = _write(client, ref, doc, after, verb="edit")
    except yaml.YAMLError as exc:
        raise InputError(f"edit: not YAML: {exc}; your changes are in {path}") from None
    except ClientError as exc:
        kept = f"{exc.message}; your changes are in {path}"
        raise ClientError(exc.code, kept, exc.exit_code) from None
    except InputError as exc:
        raise InputError(f"{exc}; your changes are in {path}") from None
    path.unlink(missing_ok=True)
    _say(f"{ref} edited" if changed else "Edit cancelled, no changes made.")
    return EXIT_DONE


def _say(text: str) -> None:
    print(text, flush=True)
