"""AdminService's device commands: Cordon, Uncordon, DeviceLogs (asked over the device's Sync
stream, nothing stored), RevokeDevice, and RevokeRegion (a regional hub's federation
certificates, :func:`hub.state.regions.revoke_region`).

Each changes the device record and persists it before answering, records an event, and marks
the device for projection (its taints change what it is sent); revocation closes the
device's stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc

from edgefleet.v1 import admin_pb2
from hub.api.admin.common import AdminAuth, Refused, invalid, not_found, rpc
from hub.decide.devices import Device
from hub.state import storekeys
from hub.state.cache import Cache
from hub.state.projector import Projector
from hub.state.regions import Regions, revoke_region
from hub.state.sessions import Sessions
from hub.state.store import Put, Store
from hub.state.writer import DeviceWriter

DEFAULT_LOG_TAIL = 100
MAX_LOG_TAIL = 1000
LOG_ANSWER_TIMEOUT_S = 10.0


class Devices:
    """The device commands (module doc)."""

    def __init__(
        self,
        authorize: AdminAuth,
        store: Store,
        cache: Cache,
        writer: DeviceWriter,
        sessions: Sessions,
        *,
        regions: Regions | None,
        clock: Callable[[], float],
        projector: Projector,
    ) -> None:
        self.authorize = authorize
        self.store = store
        self.cache = cache
        self.writer = writer
        self.sessions = sessions  # the devices' streams: logs asked, revoked ones closed
        self.regions = regions  # a root hub's regions (RevokeRegion)
        self.clock = clock
        self.projector = projector  # the device is projected again (its taints)

    def _device(self, name: str) -> Device:
        if not name:
            raise invalid("device_name: required")
        device = self.cache.devices.get(name)
        if device is None:
            raise not_found(storekeys.KIND_DEVICE, name)
        return device

    async def _set_cordoned(self, name: str, cordoned: bool) -> admin_pb2.CordonResponse:
        device = self._device(name)
        if device.cordoned != cordoned:
            writer = self.writer
            writer.update(device.with_(cordoned=cordoned))
            reason = "Cordoned" if cordoned else "Uncordoned"
            what = "no new workloads" if cordoned else "workloads allowed again"
            writer.event(storekeys.KIND_DEVICE, name, "Normal", reason, f"{name}: {what}")
            await writer.flush()
            self.projector.mark([name])
        return admin_pb2.CordonResponse()

    @rpc
    async def Cordon(
        self, request: admin_pb2.CordonRequest, context: Any
    ) -> admin_pb2.CordonResponse:
        return await self._set_cordoned(request.device_name, True)

    @rpc
    async def Uncordon(
        self, request: admin_pb2.CordonRequest, context: Any
    ) -> admin_pb2.CordonResponse:
        return await self._set_cordoned(request.device_name, False)

    @rpc
    async def DeviceLogs(
        self, request: admin_pb2.DeviceLogsRequest, context: Any
    ) -> admin_pb2.DeviceLogsResponse:
        """Ask the device over its Sync stream and relay its answer; nothing is stored."""
        device = self._device(request.device_name)
        if len(request.workload) > 253:
            raise invalid("workload: at most 253 characters")
        if request.tail > MAX_LOG_TAIL:
            raise invalid(f"tail: at most {MAX_LOG_TAIL}, got {request.tail}")
        session = self.sessions.get(device.name)
        if session is None or session.closed:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"device {device.name} is not connected: its log lines are on the device "
                "(journalctl -u edged there)",
            )
        try:
            answer = session.request_logs(request.workload, request.tail or DEFAULT_LOG_TAIL)
        except RuntimeError as exc:
            raise Refused(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"device {device.name}: {exc}"
            ) from None
        try:
            lines = await asyncio.wait_for(answer, LOG_ANSWER_TIMEOUT_S)
        except TimeoutError:
            raise Refused(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"device {device.name} did not send its log lines within {LOG_ANSWER_TIMEOUT_S:g}s",
            ) from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this call was cancelled, not the device's stream
            raise Refused(
                grpc.StatusCode.UNAVAILABLE,
                f"device {device.name} disconnected before it sent its log lines",
            ) from None
        return admin_pb2.DeviceLogsResponse(lines=lines)

    @rpc
    async def RevokeDevice(
        self, request: admin_pb2.RevokeDeviceRequest, context: Any
    ) -> admin_pb2.RevokeDeviceResponse:
        device = self._device(request.device_name)
        name = device.name
        serials = [s for s in (device.certificate_serial, device.previous_serial) if s]
        revoked = device.with_(revoked=True)
        which = ", ".join(serials) or "none on record"
        event = self.writer.prepare_event(
            storekeys.KIND_DEVICE,
            name,
            "Warning",
            "Revoked",
            f"{name}: certificates revoked ({which})",
        )
        await self.store.txn(
            (),
            [
                *(Put(storekeys.revoked_key(s), name.encode()) for s in serials),
                Put(storekeys.device_key(name), storekeys.dumps(revoked.to_json())),
                event.put,
            ],
        )
        self.writer.committed(event)
        self.cache.revoked.update(dict.fromkeys(serials, name))
        self.cache.put_device(revoked)
        session = self.sessions.get(name)
        if session is not None:
            session.close("certificate revoked")
        self.projector.mark([name])
        return admin_pb2.RevokeDeviceResponse(serials=serials)

    @rpc
    async def RevokeRegion(
        self, request: admin_pb2.RevokeRegionRequest, context: Any
    ) -> admin_pb2.RevokeRegionResponse:
        """A regional hub's federation certificates revoked (hub.state.regions.revoke_region)."""
        if not request.region:
            raise invalid("region: required (an enrolled regional hub)")
        regions = self.regions
        if regions is None:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, "this hub has no regions")
        try:
            serials = await revoke_region(
                self.store,
                self.cache,
                self.writer,
                regions,
                request.region,
                now=self.clock(),
            )
        except KeyError:
            raise Refused(
                grpc.StatusCode.NOT_FOUND,
                f"region {request.region} never enrolled at this hub (hub token create "
                "--for-region, hub init --parent)",
            ) from None
        return admin_pb2.RevokeRegionResponse(serials=serials)
