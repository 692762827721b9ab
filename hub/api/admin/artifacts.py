"""AdminService's artifacts: PushArtifact (:mod:`hub.api.push`; its refusals are listed in
docs/trust.md, "The hub side"), PushRollbackAllowance (:mod:`hub.api.allowances`) and
FetchTufMetadata (the hub's TUF repository, :func:`hub.state.tufrepo.serve_metadata`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from edgefleet.v1 import admin_pb2, common_pb2
from hub.api.admin.common import AdminAuth
from hub.state.tufrelay import RelayedTuf
from hub.state.tufrepo import TufRepository

if TYPE_CHECKING:
    from hub.context import HubContext


class Artifacts:
    """PushArtifact, PushRollbackAllowance and FetchTufMetadata (module doc)."""

    def __init__(
        self,
        authorize: AdminAuth,
        push_context: HubContext,
        *,
        tuf: Callable[[], TufRepository | RelayedTuf | None],
        clock: Callable[[], float],
    ) -> None:
        self.authorize = authorize
        # hub.api.push and hub.api.allowances still take the whole context (left to do:
        # their own explicit dependencies)
        self.push_context = push_context
        self.tuf = tuf  # the TUF repository held now
        self.clock = clock

    async def PushArtifact(
        self, request_iterator: AsyncIterator[admin_pb2.PushArtifactRequest], context: Any
    ) -> admin_pb2.PushArtifactResponse:
        await self.authorize(context)
        from hub.api.push import PushRefused, receive_artifact

        try:
            return await receive_artifact(self.push_context, request_iterator, now=self.clock())
        except PushRefused as exc:
            await context.abort(exc.code, str(exc))
            raise AssertionError("unreachable: context.abort raises") from None

    async def PushRollbackAllowance(
        self, request: admin_pb2.PushRollbackAllowanceRequest, context: Any
    ) -> admin_pb2.PushRollbackAllowanceResponse:
        await self.authorize(context)
        from hub.api.allowances import receive_allowance
        from hub.api.push import PushRefused

        try:
            allow, stored = await receive_allowance(
                self.push_context, bytes(request.envelope), now=self.clock()
            )
        except PushRefused as exc:
            await context.abort(exc.code, str(exc))
            raise AssertionError("unreachable: context.abort raises") from None
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
