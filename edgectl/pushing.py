"""``edgectl models push FILE --name N --version V [--key K]... [--metadata ENVELOPE]``.

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

from edgectl.client import AdminConfig, load_admin_config
from edgectl.commands import default_config
from edgectl.errors import EXIT_UNREACHABLE, EXIT_USAGE, EdgectlError
from edgectl.progress import Progress
from edgefleet.errors import ConfigError, TrustError
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


def _channel(config: AdminConfig) -> grpc.aio.Channel:
    try:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=config.ca_certificate.read_bytes(),
            private_key=config.key.read_bytes(),
            certificate_chain=config.certificate.read_bytes(),
        )
    except OSError as exc:
        raise PushError(f"cannot read credentials: {exc}", EXIT_USAGE) from None
    return grpc.aio.secure_channel(config.hub, credentials)


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
        "--metadata",
        type=Path,
        help="an envelope signed elsewhere (edgectl models sign); uploaded exactly as it is",
    )
    push.add_argument("--expires", default="90d", help="validity when signing here (default 90d)")


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
        envelope = _envelope(args, config)
        progress = Progress(f"model/{args.name} {args.version}:", args.file.stat().st_size)
        response = asyncio.run(push(config, args.file, envelope, progress=progress))
    except PushError as exc:
        raise PushError(f"models push: {exc}", exc.exit_code) from None
    except (TrustError, OSError, ValueError) as exc:
        raise PushError(f"models push: {exc}") from None
    what = f"model/{args.name} {args.version}"
    if response.stored:
        print(f"{what} pushed (sha256 {response.sha256}, {response.length} bytes)")
    else:
        print(f"{what} unchanged (sha256 {response.sha256}, {response.length} bytes)")
    return 0


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
        expires_in_s=signing.parse_duration_days(args.expires),
    )
    return env.to_bytes()


async def _requests(
    model: Path, envelope: bytes, progress: Progress | None
) -> AsyncIterator[admin_pb2.PushArtifactRequest]:
    yield admin_pb2.PushArtifactRequest(header=admin_pb2.ArtifactHeader(signed_metadata=envelope))
    sent = 0
    with open(model, "rb") as f:  # noqa: ASYNC230 - a CLI with nothing else to do meanwhile
        while chunk := f.read(CHUNK):
            yield admin_pb2.PushArtifactRequest(chunk=chunk)
            sent += len(chunk)  # taken by gRPC, whose flow control keeps pace with the hub
            if progress is not None:
                progress.update(sent)


async def push(
    config: AdminConfig,
    model: Path,
    envelope: bytes,
    *,
    timeout: float = 600.0,
    progress: Progress | None = None,
) -> admin_pb2.PushArtifactResponse:
    """Upload ``model`` with its signed metadata; the hub's PushArtifactResponse.
    ``progress`` is told the bytes sent, and finished once the hub answered."""
    async with _channel(config) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            response: admin_pb2.PushArtifactResponse = await stub.PushArtifact(
                _requests(model, envelope, progress), timeout=timeout
            )
            if progress is not None:
                progress.finish()
            return response
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            name = code.name if code else "UNKNOWN"
            if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                message = f"{name}: no answer from the hub at {config.hub}: outcome unknown"
                raise PushError(message, EXIT_UNREACHABLE) from None
            if code is grpc.StatusCode.UNAVAILABLE:
                message = f"{name}: cannot reach the hub at {config.hub}: {exc.details()}"
                raise PushError(message, EXIT_UNREACHABLE) from None
            raise PushError(f"{name}: {exc.details()}") from None
