"""AdminService's reads: Get, List (in pages, hub.decide.paging) and ListEvents, from the
in-memory cache (:class:`hub.state.cache.Cache`, written through), with store revisions as
resource versions; a root hub lists its regions' devices and its regions too.

The store is the truth: a replica's cache can lag it (a follower's watch behind the leader's
writes; a leader paused past its lease, which serves its own cache until it notices), so Get
and List show the cache's copy of a stored object only when it is the one the store holds
now (read from the store in the same call), the stored value otherwise; an object the store
no longer holds is not shown (docs/etcd.md)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import grpc

from edgefleet.api import PRIORITY_CLASSES, PriorityClass
from edgefleet.api.priorities import built_in_class_manifests
from edgefleet.errors import Compacted
from edgefleet.selecting import Selector, parse_selector
from edgefleet.timestamps import rfc3339
from edgefleet.v1 import admin_pb2, common_pb2
from hub.api.admin.common import (
    AdminAuth,
    Refused,
    check_kind,
    invalid,
    model_records,
    name_of,
    not_found,
    rpc,
)
from hub.api.admin.showing import Showing, stored_object
from hub.decide import apply, paging
from hub.decide.placementview import (
    KIND_PLACEMENT,
    LEAVING,
    Placed,
    placement_keys,
    placement_of,
    split_name,
)
from hub.decide.presentation import (
    KIND_REGION,
    KIND_TOKEN,
    model_object,
    object_labels,
    token_object,
)
from hub.state import storekeys, tokens
from hub.state.cache import Cache
from hub.state.regions import REGIONS, Regions, region_key
from hub.state.store import KeyValue, RangeResult, Store

DEFAULT_EVENTS_LIMIT = 500
PLACEMENTS = "placements/"  # the keys a list of Placements is paged by (none is stored)

_Show = Callable[[], dict[str, Any]]
"""An object of a list, shown when called (hub.decide.paging: only the page's are)."""


class Reads:
    """Get, List and ListEvents (module doc)."""

    def __init__(
        self,
        authorize: AdminAuth,
        store: Store,
        cache: Cache,
        show: Showing,
        *,
        regions: Regions | None,
        replica: str,
    ) -> None:
        self.authorize = authorize
        self.store = store
        self.cache = cache
        self.show = show
        self.regions = regions  # a root hub's regions (None: none)
        self.replica = replica  # this replica, as the store's region links name it

    async def _view(self, kind: str) -> tuple[str | None, RangeResult, dict[str, _Show]]:
        """What a list of ``kind`` shows now: the store prefix it pages a snapshot of (None: no
        history, shown as now), that prefix's keys now, and each object by its key, shown
        when called (a region's device at a root has a key of its own, after the devices')."""
        cache = self.cache
        view: dict[str, _Show] = {}
        if kind == storekeys.KIND_DEVICE:
            prefix: str | None = storekeys.DEVICES
            for d in cache.devices.values():
                view[storekeys.device_key(d.name)] = functools.partial(self.show.device_json, d)
            if self.regions is not None:  # a root hub: its regions' devices too
                for doc in self.regions.devices():
                    name = doc["metadata"]["name"]
                    view[f"{REGIONS}{doc['status']['region']}/{name}"] = functools.partial(
                        dict, doc
                    )
        elif kind == storekeys.KIND_MODEL:
            prefix = storekeys.MODELS
            for m in cache.models.values():
                view[storekeys.model_key(m.name, m.version)] = functools.partial(model_object, m)
        elif kind == KIND_TOKEN:
            prefix = tokens.PREFIX
        elif kind == KIND_PLACEMENT:  # shown from the cache, never stored (no history)
            prefix = None
            pairs = placement_keys(
                cache.deployments, cache.desired.by_deployment(), cache.devices.values()
            )
            for deployment, device in pairs:
                view[f"{PLACEMENTS}{deployment}/{device}"] = functools.partial(
                    self._listed_placement, deployment, device
                )
        elif kind == KIND_REGION:  # read-only, shown from hub.state.regions (none: no region)
            prefix = None
            regions = self.regions
            here = self.replica
            for doc in regions.objects(here) if regions is not None else []:
                view[region_key(doc["metadata"]["name"])] = functools.partial(dict, doc)
        else:
            prefix = storekeys.object_prefix(kind)
            for o in cache.objects_of(kind):
                view[storekeys.object_key(kind, o.name)] = functools.partial(
                    self.show.object_json, kind, o.manifest
                )
            if kind == PriorityClass.KIND:  # the built-in ones too, never stored (no history)
                for doc in built_in_class_manifests():
                    key = storekeys.object_key(kind, doc["metadata"]["name"])
                    view[key] = functools.partial(dict, doc)
        now = await self.store.range(REGIONS if prefix is None else prefix)
        if kind == KIND_TOKEN:
            for kv in now.kvs:
                record = tokens.TokenRecord.from_json(kv.value)
                view[kv.key] = functools.partial(token_object, record)
        return prefix, now, view

    @rpc
    async def Get(self, request: admin_pb2.GetRequest, context: Any) -> common_pb2.Object:
        check_kind(request.kind)
        kind, name = request.kind, request.name
        if not name:
            raise invalid("name: required (an object name)")
        cache = self.cache
        doc: dict[str, Any] | None = None
        if kind == storekeys.KIND_DEVICE:
            key = storekeys.device_key(name)
            kv = await self.store.get(key)
            device = cache.devices.get(name)
            if kv is not None:  # present as the store says; its live fields from the cache
                doc = (
                    self.show.device_json(device)
                    if device is not None
                    else self._from_store(kind, kv)
                )
            elif self.regions is not None:  # a device of a region, as it summarised it
                shown = [d for d in self.regions.devices() if d["metadata"]["name"] == name]
                if shown:
                    return common_pb2.Object(json=storekeys.dumps(shown[0]))
        elif kind == storekeys.KIND_MODEL:
            model = model_records(self.cache).get(name)
            if model is not None:
                key = storekeys.model_key(model.name, model.version)
                kv = await self.store.get(key)
                if kv is not None:
                    doc = model_object(model)
            else:  # pushed at the leader, not in this replica's cache yet?
                kv = await self._model_in_store(name)
                if kv is not None:
                    doc = self._from_store(kind, kv)
        elif kind == KIND_TOKEN:
            key = tokens.PREFIX + name
            kv = await self.store.get(key)
            if kv is not None:
                doc = token_object(tokens.TokenRecord.from_json(kv.value))
        elif kind == KIND_PLACEMENT:
            pair = split_name(name)
            placement = self._placement(*pair) if pair is not None else None
            if placement is not None:
                return common_pb2.Object(json=storekeys.dumps(placement))
        elif kind == KIND_REGION:
            key = region_key(name)
            regions = self.regions
            doc = regions.object(name, self.replica) if regions is not None else None
            if doc is None:
                await self._refuse_revoked_region(name)
            kv = await self.store.get(key)
        else:
            key = storekeys.object_key(kind, name)
            kv = await self.store.get(key)
            stored = cache.stored.get((kind, name))
            if kv is not None:  # as stored now: the cache's copy only when it is that one
                doc = (
                    self.show.object_json(kind, stored.manifest)
                    if stored is not None and stored.revision == kv.mod_revision
                    else self._from_store(kind, kv)
                )
            elif kind == PriorityClass.KIND and name in PRIORITY_CLASSES:
                built_in = [d for d in built_in_class_manifests() if d["metadata"]["name"] == name]
                return common_pb2.Object(json=storekeys.dumps(built_in[0]))
        if doc is None:
            raise not_found(kind, name)
        return stored_object(kind, doc, kv)

    def _from_store(self, kind: str, kv: KeyValue) -> dict[str, Any]:
        """``kind``'s object as the store holds it (``kv``), where this replica's cache lags it:
        a follower's cache follows the leader's writes through a watch, and a leader paused past
        its lease serves its own until it notices (docs/soak.md: a PriorityClass applied at the
        new leader, read at the old one as it was)."""
        _, show = self.show.watched(kind)
        return show(kv.key, kv.value)

    async def _model_in_store(self, name: str) -> KeyValue | None:
        """The store's record of the model listed as ``name`` (``NAME-VERSION``), None: none."""
        for kv in (await self.store.range(storekeys.MODELS)).kvs:
            model = storekeys.ModelRecord.from_json(storekeys.loads(kv.value))
            if f"{model.name}-{model.version}" == name:
                return kv
        return None

    def _cached(self, kind: str) -> dict[str, int] | None:
        """The store revision of each object of ``kind`` the cache holds, for a kind whose
        stored keys are all objects of its list (paging.snapshot's ``cached``; None: not
        such a kind, the cache shown as it is)."""
        if kind not in apply.OBJECT_KINDS:
            return None
        return {storekeys.object_key(kind, o.name): o.revision for o in self.cache.objects_of(kind)}

    def _listed_placement(self, deployment: str, device: str) -> dict[str, Any]:
        """A placement of a list: as :meth:`_placement`, or gone since the list was read
        (Leaving, nothing reported)."""
        shown = self._placement(deployment, device)
        if shown is None:
            why = "no longer placed here"
            return Placed(deployment, device, False, phase=LEAVING, reason=why).to_object()
        return shown

    def _placement(self, deployment: str, device: str) -> dict[str, Any] | None:
        """``device``'s share of ``deployment`` (hub.decide.placementview; None: no such
        device or deployment, or the device is neither sent it nor reports it)."""
        cache = self.cache
        found = cache.devices.get(device)
        record = cache.desired.get(device)
        if found is None or deployment not in cache.deployments:
            return None
        if deployment not in found.workloads and (
            record is None or deployment not in record.deployments
        ):
            return None
        placed = placement_of(
            deployment,
            found,
            dep=cache.deployments.get(deployment),
            record=record,
            revisions=cache.revisions.get(deployment, {}),
            models=cache.models,
        )
        return placed.to_object()

    async def _refuse_revoked_region(self, name: str) -> None:
        """A region revoked here is not shown (the root stops counting it): NOT_FOUND saying
        so, rather than as if it never enrolled."""
        kv = await self.store.get(region_key(name))
        record = storekeys.loads(kv.value) if kv is not None else {}
        if record.get("revoked"):
            when = rfc3339(record.get("revokedAt"))
            raise Refused(
                grpc.StatusCode.NOT_FOUND,
                f'{KIND_REGION} "{name}" was revoked (at {when}): a revoked region is not '
                "shown; to take it back, make a new token (hub token create --for-region) "
                "and enroll it again (hub init --parent)",
            )

    @rpc
    async def List(self, request: admin_pb2.ListRequest, context: Any) -> admin_pb2.ListResponse:
        check_kind(request.kind)
        try:
            selector = parse_selector(request.label_selector)
        except ValueError as exc:
            raise invalid(f"label_selector: {exc}") from None
        try:
            limit = paging.page_limit(request.limit)
            token = (
                paging.decode_token(
                    request.continue_token, kind=request.kind, selector=request.label_selector
                )
                if request.continue_token
                else None
            )
        except paging.BadPage as exc:
            raise invalid(str(exc)) from None
        return await self._page(request.kind, request.label_selector, selector, limit, token)

    async def _page(
        self,
        kind: str,
        selector_text: str,
        selector: Selector,
        limit: int,
        token: paging.ContinueToken | None,
    ) -> admin_pb2.ListResponse:
        """One page of a list (hub.decide.paging): read at the token's revision (none: now), in key
        order after the token's key, at most ``limit`` items (0: all, or RESOURCE_EXHAUSTED)
        and :data:`hub.decide.paging.MAX_PAGE_BYTES`."""
        prefix, now, view = await self._view(kind)
        revision = now.revision if token is None else token.revision
        problem = paging.revision_problem(revision, now.revision)
        if problem is not None:
            raise invalid(problem)
        current = {kv.key: kv for kv in now.kvs}
        at = current
        if prefix is not None and revision != now.revision:
            try:
                at = {kv.key: kv for kv in (await self.store.range_at(prefix, revision)).kvs}
            except Compacted:
                raise Refused(
                    grpc.StatusCode.OUT_OF_RANGE,
                    f"continue_token: expired (revision {revision} of this list is compacted): "
                    "list again without a continue_token",
                ) from None
        stored = {} if prefix is None else {k: kv.mod_revision for k, kv in current.items()}
        stored_at = {} if prefix is None else {k: kv.mod_revision for k, kv in at.items()}
        keys = paging.snapshot(list(view), stored, stored_at, cached=self._cached(kind))
        _, show = self.show.watched(kind) if prefix is not None else (None, None)
        response = admin_pb2.ListResponse(resource_version=revision)
        i, total = paging.after([k for k, _ in keys], token), 0
        while i < len(keys):
            key, source = keys[i]
            if source is paging.Source.AT and show is not None:
                doc, kv = show(key, at[key].value), at.get(key)
            else:
                doc, kv = view[key](), current.get(key)
            if selector.requirements and not selector.matches(object_labels(doc)):
                i += 1
                continue
            item = stored_object(kind, doc, kv)
            size = item.ByteSize() + 8  # and its tag and length
            budget = paging.MAX_PAGE_BYTES
            oversize = paging.oversize_message(kind, name_of(doc), size, budget)
            if oversize is not None:
                raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, oversize)
            if not paging.fits(len(response.items), total, size, limit, budget):
                break
            response.items.append(item)
            total += size
            i += 1
        if i < len(keys):
            if not limit:
                raise Refused(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the list of {kind} ({len(keys)} objects) is more than one response "
                    f"carries ({budget / 2**20:.2f} MiB): ask for it in pages "
                    "(limit and continue_token; edgectl get --chunk-size)",
                )
            last = keys[i - 1][0]  # i > 0: a page holds at least one item
            response.continue_token = paging.ContinueToken(
                kind, selector_text, revision, last
            ).encode()
            if not selector.requirements:
                response.remaining_item_count = len(keys) - i
        return response

    @rpc
    async def ListEvents(
        self, request: admin_pb2.ListEventsRequest, context: Any
    ) -> admin_pb2.ListEventsResponse:
        limit = min(request.limit or DEFAULT_EVENTS_LIMIT, len(self.cache.events))
        found = [
            ev
            for ev in self.cache.events
            if (not request.kind or ev["object"]["kind"] == request.kind)
            and (not request.name or ev["object"]["name"] == request.name)
        ]
        newest = found[len(found) - limit :] if limit else []
        shown = [{**ev, "time": rfc3339(ev.get("time"), millis=True)} for ev in newest]
        return admin_pb2.ListEventsResponse(events=[storekeys.dumps(ev) for ev in shown])
