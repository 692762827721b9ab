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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from deploymenttesting import det_canary
from fleet import MEASURED_DEVICE_CONFIG, HubProcess, enrolled_devices, free_port
from harness import Edged
from polltesting import wait_for
from rollouttesting import apply, push

from edgefleet.demo import TINY_MLP, build_mlp

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
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
def fleet_size() -> int:
    return len(NAMES)  # conftest's ``devices``: dev-0 and dev-1 with site=a, on this hub


def _release(hub: HubProcess, tmp_path: Path, version: str, *, bad: bool = False) -> None:
    push(hub, tmp_path, version, bad=bad)
    apply(hub, tmp_path, version)


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


def _page_text(driver: Any) -> str:
    return str(driver.execute_script("return document.body.innerText"))


def _field(driver: Any, name: str) -> str:
    """The text of the page's ``[data-field=NAME]`` element ("None" when there is none)."""
    script = "const e = document.querySelector(arguments[0]); return e && e.textContent"
    return str(driver.execute_script(script, f"[data-field={name}]"))


def _until(check: Callable[[], Any], what: str, within: float = 120.0) -> Any:
    return wait_for(check, within, f"the browser to show {what}", interval=0.3, tolerate=())


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
        driver.get(url)
        _until(lambda: "By region and site" in _page_text(driver), "the fleet page")
        driver.get(f"{base}/devices?phase=Ready")
        _until(lambda: all(n in _page_text(driver) for n in NAMES), "both devices Ready", within=60)
        driver.save_screenshot(str(artifacts / "fleet-devices.png"))

        driver.get(f"{base}/deployments/det")
        _until(lambda: _field(driver, "updatedDevices") == "2", "1.0.0 on both devices")
        driver.execute_script("window.notReloaded = true")

        _release(hub, tmp_path, "2.0.0")
        _until(
            lambda: "revision 2 (stable" in _page_text(driver)
            and _field(driver, "phase") == "Complete"
            and _field(driver, "updatedDevices") == "2",
            "the rollout of 2.0.0 complete",
        )  # fmt: skip

        _release(hub, tmp_path, "3.0.0", bad=True)
        _until(lambda: _field(driver, "phase") == "RolledBack", "3.0.0 rolled back")
        _until(lambda: "3.0.0 Failed" in _page_text(driver), "the failing device and its reason")
        assert driver.execute_script("return window.notReloaded")
        driver.save_screenshot(str(artifacts / "fleet-deployment.png"))

        driver.get(f"{base}/events")
        _until(lambda: "det" in _page_text(driver), "the deployment's events")

        driver.delete_all_cookies()
        driver.get(f"{base}/devices")
        _until(lambda: "authentication required" in _page_text(driver), "the refusal")
        assert "dev-0" not in _page_text(driver)
    finally:
        driver.quit()


CANARY = det_canary(
    '["50%", {{pause: {{}}}}]',
    analysis="{{minAccuracy: 0.9, maxErrorRateIncrease: 0.1, maxLatencyP95: 2s, window: 3s, "
    "minRequests: 5}}",
    progress_deadline_s=600,
)


@pytest.fixture
def measured_devices(
    hub: HubProcess, tmp_path: Path, edged_factory: Callable[..., Edged]
) -> Iterator[list[Edged]]:
    """The two devices, reporting their figures every second (what the analysis reads)."""
    with enrolled_devices(hub, tmp_path, edged_factory, len(NAMES), MEASURED_DEVICE_CONFIG) as d:
        yield d


POINTS = """
const out = {};
document.querySelectorAll("svg.compare").forEach(function (svg) {
  const fig = {limit: svg.dataset.threshold || null};
  svg.querySelectorAll("polyline[data-series]").forEach(function (p) {
    fig[p.dataset.series] = Number(p.dataset.points);
  });
  out[svg.dataset.figure] = fig;
});
return out;
"""


@pytest.mark.scenario
def test_the_canary_against_stable_over_time_survives_a_hub_restart(
    hub: HubProcess, measured_devices: list[Edged], tmp_path: Path
) -> None:
    """A real canary (real traffic on both devices, the validation set evaluated by the
    workers) held at an indefinite pause: its page plots error rate, latency p95 and accuracy
    of the canary against the stable revision over time, each with its limit dashed, grows
    without a reload, and after the hub is restarted still starts where it started."""
    from fleetcanarytesting import Traffic, labels_of
    from fleetcanarytesting import push as push_validated

    artifacts = Path(os.environ.get("EDGEFLEET_TEST_ARTIFACTS", tmp_path / "screenshots"))
    artifacts.mkdir(parents=True, exist_ok=True)
    stable = build_mlp(tmp_path / "det-1.0.0.onnx", TINY_MLP, seed=1)
    truth = labels_of(stable)
    push_validated(hub, tmp_path, "1.0.0", stable, truth)
    push_validated(
        hub,
        tmp_path,
        "1.1.0",
        build_mlp(tmp_path / "det-1.1.0.onnx", TINY_MLP, seed=1, scale=1.5),
        truth,
    )

    apply(hub, tmp_path, "1.0.0", CANARY)
    url = hub.edgectl("dashboard").stdout.splitlines()[0]
    base = url.split("/login", 1)[0]
    driver = _driver()
    try:

        def figures() -> dict[str, dict[str, Any]]:
            return dict(driver.execute_script(POINTS))

        def plotted(at_least: int) -> bool:
            got = figures()
            return all(
                (got.get(f) or {}).get(side, 0) >= at_least
                for f in ("errorRate", "latencyP95Seconds", "accuracy")
                for side in ("canary", "stable", "threshold")
            )

        driver.get(url)
        driver.get(f"{base}/deployments/det")
        _until(lambda: _field(driver, "updatedDevices") == "2", "1.0.0 on both devices")
        with Traffic(measured_devices):
            apply(hub, tmp_path, "1.1.0", CANARY)
            driver.find_element("id", "canary-link").click()
            _until(lambda: _field(driver, "canaryRevision") == "2", "the canary's page", within=60)
            driver.execute_script("window.notReloaded = true")
            _until(lambda: _field(driver, "phase") == "Paused", "the canary held at its pause", 180)
            _until(lambda: plotted(3), "both sides and the limits plotted over time", 120)
            first = figures()
            assert first["errorRate"]["limit"] == "10"  # stable 0% + maxErrorRateIncrease
            assert first["latencyP95Seconds"]["limit"] == "2000"  # ms
            assert first["accuracy"]["limit"] == "0.9"
            count = first["accuracy"]["canary"]
            _until(lambda: figures()["accuracy"]["canary"] > count, "the plots to grow live", 60)
            assert driver.execute_script("return window.notReloaded")
            assert _field(driver, "verdict") == "Pass"
            since = _page_text(driver).split(" samples from ", 1)[1].split(" ", 1)[0]
            driver.save_screenshot(str(artifacts / "canary-against-stable.png"))

            hub.stop()
            hub.start()
            url = hub.edgectl("dashboard").stdout.splitlines()[0]
            driver.get(url)
            driver.get(f"{base}/deployments/det/canary")
            _until(lambda: plotted(count), "the figures kept across the restart", 60)
            assert _page_text(driver).split(" samples from ", 1)[1].split(" ", 1)[0] == since
    finally:
        driver.quit()
