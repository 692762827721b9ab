"""``hub init`` and ``hub token``, run as the real console command on real files."""

from __future__ import annotations

import asyncio
import re
import stat
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from edgefleet.errors import ConfigError
from hub import pki
from hub.api.enrollment import enrollment_labels
from hub.config import default_config_text, load_config, parse_config
from hub.initializing import listen_for
from hub.state import storekeys, tokens
from hub.state.store import SqliteStore

HUB = [sys.executable, "-c", "import sys; from hub.cli import main; sys.exit(main())"]


def _hub(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HUB, *args], capture_output=True, text=True, timeout=60, check=False)


def test_init_creates_a_working_hub_and_refuses_to_overwrite_it(tmp_path: Path) -> None:
    d = tmp_path / "hub"
    result = _hub("init", "--data-dir", str(d), "--region", "eu-dublin", "--san", "hub.example")
    assert result.returncode == 0, result.stderr
    for name in ("ca", "hub", "admin"):
        assert stat.S_IMODE((d / f"{name}.key").stat().st_mode) == 0o600
    ca = pki.load_certified_key(d / "ca.crt", d / "ca.key")
    served = pki.load_certified_key(d / "hub.crt", d / "hub.key").certificate
    served.verify_directly_issued_by(ca.certificate)
    assert "hub.example" in served.extensions.get_extension_for_class(
        pki.x509.SubjectAlternativeName
    ).value.get_values_for_type(pki.x509.DNSName)
    admin = pki.load_certified_key(d / "admin.crt", d / "admin.key").certificate
    assert pki.identity_from_certificate(admin) == pki.Identity(
        pki.Role.ADMIN, "admin", "eu-dublin"
    )
    admin_toml = tomllib.loads((d / "admin.toml").read_text())
    assert admin_toml == {
        "hub": "localhost:7443",
        "caCertificate": str(d / "ca.crt"),
        "certificate": str(d / "admin.crt"),
        "key": str(d / "admin.key"),
        # the quickstart trust setup's, with the TUF delegation of edged releases
        "publisher": {"key": str(d / "publisher.key"), "agentKey": str(d / "agent-publisher.key")},
    }
    assert load_config(d / "hub.toml").region == "eu-dublin"
    assert load_config(d / "hub.toml").listen == "localhost:7443"  # where admin.toml looks
    assert load_config(d / "hub.toml").metrics_listen == "127.0.0.1:7445"
    pin = pki.ca_pin(ca.certificate)
    token = re.search(r"--token (\S+)", result.stdout)
    assert token and f"--ca-hash {pin}" in result.stdout
    assert "edged enroll --hub localhost:7443" in result.stdout

    async def check() -> None:
        store = await SqliteStore.open(d / "hub.db")
        try:
            await tokens.validate(store, token.group(1), now=time.time())
        finally:
            await store.close()

    asyncio.run(check())

    again = _hub("init", "--data-dir", str(d))
    assert again.returncode == 1
    assert "not empty: refusing to overwrite" in again.stderr
    assert pki.load_certified_key(d / "ca.crt", d / "ca.key").certificate == ca.certificate


def test_token_create_and_list(tmp_path: Path) -> None:
    d = tmp_path / "hub"
    assert _hub("init", "--data-dir", str(d)).returncode == 0
    created = _hub(
        "token", "create", "--data-dir", str(d), "--ttl", "1h", "--single-use",
        "--description", "line 3",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert tokens.TOKEN_PATTERN.fullmatch(token)
    assert "CA hash sha256:" in created.stderr
    listed = _hub("token", "list", "--data-dir", str(d))
    assert listed.returncode == 0
    assert token.split(".")[0] in listed.stdout and "single-use" in listed.stdout
    assert token.split(".")[1] not in listed.stdout
    assert "line 3" in listed.stdout
    # the offline command writes the Created event with the token, as the RPC does
    token_id = token.split(".")[0]
    created_events = [
        ev for ev in _events(d) if ev["object"] == {"kind": "Token", "name": token_id}
    ]
    assert [ev["reason"] for ev in created_events] == ["Created"]


def _events(d: Path) -> list[dict[str, Any]]:
    async def read() -> list[dict[str, Any]]:
        store = await SqliteStore.open(d / "hub.db")
        try:
            return [storekeys.loads(kv.value) for kv in (await store.range(storekeys.EVENTS)).kvs]
        finally:
            await store.close()

    return asyncio.run(read())


def _records(d: Path) -> list[tokens.TokenRecord]:
    async def read() -> list[tokens.TokenRecord]:
        store = await SqliteStore.open(d / "hub.db")
        try:
            return await tokens.list_tokens(store)
        finally:
            await store.close()

    return asyncio.run(read())


def test_token_create_with_label_rules(tmp_path: Path) -> None:
    """The flags for what the hub enforces at enrollment: the token's labels, and what a device
    may add of its own (nothing, or keys under a prefix); refused flags store nothing."""
    d = tmp_path / "hub"
    assert _hub("init", "--data-dir", str(d)).returncode == 0
    before = {r.id for r in _records(d)}
    prefixed = _hub(
        "token", "create", "--data-dir", str(d), "--label", "site=factory", "--label", "zone=a",
        "--device-label-prefix", "device.acme.io/",
    )  # fmt: skip
    closed = _hub("token", "create", "--data-dir", str(d), "--no-device-labels")
    assert prefixed.returncode == 0 and closed.returncode == 0, prefixed.stderr + closed.stderr
    made = {r.id: r for r in _records(d) if r.id not in before}
    first = made[prefixed.stdout.strip().split(".")[0]]
    second = made[closed.stdout.strip().split(".")[0]]
    assert (dict(first.labels), first.device_labels, first.device_label_prefix) == (
        {"site": "factory", "zone": "a"}, True, "device.acme.io/",
    )  # fmt: skip
    assert (dict(second.labels), second.device_labels) == ({}, False)
    # what the hub does with them at enrollment
    labels, problems = enrollment_labels(first, {"site": "retail", "device.acme.io/x": "1"}, ())
    assert labels == {"site": "factory", "zone": "a", "device.acme.io/x": "1"}
    assert problems == [
        "labels['site']: set to 'factory' by the bootstrap token; a device cannot change it "
        "(asked for 'retail')"
    ]
    assert enrollment_labels(second, {"cam": "1"}, ())[1] == [
        "labels: this bootstrap token does not let devices add labels (asked for cam)"
    ]
    listed = _hub("token", "list", "--data-dir", str(d)).stdout.splitlines()
    assert listed[0].split()[3:5] == ["LABELS", "OWN-LABELS"]
    row = next(line for line in listed if line.startswith(first.id))
    assert row.split()[3:5] == ["site=factory,zone=a", "device.acme.io/*"]
    assert next(line for line in listed if line.startswith(second.id)).split()[3:5] == [
        "<none>", "none",
    ]  # fmt: skip

    both = _hub(
        "token", "create", "--data-dir", str(d), "--no-device-labels",
        "--device-label-prefix", "x/",
    )  # fmt: skip
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    bad = _hub(
        "token", "create", "--data-dir", str(d), "--label", "Site!=x", "--label", "ok=no way",
        "--device-label-prefix=-bad-", "--ttl", "9600h",
    )  # fmt: skip
    assert bad.returncode == 2
    assert (
        "hub: --ttl: must be from 1s to 366 days (a year), got 3.456e+07s (400 days)" in bad.stderr
    )
    assert "hub: --label['Site!']: must be a label key" in bad.stderr
    assert "hub: --label['ok']: must be a label value" in bad.stderr
    assert "hub: --device-label-prefix: must be a label key" in bad.stderr
    assert {r.id for r in _records(d)} == before | set(made)  # nothing stored


def test_clear_errors(tmp_path: Path) -> None:
    missing = _hub("token", "list", "--data-dir", str(tmp_path / "nothing"))
    assert missing.returncode == 1 and "not a hub data directory" in missing.stderr
    bad_ttl = _hub("token", "create", "--data-dir", str(tmp_path), "--ttl", "soon")
    assert bad_ttl.returncode == 2 and "must be a duration" in bad_ttl.stderr
    bad_region = _hub("init", "--data-dir", str(tmp_path / "h"), "--region", "EU_1")
    assert bad_region.returncode == 1 and "region" in bad_region.stderr
    assert list((tmp_path / "h").iterdir()) == []  # nothing left behind
    d = tmp_path / "h2"
    assert _hub("init", "--data-dir", str(d)).returncode == 0
    (d / "hub.toml").write_text('region = "x"\nlisten = 7\n')
    broken = _hub("token", "list", "--data-dir", str(d))
    assert broken.returncode == 1 and "listen: must be a string" in broken.stderr


def test_config_defaults_round_trip_and_problems_have_paths() -> None:
    assert parse_config(tomllib.loads(default_config_text())) == parse_config({})
    with pytest.raises(ConfigError) as info:
        parse_config({"regoin": "x", "devices": {"heartbeatGrace": "1s"}, "store": "etcd://"})
    text = str(info.value)
    assert 'regoin: unknown field (did you mean "region"?)' in text
    assert "devices.heartbeatGrace: must be longer than heartbeatInterval (30s)" in text
    assert "store: store URL" in text


@pytest.mark.parametrize(
    ("hub_address", "listen"),
    [
        ("127.0.0.1:31111", "127.0.0.1:31111"),
        ("localhost:7443", "localhost:7443"),
        ("hub.example:9443", "0.0.0.0:9443"),
        ("10.0.0.5:7443", "10.0.0.5:7443"),
        ("[::1]:7443", "[::1]:7443"),
        ("0.0.0.0:8443", "0.0.0.0:8443"),
    ],
)
def test_init_listens_where_the_hub_address_says(hub_address: str, listen: str) -> None:
    assert listen_for(hub_address) == listen
