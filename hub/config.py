"""The hub's config file (``D/hub.toml``), read into frozen dataclasses.

Like edged's config: every key optional, every problem reported at once with its key path
(:class:`~edgefleet.errors.ConfigError`), durations as float seconds. ``hub init`` writes the file
with every default spelled out (:func:`default_config_text`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgefleet.api.meta import dns_label
from edgefleet.api.quantities import format_duration
from edgefleet.api.validating import Reader, as_bool, as_str, int_in
from edgefleet.configfiles import (
    host_port,
    load_config_file,
    parse_config_document,
    positive_duration,
    table,
)
from edgefleet.errors import StoreError
from hub.store import parse_store_url

CONFIG_FILE_NAME = "hub.toml"
DEFAULT_REGION = "default"
DEFAULT_LISTEN = "0.0.0.0:7443"
DEFAULT_PORT = 7443
DEFAULT_METRICS_LISTEN = "127.0.0.1:7445"


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


@dataclass(frozen=True, slots=True, kw_only=True)
class TokensConfig:
    """``[tokens]``: bootstrap token defaults."""

    default_ttl_s: float = 24 * 3600.0
    single_use: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class DevicesConfig:
    """``[devices]``: the device link."""

    heartbeat_interval_s: float = 30.0
    heartbeat_grace_s: float = 90.0
    """No heartbeat for this long: the device becomes NotReady."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AttestationConfig:
    """``[attestation]``: how the hub challenges connected devices (hub/attesting.py)."""

    period_s: float = 300.0
    """How often each connected device is challenged (and a new one at once)."""
    timeout_s: float = 30.0
    """No evidence this long after a challenge: the device becomes Untrusted (NoAnswer)."""
    pcrs: tuple[int, ...] = (23,)
    """The TPM PCRs devices with a TPM quote (edged uses the resettable PCR 23)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HubConfig:
    region: str = DEFAULT_REGION
    listen: str = DEFAULT_LISTEN
    metrics_listen: str = DEFAULT_METRICS_LISTEN
    """Plain HTTP for /metrics, /healthz, /readyz (hub.observing); empty: none."""
    store: str = ""
    """A store URL; empty: ``sqlite:///<data dir>/hub.db``."""
    certificates: CertificatesConfig = CertificatesConfig()
    tokens: TokensConfig = TokensConfig()
    devices: DevicesConfig = DevicesConfig()
    attestation: AttestationConfig = AttestationConfig()


def _read_certificates(r: Reader) -> CertificatesConfig:
    d = CertificatesConfig()
    return CertificatesConfig(
        device_lifetime_s=r.optional("deviceLifetime", positive_duration, d.device_lifetime_s),
        admin_lifetime_s=r.optional("adminLifetime", positive_duration, d.admin_lifetime_s),
        serving_lifetime_s=r.optional("servingLifetime", positive_duration, d.serving_lifetime_s),
    )


def _read_tokens(r: Reader) -> TokensConfig:
    d = TokensConfig()
    return TokensConfig(
        default_ttl_s=r.optional("defaultTtl", positive_duration, d.default_ttl_s),
        single_use=r.optional("singleUse", as_bool, d.single_use),
    )


def _read_devices(r: Reader) -> DevicesConfig:
    d = DevicesConfig()
    config = DevicesConfig(
        heartbeat_interval_s=r.optional(
            "heartbeatInterval", positive_duration, d.heartbeat_interval_s
        ),
        heartbeat_grace_s=r.optional("heartbeatGrace", positive_duration, d.heartbeat_grace_s),
    )
    if config.heartbeat_grace_s <= config.heartbeat_interval_s:
        r.problems.add(
            r.at("heartbeatGrace"),
            "must be longer than heartbeatInterval "
            f"({format_duration(config.heartbeat_interval_s)})",
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


def _optional_host_port(value: object) -> str:
    return "" if value == "" else host_port(value)


def _read_config(r: Reader) -> HubConfig:
    return HubConfig(
        region=r.optional("region", dns_label, DEFAULT_REGION),
        listen=r.optional("listen", host_port, DEFAULT_LISTEN),
        metrics_listen=r.optional("metricsListen", _optional_host_port, DEFAULT_METRICS_LISTEN),
        store=r.optional("store", _store_url, ""),
        certificates=_read_certificates(table(r, "certificates")),
        tokens=_read_tokens(table(r, "tokens")),
        devices=_read_devices(table(r, "devices")),
        attestation=_read_attestation(table(r, "attestation")),
    )


def parse_config(doc: Mapping[str, Any], *, source: str = "") -> HubConfig:
    return parse_config_document(doc, _read_config, source=source)


def load_config(path: Path) -> HubConfig:
    return load_config_file(path, _read_config)


def default_config_text(
    *,
    region: str = DEFAULT_REGION,
    listen: str = DEFAULT_LISTEN,
    metrics_listen: str = DEFAULT_METRICS_LISTEN,
) -> str:
    """A commented ``hub.toml`` with every key at its default (and the given region)."""
    c, t, d, a = CertificatesConfig(), TokensConfig(), DevicesConfig(), AttestationConfig()
    return f"""\
# hub.toml: the configuration of this edgefleet hub. Every key is optional.

# The region this hub serves (a DNS label); it is part of every certificate identity.
region = "{region}"
# Where `hub serve` listens unless --listen is given.
listen = "{listen}"
# Plain HTTP (no TLS, no authentication) for Prometheus /metrics and /healthz, /readyz; on
# loopback unless scrapers elsewhere are trusted. Empty: no such listener.
metricsListen = "{metrics_listen}"
# The store: sqlite:///ABSOLUTE/PATH (empty: hub.db in the data directory) or
# etcd://HOST:PORT,HOST:PORT (not built yet).
store = ""

[certificates]
# How long certificates signed by the hub CA are valid. Devices renew theirs at 70-90%.
deviceLifetime = "{format_duration(c.device_lifetime_s)}"
adminLifetime = "{format_duration(c.admin_lifetime_s)}"
servingLifetime = "{format_duration(c.serving_lifetime_s)}"

[tokens]
# Bootstrap tokens made without --ttl expire after this long.
defaultTtl = "{format_duration(t.default_ttl_s)}"
# Whether tokens made without --single-use are single-use anyway.
singleUse = {str(t.single_use).lower()}

[devices]
# How often devices send a heartbeat.
heartbeatInterval = "{format_duration(d.heartbeat_interval_s)}"
# No heartbeat for this long: the device becomes NotReady.
heartbeatGrace = "{format_duration(d.heartbeat_grace_s)}"

[attestation]
# How often the hub challenges each connected device for signed measurements.
period = "{format_duration(a.period_s)}"
# No answer this long after a challenge: the device becomes Untrusted (NoAnswer).
timeout = "{format_duration(a.timeout_s)}"
# TPM PCRs a device with a TPM quotes.
pcrs = [{", ".join(str(p) for p in a.pcrs)}]
"""
