"""``edgectl keys``, ``edgectl models sign``, ``edgectl trust root ...``, ``edgectl rollback
allow``: thin command-line wrappers over :mod:`edgefleet.trust.signing` (see docs/trust.md);
``edgectl rollback push FILE`` gives the hub a signed allowance (hub/api/allowances.py)."""

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

    tuf = trust.add_parser(
        "tuf", help="the fleet's TUF repository: root and top-level targets (offline keys)"
    ).add_subparsers(dest="tuf_cmd")
    troot = tuf.add_parser("root", help="a TUF root (version 1, or the next with --current)")
    troot.add_argument("--current", type=Path, help="the TUF root in force (a rotation)")
    troot.add_argument(
        "--old-root-key",
        type=Path,
        action="append",
        default=[],
        help="a private root key of the current TUF root (signs a rotation)",
    )
    troot.add_argument(
        "--root-key",
        type=Path,
        action="append",
        required=True,
        help="a private root key (the fleet trust root's root keys: devices check the first "
        "TUF root against them)",
    )
    troot.add_argument(
        "--targets-key",
        type=Path,
        action="append",
        required=True,
        help="a public key of the top-level targets role (its private key stays offline)",
    )
    troot.add_argument(
        "--online-key",
        type=Path,
        required=True,
        help="the hub's online public key for snapshot and timestamp (hub tuf online-key)",
    )
    troot.add_argument("--threshold", type=int, default=1, help="targets signatures needed")
    troot.add_argument("--root-threshold", type=int, default=None, help="default: all root keys")
    troot.add_argument("--expires", default="365d")
    troot.add_argument("--out", type=Path, required=True)
    ttargets = tuf.add_parser(
        "targets", help="the top-level targets: the delegations to publishers"
    )
    ttargets.add_argument(
        "--key", type=Path, action="append", required=True, help="a private targets key"
    )
    ttargets.add_argument(
        "--delegate",
        action="append",
        default=[],
        metavar="ROLE=PUB.pub[+PUB.pub]:PATTERN[,PATTERN][@THRESHOLD]",
        help="a publisher role: its keys and the model names it may sign (repeatable)",
    )
    ttargets.add_argument(
        "--delegate-agent",
        action="append",
        default=[],
        metavar="ROLE=PUB.pub[+PUB.pub][@THRESHOLD]",
        help="the role that signs edged releases (path agent/edged/*/* only; "
        "docs/agent-updates.md): its keys; give the targets again to add or rotate them",
    )
    ttargets.add_argument(
        "--version", type=int, required=True, help="higher than the targets in force"
    )
    ttargets.add_argument("--expires", default="365d")
    ttargets.add_argument("--out", type=Path, required=True)

    rollback = sub.add_parser("rollback", help="signed rollback allowances").add_subparsers(
        dest="rollback_cmd"
    )
    allow = rollback.add_parser(
        "allow",
        help="allow devices to install an older model version (hubs without TUF; with TUF: "
        "edgectl models push ... --allow-rollback)",
    )
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
        "push",
        help="give the hub a signed allowance: it sends it with that model version (a hub "
        "with TUF refuses it: the allowance goes in the publisher's targets)",
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
    if cmd == "trust" and args.trust_cmd == "tuf" and args.tuf_cmd in ("root", "targets"):
        return _tuf(args)
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


def _tuf(args: argparse.Namespace) -> int:
    import time

    from edgefleet.persisting import write_atomic
    from edgefleet.trust import tufmeta

    expires = time.time() + signing.parse_duration_days(args.expires)
    if args.tuf_cmd == "root":
        current = args.current.read_bytes() if args.current is not None else None
        if args.old_root_key and current is None:
            raise ValueError("--old-root-key signs a rotation: give --current too")
        root_raw = [signing.load_public_key_raw(k) for k in args.root_key]
        root = tufmeta.next_root(
            current,
            root_keys=root_raw,
            root_threshold=args.root_threshold or len(root_raw),
            targets_keys=[signing.load_public_key_raw(k) for k in args.targets_key],
            targets_threshold=args.threshold,
            online_keys=[signing.load_public_key_raw(args.online_key)],
            expires=expires,
        )
        signers = [tufmeta.tuf_signer(k) for k in [*args.old_root_key, *args.root_key]]
        write_atomic(args.out, tufmeta.sign(root, signers), mode=0o644)
        print(f"TUF root version {root.version}: {args.out}")
        return 0
    delegations = [tufmeta.parse_delegation(d) for d in args.delegate]
    delegations += [tufmeta.parse_agent_delegation(d) for d in args.delegate_agent]
    targets = tufmeta.build_targets(delegations, version=args.version, expires=expires)
    write_atomic(
        args.out, tufmeta.sign(targets, [tufmeta.tuf_signer(k) for k in args.key]), mode=0o644
    )
    roles = ", ".join(
        f"{d.role} ({'edged releases' if d.agent else ', '.join(d.name_patterns)})"
        for d in delegations
    )
    print(f"TUF targets version {args.version}: {args.out}; delegations: {roles or 'none'}")
    return 0
