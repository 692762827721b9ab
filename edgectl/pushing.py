"""``edgectl models push FILE --name N --version V [--extra F]... [--key K]... [--metadata M]``.

The file must parse as an ONNX model (:mod:`edgefleet.artifacts.onnxformat`) before anything
is signed or sent; the hub checks it again. Extra files (``--extra``: a validation set,
labels) are signed with the model and sent after it, each announced by name; with
``--metadata``, every extra it lists must be found (``--extra`` or next to the model) before
anything is sent.

Progress goes to stderr (:mod:`edgectl.progress`): a bar on a terminal, a line every few
seconds otherwise; the result line to stdout.

Signs the model with the publisher key(s) (:func:`edgefleet.trust.signing.sign_artifact`; by
default the ``[publisher] key`` of admin.toml, which ``hub init`` writes for a quickstart), or
takes a pre-signed metadata envelope (``--metadata``: signed elsewhere, offline), and uploads
it with AdminService ``PushArtifact`` over mutual TLS: a header with the envelope exactly as
signed, then the file in chunks. The hub verifies the signatures against the fleet's trust
root and stores the bytes; it never re-signs anything. admin.toml is read by
:func:`edgectl.client.load_admin_config`, like every edgectl command.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from edgectl.client import AdminConfig, load_admin_config, outcome_unknown, translate
from edgectl.commands import default_config
from edgectl.errors import EXIT_REFUSED, EXIT_USAGE, EdgectlError
from edgectl.progress import Progress
from edgefleet.artifacts.onnxformat import check_onnx_model
from edgefleet.errors import ArtifactError, ConfigError
from edgefleet.trust import signing
from edgefleet.trust.documents import parse_artifact
from edgefleet.trust.envelopes import ARTIFACT_TYPE, decode_payload, parse_envelope_bytes
from edgefleet.v1 import admin_pb2, admin_pb2_grpc

CHUNK = 256 * 1024


class PushError(EdgectlError):
    """The push could not be made or was refused; the message says why."""

    def __init__(self, message: str, exit_code: int = EdgectlError.exit_code) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _channel(config: AdminConfig, hub: str = "") -> grpc.aio.Channel:
    try:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=config.ca_certificate.read_bytes(),
            private_key=config.key.read_bytes(),
            certificate_chain=config.certificate.read_bytes(),
        )
    except OSError as exc:
        raise PushError(f"cannot read credentials: {exc}", EXIT_USAGE) from None
    return grpc.aio.secure_channel(hub or config.hub, credentials)


def add_command(models: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    push = models.add_parser("push", help="sign (or take signed metadata) and upload to the hub")
    push.add_argument("file", type=Path, help="the model file (.onnx)")
    push.add_argument("--name", required=True)
    push.add_argument("--version", required=True)
    push.add_argument(
        "--key",
        type=Path,
        action="append",
        default=[],
        help="a publisher private key (repeat for a threshold; default: admin.toml "
        "[publisher] key)",
    )
    push.add_argument(
        "--extra",
        type=Path,
        action="append",
        default=[],
        help="an extra file signed with the model (a validation set, labels); repeat for more. "
        "With --metadata, the extras it lists are taken from next to the model file",
    )
    push.add_argument(
        "--metadata",
        type=Path,
        help="an envelope signed elsewhere (edgectl models sign); uploaded exactly as it is",
    )
    push.add_argument("--expires", default="90d", help="validity when signing here (default 90d)")
    push.add_argument(
        "--targets-key",
        type=Path,
        action="append",
        default=[],
        help="a key that signs this publisher's delegated TUF targets, for a hub that keeps a "
        "TUF repository (default: --key, else admin.toml [publisher] key)",
    )
    push.add_argument(
        "--allow-rollback",
        metavar="DURATION",
        help="for a hub that keeps a TUF repository: the publisher's targets also allow devices "
        "that accepted a higher version to go back to exactly these bytes, for DURATION (e.g. "
        "7d); push the older version again with it (it is signed anew, so its metadata is "
        "newer than what devices accepted since)",
    )


def run(args: argparse.Namespace) -> int | None:
    """Run ``models push``; None when ``args`` is not that command."""
    if args.command != "models" or getattr(args, "models_cmd", None) != "push":
        return None
    try:
        config = load_admin_config(args.config or default_config(), args.context)
    except ConfigError as exc:
        raise PushError(f"models push: {exc}", EXIT_USAGE) from None
    try:
        if not args.file.is_file():
            raise PushError(f"{args.file}: no such file")
        check_onnx_model(args.file)
        envelope = _envelope(args, config)
        extras = _extras_of(envelope, args.file, args.extra)
        total = args.file.stat().st_size + sum(p.stat().st_size for _, p in extras)
        progress = Progress(f"model/{args.name} {args.version}:", total)
        targets_keys = (
            list(args.targets_key)
            or list(args.key)
            or ([config.publisher_key] if config.publisher_key else [])
        )
        response = asyncio.run(
            push(
                config,
                args.file,
                envelope,
                extras,
                progress=progress,
                targets_keys=targets_keys,
                targets_expire_in_s=signing.parse_duration_days(args.expires),
                targets_keys_given=bool(args.targets_key),
                rollback_in_s=(
                    signing.parse_duration_days(args.allow_rollback)
                    if args.allow_rollback
                    else None
                ),
            )
        )
    except PushError as exc:
        raise PushError(f"models push: {exc}", exc.exit_code) from None
    except (ArtifactError, OSError, ValueError) as exc:
        raise PushError(f"models push: {exc}") from None
    what = f"model/{args.name} {args.version}"
    with_extras = f", extras {', '.join(sorted(response.extras))}" if response.extras else ""
    if response.stored and response.reused_bytes:
        print(
            f"{what} pushed, reusing the stored bytes of the same model file (sha256 "
            f"{response.sha256}, {response.length} bytes{with_extras})"
        )
    elif response.stored:
        print(f"{what} pushed (sha256 {response.sha256}, {response.length} bytes{with_extras})")
    else:
        print(f"{what} unchanged (sha256 {response.sha256}, {response.length} bytes{with_extras})")
    return 0


def _extras_of(envelope: bytes, model: Path, given: list[Path]) -> list[tuple[str, Path]]:
    """Every extra file the signed metadata lists, found among ``given`` or next to the model;
    a listed file that cannot be found is an error before anything is sent."""
    env = parse_envelope_bytes(envelope, what="metadata")
    meta = parse_artifact(decode_payload(env, expected_type=ARTIFACT_TYPE, what="metadata"))
    by_name = {p.name: p for p in given}
    out, missing = [], []
    for fname, info in sorted(meta.files.items()):
        if info.role == "model":
            continue
        path = by_name.pop(fname, model.parent / fname)
        if not path.is_file():
            missing.append(f"{fname} (looked for {path})")
        out.append((fname, path))
    if missing:
        raise PushError(f"the signed metadata lists files that are not here: {', '.join(missing)}")
    if by_name:
        raise PushError(
            f"--extra {', '.join(sorted(by_name))}: not in the signed metadata "
            f"(it lists {', '.join(n for n, _ in out) or 'no extras'})"
        )
    return out


def _envelope(args: argparse.Namespace, config: AdminConfig) -> bytes:
    if args.metadata is not None:
        if args.key:
            raise PushError("give --metadata (signed elsewhere) or --key, not both")
        data: bytes = args.metadata.read_bytes()
        env = parse_envelope_bytes(data, what=str(args.metadata))
        meta = parse_artifact(
            decode_payload(env, expected_type=ARTIFACT_TYPE, what=str(args.metadata)),
            what=str(args.metadata),
        )
        if (meta.name, meta.version) != (args.name, args.version):
            raise PushError(
                f"{args.metadata} is signed for {meta.name} {meta.version}, "
                f"not {args.name} {args.version}"
            )
        return data
    keys = list(args.key) or ([config.publisher_key] if config.publisher_key else [])
    if not keys:
        raise PushError("no publisher key: give --key KEY (or [publisher] key in admin.toml)")
    _, env = signing.sign_artifact(
        args.file,
        name=args.name,
        version=args.version,
        keys=keys,
        extras=list(args.extra),
        expires_in_s=signing.parse_duration_days(args.expires),
    )
    return env.to_bytes()


async def _requests(
    model: Path,
    envelope: bytes,
    extras: list[tuple[str, Path]],
    progress: Progress | None,
    delegated: tuple[str, bytes] | None = None,
) -> AsyncIterator[admin_pb2.PushArtifactRequest]:
    header = admin_pb2.ArtifactHeader(signed_metadata=envelope)
    if delegated is not None:
        header.delegated_role, header.delegated_targets = delegated
    yield admin_pb2.PushArtifactRequest(header=header)
    sent = 0
    for name, path in [("", model), *extras]:
        if name:
            yield admin_pb2.PushArtifactRequest(file=admin_pb2.FileStart(name=name))
        with open(path, "rb") as f:  # noqa: ASYNC230 - a CLI with nothing else to do meanwhile
            while chunk := f.read(CHUNK):
                yield admin_pb2.PushArtifactRequest(chunk=chunk)
                sent += len(chunk)  # taken by gRPC, whose flow control keeps pace with the hub
                if progress is not None:
                    progress.update(sent)


async def push(
    config: AdminConfig,
    model: Path,
    envelope: bytes,
    extras: list[tuple[str, Path]] | None = None,
    *,
    timeout: float = 600.0,
    progress: Progress | None = None,
    targets_keys: list[Path] | None = None,
    targets_expire_in_s: float = 90 * signing.DAY,
    targets_keys_given: bool = False,
    rollback_in_s: float | None = None,
) -> admin_pb2.PushArtifactResponse:
    """Upload ``model`` and its ``extras`` (name, path) with their signed metadata; the hub's
    PushArtifactResponse. ``progress`` is told the bytes sent, and finished once the hub
    answered. A hub that keeps a TUF repository also gets the publisher's delegated targets
    with this artifact added, signed here with ``targets_keys`` (with a rollback allowance
    for ``rollback_in_s`` seconds, when given: only to such a hub)."""
    addresses = config.addresses
    for i, hub in enumerate(addresses):
        async with _channel(config, hub) as channel:
            stub = admin_pb2_grpc.AdminServiceStub(channel)  # type: ignore[no-untyped-call]
            try:
                delegated = await _delegated_targets(
                    stub,
                    envelope,
                    targets_keys or [],
                    targets_expire_in_s,
                    targets_keys_given,
                    rollback_in_s,
                )
                response: admin_pb2.PushArtifactResponse = await stub.PushArtifact(
                    _requests(model, envelope, extras or [], progress, delegated), timeout=timeout
                )
                if progress is not None:
                    progress.finish()
                return response
            except grpc.aio.AioRpcError as exc:
                error = translate(exc.code(), exc.details() or "", hub, "PushArtifact")
                if (
                    i + 1 < len(addresses)
                    and not outcome_unknown(exc.code(), exc.details() or "", hub, "PushArtifact")
                    and exc.code() is grpc.StatusCode.UNAVAILABLE
                ):
                    continue  # nothing was taken there (unreachable, or not the leader)
                if error.exit_code == EXIT_REFUSED:
                    raise PushError(f"{error.code}: {error.message}") from None
                raise PushError(f"{error.code}: {error.message}", error.exit_code) from None
    raise AssertionError("unreachable")


async def _tuf_file(stub: admin_pb2_grpc.AdminServiceStub, name: str) -> bytes | None:
    from edgefleet.trust import tufmeta
    from edgefleet.v1 import common_pb2

    try:
        response = await stub.FetchTufMetadata(
            common_pb2.TufMetadataRequest(name=name, max_length=tufmeta.TARGETS_MAX_BYTES),
            timeout=60.0,
        )
    except grpc.aio.AioRpcError as exc:
        if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED):
            return None  # no TUF repository (UNIMPLEMENTED: a hub older than TUF)
        raise
    return bytes(response.data)


async def _delegated_targets(
    stub: admin_pb2_grpc.AdminServiceStub,
    envelope: bytes,
    keys: list[Path],
    expires_in_s: float,
    keys_given: bool,
    rollback_in_s: float | None = None,
) -> tuple[str, bytes] | None:
    """For a hub with a TUF repository: the role of the top-level targets that delegates
    this model's name to the first key, and that role's targets as the hub holds them with
    this artifact's files added, the next version, signed by ``keys``. None without one."""
    import time

    from edgefleet.trust import tufmeta

    targets = await _tuf_file(stub, "targets.json")
    if targets is None:
        if keys_given:
            raise PushError("--targets-key: the hub keeps no TUF repository (not supported)")
        if rollback_in_s is not None:
            raise PushError(
                "--allow-rollback: the hub keeps no TUF repository (not supported; give it a "
                "signed allowance with edgectl rollback allow and rollback push)"
            )
        return None
    if not keys:
        raise PushError(
            "the hub keeps a TUF repository: give --targets-key (or --key) to sign this "
            "publisher's delegated targets"
        )
    env = parse_envelope_bytes(envelope, what="metadata")
    meta = parse_artifact(decode_payload(env, expected_type=ARTIFACT_TYPE, what="metadata"))
    role = tufmeta.find_role(targets, signing.load_public_key_raw(keys[0]), meta.name)
    current = await _tuf_file(stub, tufmeta.role_file(role))
    data = tufmeta.add_artifact(
        current,
        meta,
        [tufmeta.tuf_signer(k) for k in keys],
        expires=time.time() + expires_in_s,
        rollback_expires=None if rollback_in_s is None else time.time() + rollback_in_s,
    )
    return role, data
