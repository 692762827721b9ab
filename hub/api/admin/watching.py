"""AdminService's Watch: the store's watch of a kind from a revision (List, then Watch from its
revision, misses nothing), one object per message; a watch of deployments also sends their
computed status's changes (looked at every :data:`STATUS_POLL_S`). A watch of kind ``Event``
sends the events recorded (``edgectl get events -w``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import grpc

from edgefleet.errors import Compacted
from edgefleet.timestamps import rfc3339
from edgefleet.v1 import admin_pb2, common_pb2
from hub.api.admin.common import AdminAuth, Refused, check_kind, invalid, name_of
from hub.api.admin.showing import Showing
from hub.decide import paging
from hub.decide.placementview import KIND_PLACEMENT
from hub.decide.presentation import KIND_REGION, with_store_metadata
from hub.state import storekeys
from hub.state.cache import Cache
from hub.state.store import Event, EventType, KeyValue, Store

STATUS_POLL_S = 0.5  # how often a watch of deployments looks for status changes
KIND_EVENT = "Event"
EVENTS_FIRST = 500  # a watch of events from 0 sends the newest this many first (ListEvents')


class Watches:
    """Watch (module doc)."""

    def __init__(self, authorize: AdminAuth, store: Store, cache: Cache, show: Showing) -> None:
        self.authorize = authorize
        self.store = store
        self.cache = cache
        self.show = show

    async def Watch(
        self, request: admin_pb2.WatchRequest, context: Any
    ) -> AsyncIterator[admin_pb2.WatchEvent]:
        await self.authorize(context)
        if request.kind == KIND_EVENT:
            async for recorded in self._events(request, context):
                yield recorded
            return
        try:
            check_kind(request.kind)
            if request.kind == KIND_REGION:
                raise invalid(
                    f"kind: {KIND_REGION} cannot be watched (a region's status is not stored, "
                    "it is what its last report says now): list it again (edgectl get regions)"
                )
            if request.kind == KIND_PLACEMENT:
                raise invalid(
                    f"kind: {KIND_PLACEMENT} cannot be watched yet (not stored: shown from what "
                    "devices report now): list it again (edgectl get placements), or watch "
                    "the deployment (edgectl get deployments NAME -w)"
                )
            if request.resource_version < 0:
                raise invalid("resource_version: must be 0 or more")
        except Refused as exc:
            await context.abort(exc.code, exc.message)
        prefix, show = self.show.watched(request.kind)
        start = request.resource_version + 1
        if request.resource_version == 0:
            current = await self.store.range(prefix)
            for kv in current.kvs:  # one object per message (hub.decide.paging: none is too big)
                added = _watch_event(admin_pb2.WatchEvent.ADDED, kv, show(kv.key, kv.value))
                await _refuse_oversize(context, request.kind, added)
                yield added
            start = current.revision + 1
        changes = self.store.watch(prefix, start)
        if request.kind == "ModelDeployment":
            # status is computed, never stored: its changes are looked for too
            changes = self._with_status_changes(changes, show)  # type: ignore[assignment]
        try:
            async for event in changes:
                sent = event if isinstance(event, admin_pb2.WatchEvent) else _change(event, show)
                await _refuse_oversize(context, request.kind, sent)
                yield sent
        except Compacted as exc:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(exc))

    async def _events(
        self, request: admin_pb2.WatchRequest, context: Any
    ) -> AsyncIterator[admin_pb2.WatchEvent]:
        """``edgectl get events -w``: events as they are recorded (each ADDED once; the
        trimming of old ones is not sent). With resource version 0, the newest
        :data:`EVENTS_FIRST` first."""
        if request.resource_version < 0:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "resource_version: must be 0 or more"
            )
        start = request.resource_version + 1
        if request.resource_version == 0:
            current = await self.store.range(storekeys.EVENTS)
            for kv in current.kvs[-EVENTS_FIRST:]:
                yield _event(kv)
            start = current.revision + 1
        try:
            async for change in self.store.watch(storekeys.EVENTS, start):
                if change.type is not EventType.DELETE:
                    yield _event(change.kv)
        except Compacted as exc:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(exc))

    async def _with_status_changes(
        self, changes: AsyncIterator[Event], show: Callable[[str, bytes], dict[str, Any]]
    ) -> AsyncIterator[Event | admin_pb2.WatchEvent]:
        """Store events of deployments, merged with a MODIFIED event whenever a deployment's
        computed status changes (looked at every :data:`STATUS_POLL_S`): ``get deployments -w``
        prints every change of a rollout, not only applies."""
        queue: asyncio.Queue[Event | admin_pb2.WatchEvent | BaseException] = asyncio.Queue()
        shown: dict[str, Any] = {}

        async def forward() -> None:
            try:
                async for event in changes:
                    if event.type is EventType.DELETE:
                        shown.pop(event.kv.key, None)
                    else:
                        shown[event.kv.key] = show(event.kv.key, event.kv.value).get("status")
                    await queue.put(event)
            except BaseException as exc:
                await queue.put(exc)

        async def poll() -> None:
            for obj in self.cache.objects_of("ModelDeployment"):
                key = storekeys.object_key("ModelDeployment", obj.name)
                shown.setdefault(key, show(key, storekeys.object_value(obj.manifest)).get("status"))
            while True:
                await asyncio.sleep(STATUS_POLL_S)
                for obj in self.cache.objects_of("ModelDeployment"):
                    key = storekeys.object_key("ModelDeployment", obj.name)
                    if key not in shown:
                        continue  # not announced yet: its store event comes first
                    doc = self.show.object_json("ModelDeployment", obj.manifest)
                    if shown[key] != doc.get("status"):
                        shown[key] = doc.get("status")
                        await queue.put(
                            admin_pb2.WatchEvent(
                                type=admin_pb2.WatchEvent.MODIFIED,
                                object=common_pb2.Object(
                                    json=storekeys.dumps(doc), resource_version=obj.revision
                                ),
                            )
                        )

        tasks = [asyncio.ensure_future(forward()), asyncio.ensure_future(poll())]
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            for task in tasks:
                task.cancel()


def _event(kv: KeyValue) -> admin_pb2.WatchEvent:
    """A recorded event as ListEvents shows it (its time RFC 3339, to the millisecond)."""
    ev = storekeys.loads(kv.value)
    shown = {**ev, "time": rfc3339(ev.get("time"), millis=True)}
    return admin_pb2.WatchEvent(
        type=admin_pb2.WatchEvent.ADDED,
        object=common_pb2.Object(json=storekeys.dumps(shown), resource_version=kv.mod_revision),
    )


async def _refuse_oversize(context: Any, kind: str, event: admin_pb2.WatchEvent) -> None:
    """End a watch, naming the object, rather than let gRPC fail it on a too-large message."""
    size = event.ByteSize()
    if size > paging.MAX_PAGE_BYTES:
        name = name_of(storekeys.loads(event.object.json))
        message = paging.oversize_message(kind, name, size, paging.MAX_PAGE_BYTES)
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)


def _watch_event(
    type_: admin_pb2.WatchEvent.Type,
    kv: KeyValue,
    doc: Mapping[str, Any],
    prev: KeyValue | None = None,
) -> admin_pb2.WatchEvent:
    """``doc`` with its store metadata; ``prev`` (a deletion's last value) gives the uid."""
    origin = prev or kv
    is_object = origin.key.startswith(storekeys.OBJECTS) and origin.value
    stamped = with_store_metadata(
        doc,
        key=origin.key,
        create_revision=origin.create_revision,
        mod_revision=kv.mod_revision,
        created=storekeys.created_of(origin.value) if is_object else None,
    )
    return admin_pb2.WatchEvent(
        type=type_,
        object=common_pb2.Object(json=storekeys.dumps(stamped), resource_version=kv.mod_revision),
    )


def _change(event: Event, show: Callable[[str, bytes], dict[str, Any]]) -> admin_pb2.WatchEvent:
    if event.type is EventType.DELETE:
        prev = event.prev_kv
        doc = show(prev.key, prev.value) if prev is not None else {"metadata": {}}
        return _watch_event(admin_pb2.WatchEvent.DELETED, event.kv, doc, prev)
    created = event.prev_kv is None or event.kv.version == 1
    type_ = admin_pb2.WatchEvent.ADDED if created else admin_pb2.WatchEvent.MODIFIED
    return _watch_event(type_, event.kv, show(event.kv.key, event.kv.value))
