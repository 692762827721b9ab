"""``hub init``: a new hub data directory.

    D/ca.crt, D/ca.key          the hub CA (key 0600)
    D/hub.crt, D/hub.key        the hub's serving certificate (SANs: localhost, 127.0.0.1, the
                                host name, the host of --hub-address, and every --san)
    D/admin.crt, D/admin.key    the first admin's client credentials
    D/admin.toml                what edgectl reads (like a kubeconfig): hub address + paths
    D/hub.toml                  the hub's config, every default spelled out
    D/hub.db                    the store, holding its identity and the first bootstrap token
    D/store-id.json             the store's identity (id, created at): ``hub serve`` refuses a
                                store that is missing, empty or of another hub

The directory is made 0700 (also when it existed, empty) and every file in it 0600, except
certificates and the trust root, which are public (0644).

The fleet's trust root and the quickstart publisher key are made by a :data:`TrustSetup`
passed in by the caller (the trust package provides it); without one none are made.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shutil
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from edgefleet.configfiles import parse_host_port
from edgefleet.errors import HubDirError
from edgefleet.logs import get_logger
from edgefleet.persisting import write_atomic
from hub import pki
from hub.config import (
    CONFIG_FILE_NAME,
    DEFAULT_PORT,
    CertificatesConfig,
    EtcdConfig,
    TokensConfig,
    default_config_text,
)
from hub.state import tokens
from hub.state.migrations import stamp_schema
from hub.state.store import default_store_url, open_store
from hub.state.store.identity import StoreIdentity, StoreIdentityError, stamp, write_marker

log = get_logger(__name__)

ADMIN_CONFIG_NAME = "admin.toml"
ADMIN_NAME = "admin"
HUB_NAME = "hub"


@dataclass(frozen=True, slots=True)
class HubPaths:
    """Where a hub keeps its files."""

    data_dir: Path

    @classmethod
    def of(cls, data_dir: Path) -> HubPaths:
        return cls(Path(os.path.abspath(data_dir)))

    @property
    def ca_certificate(self) -> Path:
        return self.data_dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.data_dir / "ca.key"

    @property
    def hub_certificate(self) -> Path:
        return self.data_dir / "hub.crt"

    @property
    def hub_key(self) -> Path:
        return self.data_dir / "hub.key"

    @property
    def admin_certificate(self) -> Path:
        return self.data_dir / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.data_dir / "admin.key"

    @property
    def admin_config(self) -> Path:
        return self.data_dir / ADMIN_CONFIG_NAME

    @property
    def config(self) -> Path:
        return self.data_dir / CONFIG_FILE_NAME

    def created_by_init(self) -> list[Path]:
        return [
            self.ca_certificate,
            self.ca_key,
            self.hub_certificate,
            self.hub_key,
            self.admin_certificate,
            self.admin_key,
            self.admin_config,
            self.config,
        ]


TrustSetup = Callable[[HubPaths, pki.CertifiedKey], Awaitable[None]]
"""Makes the fleet trust root and the quickstart publisher key in the hub's data directory.

Called by :func:`init_hub` once the CA exists and before anything is printed. Provided by the
trust package (``edged/trust``); production keeps publisher keys offline."""


@dataclass(frozen=True, slots=True)
class InitResult:
    paths: HubPaths
    region: str
    hub_address: str
    token: str
    ca_pin: str

    @property
    def enroll_command(self) -> str:
        return (
            f"edged enroll --hub {self.hub_address} --token {self.token} "
            f"--ca-hash {self.ca_pin} --data-dir /var/lib/edged"
        )


def listen_for(hub_address: str) -> str:
    """Where ``hub serve`` listens for a hub reached at ``hub_address``: its port always; a
    loopback or IP host as it is (the hub is reached there, so it listens there), a DNS name
    or a wildcard on every interface (the name may be one the host does not know itself by,
    behind NAT or a load balancer). Pure."""
    host, port = parse_host_port(hub_address)
    if host == "localhost":
        return f"localhost:{port}"
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return f"0.0.0.0:{port}"
    if address.is_unspecified:
        return f"{host}:{port}"
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


def metrics_listen_for(listen: str) -> str:
    """The observability listener of a hub listening on ``listen``: loopback, port + 2 (after
    the mTLS port and the enrollment port). Pure."""
    _, port = parse_host_port(listen)
    return f"127.0.0.1:{port + 2}"


def default_sans(hub_address: str) -> list[str]:
    host, _ = parse_host_port(hub_address)
    names = ["localhost", "127.0.0.1", socket.gethostname()]
    if host not in ("0.0.0.0", "::"):
        names.append(host)
    return list(dict.fromkeys(names))


def replica_sans(addresses: Sequence[str]) -> list[str]:
    """The hosts of every replica's address: each must be in the serving certificate (pure)."""
    return list(dict.fromkeys(parse_host_port(a)[0].strip("[]") for a in addresses))


def _admin_toml(paths: HubPaths, hub_address: str, replicas: Sequence[str] = ()) -> str:
    def quoted(path: Path) -> str:
        return '"' + str(path.absolute()).replace("\\", "\\\\").replace('"', '\\"') + '"'

    hubs = list(dict.fromkeys([hub_address, *replicas]))
    hub = f'"{hub_address}"' if len(hubs) == 1 else "[" + ", ".join(f'"{h}"' for h in hubs) + "]"

    return f"""\
# admin.toml: how edgectl reaches this hub (like a kubeconfig). Keep it private: it points
# at the admin key.
hub = {hub}
caCertificate = {quoted(paths.ca_certificate)}
certificate = {quoted(paths.admin_certificate)}
key = {quoted(paths.admin_key)}
"""


def secure_data_dir(data_dir: Path) -> None:
    """Make the data directory, or an existing one, 0700: only the hub's user may list or
    read the fleet's keys and database (mkdir's mode does nothing for an existing one)."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if data_dir.stat().st_mode & 0o777 != 0o700:
        os.chmod(data_dir, 0o700)


def _check_empty(data_dir: Path) -> None:
    if data_dir.exists() and not data_dir.is_dir():
        raise HubDirError(f"{data_dir} exists and is not a directory")
    if data_dir.is_dir() and any(data_dir.iterdir()):
        raise HubDirError(
            f"{data_dir} is not empty: refusing to overwrite a hub (or anything else) there; "
            "choose a new directory"
        )


def _write_credentials(
    paths: HubPaths,
    region: str,
    hub_address: str,
    sans: list[str],
    now: datetime,
    store: str = "",
    etcd: EtcdConfig | None = None,
    replicas: Sequence[str] = (),
) -> pki.CertifiedKey:
    """The CA, serving and admin credentials and both config files; returns the CA."""
    secure_data_dir(paths.data_dir)
    lifetimes = CertificatesConfig()
    ca = pki.create_ca(region, now=now)
    served = pki.issue_serving_certificate(
        ca,
        pki.Identity(pki.Role.HUB, HUB_NAME, region),
        [*default_sans(hub_address), *replica_sans(replicas), *sans],
        now=now,
        lifetime=timedelta(seconds=lifetimes.serving_lifetime_s),
    )
    admin = pki.issue_client_certificate(
        ca,
        pki.Identity(pki.Role.ADMIN, ADMIN_NAME, region),
        now=now,
        lifetime=timedelta(seconds=lifetimes.admin_lifetime_s),
    )
    pki.write_private_key(paths.ca_key, ca.key)
    pki.write_certificate(paths.ca_certificate, ca.certificate)
    pki.write_private_key(paths.hub_key, served.key)
    pki.write_certificate(paths.hub_certificate, served.certificate, ca.certificate)
    pki.write_private_key(paths.admin_key, admin.key)
    pki.write_certificate(paths.admin_certificate, admin.certificate)
    admin_toml = _admin_toml(paths, hub_address, replicas)
    write_atomic(paths.admin_config, admin_toml.encode(), mode=0o600)
    listen = listen_for(hub_address)
    if len(replica_sans([hub_address, *replicas])) > 1:  # copies listen on other hosts
        listen = f"0.0.0.0:{parse_host_port(hub_address)[1]}"
    config_text = default_config_text(
        region=region,
        listen=listen,
        metrics_listen=metrics_listen_for(listen),
        store=store,
        etcd=etcd,
        replica_addresses=list(dict.fromkeys([hub_address, *replicas])) if replicas else (),
    )
    write_atomic(paths.config, config_text.encode(), mode=0o600)
    return ca


def _remove_files(data_dir: Path) -> None:
    """Leave the directory as empty as ``hub init`` found it (it was empty: _check_empty),
    directories it made included (``tuf/``, the TUF repository)."""
    if data_dir.is_dir():
        for entry in os.scandir(data_dir):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)


async def init_hub(
    data_dir: Path,
    *,
    region: str,
    hub_address: str = f"localhost:{DEFAULT_PORT}",
    sans: list[str] | None = None,
    now: datetime | None = None,
    trust_setup: TrustSetup | None = None,
    store: str = "",
    etcd: EtcdConfig | None = None,
    replicas: Sequence[str] = (),
) -> InitResult:
    """Create a hub in ``data_dir``, which must not exist or be empty (HubDirError otherwise).
    On any failure the files written so far are removed again.

    ``store`` (empty: SQLite in ``data_dir``) and ``etcd`` (TLS to etcd) go into hub.toml; an
    etcd store's namespace must not hold a hub yet (more replicas of a hub: copies of its
    data directory, docs/etcd.md). ``replicas``: the other replicas' addresses (HOST:PORT):
    in the serving certificate's names, in ``replicaAddresses`` of hub.toml (sent to devices
    at enrollment) and in admin.toml (edgectl fails over between them)."""
    _check_empty(data_dir)
    now = now or datetime.now(UTC)
    paths = HubPaths.of(data_dir)
    try:
        ca = await asyncio.to_thread(
            _write_credentials, paths, region, hub_address, sans or [], now, store, etcd, replicas
        )
        if trust_setup is not None:
            await trust_setup(paths, ca)
        opened = await open_store(
            store or default_store_url(paths.data_dir),
            data_dir=paths.data_dir,
            etcd_tls=etcd.tls(paths.data_dir) if etcd is not None else None,
        )
        try:
            identity = StoreIdentity.new(region=region, now=now.timestamp())
            try:
                await stamp(opened, identity)
            except StoreIdentityError:
                raise StoreIdentityError(
                    f"the store {store} already holds a hub's store: choose another etcd "
                    "namespace (etcd://HOST:PORT/NAMESPACE), or, for another replica of that "
                    "hub, copy its data directory"
                ) from None
            write_marker(paths.data_dir, identity)
            await stamp_schema(opened, clock=now.timestamp)
            token, _ = await tokens.create_token(
                opened,
                now=now.timestamp(),
                ttl=TokensConfig().default_ttl_s,
                description="created by hub init",
            )
        finally:
            await opened.close()
    except BaseException:
        await asyncio.to_thread(_remove_files, paths.data_dir)
        raise
    log.info("hub initialised", data_dir=str(paths.data_dir), region=region)
    return InitResult(paths, region, hub_address, token, pki.ca_pin(ca.certificate))
