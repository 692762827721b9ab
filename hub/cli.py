"""The ``hub`` command: ``hub init``, ``hub serve``, ``hub token create|list``,
``hub backup|restore`` and ``hub secrets rotate-key``."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from edgefleet.configfiles import address_option, duration_option
from edgefleet.errors import ConfigError, EdgefleetError, HubDirError, StoreError
from edgefleet.logs import configure_logging
from edgefleet.tokenoptions import add_token_label_options
from edgefleet.versioning import version_text
from hub import pki
from hub.config import DEFAULT_PORT, DEFAULT_REGION, HubConfig, load_config
from hub.initializing import HubPaths, TrustSetup, init_hub
from hub.state import tokens
from hub.state.store import Store, default_store_url, open_hub_store, open_store, parse_store_url
from hub.state.store.identity import (
    StoreIdentityError,
    backup_sqlite,
    backup_store,
    data_dir_lock,
    restore_sqlite,
    restore_store,
)


def _region_option(value: str) -> str:
    from edgefleet.api.meta import dns_label

    try:
        return dns_label(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
        "--replica-address",
        action="append",
        default=[],
        type=address_option,
        metavar="HOST:PORT",
        help="another replica of this hub (etcd store; repeatable): in the serving "
        "certificate, sent to devices at enrollment and in admin.toml, so that both fail over",
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
    tuf_flags = init.add_mutually_exclusive_group()
    tuf_flags.add_argument(
        "--tuf",
        dest="tuf",
        action="store_const",
        const=True,
        default=None,
        help="keep a TUF repository (D/tuf/) with quickstart keys: devices then admit only "
        "artifacts a delegated publisher's signed targets list (the default with the "
        "quickstart trust root; docs/trust.md)",
    )
    tuf_flags.add_argument(
        "--no-tuf",
        dest="tuf",
        action="store_const",
        const=False,
        help="keep no TUF repository: devices rely on the per-artifact envelopes alone (no "
        "signed current set, no short freeze bound, no publisher delegations); for a "
        "repository from an offline ceremony later (hub tuf online-key, hub tuf install)",
    )

    parent = init.add_argument_group("federation (docs/federation.md)")
    parent.add_argument(
        "--parent",
        type=parent_option,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="make this a regional hub under the root hub at HOST:PORT (enrolls with it now; "
        "the region's trust roots come from the root); several addresses: the root's "
        "replicas, tried in turn, and the link fails over between them",
    )
    parent.add_argument(
        "--token", default="", help="with --parent: a token from hub token create --for-region"
    )
    parent.add_argument(
        "--parent-ca-hash",
        default="",
        metavar="sha256:HEX",
        help="with --parent: the root's CA pin (printed by hub token create)",
    )

    init.add_argument(
        "--store",
        default="",
        help="store URL (default: D/hub.db); etcd://HOST:PORT,...[/NAMESPACE] for replicas",
    )
    _etcd_tls_arguments(init)

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
    serve.add_argument(
        "--dashboard-listen", type=address_option, metavar="HOST:PORT",
        help="HTTPS for the web dashboard (default: hub.toml dashboardListen)",
    )  # fmt: skip
    serve.add_argument("--store", help="store URL (default: hub.toml store, else D/hub.db)")
    _etcd_tls_arguments(serve)
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])

    backup = sub.add_parser(
        "backup",
        help="copy the store to a file (a SQLite store file; the hub may keep serving)",
    )
    backup.add_argument("--data-dir", type=Path, required=True)
    backup.add_argument("--out", type=Path, required=True, metavar="FILE")
    migrate = sub.add_parser(
        "migrate",
        help="bring the store to this hub's schema, the migrations older replicas cannot "
        "follow included: run it with every replica stopped (hub serve applies the others "
        "itself)",
    )
    migrate.add_argument("--data-dir", type=Path, required=True)
    restore = sub.add_parser(
        "restore",
        help="replace a stopped hub's store with a backup of it (made by hub backup)",
    )
    restore.add_argument("--data-dir", type=Path, required=True)
    restore.add_argument("--from", dest="source", type=Path, required=True, metavar="FILE")

    token = sub.add_parser("token", help="bootstrap tokens for enrolling devices")
    tsub = token.add_subparsers(dest="token_command", required=True, metavar="COMMAND")
    create = tsub.add_parser("create", help="a new bootstrap token")
    create.add_argument("--data-dir", type=Path, required=True)
    create.add_argument(
        "--ttl", type=duration_option, help='e.g. "24h" (default: tokens.defaultTtl)'
    )
    create.add_argument("--single-use", action="store_true", help="valid for one enrollment")
    create.add_argument("--description", default="")
    create.add_argument(
        "--for-region",
        type=_region_option,
        metavar="REGION",
        help="a token that enrolls only the regional hub of REGION (hub init --parent), no device",
    )
    create.add_argument(
        "--allow-shared-ek",
        action="store_true",
        help="let a device enroll whose TPM (endorsement key) backs a device already enrolled "
        "(refused by default: one TPM, one device record)",
    )
    add_token_label_options(create)
    listing = tsub.add_parser("list", help="the bootstrap tokens (ids only, never secrets)")
    listing.add_argument("--data-dir", type=Path, required=True)

    secrets = sub.add_parser("secrets", help="the hub's key for Secrets at rest")
    ssub = secrets.add_subparsers(dest="secrets_command", required=True, metavar="COMMAND")
    rotate = ssub.add_parser(
        "rotate-key",
        help="re-seal every stored Secret under a new secrets.key (the hub may keep serving; "
        "a rotation stopped halfway is finished by running it again)",
    )
    rotate.add_argument("--data-dir", type=Path, required=True)
    rotate.add_argument(
        "--prepare",
        action="store_true",
        help="only make the new key (secrets.key.next), to copy to every hub replica first",
    )

    parent_cmd = sub.add_parser(
        "parent", help="a regional hub's link to its root hub (docs/federation.md)"
    )
    psub = parent_cmd.add_subparsers(dest="parent_command", required=True, metavar="COMMAND")
    set_addresses = psub.add_parser(
        "set-addresses",
        help="replace the root hub's addresses (its replicas) this regional hub dials; a "
        "running hub uses them from its next connection",
    )
    set_addresses.add_argument("--data-dir", type=Path, required=True)
    set_addresses.add_argument("addresses", type=parent_option, metavar="HOST:PORT[,HOST:PORT...]")

    tuf = sub.add_parser("tuf", help="the hub's TUF repository (docs/trust.md, TUF roles)")
    tufsub = tuf.add_subparsers(dest="tuf_command", required=True, metavar="COMMAND")
    online = tufsub.add_parser(
        "online-key", help="make (once) and show the hub's online snapshot/timestamp key"
    )
    online.add_argument("--data-dir", type=Path, required=True)
    install = tufsub.add_parser(
        "install", help="install an offline-signed TUF root and top-level targets"
    )
    install.add_argument("--data-dir", type=Path, required=True)
    install.add_argument("--root", type=Path, required=True, help="edgectl trust tuf root")
    install.add_argument("--targets", type=Path, required=True, help="edgectl trust tuf targets")
    return p


def _etcd_tls_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--etcd-ca", type=Path, metavar="FILE", help="CA of etcd's certificates (TLS to etcd)"
    )
    p.add_argument("--etcd-cert", type=Path, metavar="FILE", help="client certificate for etcd")
    p.add_argument("--etcd-key", type=Path, metavar="FILE", help="its private key")


def _etcd_flags(args: argparse.Namespace) -> dict[str, Path | None]:
    return {
        "ca_file": args.etcd_ca and args.etcd_ca.absolute(),
        "cert_file": args.etcd_cert and args.etcd_cert.absolute(),
        "key_file": args.etcd_key and args.etcd_key.absolute(),
    }


def parent_option(text: str) -> list[str]:
    """``--parent A,B``: the root hub's addresses (HOST:PORT each, 1 to 16)."""
    from edgefleet.failover import split_addresses

    try:
        return split_addresses(text, what="parent")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _config(data_dir: Path) -> HubConfig:
    paths = HubPaths.of(data_dir)
    if not paths.config.exists():
        raise HubDirError(f"{data_dir} is not a hub data directory (no hub.toml): run hub init")
    return load_config(paths.config)


async def _open(data_dir: Path, config: HubConfig) -> Store:
    d = HubPaths.of(data_dir).data_dir
    return await open_hub_store(config.store or None, data_dir=d, etcd_tls=config.etcd.tls(d))


async def _init(args: argparse.Namespace) -> int:
    from hub.config import EtcdConfig
    from hub.trustsetup import choose_trust_setup, describe_trust, root_pin

    store = args.store.strip()
    if store:
        parse_store_url(store)
    flags = _etcd_flags(args)
    etcd = EtcdConfig(
        ca_file=str(flags["ca_file"] or ""),
        cert_file=str(flags["cert_file"] or ""),
        key_file=str(flags["key_file"] or ""),
    )
    if any(flags.values()) and not store.startswith("etcd:"):
        raise StoreError("--etcd-ca, --etcd-cert and --etcd-key apply only to --store etcd://...")
    etcd.tls(args.data_dir)  # both or neither, with a CA: refused before anything is made
    if args.replica_address and not store.startswith("etcd:"):
        raise StoreError("--replica-address: replicas share an etcd store (--store etcd://...)")

    trust_setup = choose_trust_setup(
        no_trust_root=args.no_trust_root,
        trust_root=args.trust_root,
        tuf=args.tuf,
        replicas=bool(args.replica_address),
    )
    if args.parent:
        trust_setup = _parent_setup(args)
    elif args.token or args.parent_ca_hash:
        raise HubDirError("--token and --parent-ca-hash apply only with --parent")
    result = await init_hub(
        args.data_dir,
        region=args.region,
        hub_address=args.hub_address,
        sans=args.san,
        replicas=args.replica_address,
        trust_setup=trust_setup,
        store=store,
        etcd=etcd,
    )
    print(f"hub initialised in {result.paths.data_dir} (region {result.region})")
    print(f"  edgectl config:   {result.paths.admin_config}")
    print(f"  CA hash (pin):    {result.ca_pin}")
    print(f"  bootstrap token:  {result.token}  (expires in 24h)")
    for line in describe_trust(result.paths):
        print(f"  {line}")
    print()
    print("Enroll a device with:")
    pin = root_pin(result.paths)
    print(f"  {result.enroll_command}" + (f" --root-hash {pin}" if pin else ""))
    return 0


def _parent_setup(args: argparse.Namespace) -> TrustSetup:
    """``hub init --parent``: enroll with the root hub instead of making a trust root."""
    from hub.controllers.parentlink.regionenrollment import enroll_with_parent

    if args.no_trust_root or args.trust_root is not None or args.tuf:
        raise HubDirError(
            "--parent takes the fleet's trust roots from the root hub: not with --trust-root, "
            "--no-trust-root or --tuf"
        )
    if not args.token or not args.parent_ca_hash:
        raise HubDirError("--parent needs --token and --parent-ca-hash (hub token create "
                          "--for-region REGION on the root prints both)")  # fmt: skip
    if args.region == DEFAULT_REGION:
        raise HubDirError("--parent needs --region: the region this hub serves")

    async def setup(paths: HubPaths, ca: pki.CertifiedKey) -> None:
        await enroll_with_parent(
            paths,
            parent=args.parent,
            token=args.token,
            ca_hash=args.parent_ca_hash,
            region=args.region,
        )

    return setup


async def _token_create(args: argparse.Namespace) -> int:
    config = _config(args.data_dir)
    paths = HubPaths.of(args.data_dir)
    pin = pki.ca_pin(pki.load_certificate(paths.ca_certificate.read_bytes()))
    ttl = args.ttl or config.tokens.default_ttl_s
    labels = dict(args.label)
    problems = tokens.check_token_request(
        ttl=ttl,
        description=args.description,
        labels=labels,
        device_labels=not args.no_device_labels,
        device_label_prefix=args.device_label_prefix,
        for_region=args.for_region or "",
        own_region=config.region,
    )
    if problems:
        for problem in problems:
            print(f"hub: {_as_option(problem)}", file=sys.stderr)
        return 2
    from hub.state.writer import offline_event

    store = await _open(args.data_dir, config)
    try:
        token, record = await tokens.create_token(
            store,
            now=time.time(),
            ttl=ttl,
            single_use=args.single_use or config.tokens.single_use,
            description=args.description,
            labels=labels,
            device_labels=not args.no_device_labels,
            device_label_prefix=args.device_label_prefix,
            event_for=lambda token_id: offline_event(
                "Token", token_id, "Normal", "Created", f"bootstrap token {token_id}"
            ),
            for_region=args.for_region or "",
            allow_shared_ek=args.allow_shared_ek,
        )
    finally:
        await store.close()
    expires = datetime.fromtimestamp(record.expires, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    from hub.trustsetup import root_pin

    root = root_pin(paths)
    print(token)
    root_part = f"root hash {root}; " if root else ""
    print(f"expires {expires}; {root_part}CA hash {pin}", file=sys.stderr)
    return 0


_TOKEN_OPTIONS = (
    ("for_region", "--for-region"),
    ("ttl", "--ttl"),
    ("description", "--description"),
    ("labels", "--label"),
    ("device_label_prefix", "--device-label-prefix"),
)


def _as_option(problem: str) -> str:
    """A problem of the token request, with its field named as the option that set it."""
    for field, option in _TOKEN_OPTIONS:
        if problem.startswith(field):
            return option + problem[len(field) :]
    return problem


def describe_device_labels(record: tokens.TokenRecord) -> str:
    """What a device enrolling with the token may add of its own labels, in a few words."""
    if not record.device_labels:
        return "none"
    return f"{record.device_label_prefix}*" if record.device_label_prefix else "any"


async def _token_list(args: argparse.Namespace) -> int:
    config = _config(args.data_dir)
    store = await _open(args.data_dir, config)
    try:
        records = await tokens.list_tokens(store)
    finally:
        await store.close()
    now = time.time()
    print(f"{'ID':8} {'EXPIRES':22} {'USAGE':12} {'LABELS':24} {'OWN-LABELS':16} DESCRIPTION")
    for r in records:
        expires = datetime.fromtimestamp(r.expires, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if r.expires <= now:
            expires += " (expired)"
        usage = ("used" if r.used is not None else "single-use") if r.single_use else "reusable"
        labels = ",".join(f"{k}={v}" for k, v in sorted(r.labels.items())) or "<none>"
        own = describe_device_labels(r)
        print(f"{r.id:8} {expires:22} {usage:12} {labels:24} {own:16} {r.description}")
    return 0


def _sqlite_path(data_dir: Path, config: HubConfig) -> Path:
    location = parse_store_url(config.store or default_store_url(HubPaths.of(data_dir).data_dir))
    if location.path is None:
        raise StoreIdentityError(
            f"hub backup and restore work on the SQLite store; this hub's store is "
            f"{config.store} (for etcd, use etcdctl snapshot save / restore)"
        )
    return location.path


def _is_sqlite(data_dir: Path, config: HubConfig) -> bool:
    d = HubPaths.of(data_dir).data_dir
    return parse_store_url(config.store or default_store_url(d)).scheme == "sqlite"


async def _backup(args: argparse.Namespace) -> int:
    config = _config(args.data_dir)
    if _is_sqlite(args.data_dir, config):
        info = await asyncio.to_thread(backup_sqlite, _sqlite_path(args.data_dir, config), args.out)
    else:
        store = await _open(args.data_dir, config)
        try:
            info = await backup_store(store, args.out)
        finally:
            await store.close()
    print(
        f"backed up store {info.identity.store_id} (revision {info.revision}, {info.keys} "
        f"keys, {info.devices} devices) to {args.out}"
    )
    return 0


async def _restore(args: argparse.Namespace) -> int:
    config = _config(args.data_dir)
    paths = HubPaths.of(args.data_dir)
    with data_dir_lock(paths.data_dir, purpose="hub restore"):
        if _is_sqlite(args.data_dir, config):
            info = await asyncio.to_thread(
                restore_sqlite, args.source, _sqlite_path(args.data_dir, config), paths.data_dir
            )
        else:
            store = await open_store(
                config.store, data_dir=paths.data_dir, etcd_tls=config.etcd.tls(paths.data_dir)
            )
            try:
                info = await restore_store(args.source, store, paths.data_dir, where=config.store)
            finally:
                await store.close()
    print(
        f"restored store {info.identity.store_id} at revision {info.revision} "
        f"({info.keys} keys, {info.devices} devices) from {args.source}"
    )
    print(
        "  devices reconnect and get what the backup says they should run; devices enrolled "
        "since the backup must enroll again, and certificates revoked since the backup must "
        "be revoked again (edgectl revoke)"
    )
    return 0


async def _migrate(args: argparse.Namespace) -> int:
    from hub.state.migrations import SCHEMA, migrate, read_schema
    from hub.state.store.identity import LEADER_KEY

    config = _config(args.data_dir)
    store = await _open(args.data_dir, config)
    try:
        before = (await read_schema(store)).version
        shared = not _is_sqlite(args.data_dir, config)
        leader = await store.get(LEADER_KEY) if shared else None  # a replica runs (its lease)
        applied = await migrate(store, shared=shared, allow_incompatible=leader is None)
    finally:
        await store.close()
    if not applied:
        print(f"store schema {before}: nothing to migrate (this hub's schema is {SCHEMA})")
    else:
        print(f"store migrated from schema {before} to {applied[-1]}")
    return 0


async def _serve(args: argparse.Namespace) -> int:
    from hub.server import serve

    return await serve(
        args.data_dir,
        listen=args.listen,
        enroll_listen=args.enroll_listen,
        store_url=args.store,
        metrics_listen=args.metrics_listen,
        etcd_flags=_etcd_flags(args),
        dashboard_listen=args.dashboard_listen,
    )


async def _secrets_rotate_key(args: argparse.Namespace) -> int:
    from hub.state.secretkeys import rotate_key

    config = _config(args.data_dir)
    d = HubPaths.of(args.data_dir).data_dir
    store = await _open(args.data_dir, config)
    try:
        done = await rotate_key(store, d, prepare_only=args.prepare)
    finally:
        await store.close()
    if done.prepared_only:
        print(
            f"new key {done.new_key_id} in {d / 'secrets.key.next'}: copy it (mode 0600) to "
            "every hub replica's data directory, then run hub secrets rotate-key"
        )
        return 0
    print(
        f"{done.resealed} Secret(s) sealed under the new key {done.new_key_id}; the previous "
        f"key {done.old_key_id} is kept as {d / 'secrets.key.old'} (backups made before now "
        "need it)"
    )
    return 0


async def _tuf_online_key(args: argparse.Namespace) -> int:
    from hub.state.tufrepo import online_key

    _config(args.data_dir)
    pub = online_key(HubPaths.of(args.data_dir).data_dir)
    print(f"the hub's online key (snapshot and timestamp): {pub}")
    print("list it in the TUF root: edgectl trust tuf root --online-key " + str(pub) + " ...")
    return 0


async def _tuf_install(args: argparse.Namespace) -> int:
    from hub.config import tuf_lifetimes
    from hub.state.tufrepo import install_repository

    config = _config(args.data_dir)
    replicated = config.store.startswith("etcd:")  # the leader signs, through the store
    d = install_repository(
        HubPaths.of(args.data_dir).data_dir, args.root, args.targets,
        signing=not replicated, **tuf_lifetimes(config),
    )  # fmt: skip
    print(f"TUF repository installed in {d}; a running hub adopts it within seconds")
    if replicated:  # once for every replica: each installs it from the store (hub.state.sharedtuf)
        from hub.state.sharedtuf import share_installed

        store = await _open(args.data_dir, config)
        try:
            await share_installed(store, d)
        finally:
            await store.close()
        print("shared with every replica of this hub through the store")
    return 0


async def _parent_set_addresses(args: argparse.Namespace) -> int:
    from hub.controllers.parentlink.regionenrollment import set_parent_addresses

    _config(args.data_dir)
    got = set_parent_addresses(HubPaths.of(args.data_dir).data_dir, args.addresses)
    print(f"root hub addresses: {','.join(got)}; a running hub dials them from its next "
          "connection")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging(getattr(args, "log_level", "warning"))
    if args.command == "init":
        action = _init
    elif args.command == "serve":
        action = _serve
    elif args.command == "backup":
        action = _backup
    elif args.command == "restore":
        action = _restore
    elif args.command == "migrate":
        action = _migrate
    elif args.command == "secrets":
        action = _secrets_rotate_key
    elif args.command == "parent":
        action = _parent_set_addresses
    elif args.command == "tuf":
        action = _tuf_online_key if args.tuf_command == "online-key" else _tuf_install
    else:
        action = _token_create if args.token_command == "create" else _token_list
    try:
        return asyncio.run(action(args))
    except (EdgefleetError, ConfigError) as exc:
        print(f"hub: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
