"""AdminService's artifacts: PushArtifact (:class:`hub.api.push.ArtifactReceiver`; its
refusals are listed in docs/trust.md, "The hub side"), PushRollbackAllowance
(:class:`hub.api.allowances.AllowanceReceiver`), FetchTufMetadata (the hub's TUF
repository, :func:`hub.state.tufrepo.serve_metadata`), and edged releases: PushAgentRelease
(:class:`hub.api.agentpush.AgentReleaseReceiver`) and ListAgentReleases."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import grpc

from edgefleet.errors import StoreError
from edgefleet.logs import get_logger
from edgefleet.v1 import admin_pb2, common_pb2
from hub.api.admin.common import AdminAuth
from hub.api.agentpush import AgentReleaseReceiver, list_releases
from hub.api.allowances import AllowanceReceiver
from hub.api.push import ArtifactReceiver, PushRefused
from hub.state.tufrelay import RelayedTuf
from hub.state.tufrepo import TufRepository

log = get_logger(__name__)


async def _store_failed(context: Any, exc: StoreError) -> NoReturn:
    """A push whose record the store did not take: UNAVAILABLE, as the admin API's other writes
    answer (hub.api.admin.common.rpc); from a replica that does not lead (its write fenced by
    the leader's term, hub.state.store.electing.FencedStore), edgectl pushes to the next one."""
    log.error("admin store failed", error=str(exc))
    await context.abort(grpc.StatusCode.UNAVAILABLE, f"the hub's store failed: {exc}")
    raise AssertionError("unreachable: context.abort raises")


class Artifacts:
    """PushArtifact, PushRollbackAllowance, FetchTufMetadata, PushAgentRelease and
    ListAgentReleases (module doc)."""

    def __init__(
        self,
        authorize: AdminAuth,
        artifacts: ArtifactReceiver,
        allowances: AllowanceReceiver,
        agent_releases: AgentReleaseReceiver,
        *,
        tuf: Callable[[], TufRepository | RelayedTuf | None],
        clock: Callable[[], float],
    ) -> None:
        self.authorize = authorize
        self.artifacts = artifacts
        self.allowances = allowances
        self.agent_releases = agent_releases
        self.tuf = tuf  # the TUF repository held now
        self.clock = clock

    async def PushArtifact(
        self, request_iterator: AsyncIterator[admin_pb2.PushArtifactRequest], context: Any
    ) -> admin_pb2.PushArtifactResponse:
        await self.authorize(context)
        try:
            return await self.artifacts.receive(request_iterator, now=self.clock())
        except PushRefused as exc:
            await context.abort(exc.code, str(exc))
            raise AssertionError("unreachable: context.abort raises") from None
        except StoreError as exc:  # a replica that does not lead (fenced) among them
            await _store_failed(context, exc)

    async def PushRollbackAllowance(
        self, request: admin_pb2.PushRollbackAllowanceRequest, context: Any
    ) -> admin_pb2.PushRollbackAllowanceResponse:
        await self.authorize(context)
        try:
            allow, stored = await self.allowances.receive(bytes(request.envelope), now=self.clock())
        except PushRefused as exc:
            await context.abort(exc.code, str(exc))
            raise AssertionError("unreachable: context.abort raises") from None
        except StoreError as exc:  # a replica that does not lead (fenced) among them
            await _store_failed(context, exc)
        return admin_pb2.PushRollbackAllowanceResponse(
            name=allow.name, version=allow.version, stored=stored
        )

    async def FetchTufMetadata(
        self, request: common_pb2.TufMetadataRequest, context: Any
    ) -> common_pb2.TufMetadataResponse:
        await self.authorize(context)
        from hub.state.tufrepo import serve_metadata

        response: common_pb2.TufMetadataResponse = await serve_metadata(
            self.tuf(), request, context
        )
        return response

    async def PushAgentRelease(
        self, request_iterator: AsyncIterator[admin_pb2.PushArtifactRequest], context: Any
    ) -> admin_pb2.PushAgentReleaseResponse:
        await self.authorize(context)
        try:
            return await self.agent_releases.receive(request_iterator, now=self.clock())
        except PushRefused as exc:
            await context.abort(exc.code, str(exc))
            raise AssertionError("unreachable: context.abort raises") from None
        except StoreError as exc:  # a replica that does not lead (fenced) among them
            await _store_failed(context, exc)

    async def ListAgentReleases(
        self, request: admin_pb2.ListAgentReleasesRequest, context: Any
    ) -> admin_pb2.ListAgentReleasesResponse:
        await self.authorize(context)
        return await list_releases(self.agent_releases.store)
