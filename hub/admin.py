"""AdminService: what operators (``edgectl``) call, over mutual TLS with an admin certificate.

Every call is authorized first (:func:`hub.auth.authorize` with ``roles={Role.ADMIN}``): a
device or child-hub certificate gets PERMISSION_DENIED, a revoked one UNAUTHENTICATED.

* **Apply** is all or nothing. Documents are parsed and validated first
  (:mod:`hub.applying`: INVALID_ARGUMENT naming ``documents[i].<path>`` for every problem);
  then each object's key is read, canonical equality decides the outcome, and every changed
  object is written in **one** store transaction that compares each key's mod revision as it
  was read. A concurrent change makes it fail whole: ABORTED, retryable. Unchanged objects are
  not written (no revision bump).
* Reads (Get, List, ListEvents) come from the in-memory cache (:class:`hub.caching.Cache`, which
  is written through), with store revisions as resource versions; Watch replays the store's
  watch from a revision (List, then Watch from its revision, misses nothing).
* Device commands (Cordon, Uncordon, RevokeDevice, Delete of a Device) change the device
  record and persist it before answering, record an event, and mark the device for
  projection; revocation and deletion close the device's stream.

gRPC status codes: INVALID_ARGUMENT (bad input, nothing written), NOT_FOUND, ABORTED (a
concurrent change; retry), OUT_OF_RANGE (a watch from a compacted revision), UNAVAILABLE (the
store failed); PushArtifact's refusals are listed in docs/trust.md ("The hub side").
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from edgefleet.api.meta import label_key, label_value
from edgefleet.errors import Compacted, CompareFailed, StoreError, ValidationError
from edgefleet.logs import get_logger
from edgefleet.selecting import parse_selector
from edgefleet.timestamps import rfc3339
from edgefleet.v1 import admin_pb2, admin_pb2_grpc, common_pb2
from hub import applying, pki, storekeys, tokens
from hub.auth import Caller, authorize
from hub.context import HubContext
from hub.devices import Device
from hub.pki import Role
from hub.presenting import (
    KIND_TOKEN,
    deployment_object,
    device_object,
    model_object,
    object_labels,
    token_object,
    with_store_metadata,
)
from hub.store import Compare, Delete, Event, EventType, KeyValue, Put

log = get_logger(__name__)

DEFAULT_EVENTS_LIMIT = 500
MAX_TOKEN_DESCRIPTION = 256

LISTED_KINDS: tuple[str, ...] = (
    storekeys.KIND_DEVICE,
    storekeys.KIND_MODEL,
    *applying.OBJECT_KINDS,
    KIND_TOKEN,
)

_OUTCOMES = {
    applying.Outcome.CREATED: admin_pb2.ApplyResult.CREATED,
    applying.Outcome.CONFIGURED: admin_pb2.ApplyResult.CONFIGURED,
    applying.Outcome.UNCHANGED: admin_pb2.ApplyResult.UNCHANGED,
}


class Refused(Exception):
    """A call refused with a gRPC status code and a message that says why."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(message)


def _invalid(message: str) -> Refused:
    return Refused(grpc.StatusCode.INVALID_ARGUMENT, message)


def _not_found(kind: str, name: str) -> Refused:
    return Refused(grpc.StatusCode.NOT_FOUND, f'{kind} "{name}" not found')


def problems_text(exc: ValidationError) -> str:
    """Every problem on its own line (one problem: one line)."""
    lines = [str(p) for p in exc.problems]
    if len(lines) == 1:
        return lines[0]
    return f"{len(lines)} problems:\n" + "\n".join(f"  - {line}" for line in lines)


Req = TypeVar("Req")
Resp = TypeVar("Resp")
Handler = Callable[["AdminServicer", Req, Any], Awaitable[Resp]]


def _rpc(fn: Handler[Req, Resp]) -> Handler[Req, Resp]:
    """Authorize, run, and turn refusals and store failures into gRPC statuses."""

    @functools.wraps(fn)
    async def handle(self: AdminServicer, request: Req, context: Any) -> Resp:
        await self.authorize(context)
        try:
            return await fn(self, request, context)
        except Refused as exc:
            await context.abort(exc.code, exc.message)
        except CompareFailed as exc:
            await context.abort(
                grpc.StatusCode.ABORTED,
                f"changed concurrently, nothing was written; try again ({exc})",
            )
        except StoreError as exc:
            log.error("admin store failed", method=fn.__name__, error=str(exc))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the hub's store failed: {exc}")
        raise AssertionError("unreachable: context.abort raises")

    return handle


@dataclass(slots=True)
class _Planned:
    """One object of an Apply: the key's mod revision as read (0: absent) and the outcome."""

    obj: applying.ParsedObject
    key: str
    read_revision: int
    outcome: applying.Outcome
    revision: int  # the object's resource version once applied
    created: float | None = None  # when it was first applied (now, for a new object)


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    """AdminService over a :class:`HubContext` (see the module doc)."""

    def __init__(self, ctx: HubContext) -> None:
        self._ctx = ctx

    async def authorize(self, context: Any) -> Caller:
        return await authorize(
            context, region=self._ctx.region, revoked=self._ctx.cache.revoked, roles={Role.ADMIN}
        )

    # -- Apply -------------------------------------------------------------------------------
    @_rpc
    async def Apply(self, request: admin_pb2.ApplyRequest, context: Any) -> admin_pb2.ApplyResponse:
        try:
            parsed = applying.parse_documents(list(request.documents))
        except ValidationError as exc:
            raise _invalid(problems_text(exc)) from None
        planned = [await self._plan(obj) for obj in parsed]
        changed = [p for p in planned if p.outcome is not applying.Outcome.UNCHANGED]
        if changed and not request.dry_run:
            revision = await self._ctx.store.txn(
                [Compare(p.key, p.read_revision) for p in changed],
                [Put(p.key, storekeys.object_value(p.obj.manifest, p.created)) for p in changed],
            )
            for p in changed:
                p.revision = revision
                self._ctx.cache.put_object(p.obj.manifest, revision)
                self._ctx.writer.event(
                    p.obj.kind,
                    p.obj.name,
                    "Normal",
                    p.outcome.value.capitalize(),
                    f"{p.obj.kind} {p.obj.name} {p.outcome.value} (revision {revision})",
                )
            self._ctx.projector.mark_all()
        return admin_pb2.ApplyResponse(
            results=[
                admin_pb2.ApplyResult(
                    kind=p.obj.kind,
                    name=p.obj.name,
                    outcome=_OUTCOMES[p.outcome],
                    resource_version=p.revision,
                )
                for p in planned
            ]
        )

    async def _plan(self, obj: applying.ParsedObject) -> _Planned:
        key = storekeys.object_key(obj.kind, obj.name)
        kv = await self._ctx.store.get(key)
        stored = storekeys.manifest_of(kv.value) if kv is not None else None
        read_revision = kv.mod_revision if kv is not None else 0
        outcome = applying.outcome_of(obj.manifest, stored)
        created = storekeys.created_of(kv.value) if kv is not None else self._ctx.clock()
        return _Planned(obj, key, read_revision, outcome, read_revision, created)

    # -- reading -----------------------------------------------------------------------------
    def _check_kind(self, kind: str) -> None:
        if kind not in LISTED_KINDS:
            raise _invalid(f"unknown kind {kind!r}: must be one of {', '.join(LISTED_KINDS)}")

    def _device_json(self, device: Device) -> dict[str, Any]:
        cache = self._ctx.cache
        return device_object(device, cache.security_policy(), cache.desired.get(device.name))

    def _assigned(self) -> dict[str, tuple[str, ...]]:
        return {name: record.deployments for name, record in self._ctx.cache.desired.items()}

    def _object_json(self, kind: str, manifest: Mapping[str, Any]) -> dict[str, Any]:
        if kind == "ModelDeployment":
            cache = self._ctx.cache
            dep = cache.deployments.get(str(manifest["metadata"]["name"]))
            return deployment_object(manifest, cache.devices.values(), self._assigned(), dep)
        return dict(manifest)

    def _model_records(self) -> dict[str, storekeys.ModelRecord]:
        return {
            f"{m.name}-{m.version}": m
            for m in sorted(self._ctx.cache.models.values(), key=lambda m: (m.name, m.version))
        }

    async def _revisions(self, prefix: str) -> tuple[dict[str, KeyValue], int]:
        result = await self._ctx.store.range(prefix)
        return {kv.key: kv for kv in result.kvs}, result.revision

    def _shown(self, kind: str, doc: Mapping[str, Any], kv: KeyValue | None) -> common_pb2.Object:
        """``doc`` with its store metadata (uid, resourceVersion, creationTimestamp)."""
        if kv is None:
            return common_pb2.Object(json=storekeys.dumps(doc))
        created = storekeys.created_of(kv.value) if kind in applying.OBJECT_KINDS else None
        stamped = with_store_metadata(
            doc,
            key=kv.key,
            create_revision=kv.create_revision,
            mod_revision=kv.mod_revision,
            created=created,
        )
        return common_pb2.Object(json=storekeys.dumps(stamped), resource_version=kv.mod_revision)

    async def _all_of(self, kind: str) -> tuple[list[common_pb2.Object], int]:
        """Every object of ``kind`` as shown to operators, and the store revision read at."""
        cache = self._ctx.cache
        docs: list[tuple[dict[str, Any], str]] = []
        if kind == storekeys.KIND_DEVICE:
            revisions, revision = await self._revisions(storekeys.DEVICES)
            docs = [
                (self._device_json(d), storekeys.device_key(d.name))
                for d in sorted(cache.devices.values(), key=lambda d: d.name)
            ]
        elif kind == storekeys.KIND_MODEL:
            revisions, revision = await self._revisions(storekeys.MODELS)
            docs = [
                (model_object(m), storekeys.model_key(m.name, m.version))
                for m in self._model_records().values()
            ]
        elif kind == KIND_TOKEN:
            revisions, revision = await self._revisions(tokens.PREFIX)
            docs = [
                (token_object(tokens.TokenRecord.from_json(kv.value)), key)
                for key, kv in sorted(revisions.items())
            ]
        else:
            revisions, revision = await self._revisions(storekeys.object_prefix(kind))
            docs = [
                (self._object_json(kind, o.manifest), storekeys.object_key(kind, o.name))
                for o in cache.objects_of(kind)
            ]
        items = [self._shown(kind, doc, revisions.get(key)) for doc, key in docs]
        return items, revision

    @_rpc
    async def Get(self, request: admin_pb2.GetRequest, context: Any) -> common_pb2.Object:
        self._check_kind(request.kind)
        kind, name = request.kind, request.name
        if not name:
            raise _invalid("name: required (an object name)")
        cache = self._ctx.cache
        doc: dict[str, Any] | None = None
        if kind == storekeys.KIND_DEVICE:
            device = cache.devices.get(name)
            if device is not None:
                doc, key = self._device_json(device), storekeys.device_key(name)
        elif kind == storekeys.KIND_MODEL:
            model = self._model_records().get(name)
            if model is not None:
                doc, key = model_object(model), storekeys.model_key(model.name, model.version)
        elif kind == KIND_TOKEN:
            key = tokens.PREFIX + name
            kv = await self._ctx.store.get(key)
            if kv is not None:
                doc = token_object(tokens.TokenRecord.from_json(kv.value))
        else:
            stored = cache.stored.get((kind, name))
            if stored is not None:
                doc, key = (
                    self._object_json(kind, stored.manifest),
                    storekeys.object_key(kind, name),
                )
        if doc is None:
            raise _not_found(kind, name)
        return self._shown(kind, doc, await self._ctx.store.get(key))

    @_rpc
    async def List(self, request: admin_pb2.ListRequest, context: Any) -> admin_pb2.ListResponse:
        self._check_kind(request.kind)
        try:
            selector = parse_selector(request.label_selector)
        except ValueError as exc:
            raise _invalid(f"label_selector: {exc}") from None
        items, revision = await self._all_of(request.kind)
        if selector.requirements:
            items = [i for i in items if selector.matches(object_labels(storekeys.loads(i.json)))]
        return admin_pb2.ListResponse(items=items, resource_version=revision)

    @_rpc
    async def ListEvents(
        self, request: admin_pb2.ListEventsRequest, context: Any
    ) -> admin_pb2.ListEventsResponse:
        limit = min(request.limit or DEFAULT_EVENTS_LIMIT, len(self._ctx.cache.events))
        found = [
            ev
            for ev in self._ctx.cache.events
            if (not request.kind or ev["object"]["kind"] == request.kind)
            and (not request.name or ev["object"]["name"] == request.name)
        ]
        newest = found[len(found) - limit :] if limit else []
        shown = [{**ev, "time": rfc3339(ev.get("time"), millis=True)} for ev in newest]
        return admin_pb2.ListEventsResponse(events=[storekeys.dumps(ev) for ev in shown])

    # -- Watch -------------------------------------------------------------------------------
    def _watched(self, kind: str) -> tuple[str, Callable[[str, bytes], dict[str, Any]]]:
        """The store prefix of ``kind`` and how a stored value of it is shown."""
        if kind == storekeys.KIND_DEVICE:
            return storekeys.DEVICES, lambda _, v: self._device_json(
                Device.from_json(storekeys.loads(v))
            )
        if kind == storekeys.KIND_MODEL:
            return storekeys.MODELS, lambda _, v: model_object(
                storekeys.ModelRecord.from_json(storekeys.loads(v))
            )
        if kind == KIND_TOKEN:
            return tokens.PREFIX, lambda _, v: token_object(tokens.TokenRecord.from_json(v))
        return storekeys.object_prefix(kind), lambda _, v: self._object_json(
            kind, storekeys.manifest_of(v)
        )

    async def Watch(
        self, request: admin_pb2.WatchRequest, context: Any
    ) -> AsyncIterator[admin_pb2.WatchEvent]:
        await self.authorize(context)
        try:
            self._check_kind(request.kind)
            if request.resource_version < 0:
                raise _invalid("resource_version: must be 0 or more")
        except Refused as exc:
            await context.abort(exc.code, exc.message)
        prefix, show = self._watched(request.kind)
        start = request.resource_version + 1
        if request.resource_version == 0:
            current = await self._ctx.store.range(prefix)
            for kv in current.kvs:
                yield _watch_event(admin_pb2.WatchEvent.ADDED, kv, show(kv.key, kv.value))
            start = current.revision + 1
        try:
            async for event in self._ctx.store.watch(prefix, start):
                yield _change(event, show)
        except Compacted as exc:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(exc))

    # -- deleting ----------------------------------------------------------------------------
    @_rpc
    async def Delete(
        self, request: admin_pb2.DeleteRequest, context: Any
    ) -> admin_pb2.DeleteResponse:
        self._check_kind(request.kind)
        if not request.name:
            raise _invalid("name: required (an object name)")
        kind, name = request.kind, request.name
        ctx, cache = self._ctx, self._ctx.cache
        if kind == storekeys.KIND_DEVICE:
            if name not in cache.devices:
                return admin_pb2.DeleteResponse(deleted=False)
            session = ctx.sessions.get(name)
            if session is not None:
                session.close("device deleted")
            await ctx.store.txn(
                (), [Delete(storekeys.device_key(name)), Delete(storekeys.desired_key(name))]
            )
            cache.devices.pop(name, None)
            cache.desired.pop(name, None)
            ctx.projector.mark([name])
        elif kind == KIND_TOKEN:
            if not await tokens.delete_token(ctx.store, name):
                return admin_pb2.DeleteResponse(deleted=False)
        elif kind == storekeys.KIND_MODEL:
            model = self._model_records().get(name)
            if model is None:
                return admin_pb2.DeleteResponse(deleted=False)
            await ctx.store.delete(storekeys.model_key(model.name, model.version))
            cache.models.pop((model.name, model.version), None)
            ctx.projector.mark_all()
        else:
            key = storekeys.object_key(kind, name)
            kv = await ctx.store.get(key)
            if kv is None:
                return admin_pb2.DeleteResponse(deleted=False)
            await ctx.store.delete(key, expect_mod_revision=kv.mod_revision)
            cache.drop_object(kind, name)
            ctx.projector.mark_all()
        ctx.writer.event(kind, name, "Normal", "Deleted", f"{kind} {name} deleted")
        return admin_pb2.DeleteResponse(deleted=True)

    # -- devices -----------------------------------------------------------------------------
    def _device(self, name: str) -> Device:
        if not name:
            raise _invalid("device_name: required")
        device = self._ctx.cache.devices.get(name)
        if device is None:
            raise _not_found(storekeys.KIND_DEVICE, name)
        return device

    async def _set_cordoned(self, name: str, cordoned: bool) -> admin_pb2.CordonResponse:
        device = self._device(name)
        if device.cordoned != cordoned:
            writer = self._ctx.writer
            writer.update(device.with_(cordoned=cordoned))
            reason = "Cordoned" if cordoned else "Uncordoned"
            what = "no new workloads" if cordoned else "workloads allowed again"
            writer.event(storekeys.KIND_DEVICE, name, "Normal", reason, f"{name}: {what}")
            await writer.flush()
            self._ctx.projector.mark([name])
        return admin_pb2.CordonResponse()

    @_rpc
    async def Cordon(
        self, request: admin_pb2.CordonRequest, context: Any
    ) -> admin_pb2.CordonResponse:
        return await self._set_cordoned(request.device_name, True)

    @_rpc
    async def Uncordon(
        self, request: admin_pb2.CordonRequest, context: Any
    ) -> admin_pb2.CordonResponse:
        return await self._set_cordoned(request.device_name, False)

    @_rpc
    async def RevokeDevice(
        self, request: admin_pb2.RevokeDeviceRequest, context: Any
    ) -> admin_pb2.RevokeDeviceResponse:
        device = self._device(request.device_name)
        name = device.name
        serials = [device.certificate_serial] if device.certificate_serial else []
        revoked = device.with_(revoked=True)
        ctx = self._ctx
        await ctx.store.txn(
            (),
            [
                *(Put(storekeys.revoked_key(s), name.encode()) for s in serials),
                Put(storekeys.device_key(name), storekeys.dumps(revoked.to_json())),
            ],
        )
        ctx.cache.revoked.update(dict.fromkeys(serials, name))
        ctx.cache.devices[name] = revoked
        session = ctx.sessions.get(name)
        if session is not None:
            session.close("certificate revoked")
        which = ", ".join(serials) or "none on record"
        ctx.writer.event(
            storekeys.KIND_DEVICE,
            name,
            "Warning",
            "Revoked",
            f"{name}: certificates revoked ({which})",
        )
        ctx.projector.mark([name])
        return admin_pb2.RevokeDeviceResponse(serials=serials)

    # -- tokens and artifacts ----------------------------------------------------------------
    @_rpc
    async def CreateToken(
        self, request: admin_pb2.CreateTokenRequest, context: Any
    ) -> admin_pb2.CreateTokenResponse:
        ctx = self._ctx
        ttl = request.ttl.ToTimedelta().total_seconds() if request.HasField("ttl") else 0.0
        if ttl < 0:
            raise _invalid(f"ttl: must be more than 0s, got {ttl:g}s")
        if len(request.description) > MAX_TOKEN_DESCRIPTION:
            raise _invalid(f"description: at most {MAX_TOKEN_DESCRIPTION} characters")
        problems: list[str] = []
        for key, value in sorted(request.labels.items()):
            for check in (label_key, label_value):
                try:
                    check(key if check is label_key else value)
                except ValueError as exc:
                    problems.append(f"labels[{key!r}]: {exc}")
        if problems:
            raise _invalid("; ".join(problems))
        token, record = await tokens.create_token(
            ctx.store,
            now=ctx.clock(),
            ttl=ttl or ctx.config.tokens.default_ttl_s,
            single_use=request.single_use or ctx.config.tokens.single_use,
            description=request.description,
            labels=dict(request.labels),
        )
        ctx.writer.event("Token", record.id, "Normal", "Created", f"bootstrap token {record.id}")
        response = admin_pb2.CreateTokenResponse(
            token=token, ca_hash=pki.ca_pin(ctx.ca.certificate)
        )
        response.expires.FromMilliseconds(int(record.expires * 1000))
        return response

    async def PushArtifact(
        self, request_iterator: AsyncIterator[admin_pb2.PushArtifactRequest], context: Any
    ) -> admin_pb2.PushArtifactResponse:
        await self.authorize(context)
        from hub.pushing import PushRefused, receive_artifact

        try:
            return await receive_artifact(self._ctx, request_iterator, now=self._ctx.clock())
        except PushRefused as exc:
            await context.abort(exc.code, str(exc))
            raise AssertionError("unreachable: context.abort raises") from None


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
