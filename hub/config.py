"""The hub's config file (``D/hub.toml``), read into frozen dataclasses.

Like edged's config: every key optional, every problem reported at once with its key path
(:class:`~edgefleet.errors.ConfigError`), durations as float seconds. ``hub init`` writes the file
with every default spelled out (:func:`default_config_text`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypedDict

from edgefleet.api.meta import dns_label, label_key
from edgefleet.api.quantities import format_duration
from edgefleet.api.validating import Reader, as_bool, as_str, int_in, number_in
from edgefleet.configfiles import (
    host_port,
    load_config_file,
    parse_config_document,
    positive_duration,
    table,
)
from edgefleet.errors import StoreError
from hub.state.store import EtcdTls, parse_store_url
from hub.state.tufrepo import SNAPSHOT_LIFETIME_S, TIMESTAMP_LIFETIME_S

CONFIG_FILE_NAME = "hub.toml"
DEFAULT_REGION = "default"
DEFAULT_LISTEN = "0.0.0.0:7443"
DEFAULT_PORT = 7443
DEFAULT_METRICS_LISTEN = "127.0.0.1:7445"
MAX_REPLICAS = 16


def _store_url(value: object) -> str:
    text = as_str(value).strip()
    if text:
        try:
            parse_store_url(text)
        except StoreError as exc:
            raise ValueError(str(exc)) from None
    return text


@dataclass(frozen=True, slots=True, kw_only=True)
class CertificatesConfig:
    """``[certificates]``: lifetimes of what the hub CA signs, in seconds."""

    device_lifetime_s: float = 7 * 24 * 3600.0
    admin_lifetime_s: float = 365 * 24 * 3600.0
    serving_lifetime_s: float = 365 * 24 * 3600.0
    region_lifetime_s: float = 365 * 24 * 3600.0  # a regional hub's federation certificate


@dataclass(frozen=True, slots=True, kw_only=True)
class TokensConfig:
    """``[tokens]``: bootstrap token defaults."""

    default_ttl_s: float = 24 * 3600.0
    single_use: bool = False


DEFAULT_RESERVED_LABELS = ("node-restriction.edgefleet.io/", "topology.edgefleet.io/")


@dataclass(frozen=True, slots=True, kw_only=True)
class EnrollmentConfig:
    """``[enrollment]``: which labels devices may give themselves, and rate limits."""

    reserved_labels: tuple[str, ...] = DEFAULT_RESERVED_LABELS
    """Label keys only tokens and ``edgectl label`` may set (an entry ending in "/" reserves
    every key with that prefix), as Kubernetes' NodeRestriction does for kubelets."""
    per_source_rate: float = 5.0
    """Enrollment attempts per second from one source address (after a burst)."""
    per_source_burst: int = 20
    per_token_failure_rate: float = 1.0
    """Refused attempts per second on one token id (after a burst): guessing its secret from
    many addresses is bounded too."""
    per_token_failure_burst: int = 10


def _label_key_or_prefix(value: object) -> str:
    text = as_str(value)
    label_key(text[:-1] if text.endswith("/") else text)
    return text


@dataclass(frozen=True, slots=True, kw_only=True)
class DevicesConfig:
    """``[devices]``: the device link."""

    heartbeat_interval_s: float = 30.0
    heartbeat_grace_s: float = 90.0
    """No heartbeat for this long: the device becomes NotReady (counted from the later of its
    last heartbeat and this hub's start or election: hub.decide.staleness)."""
    reschedule_after_s: float = 300.0
    """No message for this long: the scheduler moves the device's ``replicas.total``
    placements to other devices (at least heartbeatGrace; unset: 5m or heartbeatGrace;
    counted as heartbeatGrace is)."""
    status_rate: float = 1.0
    """Status messages per second one device may send, after a burst (edged sends status
    only when it changed, checked every second)."""
    status_burst: int = 30


@dataclass(frozen=True, slots=True, kw_only=True)
class AttestationConfig:
    """``[attestation]``: how the hub challenges connected devices
    (hub/controllers/attestation.py)."""

    period_s: float = 300.0
    """How often each connected device is challenged (and a new one at once)."""
    timeout_s: float = 30.0
    """No evidence this long after a challenge: the device becomes Untrusted (NoAnswer)."""
    pcrs: tuple[int, ...] = (23,)
    """The TPM PCRs devices with a TPM quote (edged uses the resettable PCR 23)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryConfig:
    """``[history]``: how much of the store's change history is kept
    (hub/state/store/compacting.py)."""

    retention_s: float = 15 * 60.0
    """A watcher can resume from any revision it saw this recently."""
    compaction_period_s: float = 5 * 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class EtcdConfig:
    """``[etcd]``: TLS to an etcd store (``store = "etcd://..."``); paths relative to the data
    directory. TLS is on when ``caFile`` is set; ``certFile`` and ``keyFile`` (both or
    neither) are this hub's client certificate for etcd's ``--client-cert-auth``."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    leader_lease_s: float = 10.0
    """Replicas on one etcd: a leader that stops renewing its lease for this long is replaced
    (hub/state/store/electing.py)."""
    max_shared_artifact_bytes: int = 256 * 1024 * 1024
    """Replicas share each artifact's bytes through etcd (hub/state/sharedblobs.py): a larger
    artifact is refused at push."""

    def tls(
        self,
        data_dir: Path,
        *,
        ca_file: Path | None = None,
        cert_file: Path | None = None,
        key_file: Path | None = None,
    ) -> EtcdTls | None:
        """TLS to etcd from these settings, each overridden by the flag given for it."""

        def pick(flag: Path | None, setting: str) -> Path | None:
            if flag is not None:
                return flag
            return data_dir / setting if setting else None

        ca = pick(ca_file, self.ca_file)
        cert = pick(cert_file, self.cert_file)
        key = pick(key_file, self.key_file)
        if ca is None:
            if cert is not None or key is not None:
                raise StoreError(
                    "etcd TLS: a client certificate and key need the CA of etcd's serving "
                    "certificates too (etcd caFile, or --etcd-ca)"
                )
            return None
        return EtcdTls(ca, cert, key)


MIN_TIMESTAMP_LIFETIME_S = 5 * 60.0
MAX_TIMESTAMP_LIFETIME_S = 30 * 86400.0
MAX_SNAPSHOT_LIFETIME_S = 365 * 86400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class TufConfig:
    """``[tuf]``: lifetimes of what the hub's online key signs in its TUF repository
    (hub/state/tufrepo.py), each signed again when half of it has passed."""

    timestamp_lifetime_s: float = TIMESTAMP_LIFETIME_S
    """The freeze-attack window: a device accepts a timestamp (and so no newer artifact
    hidden from it) for this long; also how long a regional hub cut off from this root can
    keep its devices taking artifacts (the root's timestamp is relayed unchanged)."""
    snapshot_lifetime_s: float = SNAPSHOT_LIFETIME_S


@dataclass(frozen=True, slots=True, kw_only=True)
class HubConfig:
    region: str = DEFAULT_REGION
    listen: str = DEFAULT_LISTEN
    metrics_listen: str = DEFAULT_METRICS_LISTEN
    """Plain HTTP for /metrics, /healthz, /readyz (hub.api.observability); empty: none."""
    dashboard_listen: str = ""
    """HTTPS for the web dashboard (hub.api.dashboard), authenticated; empty: none."""
    replica_addresses: tuple[str, ...] = ()
    """Every replica of this hub as devices and edgectl reach it (HOST:PORT); sent to devices
    at enrollment so that they fail over between them. Empty: one hub at one address."""
    store: str = ""
    """A store URL; empty: ``sqlite:///<data dir>/hub.db``."""
    certificates: CertificatesConfig = CertificatesConfig()
    tokens: TokensConfig = TokensConfig()
    devices: DevicesConfig = DevicesConfig()
    attestation: AttestationConfig = AttestationConfig()
    enrollment: EnrollmentConfig = EnrollmentConfig()
    history: HistoryConfig = HistoryConfig()
    etcd: EtcdConfig = EtcdConfig()
    tuf: TufConfig = TufConfig()


class TufLifetimes(TypedDict):
    timestamp_lifetime_s: float
    snapshot_lifetime_s: float


def tuf_lifetimes(config: HubConfig) -> TufLifetimes:
    """``[tuf]`` as :class:`hub.state.tufrepo.TufRepository`'s keyword arguments."""
    return {
        "timestamp_lifetime_s": config.tuf.timestamp_lifetime_s,
        "snapshot_lifetime_s": config.tuf.snapshot_lifetime_s,
    }


def _read_certificates(r: Reader) -> CertificatesConfig:
    d = CertificatesConfig()
    return CertificatesConfig(
        device_lifetime_s=r.optional("deviceLifetime", positive_duration, d.device_lifetime_s),
        admin_lifetime_s=r.optional("adminLifetime", positive_duration, d.admin_lifetime_s),
        serving_lifetime_s=r.optional("servingLifetime", positive_duration, d.serving_lifetime_s),
        region_lifetime_s=r.optional("regionLifetime", positive_duration, d.region_lifetime_s),
    )


def _read_tokens(r: Reader) -> TokensConfig:
    d = TokensConfig()
    return TokensConfig(
        default_ttl_s=r.optional("defaultTtl", positive_duration, d.default_ttl_s),
        single_use=r.optional("singleUse", as_bool, d.single_use),
    )


def _read_enrollment(r: Reader) -> EnrollmentConfig:
    d = EnrollmentConfig()
    reserved = r.list_of("reservedLabels", _label_key_or_prefix, unique=True)
    return EnrollmentConfig(
        reserved_labels=tuple(reserved) if reserved is not None else d.reserved_labels,
        per_source_rate=r.optional("perSourceRate", number_in(above=0), d.per_source_rate),
        per_source_burst=r.optional("perSourceBurst", int_in(1, 100_000), d.per_source_burst),
        per_token_failure_rate=r.optional(
            "perTokenFailureRate", number_in(above=0), d.per_token_failure_rate
        ),
        per_token_failure_burst=r.optional(
            "perTokenFailureBurst", int_in(1, 100_000), d.per_token_failure_burst
        ),
    )


def _read_history(r: Reader) -> HistoryConfig:
    d = HistoryConfig()
    return HistoryConfig(
        retention_s=r.optional("retention", positive_duration, d.retention_s),
        compaction_period_s=r.optional(
            "compactionPeriod", positive_duration, d.compaction_period_s
        ),
    )


def _read_devices(r: Reader) -> DevicesConfig:
    d = DevicesConfig()
    config = DevicesConfig(
        heartbeat_interval_s=r.optional(
            "heartbeatInterval", positive_duration, d.heartbeat_interval_s
        ),
        heartbeat_grace_s=r.optional("heartbeatGrace", positive_duration, d.heartbeat_grace_s),
        reschedule_after_s=r.optional("rescheduleAfter", positive_duration, d.reschedule_after_s),
        status_rate=r.optional("statusRate", number_in(above=0), d.status_rate),
        status_burst=r.optional("statusBurst", int_in(1, 100_000), d.status_burst),
    )
    if config.heartbeat_grace_s <= config.heartbeat_interval_s:
        r.problems.add(
            r.at("heartbeatGrace"),
            "must be longer than heartbeatInterval "
            f"({format_duration(config.heartbeat_interval_s)})",
        )
    if not r.has("rescheduleAfter"):  # the default follows a long grace
        config = replace(
            config, reschedule_after_s=max(config.reschedule_after_s, config.heartbeat_grace_s)
        )
    elif config.reschedule_after_s < config.heartbeat_grace_s:
        r.problems.add(
            r.at("rescheduleAfter"),
            f"must be at least heartbeatGrace ({format_duration(config.heartbeat_grace_s)})",
        )
    return config


def _read_attestation(r: Reader) -> AttestationConfig:
    d = AttestationConfig()
    pcrs = r.list_of("pcrs", int_in(0, 23), unique=True)
    config = AttestationConfig(
        period_s=r.optional("period", positive_duration, d.period_s),
        timeout_s=r.optional("timeout", positive_duration, d.timeout_s),
        pcrs=tuple(pcrs) if pcrs is not None else d.pcrs,
    )
    if config.timeout_s >= config.period_s:
        r.problems.add(
            r.at("timeout"),
            f"must be shorter than period ({format_duration(config.period_s)})",
        )
    return config


def _read_etcd(r: Reader, store: str) -> EtcdConfig:
    d = EtcdConfig()
    config = EtcdConfig(
        ca_file=r.optional("caFile", as_str, d.ca_file),
        cert_file=r.optional("certFile", as_str, d.cert_file),
        key_file=r.optional("keyFile", as_str, d.key_file),
        leader_lease_s=r.optional("leaderLease", positive_duration, d.leader_lease_s),
        max_shared_artifact_bytes=r.optional(
            "maxSharedArtifactBytes", int_in(1024 * 1024, 4 * 1024**3), d.max_shared_artifact_bytes
        ),
    )
    if not 2 <= config.leader_lease_s <= 600:
        r.problems.add(r.at("leaderLease"), "must be from 2s to 10m")
    if bool(config.cert_file) != bool(config.key_file):
        r.problems.add(r.at("keyFile" if config.cert_file else "certFile"),
                       "certFile and keyFile go together (both or neither)")  # fmt: skip
    if (config.cert_file or config.key_file) and not config.ca_file:
        r.problems.add(r.at("caFile"), "a client certificate needs caFile too")
    is_etcd = store.startswith("etcd:")
    if not is_etcd and (config.ca_file or config.cert_file or config.key_file):
        r.problems.add(r.at("caFile"), "etcd TLS applies only to an etcd:// store")
    return config


def _hours(seconds: float) -> str:
    """A long duration as people read it: "90s", "1h", "168h"."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f'"{int(seconds // 3600)}h"'
    if seconds >= 60 and seconds % 60 == 0:
        return f'"{int(seconds // 60)}m"'
    return f'"{format_duration(seconds)}"'


def _read_tuf(r: Reader) -> TufConfig:
    d = TufConfig()
    config = TufConfig(
        timestamp_lifetime_s=r.optional(
            "timestampLifetime", positive_duration, d.timestamp_lifetime_s
        ),
        snapshot_lifetime_s=r.optional(
            "snapshotLifetime", positive_duration, d.snapshot_lifetime_s
        ),
    )
    ts, snap = config.timestamp_lifetime_s, config.snapshot_lifetime_s
    if not MIN_TIMESTAMP_LIFETIME_S <= ts <= MAX_TIMESTAMP_LIFETIME_S:
        r.problems.add(
            r.at("timestampLifetime"),
            f'must be from "5m" to "720h" (30 days), got {_hours(ts)}',
        )
    elif not ts <= snap <= MAX_SNAPSHOT_LIFETIME_S:
        r.problems.add(
            r.at("snapshotLifetime"),
            f'must be from timestampLifetime ({_hours(ts)}) to "8760h" (365 days), '
            f"got {_hours(snap)}",
        )
    return config


def _optional_host_port(value: object) -> str:
    return "" if value == "" else host_port(value)


def _read_replica_addresses(r: Reader) -> tuple[str, ...]:
    addresses = r.list_of("replicaAddresses", host_port, unique=True) or []
    if len(addresses) > MAX_REPLICAS:
        r.problems.add(r.at("replicaAddresses"), f"at most {MAX_REPLICAS} replicas")
    return tuple(addresses[:MAX_REPLICAS])


def _read_config(r: Reader) -> HubConfig:
    store = r.optional("store", _store_url, "")
    return HubConfig(
        region=r.optional("region", dns_label, DEFAULT_REGION),
        listen=r.optional("listen", host_port, DEFAULT_LISTEN),
        metrics_listen=r.optional("metricsListen", _optional_host_port, DEFAULT_METRICS_LISTEN),
        dashboard_listen=r.optional("dashboardListen", _optional_host_port, ""),
        replica_addresses=_read_replica_addresses(r),
        store=store,
        certificates=_read_certificates(table(r, "certificates")),
        tokens=_read_tokens(table(r, "tokens")),
        devices=_read_devices(table(r, "devices")),
        attestation=_read_attestation(table(r, "attestation")),
        enrollment=_read_enrollment(table(r, "enrollment")),
        history=_read_history(table(r, "history")),
        etcd=_read_etcd(table(r, "etcd"), store),
        tuf=_read_tuf(table(r, "tuf")),
    )


def parse_config(doc: Mapping[str, Any], *, source: str = "") -> HubConfig:
    return parse_config_document(doc, _read_config, source=source)


def load_config(path: Path) -> HubConfig:
    return load_config_file(path, _read_config)


def _toml_string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a TOML basic string


def default_config_text(
    *,
    region: str = DEFAULT_REGION,
    listen: str = DEFAULT_LISTEN,
    metrics_listen: str = DEFAULT_METRICS_LISTEN,
    store: str = "",
    etcd: EtcdConfig | None = None,
    replica_addresses: Sequence[str] = (),
) -> str:
    """A commented ``hub.toml`` with every key at its default (and the given region, store
    and etcd settings)."""
    c, t, d, a = CertificatesConfig(), TokensConfig(), DevicesConfig(), AttestationConfig()
    e, h, x = EnrollmentConfig(), HistoryConfig(), etcd or EtcdConfig()
    u = TufConfig()
    reserved = ", ".join(f'"{k}"' for k in e.reserved_labels)
    return f"""\
# hub.toml: the configuration of this edgefleet hub. Every key is optional.

# The region this hub serves (a DNS label); it is part of every certificate identity.
region = "{region}"
# Where `hub serve` listens unless --listen is given.
listen = "{listen}"
# Plain HTTP (no TLS, no authentication) for Prometheus /metrics and /healthz, /readyz; on
# loopback unless scrapers elsewhere are trusted. Empty: no such listener.
metricsListen = "{metrics_listen}"
# HTTPS for the web dashboard, e.g. "0.0.0.0:7446" (needs the dashboard extra): every request
# needs an admin client certificate or a short-lived token from `edgectl dashboard`; an admin
# may pause, resume, promote, abort, undo and restart rollouts from it. Empty: no dashboard.
dashboardListen = ""
# Every replica of this hub (HOST:PORT as devices and edgectl reach them), sent to devices at
# enrollment: they fail over between them. Each must be in the serving certificate's names
# (hub init --replica-address puts it there). Empty: one hub at one address.
replicaAddresses = [{", ".join(_toml_string(a) for a in replica_addresses)}]
# The store: sqlite:///ABSOLUTE/PATH (empty: hub.db in the data directory) or
# etcd://HOST:PORT,HOST:PORT[/NAMESPACE] (hub replicas on one etcd cluster; see [etcd]).
store = {_toml_string(store)}

[certificates]
# How long certificates signed by the hub CA are valid. Devices renew theirs at 70-90%.
deviceLifetime = "{format_duration(c.device_lifetime_s)}"
adminLifetime = "{format_duration(c.admin_lifetime_s)}"
servingLifetime = "{format_duration(c.serving_lifetime_s)}"
# A regional hub's federation certificate (at a root hub); regions renew theirs at 70-90%.
regionLifetime = "{format_duration(c.region_lifetime_s)}"

[tokens]
# Bootstrap tokens made without --ttl expire after this long.
defaultTtl = "{format_duration(t.default_ttl_s)}"
# Whether tokens made without --single-use are single-use anyway.
singleUse = {str(t.single_use).lower()}

[devices]
# How often devices send a heartbeat.
heartbeatInterval = "{format_duration(d.heartbeat_interval_s)}"
# No heartbeat for this long: the device becomes NotReady. Both this and rescheduleAfter
# count from the hub's start when it started later: its own downtime is not the device's.
heartbeatGrace = "{format_duration(d.heartbeat_grace_s)}"
# No message for this long: the scheduler moves the device's replicas.total placements.
rescheduleAfter = "{format_duration(d.reschedule_after_s)}"
# Status messages per second one device may send, after a burst; faster ends its stream.
statusRate = {d.status_rate:g}
statusBurst = {d.status_burst}

[attestation]
# How often the hub challenges each connected device for signed measurements.
period = "{format_duration(a.period_s)}"
# No answer this long after a challenge: the device becomes Untrusted (NoAnswer).
timeout = "{format_duration(a.timeout_s)}"
# TPM PCRs a device with a TPM quotes.
pcrs = [{", ".join(str(p) for p in a.pcrs)}]

[enrollment]
# Label keys a device may not give itself (at enrollment or in what it reports): only
# bootstrap tokens and `edgectl label` set them. An entry ending in "/" reserves a prefix.
# Add the keys your placement relies on, e.g. ["region", "zone", "site", ...].
reservedLabels = [{reserved}]
# Enrollment attempts per second from one source address, after a burst.
perSourceRate = {e.per_source_rate:g}
perSourceBurst = {e.per_source_burst}
# Refused attempts per second on one bootstrap token id, after a burst.
perTokenFailureRate = {e.per_token_failure_rate:g}
perTokenFailureBurst = {e.per_token_failure_burst}

[history]
# How long the store keeps its change history: watchers resume from any revision seen this
# recently (older: they relist). Compacted every compactionPeriod.
retention = "{format_duration(h.retention_s)}"
compactionPeriod = "{format_duration(h.compaction_period_s)}"

[etcd]
# With an etcd:// store: TLS to etcd (paths relative to this directory; empty caFile: no
# TLS), and this hub's client certificate and key for etcd's --client-cert-auth.
caFile = {_toml_string(x.ca_file)}
certFile = {_toml_string(x.cert_file)}
keyFile = {_toml_string(x.key_file)}
# Hub replicas on one etcd: a leader that stops renewing its lease this long is replaced.
leaderLease = "{format_duration(x.leader_lease_s)}"
# Replicas share artifacts' bytes through etcd: the largest artifact a push may bring, in
# bytes (1 MiB to 4 GiB; they count against etcd's --quota-backend-bytes).
maxSharedArtifactBytes = {x.max_shared_artifact_bytes}

[tuf]
# Lifetimes of the TUF timestamp and snapshot this hub signs (each signed again at half).
# The timestamp's is the freeze-attack window (how long a device accepts metadata that may
# hide newer artifacts from it) and also how long a regional hub cut off from this root can
# keep giving its devices new artifacts: regions relay this root's timestamp unchanged, so
# the root's setting is the one their devices see. 5m to 720h; snapshot at least the
# timestamp's, at most 8760h.
timestampLifetime = {_hours(u.timestamp_lifetime_s)}
snapshotLifetime = {_hours(u.snapshot_lifetime_s)}
"""
