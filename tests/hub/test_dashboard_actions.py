"""The dashboard's actions on rollouts (pause, resume, promote, abort, undo, restart) over
HTTPS against a real hub (hub init, SQLite store, the rollout controller, the admin gRPC API
on loopback): an admin acts with a POST and the session's CSRF token, through the admin API's
own handler, and the event names who acted; a GET, a forged POST (no token, a wrong one,
another session's, from another site), a device certificate, an expired, forged or revoked
token never act."""

from __future__ import annotations

import re
import ssl
import time
from pathlib import Path

import aiohttp
import orjson
from asynctesting import async_test
from dashboardtesting import DashboardHub, client_tls, fake_device
from hubserving import make_hub_dir
from polltesting import eventually

from edgefleet.v1 import admin_pb2
from hub import pki
from hub.api.dashboard.access import DashboardAccess
from hub.api.dashboard.actions import VERBS
from hub.decide.devices import Device, RevisionPhase, RevisionReport, WorkloadReport
from hub.decide.revisions import RolloutPhase
from hub.pki import Identity, Role
from hub.state.storekeys import ModelRecord

CSRF = re.compile(r'name=csrf value="([^"]+)"')
NAME = "det"


def _session(tls: ssl.SSLContext) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=tls), cookie_jar=aiohttp.CookieJar(unsafe=True)
    )


def _manifest(version: str) -> bytes:
    return orjson.dumps(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "ModelDeployment",
            "metadata": {"name": NAME},
            "spec": {
                "model": {"name": "det", "version": version},
                "placement": {"nodeSelector": {"site": "retail"}},
                "rollout": {"maxSurge": 1, "maxUnavailable": 0},
            },
        }
    )


async def _deployment(d: DashboardHub, *, canary: bool = False) -> None:
    """``det`` on two devices: its first revision served by both, its second sent to none
    yet (they never report it): Progressing (``canary``: through :func:`_canary_manifest`)."""
    ctx = d.hub.ctx
    for version in ("1.0.0", "2.0.0"):
        ctx.cache.models[("det", version)] = ModelRecord(
            "det", version, version.replace(".", "") * 8, 1, b"{}", time.time()
        )
    for name in ("shop-0", "shop-1"):
        ctx.writer.update(fake_device(name, site="retail"))
    await ctx.writer.flush()
    for version, phase in (("1.0.0", RolloutPhase.COMPLETE), ("2.0.0", RolloutPhase.PROGRESSING)):
        async with d.hub.channel() as channel:
            doc = _canary_manifest() if canary and version == "2.0.0" else _manifest(version)
            await d.hub.stub(channel).Apply(admin_pb2.ApplyRequest(documents=[doc]))

        def reached(phase: RolloutPhase = phase) -> bool:
            state = ctx.cache.rollouts.get(NAME)
            return state is not None and state.phase is phase

        await eventually(reached, 20, f"the rollout of det {phase.value}")
        if version == "1.0.0":  # both serve it: the next revision has devices to move
            for name in ("shop-0", "shop-1"):
                ctx.writer.update(_serving(ctx.cache.devices[name], version))
            await ctx.writer.flush()

            def ready() -> bool:
                status = d.server.dashboard._status(NAME) or {}
                return status.get("readyDevices") == 2 and status.get("updatedDevices") == 2

            await eventually(ready, 20, "both devices ready on 1.0.0", interval=0.05)


def _serving(device: Device, version: str) -> Device:
    revision = RevisionReport(version, phase=RevisionPhase.READY, ready_replicas=1, wanted=True)
    report = WorkloadReport(version, desired_replicas=1, ready_replicas=1, revisions=(revision,))
    return device.with_(workloads={NAME: report})


def _phase(d: DashboardHub) -> RolloutPhase:
    return d.hub.ctx.cache.rollouts[NAME].phase


def _acted(d: DashboardHub) -> list[str]:
    return [
        str(ev.get("message", ""))
        for ev in d.hub.ctx.cache.events
        if ev.get("reason") == "DashboardAction"
    ]


async def _csrf(s: aiohttp.ClientSession, url: str) -> str:
    async with s.get(url) as r:
        assert r.status == 200
        found = CSRF.search(await r.text())
    assert found, "no action form on the page"
    return found[1]


@async_test
async def test_an_admin_pauses_and_resumes_with_a_post_and_the_sessions_csrf_token(
    tmp_path: Path,
) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with DashboardHub(paths, rollouts=True) as d:
        await _deployment(d)
        page = f"{d.url}/deployments/{NAME}"
        async with _session(client_tls(paths, None, tmp_path)) as s:
            token = await d.token(ttl_s=120)
            async with s.get(f"{d.url}/login", params={"token": token}) as r:
                assert r.status == 200
            csrf = await _csrf(s, page)
            # the page reads like edgectl describe, with the actions
            async with s.get(page) as r:
                text = await r.text()
            for fact in ("Model:", "Selector:", "site=retail", "Strategy:", "maxSurge 1"):
                assert fact in text, fact
            assert "revision 2 (2.0.0) Progressing" in text and "stable revision 1" in text
            for verb in VERBS.values():
                assert f"data-verb={verb.name}" in text
                if not verb.supported:  # shown, disabled, saying so: never a dead button
                    assert f'data-verb={verb.name} title="not supported yet"' in text

            pause = f"{page}/actions/pause"
            async with s.post(pause, data={"csrf": csrf}, allow_redirects=False) as r:
                assert r.status == 303 and r.headers["Location"] == f"/deployments/{NAME}"
            assert _phase(d) is RolloutPhase.PAUSED
            acted = _acted(d)
            assert len(acted) == 1
            assert acted[0].startswith(
                "rollout pause by admin admin on the dashboard (signed in with a token"
            )
            async with s.get(page) as r:  # the outcome, once
                text = await r.text()
                assert "id=flash class='flash ok'" in text and "Pause:" in text
            async with s.get(page) as r:
                assert "id=flash" not in await r.text()
            # the landing page: the deployment and its rollout in progress
            async with s.get(d.url + "/") as r:
                text = await r.text()
            assert "Rollouts in progress" in text and "Paused" in text
            assert f'<a href="/deployments/{NAME}">{NAME}</a>' in text

            # refused by the hub (as edgectl would be): said on the page, nothing done
            async with s.post(pause, data={"csrf": csrf}) as r:
                text = await r.text()
            assert r.status == 200 and "flash bad" in text and "Pause refused:" in text
            assert "not Progressing" in text
            assert len(_acted(d)) == 1

            async with s.post(f"{page}/actions/resume", data={"csrf": csrf}) as r:
                assert "Resume:" in await r.text()
            assert _phase(d) is RolloutPhase.PROGRESSING
            # abort: every device back to the stable revision
            async with s.post(f"{page}/actions/abort", data={"csrf": csrf}) as r:
                text = await r.text()
            assert "flash ok" in text and "Abort:" in text
            assert _phase(d) is RolloutPhase.ROLLED_BACK
            assert _acted(d)[-1].startswith("rollout abort by admin admin")
            # undo to a revision not kept: refused with the admin API's reason
            async with s.post(f"{page}/actions/undo", data={"csrf": csrf, "to": "7"}) as r:
                assert "no revision 7 (kept: 1, 2)" in await r.text()
            async with s.post(f"{page}/actions/undo", data={"csrf": csrf, "to": "x1"}) as r:
                assert r.status == 400 and "to: must be a revision number" in await r.text()
            for verb in VERBS.values():
                if not verb.supported:
                    async with s.post(f"{page}/actions/{verb.name}", data={"csrf": csrf}) as r:
                        assert r.status == 501 and "not supported yet" in await r.text()
            async with s.post(f"{d.url}/deployments/nope/actions/pause", data={"csrf": csrf}) as r:
                assert r.status == 404
        # with the admin certificate: its own CSRF token, and the event says so
        async with _session(client_tls(paths, d.hub.admin(), tmp_path)) as s:
            cert_csrf = await _csrf(s, page)
            assert cert_csrf != csrf
            # resume after the abort: the same revision rolled out again
            async with s.post(f"{page}/actions/resume", data={"csrf": cert_csrf}) as r:
                assert r.status == 200 and "flash ok" in await r.text()
            assert _phase(d) is RolloutPhase.PROGRESSING
            assert "(signed in with a client certificate, certificate serial" in _acted(d)[-1]
            # undo: back to the stable revision (its template again: no new revision)
            async with s.post(f"{page}/actions/undo", data={"csrf": cert_csrf}) as r:
                text = await r.text()
            assert "flash ok" in text and "Undo: det:" in text and "revision 1 (1.0.0)" in text
            assert d.hub.ctx.cache.deployments[NAME].spec.model.version == "1.0.0"
            assert _acted(d)[-1].startswith("rollout undo by admin admin")


def _canary_manifest() -> bytes:
    """det 2.0.0 through a canary: half the devices, a pause until promoted, then all."""
    doc = orjson.loads(_manifest("2.0.0"))
    doc["spec"]["rollout"]["canary"] = {"steps": ["50%", {"pause": {}}, "100%"]}
    return orjson.dumps(doc)


@async_test
async def test_promote_and_restart_act_through_the_admin_api(tmp_path: Path) -> None:
    """A canary held at its pause is promoted with a POST (the next step starts: the second
    device is given the revision), and once Complete, restart rolls the same template out
    again as a new revision; a restart of a rollout in progress is refused with the
    controller's reason, and each action is an event naming who acted."""
    paths = await make_hub_dir(tmp_path / "hub")
    async with DashboardHub(paths, rollouts=True) as d:
        ctx = d.hub.ctx
        await _deployment(d, canary=True)

        def rollout() -> tuple[int, RolloutPhase, str]:
            state = ctx.cache.rollouts[NAME]
            return state.revision, state.phase, state.reason

        assert rollout()[0] == 2
        # the canary device serves revision 2: step 1 passes and the pause holds the rest
        ctx.writer.update(_serving(ctx.cache.devices["shop-0"], "2.0.0"))
        await ctx.writer.flush()
        await eventually(
            lambda: rollout()[1:] == (RolloutPhase.PAUSED, "CanaryPause"),
            20,
            "the canary's pause",
            detail=lambda: repr(ctx.cache.rollouts[NAME]),
        )
        page = f"{d.url}/deployments/{NAME}"
        async with _session(client_tls(paths, d.hub.admin(), tmp_path)) as s:
            csrf = await _csrf(s, page)
            async with s.post(f"{page}/actions/restart", data={"csrf": csrf}) as r:
                text = await r.text()
            assert "Restart refused:" in text and "restart re-rolls a Complete revision" in text
            assert not _acted(d)
            async with s.post(f"{page}/actions/promote", data={"csrf": csrf}) as r:
                text = await r.text()
            assert "flash ok" in text and "Promote:" in text, text[-2000:]
            assert _acted(d)[-1].startswith("rollout promote by admin admin")
            await eventually(lambda: rollout()[1] is RolloutPhase.PROGRESSING, 20, "past the pause")
            # the last step: the second device serves it too, and the rollout completes
            ctx.writer.update(_serving(ctx.cache.devices["shop-1"], "2.0.0"))
            await ctx.writer.flush()
            await eventually(
                lambda: rollout()[:2] == (2, RolloutPhase.COMPLETE),
                20,
                "revision 2 Complete",
                detail=lambda: repr(ctx.cache.rollouts[NAME]),
            )
            async with s.post(f"{page}/actions/restart", data={"csrf": csrf}) as r:
                text = await r.text()
            assert "flash ok" in text and "Restart:" in text and "restarted" in text, text[-2000:]
            assert _acted(d)[-1].startswith("rollout restart by admin admin")
            # the same template rolled out again as a new revision
            await eventually(lambda: rollout()[0] == 3, 20, "revision 3 (the restart)")
            assert ctx.cache.deployments[NAME].spec.model.version == "2.0.0"
            assert ctx.cache.rollouts[NAME].restarted_at


@async_test
async def test_forged_posts_and_gets_never_act(tmp_path: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with DashboardHub(paths, rollouts=True) as d:
        await _deployment(d)
        page = f"{d.url}/deployments/{NAME}"
        pause = f"{page}/actions/pause"
        async with _session(client_tls(paths, d.hub.admin(), tmp_path)) as s:
            csrf = await _csrf(s, page)
            async with s.get(pause) as r:  # an action URL fetched: never acts
                assert r.status == 405
            for form in (
                {},
                {"csrf": ""},
                {"csrf": csrf[:-2] + ("AA" if not csrf.endswith("AA") else "BB")},
                {"csrf": "x" * 5000},
                # another session's token (another admin's token session)
                {"csrf": d.server.dashboard.access.csrf_token("token:someone-else")},
                # the token of this session made with another hub process's key
                {"csrf": DashboardAccess().csrf_token("cert:1")},
            ):
                async with s.post(pause, data=form, allow_redirects=False) as r:
                    assert r.status in (403, 413), form
                    if r.status == 403:
                        assert "CSRF token is missing or wrong" in await r.text()
            # the right token, but the form comes from another site
            for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Origin": "https://evil.example"}):
                async with s.post(pause, data={"csrf": csrf}, headers=headers) as r:
                    assert r.status == 403 and "nothing was done" in await r.text()
            # not a form
            async with s.post(pause, json={"csrf": csrf}) as r:
                assert r.status == 415
            assert _phase(d) is RolloutPhase.PROGRESSING and not _acted(d)

            # a device certificate is let nowhere, with or without the admin's token
            device = pki.issue_client_certificate(
                d.hub.ctx.ca, Identity(Role.DEVICE, "shop-0", d.hub.ctx.region)
            )
        async with _session(client_tls(paths, device, tmp_path)) as dev:
            async with dev.post(pause, data={"csrf": csrf}, allow_redirects=False) as r:
                assert r.status == 403 and "device certificate" in await r.text()
            serial = format(device.certificate.serial_number, "x")
            forged = d.server.dashboard.access.csrf_token(f"cert:{serial}")
            async with dev.post(pause, data={"csrf": forged}, allow_redirects=False) as r:
                assert r.status == 403
        # without credentials, a forged or an expired token: 401
        async with _session(client_tls(paths, None, tmp_path)) as anon:
            async with anon.post(pause, data={"csrf": csrf}, allow_redirects=False) as r:
                assert r.status == 401
            token = await d.token(ttl_s=60)
            async with anon.get(f"{d.url}/login", params={"token": token}) as r:
                assert r.status == 200
            token_csrf = await _csrf(anon, page)
            d.server.dashboard.clock = lambda: time.time() + 61
            async with anon.post(pause, data={"csrf": token_csrf}, allow_redirects=False) as r:
                assert r.status == 401 and "expired" in await r.text()
            d.server.dashboard.clock = time.time
            bad = {"Authorization": "Bearer v1.AAAA.BBBB"}
            async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=client_tls(paths, None, tmp_path))
            ) as fresh:
                async with fresh.post(pause, data={"csrf": token_csrf}, headers=bad) as r:
                    assert r.status == 401
                # the admin's certificate revoked: its token acts no more
                admin_serial = format(d.hub.admin().certificate.serial_number, "x")
                d.hub.ctx.cache.revoked[admin_serial] = "admin"
                ok = {"Authorization": f"Bearer {token}"}
                async with fresh.post(pause, data={"csrf": token_csrf}, headers=ok) as r:
                    assert r.status == 401 and "revoked" in await r.text()
        assert _phase(d) is RolloutPhase.PROGRESSING and not _acted(d)


def test_csrf_tokens_are_per_session_and_checked_whole() -> None:
    access = DashboardAccess()
    a, b = access.csrf_token("token:a"), access.csrf_token("token:b")
    assert a != b and access.csrf_ok("token:a", a) and not access.csrf_ok("token:b", a)
    assert not access.csrf_ok("", access.csrf_token(""))  # no session: no token
    assert not access.csrf_ok("token:a", a[:-1]) and not access.csrf_ok("token:a", a + "x")
    assert not access.csrf_ok("token:a", "\udcff" * 10)
    assert not DashboardAccess().csrf_ok("token:a", a)  # another hub process's key


@async_test
async def test_an_agent_upgrades_actions_are_the_admin_apis(tmp_path: Path) -> None:
    """An AgentUpgrade's actions: pause, resume and undo as forms; promote, abort and restart,
    which the admin API does not do for an AgentUpgrade yet, disabled and saying so, and
    refused if posted all the same; the controller's refusal shown on the page."""
    from dataclasses import replace

    from edgefleet.api import parse_manifest
    from hub.decide.agentupgrade import plan_upgrade

    paths = await make_hub_dir(tmp_path / "hub")
    async with DashboardHub(paths) as d:
        upgrade = parse_manifest(
            {
                "apiVersion": "edgefleet.io/v1",
                "kind": "AgentUpgrade",
                "metadata": {"name": "edged-next"},
                "spec": {"version": "0.2.1"},
            }
        )
        cache = d.hub.ctx.cache
        cache.put_object(upgrade.to_dict(), 1)
        first = plan_upgrade(upgrade, None, [], {}, "0.2.0", 1.0).state  # type: ignore[arg-type]
        assert first is not None
        cache.agent_upgrades["edged-next"] = replace(first, phase=RolloutPhase.ROLLED_BACK)
        page = f"{d.url}/agentupgrades"
        base = f"{page}/edged-next/actions"
        async with _session(client_tls(paths, d.hub.admin(), tmp_path)) as s:
            async with s.get(page) as r:
                text = await r.text()
            csrf = CSRF.search(text)
            assert csrf
            for verb in ("pause", "resume", "undo"):
                assert f'action="/agentupgrades/edged-next/actions/{verb}"' in text
            for verb in ("promote", "abort", "restart"):
                assert f'data-verb={verb} title="not supported yet"' in text
                async with s.post(f"{base}/{verb}", data={"csrf": csrf[1]}) as r:
                    assert r.status == 501 and "not supported yet" in await r.text()
            async with s.post(f"{base}/pause", data={"csrf": csrf[1]}) as r:
                text = await r.text()
            assert r.url.path == "/agentupgrades" and "Pause refused:" in text
            async with s.post(f"{page}/nope/actions/pause", data={"csrf": csrf[1]}) as r:
                assert r.status == 404
        assert cache.agent_upgrades["edged-next"].phase is RolloutPhase.ROLLED_BACK
        assert not _acted(d)
