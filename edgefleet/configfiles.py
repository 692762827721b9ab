"""Reading config files, the one way edged.toml, hub.toml and admin.toml are read.

* :func:`load_config_file` / :func:`parse_config_document`: a TOML file, then its tables read
  with :class:`~edgefleet.api.validating.Reader` s, every problem (unreadable file, invalid TOML,
  bad or unknown fields with their paths) reported at once as one
  :class:`~edgefleet.errors.ConfigError`::

      def read(r: Reader) -> MyConfig:
          return MyConfig(
              listen=r.optional("listen", host_port, "0.0.0.0:7443"),
              tokens=read_tokens(table(r, "tokens")),  # an absent table: every default
          )

      config = load_config_file(path, read)

* The value converters the files share: :data:`positive_duration`, :func:`parse_host_port` and
  :func:`host_port`; and the same values given on a command line (:func:`duration_option`,
  :func:`address_option`, for argparse's ``type=``).
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from edgefleet.api.quantities import describe, parse_duration
from edgefleet.api.validating import Problems, Reader, as_str, within
from edgefleet.errors import ConfigError, Problem

T = TypeVar("T")

positive_duration = within(parse_duration, lambda v: "must be more than 0s" if v <= 0 else None)


def read_toml_file(path: Path, *, hint: str = "") -> dict[str, Any]:
    """A TOML file as a document; ConfigError (unreadable, not UTF-8, invalid TOML) otherwise.
    ``hint`` is added to "cannot read" (how to point at another file)."""
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


def parse_config_document(
    doc: Mapping[str, Any], read: Callable[[Reader], T], *, source: str = ""
) -> T:
    """``read`` (given a reader of the top-level table) applied to a decoded document; a
    ConfigError naming ``source`` with every problem found, unknown fields included."""
    problems = Problems()
    config = read(problems.reader(doc) or problems.empty_reader(""))
    problems.raise_if_any(ConfigError, source=source)
    return config


def load_config_file(path: Path, read: Callable[[Reader], T], *, hint: str = "") -> T:
    """:func:`read_toml_file`, then :func:`parse_config_document`."""
    return parse_config_document(read_toml_file(path, hint=hint), read, source=str(path))


def table(parent: Reader, name: str) -> Reader:
    """The reader of table ``name`` of ``parent``; when it is absent (or, with a problem, not a
    table) a reader of an empty one, so that every field takes its default."""
    return parent.section(name) or parent.problems.empty_reader(parent.at(name))


# -- values -------------------------------------------------------------------------------------


def parse_host_port(value: object, *, example: str = "0.0.0.0:7443") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:7443`` for IPv6) -> (host, port); ValueError says what is wrong
    (with ``example`` as what a good one looks like)."""
    text = as_str(value).strip()
    expected = f'must be HOST:PORT such as "{example}", got {describe(value)}'
    host, colon, port_text = text.rpartition(":")
    if not colon or not host or not port_text.isdigit():
        raise ValueError(expected)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"must have a port from 0 to 65535, got {describe(value)}")
    return host, port


def host_port(value: object) -> str:
    """A converter: ``HOST:PORT`` checked by :func:`parse_host_port`, as text (stripped)."""
    parse_host_port(value)
    return as_str(value).strip()


# -- the same values on a command line (argparse ``type=``) --------------------------------------


def duration_option(text: str) -> float:
    """A positive duration option (``--ttl 24h``) in seconds."""
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0s, got {text!r}")
    return seconds


def address_option(text: str) -> str:
    """A ``HOST:PORT`` option (``--listen 0.0.0.0:7443``), as given."""
    try:
        parse_host_port(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
