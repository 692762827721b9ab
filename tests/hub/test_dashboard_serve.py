"""``hub serve`` with ``dashboardListen`` in hub.toml (a real hub process): the dashboard
listens, ``edgectl dashboard`` (a real edgectl process) prints a URL whose token logs in, and
the dashboard refuses a request without it."""

from __future__ import annotations

import http.client
import re
import ssl
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from edgefleet.launching import free_port_pair, start_hub
from hub.initializing import HubPaths

EDGECTL = str(Path(sys.executable).with_name("edgectl"))
HUB = str(Path(sys.executable).with_name("hub"))


def _get(port: int, ca: Path, target: str, cookie: str = "") -> http.client.HTTPResponse:
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=context)
    conn.request("GET", target, headers={"Cookie": cookie} if cookie else {})
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


@pytest.mark.scenario
def test_hub_serve_runs_the_dashboard_from_its_config(tmp_path: Path) -> None:
    data = tmp_path / "hub"
    port = free_port_pair()
    address = f"127.0.0.1:{port}"
    subprocess.run(
        [HUB, "init", "--data-dir", str(data), "--hub-address", address],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    dash_port = free_port_pair()
    while dash_port in (port - 1, port, port + 1, port + 2):
        dash_port = free_port_pair()
    config = data / "hub.toml"
    text = config.read_text()
    assert 'dashboardListen = ""' in text  # off unless asked for
    config.write_text(
        text.replace('dashboardListen = ""', f'dashboardListen = "127.0.0.1:{dash_port}"')
    )
    hub = start_hub(data, listen=address, log=tmp_path / "hub.log")
    try:
        hub.wait_listening(30)
        deadline = time.monotonic() + 30
        while True:
            result = subprocess.run(
                [EDGECTL, "--config", str(data / "admin.toml"), "dashboard"],
                check=False, capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            if result.returncode == 0:
                break
            assert "dashboardListen" in result.stderr, result.stderr  # not listening yet
            assert time.monotonic() < deadline, (tmp_path / "hub.log").read_text()
            time.sleep(0.2)
        url = result.stdout.splitlines()[0]
        parts = urlsplit(url)
        assert parts.port == dash_port
        ca = HubPaths.of(data).ca_certificate
        assert _get(dash_port, ca, "/").status == 401
        login = _get(dash_port, ca, f"{parts.path}?{parts.query}")
        assert login.status == 303
        cookie = re.match(r"([^;]+)", login.getheader("Set-Cookie", ""))
        assert cookie
        assert _get(dash_port, ca, "/devices", cookie[1]).status == 200
    finally:
        hub.stop()
    assert parts.query.split("=", 1)[1] not in (tmp_path / "hub.log").read_text()


# ``hub`` as its console script runs it, with aiohttp missing as on a hub installed without
# the dashboard extra: every import of it fails the way an absent package's does
WITHOUT_AIOHTTP = """
import sys

class NoAiohttp:
    def find_spec(self, name, path=None, target=None):
        if name == "aiohttp" or name.startswith("aiohttp."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoAiohttp())
from hub.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("where", ["flag", "hub.toml"])
def test_hub_serve_without_the_dashboard_extra_refuses_in_one_line(
    tmp_path: Path, where: str
) -> None:
    data = tmp_path / "hub"
    port = free_port_pair()
    subprocess.run(
        [HUB, "init", "--data-dir", str(data), "--hub-address", f"127.0.0.1:{port}"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    args = ["serve", "--data-dir", str(data), "--listen", f"127.0.0.1:{port}"]
    if where == "flag":
        args += ["--dashboard-listen", "127.0.0.1:0"]
    else:
        config = data / "hub.toml"
        text = config.read_text().replace('dashboardListen = ""', 'dashboardListen = "0.0.0.0:0"')
        config.write_text(text)
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_AIOHTTP, *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr  # no traceback, no "Event loop is closed"
    assert lines[0].startswith("hub: dashboardListen ")
    assert "pip install 'edgefleet[dashboard]'" in lines[0]
    assert "hub serving" not in result.stdout + result.stderr  # refused before it listened
