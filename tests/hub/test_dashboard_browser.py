"""The dashboard in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
driven by selenium; nothing downloads a browser), against a real hub (hub init, SQLite store,
admin gRPC API, rollout controller): logged in with a token from the admin API, the fleet,
devices, a deployment and the events; device reports and a new revision move the
deployment's page without a reload, a failing revision shows as rolled back with the failing
device, a hostile label stays text, and without the token cookie nothing is shown.
Screenshots of the main pages are saved in ``$EDGEFLEET_TEST_ARTIFACTS`` (else tmp_path)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from dashboardtesting import DashboardHub, fake_device
from hubserving import make_hub_dir
from polltesting import eventually

from edgefleet.v1 import admin_pb2
from hub.decide.devices import Device, RevisionPhase, RevisionReport, WorkloadReport
from hub.state.storekeys import ModelRecord

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage",
    "--ignore-certificate-errors",  # the hub's certificate is signed by the hub CA
    "--window-size=1400,1000",
)  # fmt: skip
DEPLOYMENT = "detector"

pytestmark = [
    pytest.mark.scenario,
    pytest.mark.skipif(
        not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
        reason="needs Debian's chromium and chromium-driver (scripts/install-system-deps)",
    ),
]


def _driver() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def _manifest(version: str) -> bytes:
    return orjson.dumps(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "ModelDeployment",
            "metadata": {"name": DEPLOYMENT},
            "spec": {
                "model": {"name": "detector", "version": version},
                "placement": {"nodeSelector": {"site": "retail"}},
                "rollout": {"maxSurge": 1, "maxUnavailable": 0},
            },
        }
    )


def _serving(device: Device, version: str, phase: RevisionPhase, reason: str = "") -> Device:
    revision = RevisionReport(
        version, phase=phase, ready_replicas=int(phase is RevisionPhase.READY), reason=reason,
        wanted=True,
    )  # fmt: skip
    report = WorkloadReport(version, desired_replicas=1, ready_replicas=1, revisions=(revision,))
    return device.with_(workloads={DEPLOYMENT: report})


async def _until(check: Callable[[], Any], what: str, within: float = 60.0) -> Any:
    async def seen() -> Any:
        return await asyncio.to_thread(check)

    return await eventually(seen, within, f"the browser to show {what}", interval=0.2)


def test_dashboard_in_a_real_browser(tmp_path: Path) -> None:
    artifacts = Path(os.environ.get("EDGEFLEET_TEST_ARTIFACTS", tmp_path / "screenshots"))
    artifacts.mkdir(parents=True, exist_ok=True)
    asyncio.run(asyncio.wait_for(_scenario(tmp_path, artifacts), 300))


async def _scenario(tmp_path: Path, artifacts: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with DashboardHub(paths, rollouts=True) as d:
        ctx = d.hub.ctx
        for version in ("1.0.0", "2.0.0"):
            ctx.cache.models[("detector", version)] = ModelRecord(
                "detector", version, version.replace(".", "") * 8, 1, b"{}", time.time()
            )
        names = [f"shop-{i}" for i in range(4)]
        for name in names:
            ctx.writer.update(fake_device(name, site="retail", region="eu"))
        ctx.writer.update(fake_device("lab-1", site="<script>alert(1)</script>"))
        await ctx.writer.flush()
        async with d.hub.channel() as channel:
            stub = d.hub.stub(channel)
            await stub.Apply(admin_pb2.ApplyRequest(documents=[_manifest("1.0.0")]))
            token = await d.token()
        driver = await asyncio.to_thread(_driver)
        try:
            # read with one script each: the live section may be replaced between a lookup
            # and a read (selenium's stale elements)
            def text() -> str:
                return str(driver.execute_script("return document.body.innerText"))

            def shot(name: str) -> None:
                driver.save_screenshot(str(artifacts / f"dashboard-{name}.png"))

            await asyncio.to_thread(driver.get, f"{d.url}/login?token={token}")
            await _until(lambda: "By region and site" in text(), "the fleet page")
            assert "eu" in text() and "retail" in text()
            await asyncio.to_thread(shot, "fleet")

            await asyncio.to_thread(driver.get, f"{d.url}/devices")
            await _until(lambda: "shop-3" in text(), "the devices table")
            assert "site=<script>alert(1)</script>" in text()  # shown as text, not run
            scripts = await asyncio.to_thread(
                driver.execute_script, "return document.scripts.length"
            )
            assert scripts == 1
            await asyncio.to_thread(shot, "devices")

            # the deployment: devices report, the page follows without a reload
            await asyncio.to_thread(driver.get, f"{d.url}/deployments/{DEPLOYMENT}")
            await _until(
                lambda: driver.execute_script("return document.body.dataset.stream") == "connected",
                "the live stream connected",
            )
            await asyncio.to_thread(driver.execute_script, "window.notReloaded = true")

            def field(name: str) -> str:
                script = "const e = document.querySelector(arguments[0]); return e && e.textContent"
                return str(driver.execute_script(script, f"[data-field={name}]"))

            await _until(lambda: field("desiredDevices") == "4", "4 devices desired")
            for name in names:
                ctx.writer.update(_serving(ctx.cache.devices[name], "1.0.0", RevisionPhase.READY))
            await _until(lambda: field("updatedDevices") == "4", "4 devices updated")
            await _until(lambda: field("phase") == "Complete", "the first rollout complete")

            # a new revision: a canary device fails it, the rollout is rolled back
            async with d.hub.channel() as channel:
                await d.hub.stub(channel).Apply(
                    admin_pb2.ApplyRequest(documents=[_manifest("2.0.0")])
                )
            await _until(lambda: field("phase") == "Progressing", "the new rollout progressing")
            state = await _until(
                lambda: ctx.cache.rollouts[DEPLOYMENT].updated, "a device assigned 2.0.0"
            )
            canary = sorted(state)[0]
            ctx.writer.update(
                _serving(ctx.cache.devices[canary], "2.0.0", RevisionPhase.FAILED, "ModelCrashed")
            )
            await _until(lambda: field("phase") == "RolledBack", "the rollout rolled back")
            await _until(lambda: "ModelCrashed" in text(), "the failing device's reason")
            assert canary in text()
            assert await asyncio.to_thread(driver.execute_script, "return window.notReloaded")
            await asyncio.to_thread(shot, "deployment")

            # events, live
            await asyncio.to_thread(driver.get, f"{d.url}/events")
            await _until(lambda: "RolledBack" in text() or "rolled back" in text(), "events")
            ctx.writer.event("Device", "shop-0", "Warning", "Overheating", "<b>92 C</b>")
            await _until(lambda: "<b>92 C</b>" in text(), "a new event without a reload")
            await asyncio.to_thread(shot, "events")

            await asyncio.to_thread(driver.get, f"{d.url}/models")
            await _until(lambda: "2.0.0" in text(), "the models page")

            # without the cookie: refused
            await asyncio.to_thread(driver.delete_all_cookies)
            await asyncio.to_thread(driver.get, f"{d.url}/devices")
            await _until(lambda: "authentication required" in text(), "the refusal")
            assert "shop-0" not in text()
        finally:
            await asyncio.to_thread(driver.quit)


def test_dashboard_actions_in_a_real_browser(tmp_path: Path) -> None:
    """An admin pauses and resumes a rollout with the page's buttons, the outcome shown once
    and the event naming them; a forged form (no CSRF token, a wrong one) and another site's
    page posting to the dashboard with the right token act on nothing. The screenshot of the
    deployment's page with its actions is docs/images/dashboard-actions.png."""
    artifacts = Path(os.environ.get("EDGEFLEET_TEST_ARTIFACTS", tmp_path / "screenshots"))
    artifacts.mkdir(parents=True, exist_ok=True)
    asyncio.run(asyncio.wait_for(_actions_scenario(tmp_path, artifacts), 300))


def _evil_site(target: str, csrf: str) -> tuple[Any, str]:
    """Another site (plain HTTP on another port) whose page posts a form to ``target`` as soon
    as it loads, with ``csrf`` (as if the attacker had learned the token)."""
    import http.server
    import threading

    page = (
        "<!doctype html><html><body onload='document.forms[0].submit()'>"
        f'<form method=post action="{target}"><input type=hidden name=csrf value="{csrf}">'
        "</form></body></html>"
    ).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


async def _actions_scenario(tmp_path: Path, artifacts: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with DashboardHub(paths, rollouts=True) as d:
        ctx = d.hub.ctx
        for version in ("1.0.0", "2.0.0"):
            ctx.cache.models[("detector", version)] = ModelRecord(
                "detector", version, version.replace(".", "") * 8, 1, b"{}", time.time()
            )
        names = [f"shop-{i}" for i in range(4)]
        for name in names:
            ctx.writer.update(fake_device(name, site="retail", region="eu"))
        await ctx.writer.flush()
        async with d.hub.channel() as channel:
            stub = d.hub.stub(channel)
            await stub.Apply(admin_pb2.ApplyRequest(documents=[_manifest("1.0.0")]))
            await eventually(
                lambda: ctx.cache.rollouts.get(DEPLOYMENT) is not None, 30, "revision 1"
            )
            for name in names:
                ctx.writer.update(_serving(ctx.cache.devices[name], "1.0.0", RevisionPhase.READY))
            await ctx.writer.flush()
            await eventually(
                lambda: ctx.cache.rollouts[DEPLOYMENT].phase.value == "Complete", 30, "1 complete"
            )
            await stub.Apply(admin_pb2.ApplyRequest(documents=[_manifest("2.0.0")]))
            token = await d.token()
        state = await eventually(
            lambda: (s := ctx.cache.rollouts[DEPLOYMENT]).revision == 2 and s.updated,
            30,
            "revision 2 rolling out",
        )
        assert state
        driver = await asyncio.to_thread(_driver)
        evil = None
        try:

            def text() -> str:
                return str(driver.execute_script("return document.body.innerText"))

            def phase() -> str:
                return ctx.cache.rollouts[DEPLOYMENT].phase.value

            def acted() -> list[str]:
                return [
                    str(ev.get("message", ""))
                    for ev in ctx.cache.events
                    if ev.get("reason") == "DashboardAction"
                ]

            def click(verb: str) -> None:
                driver.execute_script(
                    "document.querySelector(arguments[0]).click()", f"button[data-verb={verb}]"
                )

            await asyncio.to_thread(driver.get, f"{d.url}/login?token={token}")
            # the landing page: the deployment, its phase, the rollout in progress
            await _until(lambda: "Rollouts in progress" in text(), "the landing page")
            await _until(lambda: "Progressing" in text() and DEPLOYMENT in text(), "the rollout")
            await asyncio.to_thread(driver.get, f"{d.url}/deployments/{DEPLOYMENT}")
            await _until(lambda: "Selector:" in text(), "the deployment, described")
            assert "revision 2 (2.0.0) Progressing" in text()

            await asyncio.to_thread(click, "pause")
            await _until(lambda: "Pause: " in text(), "the outcome of the pause")
            assert phase() == "Paused"
            assert acted()[-1].startswith("rollout pause by admin admin on the dashboard")
            await _until(lambda: "DashboardAction" in text(), "the event on the page")

            # a forged form on the page itself: no token, then a wrong one
            csrf = str(
                driver.execute_script("return document.querySelector('input[name=csrf]').value")
            )
            for value in ("", "x" + csrf[1:]):
                await asyncio.to_thread(driver.get, f"{d.url}/deployments/{DEPLOYMENT}")
                await _until(lambda: "Selector:" in text(), "the deployment's page")
                await asyncio.to_thread(
                    driver.execute_script,
                    "const f = document.querySelector('form[action$=\"/actions/resume\"]');"
                    "f.querySelector('input[name=csrf]').value = arguments[0]; f.submit();",
                    value,
                )
                await _until(lambda: "CSRF token is missing or wrong" in text(), "the refusal")
                assert phase() == "Paused"
            # another site's page posting to the dashboard, even with the right token
            evil, evil_url = _evil_site(f"{d.url}/deployments/{DEPLOYMENT}/actions/resume", csrf)
            await asyncio.to_thread(driver.get, evil_url)
            await _until(
                lambda: "authentication required" in text() or "another site" in text(),
                "the cross-site form refused",
            )
            assert phase() == "Paused" and len(acted()) == 1
            # a GET of an action's URL
            await asyncio.to_thread(driver.get, f"{d.url}/deployments/{DEPLOYMENT}/actions/resume")
            await _until(lambda: "405" in text(), "the GET refused")
            assert phase() == "Paused"

            await asyncio.to_thread(driver.get, f"{d.url}/deployments/{DEPLOYMENT}")
            await _until(lambda: "Selector:" in text(), "the deployment again")
            assert "Pause: " not in text()  # the outcome is shown once
            await asyncio.to_thread(click, "resume")
            await _until(lambda: "Resume: " in text(), "the outcome of the resume")
            assert phase() == "Progressing" and len(acted()) == 2
            await asyncio.to_thread(driver.set_window_size, 1200, 900)
            await asyncio.to_thread(
                driver.save_screenshot, str(artifacts / "dashboard-actions.png")
            )
        finally:
            if evil is not None:
                evil.shutdown()
            await asyncio.to_thread(driver.quit)
