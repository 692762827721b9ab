"""The dashboard's listener (``dashboardListen`` in hub.toml): aiohttp over HTTPS with the
hub's serving certificate, every request authenticated (:mod:`hub.api.dashboard.access`):

* a client certificate, asked for in the handshake (optional there, verified against the hub
  CA): an admin certificate of this region, not revoked, is let in; any other is refused;
* or a dashboard token: ``GET /login?token=T`` (the URL ``edgectl dashboard`` prints) sets it
  as an HttpOnly, Secure, SameSite=Strict cookie that lives as long as the token, and
  redirects to ``/``; ``Authorization: Bearer T`` works too. The access log is off (a URL
  may carry a token); refusals are logged without it.

Pages (:mod:`hub.api.dashboard.pages`, :mod:`hub.api.dashboard.rolloutpages`) are computed
from the cache (:mod:`hub.api.dashboard.views`).
Actions on rollouts (:mod:`hub.api.dashboard.actions`) are POSTs to
``/deployments/NAME/actions/VERB`` and ``/agentupgrades/NAME/actions/VERB`` carrying the
session's CSRF token (``csrf``, checked in constant time), refused from another site
(``Sec-Fetch-Site``, ``Origin``), then a redirect (303) back to the page, which shows the
outcome once.
Live sections are server-sent events: ``/live/fleet`` and ``/live/deployments/NAME`` send the
section's HTML again when it changed (woken by each new event, checked every
:data:`LIVE_PERIOD_S` at most; rendered at most once per period for every viewer together),
``/events/stream`` sends each new event as JSON from the cache's event log (resuming after
``Last-Event-ID``). Every response has a Content-Security-Policy that allows only the
dashboard's own script and style.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from edgefleet.configfiles import parse_host_port
from edgefleet.deploymentstatus import serving_model
from edgefleet.errors import EdgefleetError
from edgefleet.logs import get_logger
from hub import pki
from hub.api.dashboard import pages, rolloutpages, views
from hub.api.dashboard.access import AccessRefused, DashboardAccess, Viewer
from hub.api.dashboard.actions import (
    AGENT_UPGRADE,
    MAX_REVISION,
    MODEL_DEPLOYMENT,
    VERBS,
    ActionFailed,
    RolloutActions,
)
from hub.initializing import HubPaths
from hub.pki import Role
from hub.state.cache import Cache

if TYPE_CHECKING:
    from hub.api.admin.showing import Showing

log = get_logger(__name__)

COOKIE = "edgefleet_dashboard"
LIVE_PERIOD_S = 1.0
COST_FACTOR = 10.0
DEPLOYMENTS_PER_PAGE = 20
MODELS_PER_PAGE = 50
MAX_AGENT_UPGRADES_SHOWN = 100
KEEPALIVE_S = 15.0
MAX_STREAMS = 64
MAX_EVENTS_SHOWN = 100
MAX_DEVICE_EVENTS = 50
MAX_DEPLOYMENT_EVENTS = 30
MAX_FORM_BYTES = 4096  # an action's form: a CSRF token and a revision number
MAX_FLASHES = 256  # the outcomes of actions not shown yet, one per session
STATIC = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}
VIEWER: web.RequestKey[Viewer] = web.RequestKey("viewer", Viewer)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class DashboardError(EdgefleetError):
    """The dashboard cannot start (its listen address, its certificate)."""


def tls_context(paths: HubPaths) -> ssl.SSLContext:
    """The hub's serving certificate; a client certificate asked for, verified if given."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(paths.hub_certificate, paths.hub_key)
        context.load_verify_locations(cafile=str(paths.ca_certificate))
    except (OSError, ssl.SSLError) as exc:
        raise DashboardError(f"the dashboard cannot load the hub's certificate: {exc}") from None
    context.verify_mode = ssl.CERT_OPTIONAL
    return context


class Memo:
    """Values computed at most once per ``period`` whoever asks (many viewers, one render),
    and kept longer when they are dear: a value that took T seconds is kept ``COST_FACTOR``
    times T, so live views never take more than about 1/COST_FACTOR of the hub's CPU per
    page, whatever the fleet's size."""

    def __init__(self, period: float) -> None:
        self.period = period
        self._values: dict[str, tuple[float, float, Any]] = {}  # key -> (at, keep, value)

    def get(self, key: str, compute: Callable[[], Any]) -> Any:
        now = time.monotonic()
        hit = self._values.get(key)
        if hit is not None and now - hit[0] < hit[1]:
            return hit[2]
        value = compute()
        cost = time.monotonic() - now
        if len(self._values) > 1000:
            self._values.clear()
        self._values[key] = (now, max(self.period, COST_FACTOR * cost), value)
        return value

    def clear(self) -> None:
        self._values.clear()


class Dashboard:
    """The dashboard's aiohttp application over the hub's cache (see the module doc);
    hub.server builds it with what it uses."""

    def __init__(
        self,
        cache: Cache,
        show: Showing,
        access: DashboardAccess,
        *,
        region: str,
        clock: Callable[[], float],
        actions: RolloutActions | None = None,
    ) -> None:
        self.cache = cache
        self.actions = actions  # an admin's actions on rollouts (None: read-only)
        # the outcome of each session's last action, shown once on the page it returns to
        self.flashes: dict[str, tuple[str, bool, str]] = {}  # session -> (path, ok, text)
        self._show = show  # a deployment's status, as `edgectl get` shows it
        self.access = access  # verifies tokens; told the port the dashboard is bound to
        self.region = region
        self.clock = clock
        self.memo = Memo(LIVE_PERIOD_S)
        self.history = views.FigureHistory()  # each deployment's figures over time
        self.streams = 0
        self.stopping = asyncio.Event()
        self.app = web.Application(
            middlewares=[self._headers, self._authenticate], client_max_size=MAX_FORM_BYTES
        )
        r = self.app.router
        r.add_get("/login", self.login)
        r.add_get("/", self.fleet)
        r.add_get("/live/fleet", self.live_fleet)
        r.add_get("/devices", self.devices)
        r.add_get("/devices/{name}", self.device)
        r.add_get("/deployments", self.deployments)
        r.add_get("/deployments/{name}", self.deployment)
        r.add_get("/live/deployments/{name}", self.live_deployment)
        r.add_get("/deployments/{name}/canary", self.canary)
        r.add_get("/live/deployments/{name}/canary", self.live_canary)
        r.add_get("/events", self.events)
        r.add_get("/events/stream", self.event_stream)
        r.add_get("/models", self.models)
        r.add_get("/agentupgrades", self.agent_upgrades)
        r.add_get("/static/{file}", self.static)
        # actions: POST only (a GET there is 405), with the session's CSRF token
        r.add_post("/deployments/{name}/actions/{verb}", self.act_deployment)
        r.add_post("/agentupgrades/{name}/actions/{verb}", self.act_upgrade)

    # -- middlewares -----------------------------------------------------------------------
    @web.middleware
    async def _headers(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                exc.headers.update(SECURITY_HEADERS)
                raise
            response = self._error(exc.status, exc.text or exc.reason)
        except views.BadQuery as exc:
            response = self._error(400, str(exc))
        if not response.prepared:
            response.headers.update(SECURITY_HEADERS)
        return response

    def _error(self, status: int, message: str) -> web.Response:
        text = pages.error_page(status, message, region=self.region)
        response = web.Response(status=status, text=text, content_type="text/html")
        if status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="edgefleet dashboard"'
        return response

    def viewer_of(self, request: web.Request) -> Viewer:
        """Who makes ``request``; raises :class:`AccessRefused` (401) or HTTPForbidden."""
        ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if der:
            cert = pki.load_certificate(der)
            identity = pki.identity_from_certificate(cert)
            serial = format(cert.serial_number, "x")
            if identity.role is not Role.ADMIN or identity.region != self.region:
                raise web.HTTPForbidden(
                    text=f"a {identity.role.value} certificate of region {identity.region} may "
                    "not see the dashboard (needs an admin certificate of this hub)"
                )
            if serial in self.cache.revoked:
                raise web.HTTPForbidden(text=f"certificate {serial} has been revoked")
            return Viewer(identity.name, serial, "certificate", session=f"cert:{serial}")
        token = request.cookies.get(COOKIE, "")
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            token = auth[len("Bearer ") :].strip()
        if not token:
            raise AccessRefused(
                "authentication required: an admin client certificate, or a token from "
                "edgectl dashboard"
            )
        return self.access.verify(token, now=self.clock(), revoked=self.cache.revoked)

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/login":
            return await handler(request)
        try:
            viewer = self.viewer_of(request)
        except (AccessRefused, EdgefleetError) as exc:
            log.info("dashboard request refused", path=request.path, reason=str(exc))
            return self._error(401, str(exc))
        request[VIEWER] = viewer
        return await handler(request)

    # -- pages -----------------------------------------------------------------------------
    def _page(self, request: web.Request, title: str, body: str, active: str) -> web.Response:
        text = pages.layout(title, body, request[VIEWER], region=self.region, active=active)
        return web.Response(text=text, content_type="text/html")

    async def login(self, request: web.Request) -> web.StreamResponse:
        token = request.query.get("token", "")
        try:
            viewer = self.access.verify(token, now=self.clock(), revoked=self.cache.revoked)
        except AccessRefused as exc:
            log.info("dashboard login refused", reason=str(exc))
            return self._error(401, str(exc))
        assert viewer.expires is not None
        log.info("dashboard login", admin=viewer.name)
        response = web.HTTPSeeOther("/")
        response.set_cookie(
            COOKIE,
            token,
            max_age=max(1, int(viewer.expires - self.clock())),
            path="/",
            secure=True,
            httponly=True,
            samesite="Strict",
        )
        raise response

    def _fleet_html(self) -> str:
        cache = self.cache

        def compute() -> str:
            summary = views.fleet_summary(
                cache.devices.values(), cache.desired, cache.security_policy(), self.region
            )
            rows, _ = self._deployment_rows(1)
            more = len(cache.deployments) - len(rows)
            overview = rolloutpages.rollouts_overview(self._in_progress(), rows, more)
            return overview + "<h2>Devices</h2>" + pages.fleet_fragment(summary)

        return str(self.memo.get("fleet", compute))

    def _in_progress(self) -> list[dict[str, Any]]:
        """The rollouts moving now (Progressing or Paused): every ModelDeployment's and
        AgentUpgrade's, from their rollout records (no pass over the devices), at most
        MAX_AGENT_UPGRADES_SHOWN of each kind."""
        cache = self.cache
        moving = ("Progressing", "Paused")
        rows: list[dict[str, Any]] = []
        for name, state in sorted(cache.rollouts.items()):
            if state.phase.value not in moving or name not in cache.deployments:
                continue
            revisions = cache.revisions.get(name, {})
            current, stable = revisions.get(state.revision), revisions.get(state.stable)
            what = f"{state.revision} ({current.model[1] if current else '?'})"
            if state.stable != state.revision:
                what += f" from {state.stable} ({stable.model[1] if stable else '?'})"
            steps = cache.deployments[name].spec.rollout.canary
            count = len(steps.steps) if steps is not None else 0
            step = (
                f"canary step {min(state.step + 1, count)} of {count}"
                if count
                else f"{len(state.updated)} devices moved"
            )
            rows.append(
                {
                    "kind": "ModelDeployment",
                    "name": name,
                    "href": f"/deployments/{pages.seg(name)}",
                    "what": what,
                    "phase": state.phase.value,
                    "step": step,
                    "since": state.changed_at or state.started_at,
                    "message": state.message,
                }
            )
            if len(rows) >= MAX_AGENT_UPGRADES_SHOWN:
                break
        upgrades = 0
        for name, up in sorted(cache.agent_upgrades.items()):
            if up.phase.value not in moving or upgrades >= MAX_AGENT_UPGRADES_SHOWN:
                continue
            upgrades += 1
            target = up.revision_of(up.revision)
            rows.append(
                {
                    "kind": "AgentUpgrade",
                    "name": name,
                    "href": "/agentupgrades",
                    "what": f"{up.revision} (edged {target.version if target else '?'})",
                    "phase": up.phase.value,
                    "step": f"{len(up.sent)} devices sent",
                    "since": up.changed_at or up.started_at,
                    "message": up.message,
                }
            )
        return rows

    async def fleet(self, request: web.Request) -> web.StreamResponse:
        body = pages.live("/live/fleet", self._fleet_html())
        return self._page(request, "Fleet", body, "/")

    async def devices(self, request: web.Request) -> web.StreamResponse:
        query = views.parse_device_query(request.query)
        devices = self.cache.devices
        names: list[str] = self.memo.get("names", lambda: sorted(devices))
        in_order = (d for n in names if (d := devices.get(n)) is not None)
        page = views.device_page(in_order, query, by_name=True)
        return self._page(request, "Devices", pages.devices_body(page, query), "/devices")

    async def device(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        cache = self.cache
        device = cache.devices.get(name)
        if device is None:
            raise web.HTTPNotFound(text=f"no device {name!r}")
        events = views.events_of(cache.events, kind="Device", name=name, limit=MAX_DEVICE_EVENTS)
        body = pages.device_body(device, cache.desired.get(name), events)
        return self._page(request, f"Device {name}", body, "/devices")

    def _doc(self, name: str) -> dict[str, Any] | None:
        """The deployment as ``edgectl get -o json`` shows it (spec, status, metadata)."""
        stored = self.cache.stored.get(("ModelDeployment", name))
        if stored is None:
            return None
        doc: dict[str, Any] = self._show.object_json("ModelDeployment", stored.manifest)
        return doc

    def _status(self, name: str) -> dict[str, Any] | None:
        doc = self._doc(name)
        if doc is None:
            return None
        status: dict[str, Any] = doc.get("status", {})
        return status

    def _deployment_rows(self, page: int) -> tuple[list[dict[str, Any]], int]:
        """One page of deployments with their status, and how many pages there are (each
        status is a pass over the devices: a page bounds the work)."""
        names = sorted(self.cache.deployments)
        pages_ = max(1, -(-len(names) // DEPLOYMENTS_PER_PAGE))
        start = (page - 1) * DEPLOYMENTS_PER_PAGE

        def compute() -> list[dict[str, Any]]:
            rows = []
            for name in names[start : start + DEPLOYMENTS_PER_PAGE]:
                dep = self.cache.deployments[name]
                model = dep.spec.model
                status = self._status(name) or {}
                spec = {"model": {"name": model.name, "version": model.version}}
                # what serves (after a rollback: the stable version, the rejected one named),
                # as edgectl's MODEL column, never only the version asked for
                shown = serving_model({"spec": spec, "status": status})
                rows.append({"name": name, "model": shown, "status": status})
            return rows

        rows: list[dict[str, Any]] = self.memo.get(f"deployments/{page}", compute)
        return rows, pages_

    async def deployments(self, request: web.Request) -> web.StreamResponse:
        page = views.page_param(request.query)
        rows, pages_ = self._deployment_rows(page)
        body = rolloutpages.deployments_body(rows, page, pages_)
        return self._page(request, "Deployments", body, "/deployments")

    def _deployment_html(self, name: str) -> str | None:
        def compute() -> str | None:
            doc = self._doc(name)
            if doc is None:
                self.history.forget(name)
                return None
            status: dict[str, Any] = doc.get("status", {})
            cache = self.cache
            state = cache.rollouts.get(name)
            revisions = []
            for number, rev in sorted(cache.revisions.get(name, {}).items()):
                role = ""
                if state is not None:
                    role = (
                        "current"
                        if number == state.revision
                        else "stable"
                        if number == state.stable
                        else ""
                    )
                serving = status.get("versions", {}).get(rev.model[1], {})
                revisions.append(
                    {
                        "number": number,
                        "model": " ".join(rev.model),
                        "createdAt": rev.created_at,
                        "role": role,
                        "devices": serving.get("devices", 0),
                        "ready": serving.get("ready", 0),
                    }
                )
            self.history.record(name, status, time.time())
            series, thresholds = self.history.of(name)
            events = views.events_of(
                cache.events, kind=MODEL_DEPLOYMENT, name=name, limit=MAX_DEPLOYMENT_EVENTS
            )
            placed = views.deployment_placements(
                name,
                dep=cache.deployments.get(name),
                holding=cache.desired.holding(name),
                devices=cache.devices,
                records=cache.desired,
                revisions=cache.revisions.get(name, {}),
                models=cache.models,
                explanation=cache.explanations.get(name),
            )
            return rolloutpages.deployment_fragment(
                status, revisions, series, thresholds, doc=doc, events=events, placements=placed
            )

        html: str | None = self.memo.get(f"deployment/{name}", compute)
        return html

    async def deployment(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        html = self._deployment_html(name)
        if html is None:
            raise web.HTTPNotFound(text=f"no deployment {name!r}")
        link = (
            f'<p><a id=canary-link href="/deployments/{pages.seg(name)}/canary">'
            "canary against stable, over time →</a></p>"
        )
        base = f"/deployments/{pages.seg(name)}"
        body = (
            self._flash(request, base)
            + self._actions(request, base)
            + link
            + pages.live(f"/live/deployments/{pages.seg(name)}", html)
        )
        return self._page(request, f"Deployment {name}", body, "/deployments")

    def _canary_html(self, name: str) -> str | None:
        """The canary-against-stable page of ``name`` from the analysis the rollout
        controller keeps over time (``cache.analysis``, loaded from the store at start):
        the samples of the current revision, else of the newest revision that has some."""

        def compute() -> str | None:
            cache = self.cache
            if name not in cache.deployments:
                return None
            ring = list(cache.analysis.get(name, {}).values())
            state = cache.rollouts.get(name)
            revision = state.revision if state is not None else 0
            if ring and not any(s.revision == revision for s in ring):
                revision = ring[-1].revision
            samples = [s for s in ring if s.revision == revision]
            phase = state.phase.value if state is not None else "—"
            message = state.message if state is not None and state.revision == revision else ""
            return rolloutpages.canary_fragment(name, samples, phase, message)

        html: str | None = self.memo.get(f"canary/{name}", compute)
        return html

    async def canary(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        html = self._canary_html(name)
        if html is None:
            raise web.HTTPNotFound(text=f"no deployment {name!r}")
        link = f'<p><a href="/deployments/{pages.seg(name)}">← deployment {pages.esc(name)}</a></p>'
        body = link + pages.live(f"/live/deployments/{pages.seg(name)}/canary", html)
        return self._page(request, f"Canary of {name} against stable", body, "/deployments")

    async def live_canary(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if self._canary_html(name) is None:
            raise web.HTTPNotFound(text=f"no deployment {name!r}")
        return await self._live(request, lambda: self._canary_html(name))

    async def events(self, request: web.Request) -> web.StreamResponse:
        log_ = self.cache.events
        shown = views.events_of(log_, limit=MAX_EVENTS_SHOWN)
        return self._page(request, "Events", pages.events_body(shown, log_.appended), "/events")

    async def agent_upgrades(self, request: web.Request) -> web.StreamResponse:
        """Every AgentUpgrade with its status (at most MAX_AGENT_UPGRADES_SHOWN: they are
        operators' objects, few)."""

        def compute() -> list[dict[str, Any]]:
            rows = []
            for stored in self.cache.objects_of("AgentUpgrade")[:MAX_AGENT_UPGRADES_SHOWN]:
                doc = self._show.object_json("AgentUpgrade", stored.manifest)
                rows.append(
                    {
                        "name": stored.name,
                        "version": str(stored.manifest.get("spec", {}).get("version", "")),
                        "status": doc.get("status", {}),
                    }
                )
            return rows

        rows: list[dict[str, Any]] = self.memo.get("agentupgrades", compute)
        body = self._flash(request, "/agentupgrades") + rolloutpages.agent_upgrades_body(rows)
        body += "".join(
            self._actions(
                request,
                f"/agentupgrades/{pages.seg(r['name'])}",
                title=f"AgentUpgrade {r['name']}",
                kind=AGENT_UPGRADE,
            )
            for r in rows
        )
        return self._page(request, "Agent upgrades", body, "/agentupgrades")

    async def models(self, request: web.Request) -> web.StreamResponse:
        """One page of pushed model versions, by name and version (each row parses its
        signed metadata: a page bounds the work and what is sent)."""
        page = views.page_param(request.query)
        cache = self.cache
        keys = sorted(cache.models)
        pages_ = max(1, -(-len(keys) // MODELS_PER_PAGE))
        start = (page - 1) * MODELS_PER_PAGE
        shown = {key: cache.models[key] for key in keys[start : start + MODELS_PER_PAGE]}
        wanted = {
            name: (dep.spec.model.name, dep.spec.model.version)
            for name, dep in cache.deployments.items()
        }
        body = pages.models_body(views.model_versions(shown, wanted), page, pages_)
        return self._page(request, "Models", body, "/models")

    async def static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["file"]
        if name not in STATIC:
            raise web.HTTPNotFound(text="no such file")
        data = resources.files("hub.api.dashboard").joinpath("static", name).read_bytes()
        return web.Response(body=data, content_type=STATIC[name], charset="utf-8")

    # -- actions (hub.api.dashboard.actions) ------------------------------------------------
    def _actions(
        self,
        request: web.Request,
        base: str,
        title: str = "Actions",
        kind: str = MODEL_DEPLOYMENT,
    ) -> str:
        viewer = request[VIEWER]
        csrf = self.access.csrf_token(viewer.session) if viewer.session else ""
        enabled = self.actions is not None and bool(csrf)
        return rolloutpages.actions_html(
            base, csrf, VERBS.values(), enabled=enabled, kind=kind, title=title
        )

    def _flash(self, request: web.Request, path: str) -> str:
        """The outcome of this session's last action if it returned to ``path`` (shown once)."""
        session = request[VIEWER].session
        held = self.flashes.get(session)
        if held is None or held[0] != path:
            return ""
        del self.flashes[session]
        return rolloutpages.flash_html((held[1], held[2]))

    def _from_elsewhere(self, request: web.Request) -> str | None:
        """Why a POST does not come from the dashboard's own pages, as the browser tells (a
        check besides the CSRF token): another site (Sec-Fetch-Site), another origin."""
        site = request.headers.get("Sec-Fetch-Site")
        if site is not None and site not in ("same-origin", "none"):
            return f"a request from another site ({site[:40]})"
        origin = request.headers.get("Origin")
        # no-referrer pages send "Origin: null" with their forms
        if origin is not None and origin not in ("null", f"https://{request.host}"):
            return "a request from another origin"
        return None

    async def act_deployment(self, request: web.Request) -> web.StreamResponse:
        return await self._act(request, MODEL_DEPLOYMENT)

    async def act_upgrade(self, request: web.Request) -> web.StreamResponse:
        return await self._act(request, AGENT_UPGRADE)

    async def _act(self, request: web.Request, kind: str) -> web.StreamResponse:
        """An admin's action (POST, the session's CSRF token): done through the admin API's
        handler, then back to the page with its outcome (303)."""
        viewer = request[VIEWER]
        name = request.match_info["name"]
        verb = VERBS.get(request.match_info["verb"])
        if verb is None:
            raise web.HTTPNotFound(text=f"no such action: one of {', '.join(VERBS)}")
        elsewhere = self._from_elsewhere(request)
        if elsewhere is not None:
            log.warning("dashboard action refused", reason=elsewhere, admin=viewer.name)
            raise web.HTTPForbidden(text=f"{elsewhere}: nothing was done")
        if request.content_type != "application/x-www-form-urlencoded":
            raise web.HTTPUnsupportedMediaType(text="an action is a form (urlencoded)")
        form = await request.post()
        if not self.access.csrf_ok(viewer.session, str(form.get("csrf", ""))):
            log.warning("dashboard action refused", reason="CSRF token", admin=viewer.name)
            raise web.HTTPForbidden(
                text="the form's CSRF token is missing or wrong: nothing was done "
                "(reload the page and try again)"
            )
        if self.actions is None:
            raise web.HTTPNotImplemented(text="this dashboard cannot act (read-only)")
        if kind == MODEL_DEPLOYMENT:
            back = f"/deployments/{pages.seg(name)}"
            if name not in self.cache.deployments:
                raise web.HTTPNotFound(text=f"no deployment {name!r}")
        else:
            back = "/agentupgrades"
            if (AGENT_UPGRADE, name) not in self.cache.stored:
                raise web.HTTPNotFound(text=f"no AgentUpgrade {name!r}")
        to_text = str(form.get("to", "")).strip()
        if to_text and not (to_text.isdigit() and len(to_text) <= 10):
            raise web.HTTPBadRequest(text=f"to: must be a revision number, got {to_text[:20]!r}")
        to = int(to_text) if to_text else 0
        if to > MAX_REVISION:
            raise web.HTTPBadRequest(text=f"to: must be at most {MAX_REVISION}")
        try:
            full = str(form.get("full", "")) in ("1", "on", "true")
            message = await self.actions.act(kind, name, verb, viewer, to, full=full)
        except ActionFailed as exc:
            if exc.status == 501:
                raise web.HTTPNotImplemented(text=exc.message) from None
            outcome = (False, f"{verb.label} refused: {exc.message}")
        else:
            outcome = (True, f"{verb.label}: {message}")
        if len(self.flashes) >= MAX_FLASHES:
            self.flashes.clear()
        self.flashes[viewer.session] = (back, *outcome)
        self.memo.clear()  # the pages show the change at once
        raise web.HTTPSeeOther(back)

    # -- live ------------------------------------------------------------------------------
    async def _stream(self, request: web.Request) -> web.StreamResponse:
        if self.streams >= MAX_STREAMS:
            raise web.HTTPServiceUnavailable(text=f"at most {MAX_STREAMS} live views at once")
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", **SECURITY_HEADERS}
        )
        await response.prepare(request)
        return response

    async def _wait(self, woken: asyncio.Event, timeout: float) -> bool:
        """Wait for a new event, the timeout or the end; False when the dashboard stops."""
        stop = asyncio.ensure_future(self.stopping.wait())
        wake = asyncio.ensure_future(woken.wait())
        try:
            await asyncio.wait((stop, wake), timeout=timeout, return_when="FIRST_COMPLETED")
        finally:
            stop.cancel()
            wake.cancel()
        woken.clear()
        return not self.stopping.is_set()

    async def _live(
        self, request: web.Request, render: Callable[[], str | None]
    ) -> web.StreamResponse:
        """Send ``render()`` whenever it changed (see the module doc) until the viewer leaves."""
        response = await self._stream(request)
        woken = asyncio.Event()
        self.cache.events.listeners.add(woken.set)
        self.streams += 1
        last: str | None = None
        quiet = 0.0
        try:
            while True:
                html = render()
                if html is None:
                    break
                if html != last:
                    data = "".join(f"data: {line}\n" for line in html.splitlines() or [""])
                    await response.write(f"event: html\n{data}\n".encode())
                    last, quiet = html, 0.0
                elif quiet >= KEEPALIVE_S:
                    await response.write(b": keepalive\n\n")
                    quiet = 0.0
                if not await self._wait(woken, LIVE_PERIOD_S):
                    break
                quiet += LIVE_PERIOD_S
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.streams -= 1
            self.cache.events.listeners.discard(woken.set)
        return response

    async def live_fleet(self, request: web.Request) -> web.StreamResponse:
        return await self._live(request, self._fleet_html)

    async def live_deployment(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if self._deployment_html(name) is None:
            raise web.HTTPNotFound(text=f"no deployment {name!r}")
        return await self._live(request, lambda: self._deployment_html(name))

    async def event_stream(self, request: web.Request) -> web.StreamResponse:
        log_ = self.cache.events
        position = log_.appended
        last_id = request.headers.get("Last-Event-ID", request.query.get("after", ""))
        if last_id.isdigit() and len(last_id) < 19:
            position = min(int(last_id), log_.appended)
        response = await self._stream(request)
        woken = asyncio.Event()
        log_.listeners.add(woken.set)
        self.streams += 1
        try:
            await response.write(b"retry: 2000\n\n")
            while True:
                missed = log_.since(position)
                position = log_.appended
                for i, ev in enumerate(missed):
                    data = orjson.dumps(views.event_json(ev)).decode()
                    ident = position - len(missed) + i + 1
                    await response.write(f"id: {ident}\nevent: event\ndata: {data}\n\n".encode())
                if not missed:
                    await response.write(b": keepalive\n\n")
                if not await self._wait(woken, KEEPALIVE_S):
                    break
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.streams -= 1
            log_.listeners.discard(woken.set)
        return response


class DashboardServer:
    """The dashboard listener as a hub component (``name`` + ``run(stop)``)."""

    name = "dashboard"

    def __init__(self, dashboard: Dashboard, paths: HubPaths, listen: str) -> None:
        self.host, self.port = parse_host_port(listen)
        self.dashboard = dashboard
        self.paths = paths  # the hub's serving certificate and CA (tls_context)
        self.bound = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        context = tls_context(self.paths)
        self.dashboard.stopping.clear()
        runner = web.AppRunner(self.dashboard.app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port, ssl_context=context)
            await site.start()
            server = getattr(site, "_server", None)
            if server is not None and server.sockets:
                self.port = server.sockets[0].getsockname()[1]
            self.dashboard.access.port = self.port
            log.info("dashboard listening", host=self.host, port=self.port)
            self.bound.set()
            await stop.wait()
        finally:
            self.dashboard.access.port = 0
            self.dashboard.stopping.set()
            await runner.cleanup()
