"""Device names from hostnames (edgefleet.devicenames, hub.api.enrollment): the rule as a
table, then real enrollments (edged's own enroll code, real TLS on loopback, a hub made by
``hub init`` with real SQLite): the hostname is the name, a suffix only on a collision, an
explicit ``--name`` is taken exactly, hostile hostnames are sanitised by the one rule or
refused with nothing written, and a name taken in the store meanwhile (another replica) is
replaced by another, with a certificate for it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from asynctesting import async_test
from hubserving import AdminHub, make_hub_dir

from edged.hublink.enrolling import EnrollError, enroll
from edgefleet import devicenames
from edgefleet.trust.signing import create_root, generate_key_pair
from edgefleet.v1 import enrollment_pb2
from hub import pki
from hub.api.enrollment import check_request
from hub.decide.devices import Device
from hub.state import storekeys, tokens
from hub.state.store import Put
from hub.state.trustroots import HubRoots, install_roots

SUFFIXED = r"-[0-9a-f]{6}"


@pytest.mark.parametrize(
    ("hostname", "name"),
    [
        ("raspberrypi", "raspberrypi"),
        ("Cam-7.factory.example.com", "cam-7"),  # the first label, lower-cased
        ("edge_node 01", "edge-node-01"),  # every run of other characters is one '-'
        ("--gw--", "gw"),
        ("Çamér@-ünit", "camer-unit"),  # accents dropped
        ("\x1b[31mred\x00", "31mred"),  # control characters are other characters
        ("a" * 100, "a" * 63),  # cut to a DNS label
        ("a" * 62 + "-b", "a" * 62),  # cut, then '-' trimmed
        ("../../etc/passwd", None),  # its first label is empty
        ("日本語", None),
        ("---", None),
        ("", None),
    ],
)
def test_the_rule(hostname: str, name: str | None) -> None:
    assert devicenames.check_hostname(hostname) is None
    got = devicenames.name_from_hostname(hostname)
    assert got == name
    assert got is None or devicenames.is_name(got)


def test_a_suffix_keeps_a_dns_label_and_an_overlong_hostname_is_refused() -> None:
    suffixed = devicenames.with_suffix("a" * 57 + "-bcdef", "0a1b2c")
    assert suffixed == "a" * 56 + "-0a1b2c" and devicenames.is_name(suffixed)
    assert devicenames.with_suffix("gw", "0a1b2c") == "gw-0a1b2c"
    assert devicenames.check_hostname("h" * 253) is None
    problems = check_request(
        enrollment_pb2.EnrollRequest(csr_pem=b"x", hostname="h" * 254)  # type: ignore[arg-type]
    )
    assert problems == ["hostname: at most 253 characters (a DNS name), got 254"]


def _fleet_root(hub: AdminHub, tmp_path: Path) -> Path:
    """A fleet trust root the hub serves, and its file as a device image carries it."""
    keys = tmp_path / "keys"
    keys.mkdir(exist_ok=True)
    for name in ("root", "publisher"):
        generate_key_pair(keys / name)
    out = tmp_path / "image-root.json"
    root = create_root(
        root_keys=[keys / "root.key"], artifact_keys=[keys / "publisher.pub"], out=out
    )
    install_roots(hub.ctx.cache, HubRoots((root.to_bytes(),)))
    return out


async def _enroll(
    hub: AdminHub, data: Path, *, name: str = "", hostname: str, token: str = ""
) -> str:
    """``edged enroll`` (the device's real code), with a fresh token unless given: the name it
    got, or the error (then nothing was written on the device)."""
    if not token:
        token, _ = await tokens.create_token(hub.ctx.store, now=time.time(), ttl=600)
    try:
        result = await enroll(
            data,
            hub=f"127.0.0.1:{hub.port}",
            enroll_address=f"127.0.0.1:{hub.enroll_port}",
            token=token,
            labels={},
            name=name,
            hostname=hostname,
            ca_hash=pki.ca_pin(hub.ctx.ca.certificate),
            root_file=data.parent / "image-root.json",
        )
    except EnrollError as exc:
        assert not (data / "hub" / "link.json").exists()
        return f"error: {exc}"
    cert = pki.load_certificate((data / "hub" / "device.crt").read_bytes())
    assert pki.identity_from_certificate(cert).name == result.device_name  # signed for it
    return result.device_name


@async_test
async def test_devices_are_named_after_their_hostnames(tmp_path: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub:
        _fleet_root(hub, tmp_path)
        d = tmp_path
        assert await _enroll(hub, d / "1", hostname="raspberrypi.local") == "raspberrypi"
        # the same hostname again (a fleet imaged alike): a suffix, and only then
        second = await _enroll(hub, d / "2", hostname="raspberrypi")
        third = await _enroll(hub, d / "3", hostname="RaspberryPi")
        assert re.fullmatch("raspberrypi" + SUFFIXED, second), second
        assert re.fullmatch("raspberrypi" + SUFFIXED, third) and third != second, third
        assert await _enroll(hub, d / "4", hostname="Cam 7") == "cam-7"
        # an explicit name is taken exactly: refused when held, never suffixed
        got = await _enroll(hub, d / "5", name="cam-7", hostname="whatever")
        assert "ALREADY_EXISTS" in got and "'cam-7' is already enrolled" in got, got
        # a long hostname: cut to a DNS label, and cut further for its suffix
        long = "edge-" + "x" * 80
        assert await _enroll(hub, d / "6", hostname=long) == long[:63]
        suffixed = await _enroll(hub, d / "7", hostname=long)
        assert re.fullmatch(long[:56] + SUFFIXED, suffixed), suffixed
        # nothing usable in it: the hub picks a name, as for a device that sent none
        assert re.fullmatch(r"device-[0-9a-f]{8}", await _enroll(hub, d / "8", hostname="..."))
        assert re.fullmatch(r"device-[0-9a-f]{8}", await _enroll(hub, d / "9", hostname=""))
        events = [e for e in hub.ctx.cache.events if e["reason"] == "Enrolled"]
        assert "named after its hostname 'raspberrypi.local'" in events[0]["message"]
        assert len(hub.ctx.cache.devices) == 8


@async_test
async def test_a_hostile_hostname_is_refused_or_sanitised_and_a_refusal_writes_nothing(
    tmp_path: Path,
) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub:
        _fleet_root(hub, tmp_path)
        d = tmp_path
        token, _ = await tokens.create_token(
            hub.ctx.store, now=time.time(), ttl=600, single_use=True
        )
        got = await _enroll(hub, d / "1", hostname="h" * 300, token=token)
        assert "INVALID_ARGUMENT" in got and "hostname: at most 253 characters" in got, got
        assert hub.ctx.cache.devices == {}
        assert not (await hub.ctx.store.range(storekeys.DEVICES)).kvs
        await tokens.validate(hub.ctx.store, token, now=time.time())  # not used up
        # a name is never taken from outside as it is: no path, no escape, no upper case
        got = await _enroll(hub, d / "2", hostname="\x1b[2J../ADMIN\n")
        assert got == "2j", got
        got = await _enroll(hub, d / "3", hostname="hub-0")  # a name like a hub's: a device
        cert = pki.load_certificate((d / "3" / "hub" / "device.crt").read_bytes())
        assert pki.identity_from_certificate(cert).role is pki.Role.DEVICE and got == "hub-0"


@async_test
async def test_a_name_taken_meanwhile_in_the_store_gets_another_one(tmp_path: Path) -> None:
    """The hub is the judge: its cache said free, but another replica enrolled that name in
    the store meanwhile; the transaction's compare refuses it, and the device gets a suffixed
    name with a certificate for that name (the token is spent once)."""
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub:
        _fleet_root(hub, tmp_path)
        other = Device("gateway", enrolled_at=time.time())
        key = storekeys.device_key("gateway")
        await hub.ctx.store.txn([], [Put(key, storekeys.dumps(other.to_json()))])
        assert "gateway" not in hub.ctx.cache.devices  # only in the store
        got = await _enroll(hub, tmp_path / "dev", hostname="gateway")
        assert re.fullmatch("gateway" + SUFFIXED, got), got
        assert set(hub.ctx.cache.devices) == {got}


def test_edged_enroll_names_the_device_after_this_machine_and_keeps_config_in_its_hint(
    tmp_path: Path,
) -> None:
    """The real ``edged enroll`` command against a real hub process's enrollment port: the
    device is named after this machine's hostname, and the ``edged run`` it prints keeps the
    --config (and the data directory) it was enrolled with."""
    import asyncio
    import shlex
    import socket

    async def main() -> None:
        paths = await make_hub_dir(tmp_path / "hub")
        async with AdminHub(paths) as hub:
            root = _fleet_root(hub, tmp_path)
            token, _ = await tokens.create_token(hub.ctx.store, now=time.time(), ttl=600)
            config = tmp_path / "my config" / "edged.toml"
            config.parent.mkdir()
            config.write_text(f'[trust]\nrootFile = "{root}"\n')
            data = tmp_path / "device data"
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "edged", "enroll", "--hub", f"127.0.0.1:{hub.port}",
                "--enroll-address", f"127.0.0.1:{hub.enroll_port}",
                "--ca-hash", pki.ca_pin(hub.ctx.ca.certificate),
                "--data-dir", str(data), "--config", str(config),
                env={**os.environ, "EDGED_TOKEN": token},
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
            out, err = await proc.communicate()
            assert proc.returncode == 0, err.decode()
            expected = devicenames.name_from_hostname(socket.gethostname())
            lines = out.decode().splitlines()
            name = lines[0].split()[2].rstrip(",")
            if expected is None:
                assert re.fullmatch(r"device-[0-9a-f]{8}", name), lines
            else:
                assert name == expected, lines
            assert name in hub.ctx.cache.devices
            hint = lines[-1].removeprefix("start edged with: ")
            assert shlex.split(hint) == [
                "edged", "run", "--data-dir", str(data), "--config", str(config)
            ]  # fmt: skip

    asyncio.run(main())
