"""The dashboard of a real fleet in a real headless Chromium: ``hub serve`` with
``dashboardListen``, two enrolled ``edged run`` devices with real ONNX Runtime workers, models
pushed with ``edgectl models push`` and applied with ``edgectl apply``, the browser logged in
with the URL ``edgectl dashboard`` prints. The page of the deployment follows two rollouts
without a reload: one that completes, one whose version fails to load on the first device
(rolled back, the failure shown). Without the token cookie nothing is shown. Screenshots in
``$EDGEFLEET_TEST_ARTIFACTS`` (else tmp_path)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll, free_port
from harness import Edged
from test_fleet_status import build_unloadable

from edgefleet.demo import TINY_MLP, build_mlp

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: det}}
spec:
  model: {{name: det, version: "{version}"}}
  runtime: {{executionProviders: [CPUExecutionProvider]}}
  replicas: {{perDevice: 1}}
  placement: {{nodeSelector: {{site: a}}}}
  probes:
    readiness: {{periodSeconds: 1, timeoutSeconds: 1}}
  rollout: {{maxSurge: 0, maxUnavailable: 1}}
"""
NAMES = ("dev-0", "dev-1")

pytestmark = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
    reason="needs Debian's chromium and chromium-driver (scripts/install-system-deps)",
)


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubProcess]:
    h = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init()
    config = h.data / "hub.toml"
    port = free_port()
    config.write_text(
        config.read_text().replace('dashboardListen = ""', f'dashboardListen = "127.0.0.1:{port}"')
    )
    h.start()
    yield h
    h.stop()


@pytest.fixture
def devices(
    hub: HubProcess, tmp_path: Path, edged_factory: Callable[..., Edged]
) -> Iterator[list[Edged]]:
    started = []
    for name in NAMES:
        data = tmp_path / name
        out = enroll(hub, data, name, {"site": "a"})
        assert out.returncode == 0, out.stdout + out.stderr
        config = SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "no-root")
        started.append(edged_factory(None, data=data, config=config).start())
    yield started
    for e in started:
        if e.proc is not None and e.proc.poll() is None:
            e.terminate()


def _release(hub: HubProcess, tmp_path: Path, version: str, *, bad: bool = False) -> None:
    path = tmp_path / f"det-{version}.onnx"
    if bad:
        build_unloadable(path)
    else:
        build_mlp(path, TINY_MLP, seed=int(version.replace(".", "")))
    out = hub.edgectl("models", "push", str(path), "--name", "det", "--version", version)
    assert "pushed" in out.stdout, out.stdout + out.stderr
    doc = tmp_path / f"det-{version}.yaml"
    doc.write_text(DEPLOYMENT.format(version=version))
    hub.edgectl("apply", "-f", str(doc))


def _driver() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage",
        "--ignore-certificate-errors", "--window-size=1400,1000",
    ):  # fmt: skip
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def _until(check: Callable[[], Any], what: str, within: float = 120.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen in the browser: {what}")
        time.sleep(0.3)


def test_a_real_fleet_on_the_dashboard(
    hub: HubProcess, devices: list[Edged], tmp_path: Path
) -> None:
    artifacts = Path(os.environ.get("EDGEFLEET_TEST_ARTIFACTS", tmp_path / "screenshots"))
    artifacts.mkdir(parents=True, exist_ok=True)
    _release(hub, tmp_path, "1.0.0")
    url = hub.edgectl("dashboard").stdout.splitlines()[0]
    assert re.match(r"https://127\.0\.0\.1:\d+/login\?token=v1\.", url), url
    base = url.split("/login", 1)[0]
    driver = _driver()
    try:

        def text() -> str:
            return str(driver.execute_script("return document.body.innerText"))

        def field(name: str) -> str:
            script = "const e = document.querySelector(arguments[0]); return e && e.textContent"
            return str(driver.execute_script(script, f"[data-field={name}]"))

        driver.get(url)
        _until(lambda: "By region and site" in text(), "the fleet page")
        driver.get(f"{base}/devices?phase=Ready")
        _until(lambda: all(n in text() for n in NAMES), "both devices Ready", within=60)
        driver.save_screenshot(str(artifacts / "fleet-devices.png"))

        driver.get(f"{base}/deployments/det")
        _until(lambda: field("updatedDevices") == "2", "1.0.0 on both devices")
        driver.execute_script("window.notReloaded = true")

        _release(hub, tmp_path, "2.0.0")
        _until(
            lambda: "revision 2 (stable" in text() and field("phase") == "Complete"
            and field("updatedDevices") == "2",
            "the rollout of 2.0.0 complete",
        )  # fmt: skip

        _release(hub, tmp_path, "3.0.0", bad=True)
        _until(lambda: field("phase") == "RolledBack", "3.0.0 rolled back")
        _until(lambda: "3.0.0 Failed" in text(), "the failing device and its reason")
        assert driver.execute_script("return window.notReloaded")
        driver.save_screenshot(str(artifacts / "fleet-deployment.png"))

        driver.get(f"{base}/events")
        _until(lambda: "det" in text(), "the deployment's events")

        driver.delete_all_cookies()
        driver.get(f"{base}/devices")
        _until(lambda: "authentication required" in text(), "the refusal")
        assert "dev-0" not in text()
    finally:
        driver.quit()
