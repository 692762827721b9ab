"""AdminService's Delete: an object, a device (its stream closed), a token or a pushed model;
a PriorityClass or model in use only with force. Region objects are not deleted (revoked).

The handler only writes: the cache tells the controllers of what changed
(:mod:`hub.state.feed`), and Delete answers once they acted on it (``cache.feed.settled()``:
a deployment's rollout and revisions are gone when it answers). A deleted device is marked
for the projector, which forgets what it sent it.
"""

from __future__ import annotations

from typing import Any

import grpc

from edgefleet.api import PRIORITY_CLASSES, PriorityClass
from edgefleet.v1 import admin_pb2
from hub.api.admin.common import (
    AdminAuth,
    Refused,
    check_kind,
    invalid,
    model_records,
    model_users,
    refuse_root_owned,
    rpc,
)
from hub.decide import priority
from hub.decide.placementview import KIND_PLACEMENT, PLACEMENT_MANAGED
from hub.decide.presentation import KIND_REGION, KIND_TOKEN, REGION_MANAGED
from hub.state import storekeys, tokens
from hub.state.cache import Cache
from hub.state.projector import Projector
from hub.state.sessions import Sessions
from hub.state.sharedblobs import SharedBlobs
from hub.state.store import Compare, Delete, Store
from hub.state.writer import DeviceWriter

KIND_PRIORITY_CLASS = PriorityClass.KIND


class Deletes:
    """Delete (module doc)."""

    def __init__(
        self,
        authorize: AdminAuth,
        store: Store,
        cache: Cache,
        writer: DeviceWriter,
        sessions: Sessions,
        *,
        shared_blobs: SharedBlobs | None,
        projector: Projector,
    ) -> None:
        self.authorize = authorize
        self.store = store
        self.cache = cache
        self.writer = writer
        self.sessions = sessions  # a deleted device's stream is closed
        self.shared_blobs = shared_blobs  # replicas: a deleted model's bytes in the store
        self.projector = projector  # a deleted device is projected (to nothing)

    @rpc
    async def Delete(
        self, request: admin_pb2.DeleteRequest, context: Any
    ) -> admin_pb2.DeleteResponse:
        check_kind(request.kind)
        if not request.name:
            raise invalid("name: required (an object name)")
        kind, name = request.kind, request.name
        if kind == KIND_REGION:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{KIND_REGION} {name} is not deleted: {REGION_MANAGED}",
            )
        if kind == KIND_PLACEMENT:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{KIND_PLACEMENT} {name} is not deleted: {PLACEMENT_MANAGED}",
            )
        if kind == KIND_PRIORITY_CLASS and name in PRIORITY_CLASSES:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"PriorityClass {name} is built in ({', '.join(PRIORITY_CLASSES)}): it is not "
                "deleted",
            )
        cache = self.cache
        forced = ""
        if kind == KIND_PRIORITY_CLASS and (
            users := priority.users_of(name, cache.deployments.values())
        ):
            if not request.force:
                raise Refused(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"PriorityClass {name} is in use by ModelDeployment {', '.join(users)}: "
                    "change those deployments first, or delete with force (they then get "
                    "priority 0 and preempt nothing)",
                )
            forced = f" (forced: in use by {', '.join(users)})"
        if kind == storekeys.KIND_MODEL and (model := model_records(self.cache).get(name)):
            users = model_users(cache, (model.name, model.version))
            if users and not request.force:
                raise Refused(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"model {name} is in use by ModelDeployment {', '.join(users)}: deleting it "
                    "takes that workload off every device; change or delete those deployments "
                    "first, or delete with force",
                )
            if users:
                forced = f" (forced: in use by {', '.join(users)})"
        event = self.writer.prepare_event(
            kind, name, "Normal", "Deleted", f"{kind} {name} deleted{forced}"
        )
        if kind == storekeys.KIND_DEVICE:
            if name not in cache.devices:
                return admin_pb2.DeleteResponse(deleted=False)
            session = self.sessions.get(name)
            if session is not None:
                session.close("device deleted")
            await self.store.txn(
                (),
                [
                    Delete(storekeys.device_key(name)),
                    Delete(storekeys.desired_key(name)),
                    event.put,
                ],
            )
            cache.drop_device(name)
            self.projector.mark([name])
        elif kind == KIND_TOKEN:
            if not await tokens.delete_token(self.store, name):
                return admin_pb2.DeleteResponse(deleted=False)
        elif kind == storekeys.KIND_MODEL:
            model = model_records(self.cache).get(name)
            if model is None:
                return admin_pb2.DeleteResponse(deleted=False)
            await self.store.txn(
                (), [Delete(storekeys.model_key(model.name, model.version)), event.put]
            )
            cache.drop_model(model.name, model.version)  # every device is projected again
            if self.shared_blobs is not None:  # bytes no other model uses leave the store too
                used = {d for m in cache.models.values() for d in m.digests()}
                for digest in model.digests() - used:
                    await self.shared_blobs.forget(digest)
        else:
            key = storekeys.object_key(kind, name)
            kv = await self.store.get(key)
            if kv is None:
                return admin_pb2.DeleteResponse(deleted=False)
            refuse_root_owned(kind, name, kv.value, "delete")
            await self.store.txn([Compare(key, kv.mod_revision)], [Delete(key), event.put])
            cache.drop_object(kind, name)  # the controllers react (hub.state.feed)
            await cache.feed.settled()  # its rollout and revisions are gone when it answers
        self.writer.committed(event)
        return admin_pb2.DeleteResponse(deleted=True)
