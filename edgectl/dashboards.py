"""``edgectl dashboard [--ttl D] [--open]``: a URL to the hub's web dashboard, with a
short-lived token bound to this admin certificate (AdminService.CreateDashboardToken; the hub
must have ``dashboardListen`` set). The URL is printed on stdout (it carries the token: do not
paste it where others read); ``--open`` opens it in the default browser too.

The dashboard serves HTTPS with the hub's certificate, signed by the hub CA (the
``caCertificate`` of edgectl's config): a browser that does not trust that CA warns first.
"""

from __future__ import annotations

import argparse
import webbrowser
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from edgectl.client import AdminClient, load_admin_config
from edgefleet.configfiles import duration_option, parse_host_port
from edgefleet.v1 import admin_pb2


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "dashboard", help="a URL (with a short-lived token) to the hub's web dashboard"
    )
    p.add_argument(
        "--ttl",
        type=duration_option,
        default=None,
        help="how long the token is valid (default 5m, at most 15m)",
    )
    p.add_argument("--open", action="store_true", help="open the URL in the default browser")


def dashboard_url(hub: str, port: int, token: str) -> str:
    host, _ = parse_host_port(hub)
    if ":" in host:
        host = f"[{host}]"
    return f"https://{host}:{port}/login?token={quote(token, safe='')}"


def run(args: argparse.Namespace) -> int | None:
    if args.command != "dashboard":
        return None
    from edgectl.commands import default_config

    config = load_admin_config(args.config or default_config(), getattr(args, "context", None))
    request = admin_pb2.CreateDashboardTokenRequest()
    if args.ttl is not None:
        request.ttl.FromNanoseconds(int(args.ttl * 1e9))
    with AdminClient(config) as client:
        response = client.call("CreateDashboardToken", request)
    url = dashboard_url(config.hub, int(response.port), response.token)
    expires = datetime.fromtimestamp(response.expires.ToMilliseconds() / 1000, UTC)
    print(url, flush=True)
    print(f"valid until {expires.isoformat(timespec='seconds')}", flush=True)
    if args.open:
        webbrowser.open(url)
    return 0
