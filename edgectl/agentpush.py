"""``edgectl agent push FILE --version V [--key KEY]...`` and ``edgectl agent list``: edged
releases (docs/agent-updates.md, "Releases").

``push`` checks the release file as the hub and the devices will (a gzip'd tar of
``release.json`` and ``lib/`` only, its ``release.json`` of version V:
:func:`edgefleet.trust.agentreleases.inspect_release`), signs its metadata with the agent
publisher key(s) (by default ``[publisher] agentKey`` of admin.toml, which ``hub init`` writes
for a quickstart), adds the file to the agent role's TUF targets the hub holds (the next
version, signed with the same key(s) or ``--targets-key``) and uploads it all with AdminService
``PushAgentRelease`` over mutual TLS. The hub checks it again and never re-signs anything.

``list`` prints the releases the hub holds, newest push first (``-o json``: as JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import orjson

from edgectl.client import AdminConfig, load_admin_config, outcome_unknown, translate
from edgectl.commands import default_config
from edgectl.errors import EXIT_USAGE
from edgectl.printing import age, table
from edgectl.progress import Progress
from edgectl.pushing import CHUNK, PushError, _channel
from edgefleet.errors import ArtifactError, ConfigError
from edgefleet.trust import agentreleases, signing
from edgefleet.trust.agentreleases import AgentReleaseMetadata
from edgefleet.v1 import admin_pb2, admin_pb2_grpc


def add_commands(sub: Any) -> None:
    agent = sub.add_parser("agent", help="edged releases (self-update)").add_subparsers(
        dest="agent_cmd", metavar="COMMAND"
    )
    push = agent.add_parser(
        "push", help="sign an edged release (packaging/agent/build-release) and upload it"
    )
    push.add_argument("file", type=Path, help="the release (.tar.gz)")
    push.add_argument("--version", required=True, help="its version; release.json must say it")
    push.add_argument(
        "--key",
        type=Path,
        action="append",
        default=[],
        help="an agent publisher private key (repeat for a threshold; default: admin.toml "
        "[publisher] agentKey)",
    )
    push.add_argument(
        "--targets-key",
        type=Path,
        action="append",
        default=[],
        help="a key that signs the agent role's TUF targets (default: --key)",
    )
    push.add_argument("--expires", default="365d", help="validity of the signed metadata")
    lst = agent.add_parser("list", help="the edged releases the hub holds, newest first")
    lst.add_argument("-o", "--output", choices=("table", "json"), default="table")


def run(args: argparse.Namespace) -> int | None:
    if args.command != "agent":
        return None
    cmd = getattr(args, "agent_cmd", None)
    if cmd is None:
        raise PushError("agent: give a command: push or list", EXIT_USAGE)
    try:
        config = load_admin_config(args.config or default_config(), args.context)
    except ConfigError as exc:
        raise PushError(f"agent {cmd}: {exc}", EXIT_USAGE) from None
    if cmd == "list":
        response = asyncio.run(_call(config, "ListAgentReleases", None))
        print(list_text(response, args.output, now=time.time()))
        return 0
    try:
        return _push(args, config)
    except PushError as exc:
        raise PushError(f"agent push: {exc}", exc.exit_code) from None
    except ArtifactError as exc:
        raise PushError(f"agent push: {exc.reason}: {exc}") from None
    except (OSError, ValueError) as exc:
        raise PushError(f"agent push: {exc}") from None


def _push(args: argparse.Namespace, config: AdminConfig) -> int:
    if not args.file.is_file():
        raise PushError(f"{args.file}: no such file")
    keys = list(args.key) or ([config.agent_key] if config.agent_key else [])
    if not keys:
        raise PushError(
            "no agent publisher key: give --key KEY (or [publisher] agentKey in admin.toml)",
            EXIT_USAGE,
        )
    meta, env = agentreleases.sign_release(
        args.file,
        version=args.version,
        private_keys=[signing.load_private_key(k) for k in keys],
        expires_in_s=signing.parse_duration_days(args.expires),
    )
    progress = Progress(f"edged {meta.version} ({meta.platform}):", meta.length)
    response = push_release(
        config,
        args.file,
        env.to_bytes(),
        meta,
        targets_keys=list(args.targets_key) or keys,
        targets_expire_in_s=signing.parse_duration_days(args.expires),
        progress=progress,
    )
    what = f"edged {response.version} ({response.arch}/{response.python_abi})"
    done = "pushed" if response.stored else "unchanged"
    print(f"{what} {done} (sha256 {response.sha256}, {response.length} bytes)")
    return 0


def _requests(
    path: Path, header: admin_pb2.ArtifactHeader, progress: Progress | None
) -> Iterator[admin_pb2.PushArtifactRequest]:
    yield admin_pb2.PushArtifactRequest(header=header)
    sent = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            yield admin_pb2.PushArtifactRequest(chunk=chunk)
            sent += len(chunk)
            if progress is not None:
                progress.update(sent)


def _sync_channel(config: AdminConfig, hub: str) -> grpc.Channel:
    try:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=config.ca_certificate.read_bytes(),
            private_key=config.key.read_bytes(),
            certificate_chain=config.certificate.read_bytes(),
        )
    except OSError as exc:
        raise PushError(f"cannot read credentials: {exc}", EXIT_USAGE) from None
    return grpc.secure_channel(hub, credentials)


def _tuf_file(stub: Any, name: str) -> bytes | None:
    from edgefleet.trust import tufmeta
    from edgefleet.v1 import common_pb2

    try:
        response = stub.FetchTufMetadata(
            common_pb2.TufMetadataRequest(name=name, max_length=tufmeta.TARGETS_MAX_BYTES),
            timeout=60.0,
        )
    except grpc.RpcError as exc:
        if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED):
            return None
        raise
    return bytes(response.data)


def push_release(
    config: AdminConfig,
    path: Path,
    envelope: bytes,
    meta: AgentReleaseMetadata,
    *,
    targets_keys: list[Path],
    targets_expire_in_s: float,
    progress: Progress | None = None,
    timeout: float = 600.0,
) -> admin_pb2.PushAgentReleaseResponse:
    """Upload the release at ``path`` with its signed metadata and the agent role's TUF
    targets listing it (the hub's, with this file added, the next version, signed by
    ``targets_keys``). gRPC's blocking API: a refusal the hub sends before it has read the
    whole stream (``VersionExists``) arrives as the hub sent it (grpc/grpc#36066 turns it
    into INTERNAL in the asyncio API)."""
    from edgefleet.trust import tufmeta

    addresses = config.addresses
    for i, hub in enumerate(addresses):
        with _sync_channel(config, hub) as channel:
            stub = admin_pb2_grpc.AdminServiceStub(channel)  # type: ignore[no-untyped-call]
            try:
                targets = _tuf_file(stub, "targets.json")
                if targets is None:
                    raise PushError(
                        "the hub keeps no TUF repository: edged releases are delegated by TUF "
                        "only (hub init --tuf)"
                    )
                role = agentreleases.find_agent_role(
                    targets, signing.load_public_key_raw(targets_keys[0])
                )
                data = agentreleases.add_release(
                    _tuf_file(stub, tufmeta.role_file(role)),
                    meta,
                    [tufmeta.tuf_signer(k) for k in targets_keys],
                    expires=time.time() + targets_expire_in_s,
                )
                header = admin_pb2.ArtifactHeader(
                    signed_metadata=envelope, delegated_role=role, delegated_targets=data
                )
                response: admin_pb2.PushAgentReleaseResponse = stub.PushAgentRelease(
                    _requests(path, header, progress), timeout=timeout
                )
                if progress is not None:
                    progress.finish()
                return response
            except grpc.RpcError as exc:
                code, details = exc.code(), exc.details() or ""
                if (
                    i + 1 < len(addresses)
                    and code is grpc.StatusCode.UNAVAILABLE
                    and not outcome_unknown(code, details, hub, "PushAgentRelease")
                ):
                    continue
                error = translate(code, details, hub, "PushAgentRelease")
                raise PushError(f"{error.code}: {error.message}", error.exit_code) from None
    raise AssertionError("unreachable")


async def _call(config: AdminConfig, method: str, request: Any) -> Any:
    addresses = config.addresses
    for i, hub in enumerate(addresses):
        async with _channel(config, hub) as channel:
            stub = admin_pb2_grpc.AdminServiceStub(channel)  # type: ignore[no-untyped-call]
            try:
                return await stub.ListAgentReleases(
                    admin_pb2.ListAgentReleasesRequest(), timeout=60.0
                )
            except grpc.aio.AioRpcError as exc:
                if i + 1 < len(addresses) and exc.code() is grpc.StatusCode.UNAVAILABLE:
                    continue
                error = translate(exc.code(), exc.details() or "", hub, method)
                raise PushError(
                    f"agent list: {error.code}: {error.message}", error.exit_code
                ) from None
    raise AssertionError("unreachable")


def list_text(response: admin_pb2.ListAgentReleasesResponse, output: str, *, now: float) -> str:
    """The releases as a table (or JSON), newest push first."""
    docs = [
        {
            "version": r.version,
            "arch": r.arch,
            "pythonAbi": r.python_abi,
            "sha256": r.sha256,
            "length": r.length,
            "pushedAt": r.pushed_at.ToJsonString(),
            "signers": list(r.signers),
        }
        for r in response.releases
    ]
    if output == "json":
        return orjson.dumps({"releases": docs}, option=orjson.OPT_INDENT_2).decode()
    if not docs:
        return "No edged releases."
    rows = [
        [
            r.version,
            r.arch,
            r.python_abi,
            str(r.length),
            r.sha256[:12],
            age(r.pushed_at.ToJsonString(), now),
        ]
        for r in response.releases
    ]
    return table(["VERSION", "ARCH", "PYTHON-ABI", "BYTES", "SHA256", "AGE"], rows)
