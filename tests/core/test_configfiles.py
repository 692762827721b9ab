"""edgefleet.configfiles: the one way edged.toml, hub.toml and admin.toml are read. Real TOML
files in tmp_path; the three programs' readers are checked to answer alike."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgectl.client import parse_admin_config
from edged.config import parse_config as parse_edged_config
from edgefleet.api.validating import Reader, as_bool
from edgefleet.configfiles import (
    address_option,
    duration_option,
    host_port,
    load_config_file,
    parse_host_port,
    positive_duration,
    table,
)
from edgefleet.errors import ConfigError
from hub.config import parse_config as parse_hub_config


@dataclass(frozen=True)
class Sample:
    listen: str = "0.0.0.0:7443"
    period_s: float = 30.0
    single_use: bool = False


def read_sample(r: Reader) -> Sample:
    d = Sample()
    tokens = table(r, "tokens")
    return Sample(
        listen=r.optional("listen", host_port, d.listen),
        period_s=tokens.optional("period", positive_duration, d.period_s),
        single_use=tokens.optional("singleUse", as_bool, d.single_use),
    )


def problems(path: Path) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load_config_file(path, read_sample)
    assert info.value.source == str(path)
    return {p.path: p.message for p in info.value.problems}


def test_an_absent_table_takes_every_default(tmp_path: Path) -> None:
    f = tmp_path / "a.toml"
    f.write_text('listen = " [::1]:80 "\n')
    assert load_config_file(f, read_sample) == Sample(listen="[::1]:80")
    f.write_text('[tokens]\nperiod = "1m"\nsingleUse = true\n')
    assert load_config_file(f, read_sample) == Sample(period_s=60.0, single_use=True)


def test_every_problem_at_once_with_its_path(tmp_path: Path) -> None:
    f = tmp_path / "a.toml"
    f.write_text('listen = "nowhere"\nlisten_ = 1\n[tokens]\nperiod = "0s"\nsingle = true\n')
    assert problems(f) == {
        "listen": 'must be HOST:PORT such as "0.0.0.0:7443", got "nowhere"',
        "listen_": 'unknown field (did you mean "listen"?)',
        "tokens.period": "must be more than 0s",
        "tokens.single": 'unknown field (did you mean "singleUse"?)',
    }


def test_a_table_that_is_not_one(tmp_path: Path) -> None:
    f = tmp_path / "a.toml"
    f.write_text("tokens = 3\n")
    assert problems(f) == {"tokens": "must be a mapping, got 3"}


def test_the_file_itself(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read: No such file or directory; try X"):
        load_config_file(tmp_path / "absent.toml", read_sample, hint="; try X")
    f = tmp_path / "a.toml"
    f.write_text("listen = \n")
    assert list(problems(f)) == [""]


def test_edged_hub_and_edgectl_read_alike() -> None:
    """The same mistake in each program's file reads the same."""
    edged = {"inference": 3, "reconcile": {"resyncPeriod": "0s"}}
    with pytest.raises(ConfigError) as e:
        parse_edged_config(edged, source="edged.toml")
    hub = {"tokens": 3, "devices": {"heartbeatInterval": "0s"}, "listen": "x"}
    with pytest.raises(ConfigError) as h:
        parse_hub_config(hub, source="hub.toml")
    admin = {"publisher": 3, "hub": "x"}
    with pytest.raises(ConfigError) as a:
        parse_admin_config(admin, source="admin.toml", base=Path("/"))
    found = {p.path: p.message for err in (e, h, a) for p in err.value.problems}
    not_a_table = "must be a mapping, got 3"
    assert found["inference"] == found["tokens"] == found["publisher"] == not_a_table
    assert found["reconcile.resyncPeriod"] == found["devices.heartbeatInterval"]
    bad_address = 'must be HOST:PORT such as "0.0.0.0:7443", got "x"'
    assert found["listen"] == found["hub"] == bad_address


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:7443", ("127.0.0.1", 7443)),
        ("[::1]:0", ("::1", 0)),
        (" hub.example:443 ", ("hub.example", 443)),
    ],
)
def test_host_port(text: str, expected: tuple[str, int]) -> None:
    assert parse_host_port(text) == expected
    assert host_port(text) == text.strip()
    assert address_option(text) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("7443", 'must be HOST:PORT such as "127.0.0.1:1", got "7443"'),
        (":7443", "HOST:PORT"),
        ("h:http", "HOST:PORT"),
        ("h:70000", 'must have a port from 0 to 65535, got "h:70000"'),
    ],
)
def test_bad_host_port(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"HOST:PORT|port from") as info:
        parse_host_port(text, example="127.0.0.1:1")
    assert message in str(info.value)
    with pytest.raises(argparse.ArgumentTypeError):
        address_option(text)


def test_duration_option() -> None:
    assert duration_option("1h") == 3600.0
    with pytest.raises(argparse.ArgumentTypeError, match="must be more than 0s, got '0s'"):
        duration_option("0s")
    with pytest.raises(argparse.ArgumentTypeError):
        duration_option("soon")
