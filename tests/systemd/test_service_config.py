"""The packaged default config (packaging/config/edged.toml) and the path defaults that systemd's
StateDirectory=/RuntimeDirectory= supply."""

from __future__ import annotations

import tomllib
from pathlib import Path

from edged.config import (
    DEFAULT_DATA_DIR,
    EdgedConfig,
    ServiceDirs,
    default_config_text,
    load_config,
    parse_config,
)

PACKAGED = Path(__file__).parents[2] / "packaging" / "config" / "edged.toml"
REGENERATE = (
    "python -c 'from edged.config import default_config_text; "
    'print(default_config_text(), end="")\' > packaging/config/edged.toml'
)


def test_packaged_config_is_the_generated_default() -> None:
    assert PACKAGED.read_text() == default_config_text(), f"regenerate it: {REGENERATE}"
    assert parse_config(tomllib.loads(PACKAGED.read_text())) == EdgedConfig()


def test_service_dirs_come_from_systemd_environment() -> None:
    env = {"STATE_DIRECTORY": "/var/lib/edged", "RUNTIME_DIRECTORY": "/run/edged:/run/other"}
    assert ServiceDirs.from_environ(env) == ServiceDirs(
        state=Path("/var/lib/edged"), runtime=Path("/run/edged")
    )
    assert ServiceDirs.from_environ({}) == ServiceDirs()
    assert ServiceDirs.from_environ({"STATE_DIRECTORY": "relative"}) == ServiceDirs()


def test_under_systemd_sockets_default_to_the_runtime_directory() -> None:
    service = ServiceDirs(state=Path("/var/lib/x"), runtime=Path("/run/edged"))
    paths = parse_config({}, service=service).paths
    assert paths.data_dir == Path("/var/lib/x")
    assert paths.status_socket == Path("/run/edged/edged.sock")
    assert paths.inference_socket == Path("/run/edged/infer.sock")


def test_the_packaged_config_under_systemd_uses_var_lib_and_run() -> None:
    service = ServiceDirs(state=Path("/var/lib/edged"), runtime=Path("/run/edged"))
    paths = load_config(PACKAGED, data_dir=DEFAULT_DATA_DIR, service=service).paths
    assert paths.data_dir == Path("/var/lib/edged")
    assert paths.status_socket == Path("/run/edged/edged.sock")


def test_explicit_paths_win_over_systemd_directories(tmp_path: Path) -> None:
    service = ServiceDirs(state=Path("/var/lib/edged"), runtime=Path("/run/edged"))
    doc = {"paths": {"dataDir": "/srv/edged", "statusSocket": "s.sock"}}
    paths = parse_config(doc, service=service).paths
    assert paths.data_dir == Path("/srv/edged")
    assert paths.status_socket == Path("/srv/edged/s.sock")
    assert paths.inference_socket == Path("/run/edged/infer.sock")
    assert parse_config({}, data_dir=tmp_path, service=service).paths.data_dir == tmp_path
