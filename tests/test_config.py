"""edged's config file: defaults, every problem with its key path, the default text.

Real TOML files in pytest's tmp_path; nothing faked.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from edged.config import (
    DEFAULT_DATA_DIR,
    EdgedConfig,
    LogLevel,
    TcpAddress,
    default_config_text,
    load_config,
    parse_config,
)
from edgefleet.errors import ConfigError


def problems_of(doc: dict[str, Any], **kwargs: Any) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_config(doc, source="edged.toml", **kwargs)
    assert info.value.source == "edged.toml"
    return {p.path: p.message for p in info.value.problems}


def test_defaults() -> None:
    config = load_config(None)
    assert config == parse_config({})
    assert config.log_level is LogLevel.INFO
    assert config.paths.data_dir == DEFAULT_DATA_DIR
    assert config.paths.status_socket == DEFAULT_DATA_DIR / "edged.sock"
    assert config.paths.inference_socket == DEFAULT_DATA_DIR / "infer.sock"
    assert config.inference.listen_tcp is None
    assert config.inference.max_request_bytes == 64 * 2**20
    assert config.reconcile.resync_period_s == 60.0
    assert config.reconcile.backoff_base_s == 0.05
    assert config.reconcile.backoff_max_s == 300.0
    assert config.reconcile.workers == 4
    assert config.workers.cgroup_root == "auto"
    assert config.workers.python_executable == Path(sys.executable)
    assert config.workers.separate_uids is True
    assert (config.workers.uid_base, config.workers.uid_count) == (61184, 4336)  # to 65519
    assert config.trust.allow_unsigned is False
    assert config == EdgedConfig()


def test_default_text_parses_to_the_defaults(tmp_path: Path) -> None:
    text = default_config_text()
    assert parse_config(tomllib.loads(text)) == EdgedConfig()
    path = tmp_path / "edged.toml"
    path.write_text(text)
    assert load_config(path) == load_config(None)


def test_default_text_names_every_key() -> None:
    doc = tomllib.loads(default_config_text())
    assert set(doc) == {
        "logLevel",
        "paths",
        "inference",
        "reconcile",
        "workers",
        "trust",
        "discovery",
        "hub",
        "device",
        "scaling",
        "eviction",
        "power",
        "secrets",
    }
    assert set(doc["hub"]) == {"addresses"}
    assert set(doc["discovery"]) == {"enabled", "healthPeriod", "executionProviders"}
    assert set(doc["reconcile"]) == {"resyncPeriod", "backoffBase", "backoffMax", "workers"}


def test_a_full_config(tmp_path: Path) -> None:
    path = tmp_path / "edged.toml"
    path.write_text(
        'logLevel = "debug"\n'
        "[paths]\n"
        'dataDir = "/srv/edged"\n'
        'statusSocket = "/run/edged/status.sock"\n'
        'inferenceSocket = "sockets/infer.sock"\n'
        "[inference]\n"
        'listenTcp = "127.0.0.1:8080"\n'
        "maxRequestBytes = 1048576\n"
        "maxConnections = 200\n"
        'maxBufferedBytes = "32Mi"\n'
        'headerTimeout = "5s"\n'
        'bodyTimeout = "20s"\n'
        'idleTimeout = "2m"\n'
        "[reconcile]\n"
        'resyncPeriod = "2m"\n'
        "backoffBase = 0.1\n"
        'backoffMax = "30s"\n'
        "workers = 8\n"
        "[workers]\n"
        'cgroupRoot = "/sys/fs/cgroup/edged.slice/workers"\n'
        'pythonExecutable = "/opt/venv/bin/python"\n'
        "[trust]\n"
        "allowUnsigned = true\n"
    )
    config = load_config(path)
    assert config.log_level is LogLevel.DEBUG
    assert config.paths.data_dir == Path("/srv/edged")
    assert config.paths.status_socket == Path("/run/edged/status.sock")
    assert config.paths.inference_socket == Path("/srv/edged/sockets/infer.sock")
    assert config.inference.listen_tcp == TcpAddress("127.0.0.1", 8080)
    assert config.inference.max_request_bytes == 2**20
    assert (config.inference.max_connections, config.inference.max_buffered_bytes) == (
        200,
        32 * 2**20,
    )
    assert (
        config.inference.header_timeout_s,
        config.inference.body_timeout_s,
        config.inference.idle_timeout_s,
    ) == (5.0, 20.0, 120.0)
    assert (config.reconcile.resync_period_s, config.reconcile.backoff_base_s) == (120.0, 0.1)
    assert (config.reconcile.backoff_max_s, config.reconcile.workers) == (30.0, 8)
    assert config.workers.cgroup_root == Path("/sys/fs/cgroup/edged.slice/workers")
    assert config.workers.python_executable == Path("/opt/venv/bin/python")
    assert config.trust.allow_unsigned is True


def test_data_dir_argument_overrides_the_file_and_moves_default_sockets(tmp_path: Path) -> None:
    path = tmp_path / "edged.toml"
    path.write_text('[paths]\ndataDir = "/srv/edged"\n')
    config = load_config(path, data_dir=tmp_path / "d")
    assert config.paths.data_dir == tmp_path / "d"
    assert config.paths.status_socket == tmp_path / "d" / "edged.sock"
    assert config.paths.inference_socket == tmp_path / "d" / "infer.sock"
    assert load_config(None, data_dir=tmp_path).paths.status_socket == tmp_path / "edged.sock"


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:8080", TcpAddress("127.0.0.1", 8080)),
        ("127.1.2.3:1", TcpAddress("127.1.2.3", 1)),
        ("[::1]:8080", TcpAddress("::1", 8080)),
        ("localhost:0", TcpAddress("localhost", 0)),
        ("", None),
    ],
)
def test_loopback_tcp_addresses(address: str, expected: TcpAddress | None) -> None:
    assert parse_config({"inference": {"listenTcp": address}}).inference.listen_tcp == expected


def test_tcp_address_text() -> None:
    assert str(TcpAddress("::1", 80)) == "[::1]:80"
    assert str(TcpAddress("127.0.0.1", 80)) == "127.0.0.1:80"


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("0.0.0.0:8080", "must be a loopback address (127.0.0.0/8, ::1 or localhost)"),
        ("192.168.1.5:8080", "loopback"),
        ("[::]:8080", "loopback"),
        ("example.com:80", "loopback"),
        ("127.0.0.1", "HOST:PORT"),
        ("127.0.0.1:http", "HOST:PORT"),
        (":8080", "HOST:PORT"),
        ("127.0.0.1:70000", "0 to 65535"),
    ],
)
def test_non_loopback_or_bad_tcp_addresses(address: str, message: str) -> None:
    found = problems_of({"inference": {"listenTcp": address}})
    assert message in found["inference.listenTcp"]
    assert f'got "{address}"' in found["inference.listenTcp"]


@pytest.mark.parametrize(
    ("doc", "path", "message"),
    [
        ({"logLevel": "verbose"}, "logLevel", 'one of debug, info, warning, error, got "verbose"'),
        ({"paths": {"dataDir": "relative/dir"}}, "paths.dataDir", "absolute path"),
        ({"paths": {"dataDir": 5}}, "paths.dataDir", "must be a string, got 5"),
        ({"paths": "x"}, "paths", 'must be a mapping, got "x"'),
        ({"paths": {"statusSocket": "/" + "s" * 120}}, "paths.statusSocket", "at most 107"),
        ({"inference": {"maxRequestBytes": "lots"}}, "inference.maxRequestBytes", "memory"),
        ({"inference": {"maxRequestBytes": 0}}, "inference.maxRequestBytes", "more than 0"),
        ({"inference": {"maxConnections": 0}}, "inference.maxConnections", "from 1 to"),
        ({"inference": {"maxBufferedBytes": "x"}}, "inference.maxBufferedBytes", "memory"),
        ({"inference": {"headerTimeout": "0s"}}, "inference.headerTimeout", "more than 0s"),
        ({"inference": {"bodyTimeout": "later"}}, "inference.bodyTimeout", "duration"),
        ({"inference": {"idleTimeout": -1}}, "inference.idleTimeout", "duration"),
        ({"reconcile": {"resyncPeriod": "soon"}}, "reconcile.resyncPeriod", "duration"),
        ({"reconcile": {"resyncPeriod": "0s"}}, "reconcile.resyncPeriod", "more than 0s"),
        ({"reconcile": {"workers": 0}}, "reconcile.workers", "from 1 to 64, got 0"),
        ({"reconcile": {"workers": "4"}}, "reconcile.workers", 'integer, got "4"'),
        (
            {"reconcile": {"backoffBase": "10s", "backoffMax": "1s"}},
            "reconcile.backoffBase",
            "must not exceed backoffMax (1s)",
        ),
        ({"workers": {"cgroupRoot": "on"}}, "workers.cgroupRoot", '"auto", "off" or'),
        ({"workers": {"pythonExecutable": "python3"}}, "workers.pythonExecutable", "absolute"),
        ({"workers": {"separateUids": "no"}}, "workers.separateUids", "true or false"),
        ({"workers": {"uidBase": 0}}, "workers.uidBase", "from 1000 to"),
        ({"workers": {"uidCount": 0}}, "workers.uidCount", "from 1 to"),
        ({"workers": {"keepOnExit": "yes"}}, "workers.keepOnExit", '"auto", true or false'),
        ({"workers": {"orphanTimeout": "0s"}}, "workers.orphanTimeout", "more than 0s"),
        ({"workers": {"uidBase": 2**31 - 10, "uidCount": 20}}, "workers.uidCount", "at most"),
        ({"trust": {"allowUnsigned": "yes"}}, "trust.allowUnsigned", "true or false"),
        ({"trust": {"rootFile": "root.json"}}, "trust.rootFile", "absolute path"),
        ({"trust": {"tpm": ""}}, "trust.tpm", "TCTI"),
        ({"scaling": {"samplePeriod": "10ms"}}, "scaling.samplePeriod", "between 100ms and 1m"),
        ({"scaling": {"samplePeriod": "soon"}}, "scaling.samplePeriod", "duration"),
        ({"eviction": {"memoryAvailableFloor": "lots"}}, "eviction.memoryAvailableFloor", "memory"),
        ({"eviction": {"memoryAvailableFloor": "2Ti"}}, "eviction.memoryAvailableFloor", "1Ti"),
        ({"eviction": {"hysteresis": "150%"}}, "eviction.hysteresis", "0% to 100%"),
        ({"eviction": {"interval": "0s"}}, "eviction.interval", "more than 0s"),
    ],
)
def test_bad_values(doc: dict[str, Any], path: str, message: str) -> None:
    found = problems_of(doc)
    assert list(found) == [path]
    assert message in found[path]


def test_unknown_keys_at_every_level_with_suggestions() -> None:
    found = problems_of(
        {
            "loglevel": "info",
            "reconcile": {"resyncPerod": "60s"},
            "paths": {"dataDirectory": "/x"},
            "extra": {"a": 1},
        }
    )
    assert found == {
        "loglevel": 'unknown field (did you mean "logLevel"?)',
        "reconcile.resyncPerod": 'unknown field (did you mean "resyncPeriod"?)',
        "paths.dataDirectory": 'unknown field (did you mean "dataDir"?)',
        "extra": "unknown field",
    }


def test_every_problem_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "edged.toml"
    path.write_text(
        'logLevel = "loud"\n[inference]\nlistenTcp = "0.0.0.0:80"\n[reconcile]\nworkers = 100\n'
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.source == str(path)
    assert [p.path for p in info.value.problems] == [
        "logLevel",
        "inference.listenTcp",
        "reconcile.workers",
    ]
    assert str(info.value).startswith(f"{path}: 3 problems:\n  - logLevel: ")


def test_long_data_dir_argument_is_reported_at_the_socket() -> None:
    found = problems_of({}, data_dir=Path("/" + "d" * 100))
    assert set(found) == {"paths.statusSocket", "paths.inferenceSocket"}


def test_toml_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "edged.toml"
    path.write_text("[reconcile]\nworkers = \n")
    with pytest.raises(ConfigError, match=r"invalid TOML: .*line 2") as info:
        load_config(path)
    assert info.value.source == str(path)


def test_unreadable_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_bytes(b'logLevel = "\xff"\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(tmp_path / "bad.toml")


def test_discovery_and_device_sections() -> None:
    config = parse_config(
        {
            "discovery": {
                "enabled": False,
                "healthPeriod": "5s",
                "executionProviders": ["OpenVINOExecutionProvider", "CPUExecutionProvider"],
            },
            "device": {"labels": {"site": "retail-042"}},
        }
    )
    assert config.discovery.enabled is False
    assert config.discovery.health_period_s == 5.0
    assert config.discovery.execution_providers == (
        "OpenVINOExecutionProvider",
        "CPUExecutionProvider",
    )
    assert dict(config.device.labels) == {"site": "retail-042"}


def test_discovery_problems_have_paths() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(
            {
                "discovery": {"healthPeriod": "0s", "executionProviders": ["Cuda"], "enable": 1},
                "device": {"labels": {"bad key!": "x"}},
            }
        )
    paths = sorted(p.path for p in exc.value.problems)
    assert paths == [
        'device.labels["bad key!"]',
        "discovery.enable",
        "discovery.executionProviders[0]",
        "discovery.healthPeriod",
    ]


def test_scaling_and_eviction_sections() -> None:
    config = parse_config(
        {
            "scaling": {"samplePeriod": "250ms"},
            "eviction": {"memoryAvailableFloor": "256Mi", "hysteresis": "20%", "interval": "2s"},
        }
    )
    assert config.scaling.sample_period_s == 0.25
    assert config.eviction.memory_available_floor == 256 << 20
    assert (config.eviction.hysteresis_percent, config.eviction.interval_s) == (20, 2.0)
    assert EdgedConfig().eviction.memory_available_floor == 0  # off by default


def test_hub_reschedule_after_defaults_to_at_least_the_grace_and_is_checked() -> None:
    from edgefleet.errors import ConfigError
    from hub.config import parse_config

    assert parse_config({}).devices.reschedule_after_s == 300.0
    long_grace = parse_config({"devices": {"heartbeatGrace": "10m"}})
    assert long_grace.devices.reschedule_after_s == 600.0
    fast = {"heartbeatInterval": "1s", "heartbeatGrace": "3s", "rescheduleAfter": "4s"}
    assert parse_config({"devices": fast}).devices.reschedule_after_s == 4.0
    with pytest.raises(ConfigError, match="rescheduleAfter: must be at least heartbeatGrace"):
        parse_config({"devices": {**fast, "rescheduleAfter": "2s"}})


def test_hub_tuf_lifetimes_are_bounded_and_named_in_errors() -> None:
    from edgefleet.errors import ConfigError
    from hub.config import parse_config

    default = parse_config({}).tuf
    assert (default.timestamp_lifetime_s, default.snapshot_lifetime_s) == (3600.0, 7 * 86400.0)
    long = parse_config({"tuf": {"timestampLifetime": "168h", "snapshotLifetime": "168h"}})
    assert long.tuf.timestamp_lifetime_s == long.tuf.snapshot_lifetime_s == 7 * 86400.0
    for doc, message in (
        ({"timestampLifetime": "1m"}, 'tuf.timestampLifetime: must be from "5m" to "720h"'),
        ({"timestampLifetime": "721h"}, 'tuf.timestampLifetime: must be from "5m" to "720h"'),
        (
            {"timestampLifetime": "2h", "snapshotLifetime": "1h"},
            'tuf.snapshotLifetime: must be from timestampLifetime \\("2h"\\)',
        ),
        ({"snapshotLifetime": "9000h"}, "tuf.snapshotLifetime: must be from"),
        ({"timestampLifetime": "an hour"}, "tuf.timestampLifetime: must be a duration"),
        ({"lifetime": "1h"}, "tuf.lifetime"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_config({"tuf": doc})


def test_hub_addresses_are_host_ports_each_once() -> None:
    config = parse_config({"hub": {"addresses": ["hub-a.example:7443", "10.0.0.2:7443"]}})
    assert config.hub.addresses == ("hub-a.example:7443", "10.0.0.2:7443")
    assert parse_config({}).hub.addresses == ()
    with pytest.raises(ConfigError) as info:
        parse_config({"hub": {"addresses": ["hub-a.example:7443", "hub-a", "hub-a.example:7443"]}})
    text = str(info.value)
    assert "hub.addresses[1]" in text and "hub.addresses[2]" in text


def test_link_json_keeps_every_replica_address(tmp_path: Path) -> None:
    import orjson

    from edged.hublink.files import LinkFiles

    files = LinkFiles(tmp_path)
    files.dir.mkdir(parents=True)
    files.link.write_bytes(
        orjson.dumps({"hub": "a:7443", "hubs": ["a:7443", "b:7443"], "deviceName": "d"})
    )
    assert files.load().addresses == ("a:7443", "b:7443")
    files.link.write_bytes(orjson.dumps({"hub": "a:7443", "deviceName": "d"}))  # older edged
    assert files.load().addresses == ("a:7443",)
    files.link.write_bytes(orjson.dumps({"hub": "a:7443", "hubs": ["b"], "deviceName": "d"}))
    with pytest.raises(Exception, match="not a hub link"):
        files.load()


def test_keep_on_exit_auto_means_under_systemd_or_the_launcher() -> None:
    auto = parse_config({}).workers
    assert auto.keep_on_exit == "auto" and auto.orphan_timeout_s == 300.0
    assert not auto.keeps_workers({})
    assert not auto.keeps_workers({"INVOCATION_ID": "0123"})  # a desktop terminal has one
    assert auto.keeps_workers({"NOTIFY_SOCKET": "/run/systemd/notify"})
    off = parse_config({"workers": {"keepOnExit": False, "orphanTimeout": "30s"}}).workers
    assert not off.keeps_workers({"NOTIFY_SOCKET": "/n"}) and off.orphan_timeout_s == 30.0
    assert parse_config({"workers": {"keepOnExit": True}}).workers.keeps_workers({})
