"""edged's own config file (``edged.toml``), read into frozen dataclasses.

Every key is optional; :func:`default_config_text` is the file with every default spelled out.
Every problem is reported at once in a :class:`~edgefleet.errors.ConfigError`, each with its key
path (``reconcile.resyncPerod: unknown field (did you mean "resyncPeriod"?)``). Durations are
float seconds, sizes int bytes.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from edgefleet.api.meta import label_key, label_value
from edgefleet.api.quantities import (
    describe,
    format_duration,
    parse_duration,
    parse_memory,
    parse_percent,
)
from edgefleet.api.validating import Reader, as_bool, as_str, int_in, matching, one_of, within
from edgefleet.configfiles import (
    host_port,
    load_config_file,
    parse_config_document,
    parse_host_port,
    positive_duration,
    table,
)

DEFAULT_DATA_DIR = Path("/var/lib/edged")
DEFAULT_RUNTIME_DIR = Path("/run/edged")  # the sockets' home under systemd (RuntimeDirectory=)
DEFAULT_TRUST_ROOT = Path("/etc/edged/trust-root.json")
STATUS_SOCKET_NAME = "edged.sock"
INFERENCE_SOCKET_NAME = "infer.sock"
MAX_SOCKET_PATH_BYTES = 107  # sun_path holds 108 bytes with the terminating NUL (Linux)

_MAX_REQUEST_TEXT = "64Mi"
_MAX_BUFFERED_TEXT = "256Mi"
_HEADER_TIMEOUT_TEXT = "10s"
_BODY_TIMEOUT_TEXT = "60s"
_IDLE_TIMEOUT_TEXT = "60s"
_METRICS_PERIOD_TEXT = "5s"
_LATENCY_WINDOW_TEXT = "60s"
_RESYNC_TEXT = "60s"
_BACKOFF_BASE_TEXT = "50ms"
_BACKOFF_MAX_TEXT = "5m"
_HEALTH_PERIOD_TEXT = "30s"
_SAMPLE_PERIOD_TEXT = "1s"
_EVICTION_INTERVAL_TEXT = "5s"
_ORPHAN_TIMEOUT_TEXT = "5m"


class LogLevel(StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


CgroupRoot = Path | Literal["auto", "off"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PathsConfig:
    """``[paths]``: where edged keeps state and its sockets (always resolved, never empty)."""

    data_dir: Path = DEFAULT_DATA_DIR
    status_socket: Path = DEFAULT_DATA_DIR / STATUS_SOCKET_NAME
    inference_socket: Path = DEFAULT_DATA_DIR / INFERENCE_SOCKET_NAME


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceDirs:
    """The directories systemd made for the unit (``StateDirectory=``, ``RuntimeDirectory=``).

    Under systemd they are the defaults: state in ``$STATE_DIRECTORY`` (``/var/lib/edged``),
    sockets in ``$RUNTIME_DIRECTORY`` (``/run/edged``). Explicit config and flags win."""

    state: Path | None = None
    runtime: Path | None = None

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> ServiceDirs:
        def first(name: str) -> Path | None:
            value = env.get(name, "").split(":")[0]  # several directories: colon-separated
            return Path(value) if value.startswith("/") else None

        return cls(state=first("STATE_DIRECTORY"), runtime=first("RUNTIME_DIRECTORY"))


@dataclass(frozen=True, slots=True)
class TcpAddress:
    """A loopback TCP address to listen on. Port 0 picks a free port."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True, kw_only=True)
class InferenceConfig:
    """``[inference]``: the local inference API."""

    listen_tcp: TcpAddress | None = None
    max_request_bytes: int = parse_memory(_MAX_REQUEST_TEXT)
    max_connections: int = 1024
    max_buffered_bytes: int = parse_memory(_MAX_BUFFERED_TEXT)
    header_timeout_s: float = parse_duration(_HEADER_TIMEOUT_TEXT)
    body_timeout_s: float = parse_duration(_BODY_TIMEOUT_TEXT)
    idle_timeout_s: float = parse_duration(_IDLE_TIMEOUT_TEXT)
    metrics_period_s: float = parse_duration(_METRICS_PERIOD_TEXT)
    latency_window_s: float = parse_duration(_LATENCY_WINDOW_TEXT)
    shared_memory_regions: int = 32  # per client uid; 0: the extension is off
    shared_memory_bytes: int = 1 << 30  # per client uid


@dataclass(frozen=True, slots=True, kw_only=True)
class ReconcileConfig:
    """``[reconcile]``: the control loop. Times in seconds."""

    resync_period_s: float = parse_duration(_RESYNC_TEXT)
    backoff_base_s: float = parse_duration(_BACKOFF_BASE_TEXT)
    backoff_max_s: float = parse_duration(_BACKOFF_MAX_TEXT)
    workers: int = 4


KeepOnExit = bool | Literal["auto"]

SANDBOX_MODES = ("landlock", "off")
"""``[workers] sandbox``: how workers confine themselves (edged/runtime/securing.py)."""


def _running_python() -> Path:
    return Path(sys.executable)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkersConfig:
    """``[workers]``: inference worker processes."""

    cgroup_root: CgroupRoot = "auto"
    python_executable: Path = field(default_factory=_running_python)
    sandbox: str = "landlock"  # "landlock" | "off" (edged/runtime/securing.py)
    seccomp: bool = True
    # when edged runs as root: a uid of its own per worker replica (runtime/identities.py)
    separate_uids: bool = True
    uid_base: int = 61184
    uid_count: int = 4336  # 61184-65519, systemd's dynamic users (locked as systemd does)
    # workers outlive edged's stop and the next edged adopts them (runtime/adopting.py):
    # "auto" (when systemd or edged's launcher runs edged), True or False
    keep_on_exit: KeepOnExit = "auto"
    # a kept worker that no edged comes back for within this long exits by itself
    orphan_timeout_s: float = parse_duration(_ORPHAN_TIMEOUT_TEXT)

    def keeps_workers(self, environ: Mapping[str, str]) -> bool:
        """Whether workers outlive this edged: ``keepOnExit``, where ``auto`` means edged
        runs under systemd's Type=notify unit or its launcher (``NOTIFY_SOCKET`` set; not
        ``INVOCATION_ID``: a terminal of a desktop session may have one)."""
        if self.keep_on_exit == "auto":
            return bool(environ.get("NOTIFY_SOCKET"))
        return self.keep_on_exit


@dataclass(frozen=True, slots=True, kw_only=True)
class TrustConfig:
    """``[trust]``: artifact verification and device identity (docs/trust.md)."""

    allow_unsigned: bool = False
    root_file: Path = DEFAULT_TRUST_ROOT
    tpm: str = "auto"  # "auto" | "off" | a TCTI string such as "device:/dev/tpmrm0"
    require_tuf: bool = False  # refuse the hub's artifacts until it serves TUF metadata
    # edged's own measurements extended into this static PCR (8-15) with a TPM attestation
    # key; None: not extended (docs/trust.md, "edged's measurements in a PCR")
    measurement_pcr: int | None = None
    measurement_log: Path = Path("/run/edged/measurements.json")


@dataclass(frozen=True, slots=True, kw_only=True)
class DiscoveryConfig:
    """``[discovery]``: accelerators (udev), health sampling, onnxruntime's providers."""

    enabled: bool = True
    health_period_s: float = parse_duration(_HEALTH_PERIOD_TEXT)
    execution_providers: tuple[str, ...] = ()  # empty: ask the workers' onnxruntime


@dataclass(frozen=True, slots=True, kw_only=True)
class HubLinkConfig:
    """``[hub]``: the hub's replicas (HOST:PORT), dialled in turn when one fails; empty: the
    addresses enrollment wrote (``<dataDir>/hub/link.json``)."""

    addresses: tuple[str, ...] = ()


MAX_HUB_ADDRESSES = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceConfig:
    """``[device]``: labels the operator sets on this device (merged with discovered ones)."""

    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScalingConfig:
    """``[scaling]``: how often workers are sampled for the autoscaler and eviction."""

    sample_period_s: float = parse_duration(_SAMPLE_PERIOD_TEXT)


@dataclass(frozen=True, slots=True, kw_only=True)
class EvictionConfig:
    """``[eviction]``: stop the lowest-priority replicas when memory runs short."""

    memory_available_floor: int = 0  # bytes; 0: eviction off
    hysteresis_percent: int = 10  # of the floor
    interval_s: float = parse_duration(_EVICTION_INTERVAL_TEXT)


@dataclass(frozen=True, slots=True, kw_only=True)
class PowerConfig:
    """``[power]``: the time zone of ``spec.power.schedule`` windows (an IANA name such as
    ``Europe/Berlin``; empty: the system's local time)."""

    time_zone: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class SecretsConfig:
    """``[secrets]``: where the values of Secrets the hub sends are written (docs/security.md).

    ``dir``: ``None`` = ``$RUNTIME_DIRECTORY/secrets`` under systemd, else
    ``/dev/shm/edged-<uid>-<hash of the data dir>``. It must be on a tmpfs (values never reach
    a disk) unless ``allow_non_tmpfs``, which is for tests and development only."""

    dir: Path | None = None
    allow_non_tmpfs: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgedConfig:
    """The whole edged config."""

    log_level: LogLevel = LogLevel.INFO
    paths: PathsConfig = PathsConfig()
    inference: InferenceConfig = InferenceConfig()
    reconcile: ReconcileConfig = ReconcileConfig()
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    trust: TrustConfig = TrustConfig()
    discovery: DiscoveryConfig = DiscoveryConfig()
    hub: HubLinkConfig = HubLinkConfig()
    device: DeviceConfig = field(default_factory=DeviceConfig)
    scaling: ScalingConfig = ScalingConfig()
    eviction: EvictionConfig = EvictionConfig()
    power: PowerConfig = PowerConfig()
    secrets: SecretsConfig = SecretsConfig()


# Converters


def _absolute_path(value: object) -> Path:
    text = as_str(value)
    if not text or not os.path.isabs(text):
        raise ValueError(f"must be an absolute path, got {describe(value)}")
    return Path(text)


def _keep_on_exit(value: object) -> KeepOnExit:
    if value == "auto":
        return "auto"
    if isinstance(value, bool):
        return value
    raise ValueError(f'must be "auto", true or false, got {describe(value)}')


def _cgroup_root(value: object) -> CgroupRoot:
    if value == "auto":
        return "auto"
    if value == "off":
        return "off"
    if isinstance(value, str) and os.path.isabs(value):
        return Path(value)
    raise ValueError(
        f'must be "auto", "off" or the absolute path of a cgroup v2 directory, '
        f"got {describe(value)}"
    )


def _listen_tcp(value: object) -> TcpAddress | None:
    if not as_str(value).strip():
        return None
    host, port = parse_host_port(value, example="127.0.0.1:8080")
    if host != "localhost":
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ValueError(
                "must be a loopback address (127.0.0.0/8, ::1 or localhost): inference is "
                f"served only to applications on this device, got {describe(value)}"
            )
    return TcpAddress(host, port)


_size = within(parse_memory, lambda v: "must be more than 0 bytes" if v <= 0 else None)


# Reading


def _socket_path(
    r: Reader, name: str, data_dir: Path, runtime_dir: Path | None, default_name: str
) -> Path:
    text = r.optional(name, as_str, "")
    # an absolute ``text`` replaces data_dir; no ``text``: the runtime directory if any
    path = data_dir / text if text else (runtime_dir or data_dir) / default_name
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH_BYTES:
        r.problems.add(
            r.at(name),
            f"{path} is {size} bytes long; a Unix socket path can have at most "
            f"{MAX_SOCKET_PATH_BYTES} (choose a shorter path or data directory)",
        )
    return path


def _read_paths(r: Reader, data_dir: Path | None, service: ServiceDirs) -> PathsConfig:
    configured = r.optional("dataDir", _absolute_path, service.state or DEFAULT_DATA_DIR)
    base = data_dir if data_dir is not None else configured
    run = service.runtime
    return PathsConfig(
        data_dir=base,
        status_socket=_socket_path(r, "statusSocket", base, run, STATUS_SOCKET_NAME),
        inference_socket=_socket_path(r, "inferenceSocket", base, run, INFERENCE_SOCKET_NAME),
    )


def _read_inference(r: Reader) -> InferenceConfig:
    default = InferenceConfig()
    return InferenceConfig(
        listen_tcp=r.optional("listenTcp", _listen_tcp, default.listen_tcp),
        max_request_bytes=r.optional("maxRequestBytes", _size, default.max_request_bytes),
        max_connections=r.optional("maxConnections", int_in(1, 1 << 20), default.max_connections),
        max_buffered_bytes=r.optional("maxBufferedBytes", _size, default.max_buffered_bytes),
        header_timeout_s=r.optional("headerTimeout", positive_duration, default.header_timeout_s),
        body_timeout_s=r.optional("bodyTimeout", positive_duration, default.body_timeout_s),
        idle_timeout_s=r.optional("idleTimeout", positive_duration, default.idle_timeout_s),
        metrics_period_s=r.optional("metricsPeriod", positive_duration, default.metrics_period_s),
        latency_window_s=r.optional("latencyWindow", positive_duration, default.latency_window_s),
        shared_memory_regions=r.optional(
            "sharedMemoryRegions", int_in(0, 4096), default.shared_memory_regions
        ),
        shared_memory_bytes=r.optional("sharedMemoryBytes", _size, default.shared_memory_bytes),
    )


def _read_reconcile(r: Reader) -> ReconcileConfig:
    default = ReconcileConfig()
    config = ReconcileConfig(
        resync_period_s=r.optional("resyncPeriod", positive_duration, default.resync_period_s),
        backoff_base_s=r.optional("backoffBase", positive_duration, default.backoff_base_s),
        backoff_max_s=r.optional("backoffMax", positive_duration, default.backoff_max_s),
        workers=r.optional("workers", int_in(1, 64), default.workers),
    )
    if config.backoff_base_s > config.backoff_max_s:
        r.problems.add(
            r.at("backoffBase"),
            f"must not exceed backoffMax ({format_duration(config.backoff_max_s)})",
        )
    return config


def _read_workers(r: Reader) -> WorkersConfig:
    default = WorkersConfig()
    python = r.optional("pythonExecutable", as_str, "")
    config = WorkersConfig(
        cgroup_root=r.optional("cgroupRoot", _cgroup_root, default.cgroup_root),
        python_executable=r.problems.convert(
            r.at("pythonExecutable"), python, _absolute_path, default.python_executable
        )
        if python
        else default.python_executable,
        sandbox=r.optional("sandbox", _one_of_text(SANDBOX_MODES), default.sandbox),
        seccomp=r.optional("seccomp", as_bool, default.seccomp),
        separate_uids=r.optional("separateUids", as_bool, default.separate_uids),
        uid_base=r.optional("uidBase", int_in(1000, 2**31 - 2), default.uid_base),
        uid_count=r.optional("uidCount", int_in(1, 1 << 20), default.uid_count),
        keep_on_exit=r.optional("keepOnExit", _keep_on_exit, default.keep_on_exit),
        orphan_timeout_s=r.optional("orphanTimeout", positive_duration, default.orphan_timeout_s),
    )
    if config.uid_base + config.uid_count - 1 > 2**31 - 1:
        r.problems.add(
            r.at("uidCount"),
            f"uidBase + uidCount - 1 must be at most {2**31 - 1}, got "
            f"{config.uid_base + config.uid_count - 1}",
        )
    return config


def _one_of_text(choices: tuple[str, ...]) -> Callable[[object], str]:
    def convert(value: object) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")
        return str(value)

    return convert


def _tpm(value: object) -> str:
    text = as_str(value).strip()
    if not text:
        raise ValueError('must be "auto", "off" or a TCTI string such as "device:/dev/tpmrm0"')
    return text


def _read_trust(r: Reader) -> TrustConfig:
    default = TrustConfig()
    return TrustConfig(
        allow_unsigned=r.optional("allowUnsigned", as_bool, False),
        root_file=r.optional("rootFile", _absolute_path, default.root_file),
        tpm=r.optional("tpm", _tpm, default.tpm),
        require_tuf=r.optional("requireTuf", as_bool, False),
        measurement_pcr=r.optional("measurementPcr", _measurement_pcr, None),
        measurement_log=r.optional("measurementLog", _absolute_path, default.measurement_log),
    )


def _measurement_pcr(value: object) -> int | None:
    if value == "off":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 8 <= value <= 15:
        raise ValueError(
            'must be "off" or a PCR index 8-15 (reset only by a reboot; one the image\'s boot '
            f"chain does not use), got {value!r}"
        )
    return value


_provider_name = matching(
    r"[A-Za-z][A-Za-z0-9_]*ExecutionProvider",
    'an ONNX Runtime execution provider such as "CUDAExecutionProvider"',
)


def _read_discovery(r: Reader) -> DiscoveryConfig:
    default = DiscoveryConfig()
    return DiscoveryConfig(
        enabled=r.optional("enabled", as_bool, default.enabled),
        health_period_s=r.optional("healthPeriod", positive_duration, default.health_period_s),
        execution_providers=tuple(
            r.list_of("executionProviders", _provider_name, unique=True) or ()
        ),
    )


def _read_hub(r: Reader) -> HubLinkConfig:
    addresses = r.list_of("addresses", host_port, unique=True) or []
    if len(addresses) > MAX_HUB_ADDRESSES:
        r.problems.add(r.at("addresses"), f"at most {MAX_HUB_ADDRESSES} addresses")
    return HubLinkConfig(addresses=tuple(addresses[:MAX_HUB_ADDRESSES]))


def _read_device(r: Reader) -> DeviceConfig:
    return DeviceConfig(labels=r.string_map("labels", label_key, label_value) or {})


_sample_period = within(
    parse_duration,
    lambda v: "must be between 100ms and 1m" if not 0.1 <= v <= 60 else None,
)
_floor = within(parse_memory, lambda v: "must be at most 1Ti" if v > 1 << 40 else None)


def _read_scaling(r: Reader) -> ScalingConfig:
    return ScalingConfig(
        sample_period_s=r.optional("samplePeriod", _sample_period, ScalingConfig().sample_period_s)
    )


def _read_eviction(r: Reader) -> EvictionConfig:
    default = EvictionConfig()
    return EvictionConfig(
        memory_available_floor=r.optional(
            "memoryAvailableFloor", _floor, default.memory_available_floor
        ),
        hysteresis_percent=r.optional("hysteresis", parse_percent, default.hysteresis_percent),
        interval_s=r.optional("interval", positive_duration, default.interval_s),
    )


def _time_zone(value: object) -> str:
    text = as_str(value)
    if text == "":
        return ""
    try:
        if len(text) > 64:
            raise ValueError(text)
        ZoneInfo(text)
    except (ValueError, ZoneInfoNotFoundError, OSError):
        raise ValueError(
            f'must be an IANA time zone name such as "Europe/Berlin" (or "" for the '
            f"system's), got {describe(value)}"
        ) from None
    return text


def _read_power(r: Reader) -> PowerConfig:
    return PowerConfig(time_zone=r.optional("timeZone", _time_zone, ""))


def _read_secrets(r: Reader) -> SecretsConfig:
    text = r.optional("dir", as_str, "")
    return SecretsConfig(
        dir=r.problems.convert(r.at("dir"), text, _absolute_path, None) if text else None,
        allow_non_tmpfs=r.optional("allowNonTmpfs", as_bool, False),
    )


def _reader(data_dir: Path | None, service: ServiceDirs) -> Callable[[Reader], EdgedConfig]:
    """Reads the whole file (every table through :func:`~edgefleet.configfiles.table`: an
    absent one takes every default)."""

    def read(r: Reader) -> EdgedConfig:
        return EdgedConfig(
            log_level=r.optional("logLevel", one_of(LogLevel), LogLevel.INFO),
            paths=_read_paths(table(r, "paths"), data_dir, service),
            inference=_read_inference(table(r, "inference")),
            reconcile=_read_reconcile(table(r, "reconcile")),
            workers=_read_workers(table(r, "workers")),
            trust=_read_trust(table(r, "trust")),
            discovery=_read_discovery(table(r, "discovery")),
            hub=_read_hub(table(r, "hub")),
            device=_read_device(table(r, "device")),
            scaling=_read_scaling(table(r, "scaling")),
            eviction=_read_eviction(table(r, "eviction")),
            power=_read_power(table(r, "power")),
            secrets=_read_secrets(table(r, "secrets")),
        )

    return read


def parse_config(
    doc: Mapping[str, Any],
    *,
    source: str = "",
    data_dir: Path | None = None,
    service: ServiceDirs = ServiceDirs(),
) -> EdgedConfig:
    """The config of a decoded TOML document; ``data_dir`` overrides ``paths.dataDir``;
    ``service`` (systemd's directories) supplies the path defaults when set."""
    return parse_config_document(doc, _reader(data_dir, service), source=source)


def load_config(
    path: Path | None, *, data_dir: Path | None = None, service: ServiceDirs = ServiceDirs()
) -> EdgedConfig:
    """The config in ``path`` (defaults when ``None``); ``data_dir`` overrides ``paths.dataDir``."""
    if path is None:
        return parse_config({}, source="defaults", data_dir=data_dir, service=service)
    return load_config_file(path, _reader(data_dir, service))


def default_config_text() -> str:
    """A commented ``edged.toml`` that sets every key to its default."""
    return f"""\
# edged.toml: the configuration of edged, the edgefleet device daemon.
# Every key is optional; the values below are the defaults.

# debug | info | warning | error
logLevel = "{LogLevel.INFO.value}"

[paths]
# State and verified artifacts. `edged run --data-dir` overrides it. Under systemd the
# default is $STATE_DIRECTORY (StateDirectory=edged: {DEFAULT_DATA_DIR}).
dataDir = "{DEFAULT_DATA_DIR}"
# The status socket (HTTP). Empty: <dataDir>/{STATUS_SOCKET_NAME}, or under systemd
# $RUNTIME_DIRECTORY/{STATUS_SOCKET_NAME} (RuntimeDirectory=edged: {DEFAULT_RUNTIME_DIR}).
# Relative paths are under dataDir.
statusSocket = ""
# The inference socket (Open Inference Protocol). Empty: <dataDir>/{INFERENCE_SOCKET_NAME},
# or under systemd $RUNTIME_DIRECTORY/{INFERENCE_SOCKET_NAME}.
inferenceSocket = ""

[inference]
# Also serve inference over TCP, e.g. "127.0.0.1:8080". Loopback addresses only. Empty: off.
listenTcp = ""
# The largest request body accepted: a size such as "64Mi", "1G" or a number of bytes.
# An infer request is also held to what its model's inputs can take (maxBatchSize rows of
# them, as JSON) and to 1/64 of the replica's memory limit.
maxRequestBytes = "{_MAX_REQUEST_TEXT}"
# Connections to the inference socket (and TCP address) at once. At the cap the longest-idle
# connection (idle for 1s at least) is closed for a new one; with none, the new one gets 503.
# edged raises its open-files limit to the hard limit and lowers this cap if that is too low.
maxConnections = {InferenceConfig().max_connections}
# Request bodies being read at once, all connections together; beyond: 503.
maxBufferedBytes = "{_MAX_BUFFERED_TEXT}"
# A request's headers must arrive within headerTimeout of its first byte, its body within
# bodyTimeout of its headers (else 408); a connection with nothing asked closes after
# idleTimeout.
headerTimeout = "{_HEADER_TIMEOUT_TEXT}"
bodyTimeout = "{_BODY_TIMEOUT_TEXT}"
idleTimeout = "{_IDLE_TIMEOUT_TEXT}"
# What each revision answered (requests, errors, latency p95 over latencyWindow) is reported
# to the hub for canary analysis, refreshed at most every metricsPeriod.
metricsPeriod = "{_METRICS_PERIOD_TEXT}"
latencyWindow = "{_LATENCY_WINDOW_TEXT}"
# The system shared-memory extension (docs/edged.md): regions each client uid may register
# at once (0 turns the extension off), and their bytes together.
sharedMemoryRegions = {InferenceConfig().shared_memory_regions}
sharedMemoryBytes = "1Gi"

[reconcile]
# Check everything this often, even when no event says something changed.
resyncPeriod = "{_RESYNC_TEXT}"
# A failed action is retried after backoffBase, doubling each time up to backoffMax.
backoffBase = "{_BACKOFF_BASE_TEXT}"
backoffMax = "{_BACKOFF_MAX_TEXT}"
# Deployments reconciled at the same time (1 to 64).
workers = {ReconcileConfig().workers}

[workers]
# Resource limits of inference workers: "auto" (use the cgroup v2 subtree delegated to edged,
# if any), "off", or the absolute path of a delegated cgroup v2 directory.
cgroupRoot = "auto"
# The Python interpreter that runs inference workers. Empty: the one running edged.
pythonExecutable = ""
# Each worker confines itself before it loads its model (docs/security.md): "landlock" reads
# only its artifact and the runtime's libraries, no TCP but what spec.network allows; "off"
# (a SecurityBaseline with requireSandbox overrides it). A kernel without Landlock is reported
# in status, not fatal, unless a baseline requires the sandbox.
sandbox = "landlock"
# With the sandbox: a seccomp filter (no UDP/raw sockets, no ptrace, mount, bpf, ...).
seccomp = true
# When edged runs as root: each worker replica leaves root for a uid (and gid) of its own,
# taken from uidBase .. uidBase + uidCount - 1 (default 61184-65519, systemd's dynamic users,
# locked in /run/systemd/dynamic-uid as systemd does) and freed when it stops. false: workers
# run as edged's user (root) unless a baseline requires the sandbox. Ignored (said in status)
# when edged is not root: the packaged unit runs edged as user edged (docs/security.md).
separateUids = true
uidBase = {WorkersConfig().uid_base}
uidCount = {WorkersConfig().uid_count}
# Workers outlive edged's stop (an update, a crash, systemctl restart): the next edged adopts
# each one it can prove is what its record says (docs/agent-updates.md, "Workers outlive
# edged"). "auto": when systemd or edged's launcher runs edged; true; false: workers stop
# with edged, as before.
keepOnExit = "auto"
# A kept worker that no edged comes back for within this long exits by itself.
orphanTimeout = "{_ORPHAN_TIMEOUT_TEXT}"

[trust]
# Accept model artifacts without signed metadata. For development only: loud in status and logs.
allowUnsigned = false
# Admit the hub's artifacts only when a publisher's TUF targets list them (python-tuf's
# client: snapshot, timestamp, delegations), even before the hub first served TUF metadata.
# A device that once received a TUF root from its hub requires TUF from then on anyway.
requireTuf = false
# The fleet trust root from the device image: the device's anchor (edged enroll needs it, or
# --root-hash). The accepted root is kept in <dataDir>/trust/root.json; a newer root here is
# accepted only if the accepted root's keys signed it (rotation). See docs/trust.md.
rootFile = "{DEFAULT_TRUST_ROOT}"
# The TPM for attestation: "auto" (/dev/tpmrm0 if present and accessible), "off", or a TCTI
# string such as "device:/dev/tpmrm0" or "swtpm:host=127.0.0.1,port=2321". With a TPM,
# edged enroll makes an attestation key in it that the hub binds to the TPM's endorsement
# key, and every attestation answer carries a quote by it. The identity (TLS) key is the file
# <dataDir>/identity/key.pem either way.
tpm = "auto"
# With that attestation key: extend edged's code and config digests and each model in use
# into this PCR (8-15: reset only by a reboot; pick one the image's boot chain leaves alone)
# before quoting it, with an event log since boot that the hub replays. "off": not extended.
measurementPcr = "off"
# The event log of those extends; under /run so that it is cleared at reboot, like the PCR.
measurementLog = "/run/edged/measurements.json"

[discovery]
# Find accelerators through udev (and follow hotplug), sample health, publish device labels.
# Off: workloads get the execution providers their spec lists, unchecked.
enabled = true
# Sample health (RAM, CPU temperature, disk, uptime) this often; DeviceHealthPolicy documents
# in the manifests directory say when the device is schedulable.
healthPeriod = "{_HEALTH_PERIOD_TEXT}"
# The execution providers the workers' onnxruntime build offers, e.g.
# ["OpenVINOExecutionProvider", "CPUExecutionProvider"]. Empty: ask it once at start.
# A provider listed here that the build lacks makes workers fall back to CPU (they say so).
executionProviders = []

[hub]
# The hub's replicas, e.g. ["hub-a.example:7443", "hub-b.example:7443"]: the link stays on
# the one that works and dials the next when it fails. Empty: the addresses edged enroll
# wrote (those given with --hub and those the hub named when it enrolled this device).
addresses = []

[scaling]
# How often workers are sampled (requests in flight, CPU, memory) for spec.scaling and for
# eviction; only while some workload has spec.scaling or memoryAvailableFloor is set.
samplePeriod = "{_SAMPLE_PERIOD_TEXT}"

[eviction]
# When MemAvailable falls below this, replicas are stopped, lowest spec.priority first, one
# per interval, never one of the highest priority running. "0": off.
memoryAvailableFloor = "0"
# They start again, highest priority first, one per interval, once MemAvailable is above the
# floor by this share of it plus what one replica of theirs was seen to use.
hysteresis = "10%"
interval = "{_EVICTION_INTERVAL_TEXT}"

[power]
# The time zone of spec.power.schedule windows, an IANA name such as "Europe/Berlin".
# Empty: the system's local time.
timeZone = ""


[secrets]
# Where the values of the Secrets this device's workloads mount are written, one directory
# per workload that only its workers may read (Landlock). Empty: $RUNTIME_DIRECTORY/secrets
# under systemd, else /dev/shm/edged-<uid>-<hash of the data directory>. It must be a tmpfs.
dir = ""
# Write them to a directory that is not a tmpfs (values on disk): tests and development only.
allowNonTmpfs = false

[device.labels]
# Labels of this device, merged over the discovered ones (arch, accelerator...), e.g.
# site = "retail-042". Labels set at enrollment (<dataDir>/labels.json) win over these.
"""
