"""The hub's web dashboard over HTTPS against a real hub (hub init, SQLite store, the admin
gRPC API on loopback with mutual TLS): nothing without an admin certificate or a valid
token, tokens from the admin API that expire and die with a revocation, hostile device
strings shown inert under a strict CSP, bounded pagination, and events live over SSE."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import grpc
import pytest
from asynctesting import async_test, eventually
from dashboardtesting import DashboardHub, client_tls, fake_device
from hubserving import make_hub_dir

from edgefleet.v1 import admin_pb2
from hub import pki
from hub.api.dashboard.access import DashboardAccess
from hub.pki import Identity, Role

ROWS = re.compile(r'<tr><td><a href="/devices/')


def _session(tls: ssl.SSLContext) -> aiohttp.ClientSession:
    # unsafe: keep cookies of an IP address (the dashboard on loopback)
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=tls), cookie_jar=aiohttp.CookieJar(unsafe=True)
    )


@async_test
async def test_nothing_is_served_without_a_certificate_or_token(tmp_path: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with DashboardHub(paths) as d, _session(client_tls(paths, None, tmp_path)) as s:
        for path in ("/", "/devices", "/events", "/events/stream", "/static/dashboard.js"):
            async with s.get(d.url + path) as r:
                assert r.status == 401, path
                assert "admin client certificate" in await r.text()
                assert "script-src 'self'" in r.headers["Content-Security-Policy"]
        for bad in ("v1.AAAA.BBBB", "nonsense", "x" * 600):
            async with s.get(d.url + "/", headers={"Authorization": f"Bearer {bad}"}) as r:
                assert r.status == 401
            async with s.get(d.url + "/login", params={"token": bad}) as r:
                assert r.status == 401
                assert "set-cookie" not in r.headers


@async_test
async def test_admin_certificate_is_let_in_and_a_device_certificate_is_not(
    tmp_path: Path,
) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with DashboardHub(paths) as d:
        async with (
            _session(client_tls(paths, d.hub.admin(), tmp_path)) as s,
            s.get(d.url + "/") as r,
        ):
            assert r.status == 200
            text = await r.text()
            assert "Fleet" in text and "admin" in text and "(certificate" in text
            assert r.headers["X-Content-Type-Options"] == "nosniff"
        device = pki.issue_client_certificate(
            d.hub.ctx.ca, Identity(Role.DEVICE, "cam-1", d.hub.ctx.region)
        )
        async with _session(client_tls(paths, device, tmp_path)) as s, s.get(d.url + "/") as r:
            assert r.status == 403
            assert "device certificate" in await r.text()


@async_test
async def test_token_login_expiry_and_revocation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    paths = await make_hub_dir(tmp_path / "hub")
    async with DashboardHub(paths) as d, _session(client_tls(paths, None, tmp_path)) as s:
        token = await d.token(ttl_s=120)
        async with s.get(d.url + "/login", params={"token": token}, allow_redirects=False) as r:
            assert r.status == 303 and r.headers["Location"] == "/"
            cookie = r.headers["Set-Cookie"]
            for attribute in ("HttpOnly", "Secure", "SameSite=Strict", "Max-Age="):
                assert attribute in cookie
        async with s.get(d.url + "/devices") as r:  # the cookie
            assert r.status == 200
            assert "(token, until" in await r.text()
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=client_tls(paths, None, tmp_path))
        ) as fresh:
            headers = {"Authorization": f"Bearer {token}"}
            async with fresh.get(d.url + "/models", headers=headers) as r:
                assert r.status == 200
            # tampered: refused
            forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
            async with fresh.get(d.url + "/", headers={"Authorization": f"Bearer {forged}"}) as r:
                assert r.status == 401
            # another hub process (another key): refused
            other, _ = DashboardAccess().issue("admin", "1", now=time.time(), ttl=60)
            async with fresh.get(d.url + "/", headers={"Authorization": f"Bearer {other}"}) as r:
                assert r.status == 401
            # expired: refused, with the way out
            ctx = d.hub.ctx
            d.server.dashboard.clock = lambda: time.time() + 121
            async with fresh.get(d.url + "/", headers=headers) as r:
                assert r.status == 401
                assert "expired" in await r.text()
            async with s.get(d.url + "/") as r:  # the cookie too
                assert r.status == 401
            d.server.dashboard.clock = time.time
            # the admin certificate revoked: its tokens are refused
            serial = format(d.hub.admin().certificate.serial_number, "x")
            ctx.cache.revoked[serial] = "admin"
            async with fresh.get(d.url + "/", headers=headers) as r:
                assert r.status == 401
                assert "revoked" in await r.text()
    logged = [(r.getMessage(), repr(getattr(r, "fields", ""))) for r in caplog.records]
    assert any("dashboard token issued" in m for m, _ in logged)
    assert any("dashboard request refused" in m for m, _ in logged)
    secret = token.split(".")[2]
    assert not [line for line in logged if secret in line[0] or secret in line[1]]


@async_test
async def test_token_lifetimes_are_bounded_and_need_a_dashboard(tmp_path: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with DashboardHub(paths) as d:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await d.token(ttl_s=3600)
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "ttl" in str(refused.value.details())
        d.hub.ctx.dashboard.port = 0  # as if no dashboard listened
        async with d.hub.channel() as channel:
            with pytest.raises(grpc.aio.AioRpcError) as none:
                await d.hub.stub(channel).CreateDashboardToken(
                    admin_pb2.CreateDashboardTokenRequest()
                )
        assert none.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "dashboardListen" in str(none.value.details())
        d.hub.ctx.dashboard.port = d.server.port


@async_test
async def test_hostile_device_strings_render_inert(tmp_path: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with DashboardHub(paths) as d:
        hostile = '<script>alert("x")</script>'
        ctx = d.hub.ctx
        ctx.writer.update(fake_device("cam-1", site=hostile, note='"><img src=x onerror=alert(1)>'))
        ctx.writer.event("Device", "cam-1", "Warning", "Hostile", hostile)
        await ctx.writer.flush()
        async with _session(client_tls(paths, d.hub.admin(), tmp_path)) as s:
            for path in ("/", "/devices", "/devices/cam-1", "/events"):
                async with s.get(d.url + path) as r:
                    assert r.status == 200, path
                    text = await r.text()
                    assert "<script>alert" not in text and "<img src=x" not in text, path
                    assert "&lt;script&gt;" in text, path
                    csp = r.headers["Content-Security-Policy"]
                    assert "default-src 'none'" in csp and "unsafe-inline" not in csp
                    # the only script is the dashboard's own file
                    assert re.findall(r"<script[^>]*>", text) == [
                        '<script src="/static/dashboard.js" defer>'
                    ]


@async_test
async def test_devices_are_paginated_within_bounds(tmp_path: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with DashboardHub(paths) as d:
        for i in range(120):
            d.hub.ctx.writer.update(fake_device(f"dev-{i:03d}", site="a" if i % 2 else "b"))
        await d.hub.ctx.writer.flush()
        async with _session(client_tls(paths, d.hub.admin(), tmp_path)) as s:

            async def get(**params: str) -> tuple[int, str]:
                async with s.get(d.url + "/devices", params=params) as r:
                    return r.status, await r.text()

            status, text = await get()
            assert status == 200 and len(ROWS.findall(text)) == 50
            assert "page 1 of 3 (120 devices match)" in text
            status, text = await get(page="3")
            assert len(ROWS.findall(text)) == 20 and "dev-119" in text and "dev-099" not in text
            status, text = await get(page="4")  # past the end: empty, not an error
            assert status == 200 and not ROWS.findall(text) and "page 4 of 3" in text
            status, text = await get(selector="site=a", per="200")
            assert len(ROWS.findall(text)) == 60
            status, text = await get(q="dev-11")
            assert len(ROWS.findall(text)) == 10
            for bad, field in (
                ({"per": "201"}, "per"),
                ({"per": "0"}, "per"),
                ({"page": "0"}, "page"),
                ({"page": "-1"}, "page"),
                ({"page": "x" * 40}, "page"),
                ({"phase": "<b>"}, "phase"),
                ({"selector": "a in ("}, "selector"),
                ({"q": "x" * 300}, "q"),
            ):
                status, text = await get(**bad)
                assert status == 400, bad
                assert f"{field}:" in text, bad
                assert "<b>" not in text
            async with s.get(d.url + "/devices/nobody") as r:
                assert r.status == 404


@async_test
async def test_events_arrive_live_over_sse(tmp_path: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with (
        DashboardHub(paths) as d,
        _session(client_tls(paths, d.hub.admin(), tmp_path)) as s,
    ):
        async with s.get(d.url + "/events/stream") as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/event-stream")
            assert (await r.content.readline()).startswith(b"retry:")
            d.hub.ctx.writer.event("Device", "cam-9", "Normal", "Tested", "a new <event>")
            seen = b""
            while b"a new <event>" not in seen:
                seen += await asyncio.wait_for(r.content.readline(), 10)
            assert b'"name":"cam-9"' in seen and b"id: " in seen
        async with s.get(d.url + "/live/fleet") as r:
            assert r.status == 200
            first = b""
            while not first.endswith(b"\n\n"):
                first += await asyncio.wait_for(r.content.readline(), 10)
            assert first.startswith(b"event: html\n") and b"By region and site" in first


@async_test
async def test_deployments_pages(tmp_path: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    manifest = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": "fraud"},
        "spec": {"model": {"name": "fraud", "version": "1.0.0"}},
    }
    async with (
        DashboardHub(paths) as d,
        _session(client_tls(paths, d.hub.admin(), tmp_path)) as s,
    ):
        async with d.hub.channel() as channel:
            await d.hub.stub(channel).Apply(
                admin_pb2.ApplyRequest(documents=[json.dumps(manifest).encode()])
            )
        async with s.get(d.url + "/deployments") as r:
            assert r.status == 200
            text = await r.text()
            assert 'href="/deployments/fraud"' in text
            # the model column as edgectl's: what serves (nothing yet: what it asks for), after
            # a rollback the stable version (edgefleet.deploymentstatus.serving_model)
            assert "<td>fraud:1.0.0</td>" in text
        async with s.get(d.url + "/deployments/fraud") as r:
            text = await r.text()
            assert r.status == 200 and "ModelNotPushed" in text
            assert 'data-live="/live/deployments/fraud"' in text
        for path, status in (
            ("/deployments?page=0", 400),
            ("/deployments?page=2", 200),
            ("/deployments/nope", 404),
            ("/live/deployments/nope", 404),
        ):
            async with s.get(d.url + path) as r:
                assert r.status == status, path


@async_test
async def test_a_deployment_page_shows_where_the_scheduler_placed_it_and_why_not_elsewhere(
    tmp_path: Path,
) -> None:
    """A ``replicas.total`` deployment in a real hub with its scheduler and projector: the
    page lists the devices it was placed on (as ``edgectl get placements``) and the
    scheduler's reasons for the devices it left out (each device counted once, under the
    first filter it fails)."""
    from hub.state.storekeys import ModelRecord

    paths = await make_hub_dir(tmp_path / "hub")
    manifest = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": "det"},
        "spec": {
            "model": {"name": "det", "version": "1.0.0"},
            "replicas": {"total": 3},
            "placement": {"nodeSelector": {"site": "shop"}},
        },
    }
    async with (
        DashboardHub(paths) as d,
        _session(client_tls(paths, d.hub.admin(), tmp_path)) as s,
    ):
        ctx = d.hub.ctx
        assert ctx.scheduler is not None
        for name, site in (("cam-1", "shop"), ("cam-2", "shop"), ("cam-3", "depot")):
            ctx.writer.update(fake_device(name, site=site))
        await ctx.writer.flush()
        ctx.cache.put_model(ModelRecord("det", "1.0.0", "ab" * 32, 10, b"{}", 1.0))
        async with d.hub.channel() as channel:
            await d.hub.stub(channel).Apply(
                admin_pb2.ApplyRequest(documents=[json.dumps(manifest).encode()])
            )
        await ctx.scheduler.pass_now()
        assert ctx.cache.placements["det"] == {"cam-1", "cam-2"}
        await eventually(lambda: ctx.cache.desired.holding("det") == {"cam-1", "cam-2"}, 10)

        async def page() -> str:
            async with s.get(d.url + "/deployments/det") as r:
                assert r.status == 200
                return await r.text()

        # the page is rendered at most once a second: wait for one after the projection
        text = await eventually(lambda: _placed_page(page), 10)
        placements = text.split("id=placements>")[1].split("</table>")[0]
        assert re.findall(r'<a href="/devices/([^"]+)">', placements) == ["cam-1", "cam-2"]
        left_out = text.split("<h2>Devices left out</h2>")[1].split("<h2>")[0]
        assert "2/3 replicas placed; 0/3 devices fit" in left_out
        assert "<td>already running a replica</td><td class=num>2</td>" in left_out
        assert "<td>not matching nodeSelector site=shop</td><td class=num>1</td>" in left_out


async def _placed_page(page: Callable[[], Awaitable[str]]) -> str | None:
    text = await page()
    return text if "id=placements>" in text else None


@async_test
async def test_models_pages(tmp_path: Path) -> None:
    """The models page lists a page of model versions, not every one (issue 29, item 7)."""
    from hub.api.dashboard.serving import MODELS_PER_PAGE
    from hub.state.storekeys import ModelRecord

    paths = await make_hub_dir(tmp_path / "hub")
    async with (
        DashboardHub(paths) as d,
        _session(client_tls(paths, d.hub.admin(), tmp_path)) as s,
    ):
        count = MODELS_PER_PAGE + 3
        for i in range(count):
            record = ModelRecord("detector", f"1.{i:03d}.0", "ab" * 32, 10, b"{}", 1.0)
            d.hub.ctx.cache.models[("detector", record.version)] = record
        shown = []
        for page in (1, 2):
            async with s.get(d.url + "/models", params={"page": str(page)}) as r:
                assert r.status == 200
                text = await r.text()
            assert f"page {page} of 2" in text
            shown += re.findall(r"<td>(1\.\d{3}\.0)</td>", text)
        assert shown == [f"1.{i:03d}.0" for i in range(count)]
        async with s.get(d.url + "/models", params={"page": "0"}) as r:
            assert r.status == 400


@async_test
async def test_edgectl_dashboard_prints_a_url_that_logs_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from edgectl.cli import main

    paths = await make_hub_dir(tmp_path / "hub")
    async with DashboardHub(paths) as d:
        config = paths.admin_config
        config.write_text(
            re.sub(
                r'^hub = ".*"$', f'hub = "127.0.0.1:{d.hub.port}"', config.read_text(), flags=re.M
            )
        )
        code = await asyncio.to_thread(main, ["dashboard", "--config", str(config), "--ttl", "2m"])
        assert code == 0
        url, valid = capsys.readouterr().out.splitlines()
        assert url.startswith(f"https://127.0.0.1:{d.server.port}/login?token=v1.")
        assert valid.startswith("valid until ")
        async with _session(client_tls(paths, None, tmp_path)) as s, s.get(url) as r:
            assert r.status == 200 and str(r.url).endswith("/")  # redirected, logged in
            assert "By region and site" in await r.text()


@pytest.mark.scenario
def test_a_fleet_of_10000_is_never_sent_whole(tmp_path: Path) -> None:
    async def scenario() -> None:
        paths = await make_hub_dir(tmp_path / "hub")
        async with (
            DashboardHub(paths) as d,
            _session(client_tls(paths, d.hub.admin(), tmp_path)) as s,
        ):
            ctx = d.hub.ctx
            for i in range(10_000):  # 1,000 sites: more groups than the fleet page lists
                ctx.writer.update(fake_device(f"dev-{i:05d}", site=f"site-{i % 1000}"))
            await ctx.writer.flush()  # into the hub's SQLite store
            for path, rows in (("/", 0), ("/devices", 50), ("/devices?per=200&page=50", 200)):
                async with s.get(d.url + path) as r:
                    body = await r.text()
                    assert r.status == 200, path
                    assert len(body) < 100_000, (path, len(body))
                    assert len(ROWS.findall(body)) == rows, path
            async with s.get(d.url + "/") as r:
                body = await r.text()
                assert "<b data-count=total>10000</b>" in body
                assert "and 900 smaller groups not shown" in body

    asyncio.run(asyncio.wait_for(scenario(), 240))


@async_test
async def test_the_agent_upgrades_page(tmp_path: Path) -> None:
    """An AgentUpgrade rolled back shows its phase, counts and every failed device with its
    reason (text from a device is escaped)."""
    from dataclasses import replace

    from edgefleet.api import parse_manifest
    from hub.decide.agentrevisions import AgentUpgradeState, SentAgent
    from hub.decide.agentupgrade import plan_upgrade
    from hub.decide.revisions import RolloutPhase

    paths = await make_hub_dir(tmp_path / "hub")
    async with (
        DashboardHub(paths) as d,
        _session(client_tls(paths, d.hub.admin(), tmp_path)) as s,
    ):
        async with s.get(d.url + "/agentupgrades") as r:
            assert r.status == 200 and "no AgentUpgrade applied" in await r.text()
        manifest = {
            "apiVersion": "edgefleet.io/v1",
            "kind": "AgentUpgrade",
            "metadata": {"name": "edged-next"},
            "spec": {"version": "0.2.1"},
        }
        upgrade = parse_manifest(manifest)
        cache = d.hub.ctx.cache
        cache.put_object(upgrade.to_dict(), 1)
        first = plan_upgrade(upgrade, None, [], {}, "0.2.0", 1.0).state  # type: ignore[arg-type]
        assert first is not None
        state: AgentUpgradeState = replace(
            first,
            phase=RolloutPhase.ROLLED_BACK,
            message="stopped",
            sent={"dev-1": SentAgent(1, 1.0, "0.2.0")},
            failed={"dev-1": "CrashLoop: <b>exited</b>"},
        )
        cache.agent_upgrades["edged-next"] = state
        d.server.dashboard.memo.clear()  # the page's memo (LIVE_PERIOD_S)
        async with s.get(d.url + "/agentupgrades") as r:
            assert r.status == 200
            text = await r.text()
        assert "<td>edged-next</td><td>0.2.1</td><td>RolledBack</td>" in text, text
        assert "failed dev-1: CrashLoop: &lt;b&gt;exited&lt;/b&gt;" in text, text
