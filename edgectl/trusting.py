"""``edgectl keys``, ``edgectl models sign``, ``edgectl trust root ...``, ``edgectl rollback
allow``: thin command-line wrappers over :mod:`edgefleet.trust.signing` (see docs/trust.md);
``edgectl rollback push FILE`` gives the hub a signed allowance (hub/allowing.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edgefleet.errors import TrustError
from edgefleet.trust import signing
from edgefleet.trust.verifying import root_digest


def add_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """Add the trust commands; returns the ``models`` sub-commands (``push`` joins them)."""
    keys = sub.add_parser("keys", help="publisher signing keys").add_subparsers(dest="keys_cmd")
    gen = keys.add_parser("generate", help="a new Ed25519 key pair: PREFIX.key (0600), PREFIX.pub")
    gen.add_argument("--out", type=Path, required=True, metavar="PREFIX")

    models = sub.add_parser("models", help="model artifacts").add_subparsers(dest="models_cmd")
    sign = models.add_parser("sign", help="write signed metadata for a model file (+ extras)")
    sign.add_argument("file", type=Path)
    sign.add_argument("--name", required=True)
    sign.add_argument("--version", required=True)
    sign.add_argument(
        "--key",
        type=Path,
        action="append",
        required=True,
        help="a publisher private key (repeat for a threshold)",
    )
    sign.add_argument(
        "--extra",
        type=Path,
        action="append",
        default=[],
        help="a file that belongs to the artifact (validation set, labels)",
    )
    sign.add_argument("--precision", default=None)
    sign.add_argument("--expires", default="90d", help="validity, e.g. 90d (default)")
    sign.add_argument(
        "--metadata-version",
        type=int,
        default=None,
        help="default: seconds since the epoch (always increasing)",
    )
    sign.add_argument("--out", type=Path, default=None, help="default: FILE.metadata.json")

    trust = sub.add_parser("trust", help="the fleet trust root").add_subparsers(dest="trust_cmd")
    root = trust.add_parser("root", help="create, rotate and sign trust roots").add_subparsers(
        dest="root_cmd"
    )
    for name, helptext in (
        ("create", "a version-1 root"),
        ("rotate", "the next root version (new keys)"),
    ):
        p = root.add_parser(name, help=helptext)
        if name == "rotate":
            p.add_argument("current", type=Path, help="the root in force")
            p.add_argument(
                "--old-root-key",
                type=Path,
                action="append",
                default=[],
                help="a private root key of the current root (signs the new one)",
            )
        p.add_argument(
            "--root-key",
            type=Path,
            action="append",
            required=True,
            help="a private root key of the new root (signs it)",
        )
        p.add_argument(
            "--artifact-key",
            type=Path,
            action="append",
            required=True,
            help="a publisher public key allowed to sign artifacts",
        )
        p.add_argument("--threshold", type=int, default=1, help="artifact signatures needed")
        p.add_argument(
            "--root-threshold",
            type=int,
            default=None,
            help="root signatures needed (default: --threshold)",
        )
        p.add_argument("--expires", default="365d")
        p.add_argument("--out", type=Path, required=True)
    rsign = root.add_parser("sign", help="add signatures to a root (e.g. the old root keys')")
    rsign.add_argument("file", type=Path)
    rsign.add_argument("--key", type=Path, action="append", required=True)

    rollback = sub.add_parser("rollback", help="signed rollback allowances").add_subparsers(
        dest="rollback_cmd"
    )
    allow = rollback.add_parser("allow", help="allow devices to install an older model version")
    allow.add_argument("--name", required=True)
    allow.add_argument("--version", required=True)
    bytes_of = allow.add_mutually_exclusive_group(required=True)
    bytes_of.add_argument(
        "--model", type=Path, help="the model file of that version (its sha256 is signed)"
    )
    bytes_of.add_argument("--sha256", help="the sha256 of that version's model file")
    allow.add_argument("--key", type=Path, action="append", required=True)
    allow.add_argument("--expires", default="7d")
    allow.add_argument("--out", type=Path, required=True)
    push = rollback.add_parser(
        "push", help="give the hub a signed allowance: it sends it with that model version"
    )
    push.add_argument("file", type=Path, help="the allowance (edgectl rollback allow --out)")
    return models


def run(args: argparse.Namespace) -> int | None:
    """Run a trust command; None when ``args`` is not one."""
    try:
        return _run(args)
    except (TrustError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int | None:
    cmd = args.command
    if cmd == "keys" and args.keys_cmd == "generate":
        kid = signing.generate_key_pair(args.out)
        print(f"key id {kid}")
        print(f"private key {args.out}.key (keep it secret), public key {args.out}.pub")
        return 0
    if cmd == "models" and args.models_cmd == "sign":
        out, env = signing.sign_artifact(
            args.file,
            name=args.name,
            version=args.version,
            keys=args.key,
            extras=args.extra,
            precision=args.precision,
            expires_in_s=signing.parse_duration_days(args.expires),
            metadata_version=args.metadata_version,
            out=args.out,
        )
        print(f"signed {args.name} {args.version} ({len(env.signatures)} signature(s)): {out}")
        return 0
    if cmd == "trust" and args.trust_cmd == "root":
        if args.root_cmd == "create":
            env = signing.create_root(
                root_keys=args.root_key,
                artifact_keys=args.artifact_key,
                threshold=args.threshold,
                root_threshold=args.root_threshold,
                expires_in_s=signing.parse_duration_days(args.expires),
                out=args.out,
            )
            print(f"trust root version 1: {args.out}")
            print(f"root hash (pin for edged enroll --root-hash): sha256:{root_digest(env)}")
            return 0
        if args.root_cmd == "rotate":
            env = signing.rotate_root(
                args.current,
                root_keys=args.root_key,
                artifact_keys=args.artifact_key,
                threshold=args.threshold,
                root_threshold=args.root_threshold,
                expires_in_s=signing.parse_duration_days(args.expires),
            )
            env = signing.sign_root(env, args.old_root_key)
            signing.write_envelope(env, args.out)
            print(f"rotated trust root: {args.out} ({len(env.signatures)} signature(s))")
            print(f"root hash: sha256:{root_digest(env)}")
            if not args.old_root_key:
                print(
                    "devices accept it only once the current root keys sign it: "
                    "edgectl trust root sign FILE --key OLD_ROOT_KEY"
                )
            return 0
        if args.root_cmd == "sign":
            env = signing.sign_root(signing.read_envelope(args.file), args.key)
            signing.write_envelope(env, args.file)
            print(f"{args.file}: {len(env.signatures)} signature(s)")
            return 0
    if cmd == "rollback" and args.rollback_cmd == "push":
        return _push_allowance(args)
    if cmd == "rollback" and args.rollback_cmd == "allow":
        sha256 = args.sha256
        if args.model is not None:
            sha256 = signing.describe_file(args.model, "model")["sha256"]
        env = signing.sign_rollback_allowance(
            name=args.name,
            version=args.version,
            sha256=str(sha256).lower().removeprefix("sha256:"),
            keys=args.key,
            expires_in_s=signing.parse_duration_days(args.expires),
        )
        signing.write_envelope(env, args.out)
        print(f"rollback allowance for {args.name} {args.version}: {args.out}")
        return 0
    return None


def _push_allowance(args: argparse.Namespace) -> int:
    """``rollback push FILE``: the hub checks the signatures and that the model version it
    names was pushed with those bytes, keeps it, and sends it to devices with that version."""
    from edgectl.client import AdminClient, load_admin_config
    from edgectl.commands import default_config
    from edgefleet.v1 import admin_pb2

    envelope = args.file.read_bytes()
    config = load_admin_config(args.config or default_config(), getattr(args, "context", None))
    with AdminClient(config) as client:
        got = client.call(
            "PushRollbackAllowance", admin_pb2.PushRollbackAllowanceRequest(envelope=envelope)
        )
    what = f"{got.name} {got.version}"
    print(
        f"rollback allowance for {what} "
        + ("stored: devices are sent it with that version" if got.stored else "unchanged")
    )
    return 0
