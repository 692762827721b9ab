"""AdminService's tokens: CreateToken (a device's bootstrap token, or a regional hub's) and
CreateDashboardToken (bound to the caller's certificate, :mod:`hub.api.dashboard.access`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from edgefleet.logs import get_logger
from edgefleet.timestamps import rfc3339
from edgefleet.v1 import admin_pb2
from hub import pki
from hub.api.admin.common import AdminAuth, Refused, invalid, rpc
from hub.api.auth import caller_of
from hub.api.dashboard import access as dashboard_access
from hub.api.dashboard.access import DashboardAccess
from hub.config import TokensConfig
from hub.state import tokens
from hub.state.cache import Cache
from hub.state.store import Put, Store
from hub.state.trustroots import HubRoots, root_pin
from hub.state.writer import DeviceWriter, PreparedEvent

log = get_logger("hub.api.admin")


class Tokens:
    """CreateToken and CreateDashboardToken (module doc)."""

    def __init__(
        self,
        authorize: AdminAuth,
        store: Store,
        cache: Cache,
        writer: DeviceWriter,
        ca: pki.CertifiedKey,
        *,
        region: str,
        config: TokensConfig,
        dashboard: DashboardAccess,
        clock: Callable[[], float],
    ) -> None:
        self.authorize = authorize
        self.store = store
        self.cache = cache  # the trust roots, pinned in the answer
        self.writer = writer
        self.ca = ca
        self.region = region
        self.config = config
        self.dashboard = dashboard  # its port: 0 while no dashboard listens
        self.clock = clock

    @rpc
    async def CreateToken(
        self, request: admin_pb2.CreateTokenRequest, context: Any
    ) -> admin_pb2.CreateTokenResponse:
        ttl = self.config.default_ttl_s
        if request.HasField("ttl") and (request.ttl.seconds or request.ttl.nanos):
            # Seconds and nanos straight from the message: a Duration beyond timedelta's
            # range must be a clear refusal, not an overflow.
            ttl = request.ttl.seconds + request.ttl.nanos / 1e9
        prefix = request.device_label_prefix
        problems = tokens.check_token_request(
            ttl=ttl,
            description=request.description,
            labels=request.labels,
            device_labels=not request.no_device_labels,
            device_label_prefix=prefix,
            for_region=request.for_region,
            own_region=self.region,
        )
        if problems:
            raise invalid("; ".join(problems))
        what = (
            f"regional hub token for {request.for_region}"
            if request.for_region
            else "bootstrap token"
        )
        prepared: list[PreparedEvent] = []

        def event_for(token_id: str) -> Put:
            prepared[:] = [
                self.writer.prepare_event(
                    "Token", token_id, "Normal", "Created", f"{what} {token_id}"
                )
            ]
            return prepared[0].put

        token, record = await tokens.create_token(
            self.store,
            now=self.clock(),
            ttl=ttl,
            single_use=request.single_use or self.config.single_use,
            description=request.description,
            labels=dict(request.labels),
            device_labels=not request.no_device_labels,
            device_label_prefix=prefix,
            event_for=event_for,
            for_region=request.for_region,
        )
        self.writer.committed(prepared[0])
        response = admin_pb2.CreateTokenResponse(
            token=token,
            ca_hash=pki.ca_pin(self.ca.certificate),
            root_hash=root_pin(HubRoots(self.cache.trust_roots).current),
        )
        response.expires.FromMilliseconds(int(record.expires * 1000))
        return response

    @rpc
    async def CreateDashboardToken(
        self, request: admin_pb2.CreateDashboardTokenRequest, context: Any
    ) -> admin_pb2.CreateDashboardTokenResponse:
        """A dashboard token bound to the caller's certificate (:mod:`hub.api.dashboard.access`)."""
        if not self.dashboard.port:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this hub serves no dashboard: set dashboardListen in hub.toml",
            )
        ttl = dashboard_access.DEFAULT_TTL_S
        if request.HasField("ttl") and (request.ttl.seconds or request.ttl.nanos):
            ttl = request.ttl.seconds + request.ttl.nanos / 1e9
        caller = caller_of(context, self.region)
        try:
            token, expires = self.dashboard.issue(
                caller.name, caller.serial, now=self.clock(), ttl=ttl
            )
        except ValueError as exc:
            raise invalid(str(exc)) from None
        log.info("dashboard token issued", admin=caller.name, expires=rfc3339(expires))
        response = admin_pb2.CreateDashboardTokenResponse(token=token, port=self.dashboard.port)
        response.expires.FromMilliseconds(int(expires * 1000))
        return response
