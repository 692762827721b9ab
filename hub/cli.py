"""The ``hub`` command: ``hub init``, ``hub serve`` and ``hub token create|list``."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from edgefleet.configfiles import address_option, duration_option
from edgefleet.errors import ConfigError, EdgefleetError, HubDirError
from edgefleet.logs import configure_logging
from edgefleet.versioning import version_text
from hub import pki, tokens
from hub.config import DEFAULT_PORT, DEFAULT_REGION, HubConfig, load_config
from hub.initializing import HubPaths, init_hub
from hub.store import Store, open_store


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hub", description="edgefleet hub: the regional control plane of a device fleet."
    )
    p.add_argument("--version", action="version", version=version_text("hub"))
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    init = sub.add_parser(
        "init", help="create a hub: CA, serving and admin credentials, first bootstrap token"
    )
    init.add_argument("--data-dir", type=Path, required=True, help="a new or empty directory")
    init.add_argument("--region", default=DEFAULT_REGION, help="the region (a DNS label)")
    init.add_argument(
        "--hub-address",
        default=f"localhost:{DEFAULT_PORT}",
        type=address_option,
        help="HOST:PORT devices and edgectl use to reach this hub",
    )
    init.add_argument(
        "--san",
        action="append",
        default=[],
        metavar="NAME_OR_IP",
        help="another DNS name or IP address for the serving certificate (repeatable)",
    )
    trust = init.add_mutually_exclusive_group()
    trust.add_argument(
        "--trust-root",
        type=Path,
        metavar="FILE",
        help="use this operator-made fleet trust root (keys kept offline) instead of making "
        "a quickstart root and publisher key in the data directory",
    )
    trust.add_argument(
        "--no-trust-root",
        action="store_true",
        help="make no trust root (the hub then refuses every artifact push)",
    )

    serve = sub.add_parser("serve", help="run the hub's gRPC services and controllers")
    serve.add_argument("--data-dir", type=Path, required=True, help="made by hub init")
    serve.add_argument(
        "--listen", type=address_option, help="HOST:PORT for mutual TLS (default: hub.toml listen)"
    )
    serve.add_argument(
        "--enroll-listen", type=address_option, help="HOST:PORT for enrollment (default: port + 1)"
    )
    serve.add_argument(
        "--metrics-listen", type=address_option, metavar="HOST:PORT",
        help="plain HTTP for /metrics, /healthz, /readyz (default: hub.toml metricsListen)",
    )  # fmt: skip
    serve.add_argument("--store", help="store URL (default: hub.toml store, else D/hub.db)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])

    token = sub.add_parser("token", help="bootstrap tokens for enrolling devices")
    tsub = token.add_subparsers(dest="token_command", required=True, metavar="COMMAND")
    create = tsub.add_parser("create", help="a new bootstrap token")
    create.add_argument("--data-dir", type=Path, required=True)
    create.add_argument(
        "--ttl", type=duration_option, help='e.g. "24h" (default: tokens.defaultTtl)'
    )
    create.add_argument("--single-use", action="store_true", help="valid for one enrollment")
    create.add_argument("--description", default="")
    listing = tsub.add_parser("list", help="the bootstrap tokens (ids only, never secrets)")
    listing.add_argument("--data-dir", type=Path, required=True)
    return p


def _config(data_dir: Path) -> HubConfig:
    paths = HubPaths.of(data_dir)
    if not paths.config.exists():
        raise HubDirError(f"{data_dir} is not a hub data directory (no hub.toml): run hub init")
    return load_config(paths.config)


async def _open(data_dir: Path, config: HubConfig) -> Store:
    return await open_store(config.store or None, data_dir=HubPaths.of(data_dir).data_dir)


async def _init(args: argparse.Namespace) -> int:
    from hub.trustsetup import choose_trust_setup, describe_trust

    result = await init_hub(
        args.data_dir,
        region=args.region,
        hub_address=args.hub_address,
        sans=args.san,
        trust_setup=choose_trust_setup(
            no_trust_root=args.no_trust_root, trust_root=args.trust_root
        ),
    )
    print(f"hub initialised in {result.paths.data_dir} (region {result.region})")
    print(f"  edgectl config:   {result.paths.admin_config}")
    print(f"  CA hash (pin):    {result.ca_pin}")
    print(f"  bootstrap token:  {result.token}  (expires in 24h)")
    for line in describe_trust(result.paths):
        print(f"  {line}")
    print()
    print("Enroll a device with:")
    print(f"  {result.enroll_command}")
    return 0


async def _token_create(args: argparse.Namespace) -> int:
    config = _config(args.data_dir)
    paths = HubPaths.of(args.data_dir)
    pin = pki.ca_pin(pki.load_certificate(paths.ca_certificate.read_bytes()))
    store = await _open(args.data_dir, config)
    try:
        token, record = await tokens.create_token(
            store,
            now=time.time(),
            ttl=args.ttl or config.tokens.default_ttl_s,
            single_use=args.single_use or config.tokens.single_use,
            description=args.description,
        )
    finally:
        await store.close()
    expires = datetime.fromtimestamp(record.expires, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    print(token)
    print(f"expires {expires}; CA hash {pin}", file=sys.stderr)
    return 0


async def _token_list(args: argparse.Namespace) -> int:
    config = _config(args.data_dir)
    store = await _open(args.data_dir, config)
    try:
        records = await tokens.list_tokens(store)
    finally:
        await store.close()
    now = time.time()
    print(f"{'ID':8} {'EXPIRES':22} {'USAGE':12} DESCRIPTION")
    for r in records:
        expires = datetime.fromtimestamp(r.expires, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if r.expires <= now:
            expires += " (expired)"
        usage = ("used" if r.used is not None else "single-use") if r.single_use else "reusable"
        print(f"{r.id:8} {expires:22} {usage:12} {r.description}")
    return 0


async def _serve(args: argparse.Namespace) -> int:
    from hub.server import serve

    return await serve(
        args.data_dir,
        listen=args.listen,
        enroll_listen=args.enroll_listen,
        store_url=args.store,
        metrics_listen=args.metrics_listen,
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging(getattr(args, "log_level", "warning"))
    if args.command == "init":
        action = _init
    elif args.command == "serve":
        action = _serve
    else:
        action = _token_create if args.token_command == "create" else _token_list
    try:
        return asyncio.run(action(args))
    except (EdgefleetError, ConfigError) as exc:
        print(f"hub: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
