"""The AdminService servicer: one gRPC servicer made of a handler object per group of calls,
each built with exactly what it uses (hub.server wires them)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from edgefleet.v1 import admin_pb2, admin_pb2_grpc, common_pb2
from hub.api.admin.applying import Applies
from hub.api.admin.artifacts import Artifacts
from hub.api.admin.deleting import Deletes
from hub.api.admin.devices import Devices
from hub.api.admin.reading import Reads
from hub.api.admin.rollouts import Rollouts
from hub.api.admin.tokens import Tokens
from hub.api.admin.watching import Watches


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    """AdminService (hub.api.admin): every call handed to its group."""

    def __init__(
        self,
        *,
        applies: Applies,
        reads: Reads,
        watches: Watches,
        deletes: Deletes,
        devices: Devices,
        rollouts: Rollouts,
        tokens: Tokens,
        artifacts: Artifacts,
    ) -> None:
        self.applies = applies
        self.reads = reads
        self.watches = watches
        self.deletes = deletes
        self.devices = devices
        self.rollouts = rollouts
        self.tokens = tokens
        self.artifacts = artifacts

    async def Apply(self, request: admin_pb2.ApplyRequest, context: Any) -> admin_pb2.ApplyResponse:
        return await self.applies.Apply(request, context)

    async def Get(self, request: admin_pb2.GetRequest, context: Any) -> common_pb2.Object:
        return await self.reads.Get(request, context)

    async def List(self, request: admin_pb2.ListRequest, context: Any) -> admin_pb2.ListResponse:
        return await self.reads.List(request, context)

    async def ListEvents(
        self, request: admin_pb2.ListEventsRequest, context: Any
    ) -> admin_pb2.ListEventsResponse:
        return await self.reads.ListEvents(request, context)

    def Watch(
        self, request: admin_pb2.WatchRequest, context: Any
    ) -> AsyncIterator[admin_pb2.WatchEvent]:
        return self.watches.Watch(request, context)

    async def Delete(
        self, request: admin_pb2.DeleteRequest, context: Any
    ) -> admin_pb2.DeleteResponse:
        return await self.deletes.Delete(request, context)

    async def Cordon(
        self, request: admin_pb2.CordonRequest, context: Any
    ) -> admin_pb2.CordonResponse:
        return await self.devices.Cordon(request, context)

    async def Uncordon(
        self, request: admin_pb2.CordonRequest, context: Any
    ) -> admin_pb2.CordonResponse:
        return await self.devices.Uncordon(request, context)

    async def DeviceLogs(
        self, request: admin_pb2.DeviceLogsRequest, context: Any
    ) -> admin_pb2.DeviceLogsResponse:
        return await self.devices.DeviceLogs(request, context)

    async def RevokeDevice(
        self, request: admin_pb2.RevokeDeviceRequest, context: Any
    ) -> admin_pb2.RevokeDeviceResponse:
        return await self.devices.RevokeDevice(request, context)

    async def RevokeRegion(
        self, request: admin_pb2.RevokeRegionRequest, context: Any
    ) -> admin_pb2.RevokeRegionResponse:
        return await self.devices.RevokeRegion(request, context)

    async def ListRevisions(
        self, request: admin_pb2.ListRevisionsRequest, context: Any
    ) -> admin_pb2.ListRevisionsResponse:
        return await self.rollouts.ListRevisions(request, context)

    async def RolloutAction(
        self, request: admin_pb2.RolloutActionRequest, context: Any
    ) -> admin_pb2.RolloutActionResponse:
        return await self.rollouts.RolloutAction(request, context)

    async def CreateToken(
        self, request: admin_pb2.CreateTokenRequest, context: Any
    ) -> admin_pb2.CreateTokenResponse:
        return await self.tokens.CreateToken(request, context)

    async def CreateDashboardToken(
        self, request: admin_pb2.CreateDashboardTokenRequest, context: Any
    ) -> admin_pb2.CreateDashboardTokenResponse:
        return await self.tokens.CreateDashboardToken(request, context)

    async def PushArtifact(
        self, request_iterator: AsyncIterator[admin_pb2.PushArtifactRequest], context: Any
    ) -> admin_pb2.PushArtifactResponse:
        return await self.artifacts.PushArtifact(request_iterator, context)

    async def PushRollbackAllowance(
        self, request: admin_pb2.PushRollbackAllowanceRequest, context: Any
    ) -> admin_pb2.PushRollbackAllowanceResponse:
        return await self.artifacts.PushRollbackAllowance(request, context)

    async def FetchTufMetadata(
        self, request: common_pb2.TufMetadataRequest, context: Any
    ) -> common_pb2.TufMetadataResponse:
        return await self.artifacts.FetchTufMetadata(request, context)

    async def PushAgentRelease(
        self, request_iterator: AsyncIterator[admin_pb2.PushArtifactRequest], context: Any
    ) -> admin_pb2.PushAgentReleaseResponse:
        return await self.artifacts.PushAgentRelease(request_iterator, context)

    async def ListAgentReleases(
        self, request: admin_pb2.ListAgentReleasesRequest, context: Any
    ) -> admin_pb2.ListAgentReleasesResponse:
        return await self.artifacts.ListAgentReleases(request, context)
