"""Reading config files: TOML with every problem reported as a ConfigError, and the value
converters that edged.toml, hub.toml and admin.toml share (durations, HOST:PORT)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from edgefleet.api.quantities import describe, parse_duration
from edgefleet.api.validating import as_str, within
from edgefleet.errors import ConfigError, Problem

positive_duration = within(parse_duration, lambda v: "must be more than 0s" if v <= 0 else None)


def read_toml_file(path: Path, *, hint: str = "") -> dict[str, Any]:
    """A TOML file as a document; ConfigError (unreadable, not UTF-8, invalid TOML) otherwise.
    Shared by every config file of the project (edged.toml, hub.toml, admin.toml)."""
    source = str(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError([Problem("", f"cannot read: {reason}{hint}")], source=source) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError([Problem("", "is not UTF-8 text")], source=source) from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([Problem("", f"invalid TOML: {exc}")], source=source) from exc


def parse_host_port(value: object) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:7443`` for IPv6) -> (host, port); ValueError says what is wrong."""
    text = as_str(value).strip()
    expected = f'must be HOST:PORT such as "0.0.0.0:7443", got {describe(value)}'
    host, colon, port_text = text.rpartition(":")
    if not colon or not host or not port_text.isdigit():
        raise ValueError(expected)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"must have a port from 0 to 65535, got {describe(value)}")
    return host, port
