"""AdminService: what operators (``edgectl``) call, over mutual TLS with an admin certificate.

Every call is authorized first (:func:`hub.api.auth.authorize` with ``roles={Role.ADMIN}``): a
device or child-hub certificate gets PERMISSION_DENIED, a revoked one UNAUTHENTICATED.

* **Apply** is all or nothing. Documents are parsed and validated first
  (:mod:`hub.decide.apply`: INVALID_ARGUMENT naming ``documents[i].<path>`` for every problem);
  then each object's key is read, canonical equality decides the outcome, and every changed
  object is written in **one** store transaction that compares each key's mod revision as it
  was read. A concurrent change makes it fail whole: ABORTED, retryable. Unchanged objects are
  not written (no revision bump).
* Reads (Get, List, ListEvents) come from the in-memory cache (:class:`hub.state.cache.Cache`, which
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

import asyncio
import dataclasses
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from edgefleet.api import PRIORITY_CLASSES, ModelDeployment, PriorityClass, parse_manifest
from edgefleet.errors import (
    Compacted,
    CompareFailed,
    EdgefleetError,
    StoreError,
    ValidationError,
)
from edgefleet.logs import get_logger
from edgefleet.selecting import Selector, parse_selector
from edgefleet.timestamps import rfc3339
from edgefleet.v1 import admin_pb2, admin_pb2_grpc, common_pb2
from hub import pki
from hub.api.auth import Caller, authorize, caller_of
from hub.api.dashboard import access as dashboard_access
from hub.api.regions import REGIONS, region_key, replica_name, revoke_region
from hub.context import HubContext
from hub.controllers.rollout import ActionRefused, canary_status, progress_of, undo_manifest
from hub.decide import apply, paging, priority, regionslice, statebound
from hub.decide.desired import MAX_DESIRED_STATE_BYTES
from hub.decide.devices import Device
from hub.decide.labeltrust import secrets_withheld
from hub.decide.modelclaim import apply_refusal
from hub.decide.placement import REGION_LABEL
from hub.decide.presentation import (
    KIND_REGION,
    KIND_TOKEN,
    REGION_MANAGED,
    deployment_object,
    device_object,
    fleet_compliance,
    model_object,
    object_labels,
    token_object,
    with_store_metadata,
)
from hub.decide.rollout import Revision, RolloutState, template_hash
from hub.decide.rolloutstatus import rollout_versions, with_rollout
from hub.decide.status import count_placeable, placement_warnings
from hub.decide.undo import undo_refused
from hub.pki import Role
from hub.state import storekeys, tokens
from hub.state.cache import Cache
from hub.state.secrets import MAX_SECRETS, SecretRecord, plan_record, record_of
from hub.state.store import Compare, Delete, Event, EventType, KeyValue, Put, RangeResult
from hub.state.trustroots import root_pin
from hub.state.writer import PreparedEvent

log = get_logger(__name__)

DEFAULT_EVENTS_LIMIT = 500
DEFAULT_LOG_TAIL = 100
MAX_LOG_TAIL = 1000
LOG_ANSWER_TIMEOUT_S = 10.0
STATUS_POLL_S = 0.5  # how often a watch of deployments looks for status changes

KIND_PRIORITY_CLASS = PriorityClass.KIND

LISTED_KINDS: tuple[str, ...] = (
    storekeys.KIND_DEVICE,
    storekeys.KIND_MODEL,
    *apply.OBJECT_KINDS,
    KIND_TOKEN,
    KIND_REGION,
)

_Show = Callable[[], dict[str, Any]]
"""An object of a list, shown when called (hub.decide.paging: only the page's are)."""

_OUTCOMES = {
    apply.Outcome.CREATED: admin_pb2.ApplyResult.CREATED,
    apply.Outcome.CONFIGURED: admin_pb2.ApplyResult.CONFIGURED,
    apply.Outcome.UNCHANGED: admin_pb2.ApplyResult.UNCHANGED,
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


def _model_users(cache: Cache, model: tuple[str, str]) -> list[str]:
    """The deployments that ask for ``model``, or whose rollout still sends it to devices."""
    users = {
        name
        for name, dep in cache.deployments.items()
        if (dep.spec.model.name, dep.spec.model.version) == model
    }
    for name, state in cache.rollouts.items():
        for number, what in ((state.stable, "stable"), (state.revision, "current")):
            revision = cache.revisions.get(name, {}).get(number)
            if name not in users and revision is not None and revision.model == model:
                users.add(f"{name} ({what} revision {number})")
    return sorted(users)


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


def _refuse_root_owned(kind: str, name: str, value: bytes, what: str) -> None:
    """A regional hub's objects that came from its root hub change only at the root
    (hub.controllers.parentlink): FAILED_PRECONDITION, also while the root is unreachable."""
    generation = storekeys.federated_generation(value)
    if generation is not None:
        raise Refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{kind} {name} is owned by the root hub (federation, generation {generation}): "
            f"{what} it at the root; a regional hub keeps enforcing it meanwhile",
        )


@dataclass(slots=True)
class _Planned:
    """One object of an Apply: the key's mod revision as read (0: absent) and the outcome."""

    obj: apply.ParsedObject
    key: str
    read_revision: int
    outcome: apply.Outcome
    revision: int  # the object's resource version once applied
    created: float | None = None  # when it was first applied (now, for a new object)
    secret: SecretRecord | None = None  # a Secret's values sealed with the hub's key

    def stored_value(self) -> bytes:
        sealed = self.secret.to_json() if self.secret is not None else None
        return storekeys.object_value(self.obj.manifest, self.created, sealed)


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
            parsed = apply.parse_documents(list(request.documents))
            if any(p.manifest.get("spec", {}).get("publishers") is not None for p in parsed):
                apply.check_publisher_keys(list(request.documents), self._publisher_keys())
        except ValidationError as exc:
            raise _invalid(problems_text(exc)) from None
        self._check_priority_classes(parsed)
        self._check_waves(parsed)
        if (claimed := apply_refusal(parsed, self._ctx.cache.deployments)) is not None:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, claimed)  # hub.decide.modelclaim
        planned = [await self._plan(obj) for obj in parsed]
        changed = [p for p in planned if p.outcome is not apply.Outcome.UNCHANGED]
        self._check_secret_count(planned)
        if changed:
            self._check_desired_sizes(changed)
        if changed and not request.dry_run:
            writer = self._ctx.writer
            events = [
                writer.prepare_event(
                    p.obj.kind,
                    p.obj.name,
                    "Normal",
                    p.outcome.value.capitalize(),
                    f"{p.obj.kind} {p.obj.name} {p.outcome.value} by apply",
                )
                for p in changed
            ]
            # One transaction: the objects and the events that describe them.
            revision = await self._ctx.store.txn(
                [Compare(p.key, p.read_revision) for p in changed],
                [
                    *(Put(p.key, p.stored_value()) for p in changed),
                    *(e.put for e in events),
                ],
            )
            for p, e in zip(changed, events, strict=True):
                p.revision = revision
                self._ctx.cache.put_object(p.obj.manifest, revision, secret=p.secret)
                writer.committed(e)
            await self._ctx.cache.feed.settled()  # its revisions exist when it answers
        return admin_pb2.ApplyResponse(
            results=[
                admin_pb2.ApplyResult(
                    kind=p.obj.kind,
                    name=p.obj.name,
                    outcome=_OUTCOMES[p.outcome],
                    resource_version=p.revision,
                    warnings=self._warnings(p.obj),
                )
                for p in planned
            ]
        )

    def _publisher_keys(self) -> frozenset[str]:
        """The publisher keys this hub knows: the artifacts keys of its trust root and the
        keys of its TUF delegations."""
        from edgefleet.errors import TrustError
        from edgefleet.trust.documents import ROLE_ARTIFACTS, parse_root
        from edgefleet.trust.envelopes import ROOT_TYPE, decode_payload, parse_envelope_bytes

        known: set[str] = set()
        if self._ctx.trust_root:
            try:
                env = parse_envelope_bytes(self._ctx.trust_root, what="the hub's trust root")
                root = parse_root(decode_payload(env, expected_type=ROOT_TYPE, what="root"))
                known.update(root.role(ROLE_ARTIFACTS).keyids)
            except TrustError:
                pass  # checked at start; a hub without a usable root knows no publisher
        if self._ctx.tuf is not None:
            delegations = self._ctx.tuf.targets.delegations
            if delegations is not None:
                known.update(delegations.keys)
        return frozenset(known)

    def _check_desired_sizes(self, changed: list[_Planned]) -> None:
        """Refuse an apply that makes a device's desired state too large for a message (it
        could then never be sent to that device), naming the devices and sizes; a device
        already over the bound refuses only an apply that grows it (hub.decide.statebound)."""
        cache = self._ctx.cache
        trial = dataclasses.replace(
            cache, stored=dict(cache.stored), deployments=dict(cache.deployments)
        )
        for p in changed:
            trial.put_object(p.obj.manifest, 0)
        # the worst case: each changed deployment's new revision on every device it reaches
        planned = {
            p.obj.name: Revision(p.obj.name, 0, template_hash(p.obj.manifest), p.obj.manifest, 0.0)
            for p in changed
            if p.obj.kind == "ModelDeployment"
        }
        too_big = statebound.grown_past_bound(
            cache, trial, planned=planned, region=self._ctx.region
        )
        if too_big:
            shown = ", ".join(f"{n} ({s / 2**20:.1f} MiB)" for n, s in too_big[:10])
            more = f" and {len(too_big) - 10} more" if len(too_big) > 10 else ""
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"nothing applied: the desired state of {len(too_big)} device(s) would exceed "
                f"{MAX_DESIRED_STATE_BYTES / 2**20:.2f} MiB, the most a device can receive: "
                f"{shown}{more}; make manifests smaller (annotations) or select fewer devices",
            )

    def _check_priority_classes(self, parsed: list[apply.ParsedObject]) -> None:
        """A deployment naming a class that is neither built in nor applied (before, or in
        this apply) is refused, and nothing is applied."""
        deployments = []
        for obj in parsed:
            if obj.kind == "ModelDeployment":
                dep = parse_manifest(dict(obj.manifest))
                assert isinstance(dep, ModelDeployment)
                deployments.append(dep)
        known = {o.name for o in self._ctx.cache.objects_of(KIND_PRIORITY_CLASS)}
        known |= {obj.name for obj in parsed if obj.kind == KIND_PRIORITY_CLASS}
        unknown = priority.unknown_classes(deployments, known)
        if unknown:
            builtin = ", ".join(PRIORITY_CLASSES)
            applied = ", ".join(sorted(known)) or "none"
            raise _invalid(
                "nothing applied: "
                + "; ".join(
                    f"ModelDeployment {dep}: spec.priorityClassName: unknown class {cls!r}"
                    for dep, cls in unknown
                )
                + f" (built-in: {builtin}; PriorityClasses applied: {applied})"
            )

    def _check_waves(self, parsed: list[apply.ParsedObject]) -> None:
        """``spec.rollout.waves`` rolls a revision out across regions: only at a root hub with
        regions enrolled, naming enrolled regions (hub.decide.wave). A per-region override
        (hub.decide.regionslice) may not name this hub's own region."""
        problems: list[str] = []
        regions = self._ctx.regions
        enrolled = sorted(regions.regions) if regions is not None else []
        for i, obj in enumerate(parsed):
            waves = obj.manifest.get("spec", {}).get("rollout", {}).get("waves")
            if obj.kind != "ModelDeployment" or not waves:
                continue
            path = f"documents[{i}].spec.rollout.waves"
            if self._ctx.waves is None:
                problems.append(
                    f"{path}: this is a regional hub: waves roll a revision out across regions "
                    "and are set at the root hub (docs/federation.md)"
                )
            elif not enrolled:
                problems.append(
                    f"{path}: this hub has no regional hubs enrolled (federation, "
                    "docs/federation.md): waves roll a revision out across the regions of a "
                    "root hub"
                )
            else:
                for j, wave in enumerate(waves):
                    for k, region in enumerate(wave.get("regions", [])):
                        if region not in enrolled:
                            problems.append(
                                f"{path}[{j}].regions[{k}]: {region!r} is not an enrolled "
                                f"region (enrolled: {', '.join(enrolled)})"
                            )
        for i, obj in enumerate(parsed):  # an override for this hub's own devices: none apply
            for key, region in sorted(regionslice.override_regions(obj.manifest).items()):
                if region == self._ctx.region:
                    problems.append(
                        f'documents[{i}].metadata.annotations["{key}"]: names this hub\'s own '
                        f"region {region!r}: per-region overrides apply to the regional hubs "
                        "below it; its own devices run the deployment as applied"
                    )
        if problems:
            raise _invalid("; ".join(problems))

    def _warnings(self, obj: apply.ParsedObject) -> list[str]:
        """An accepted deployment that cannot run anywhere says so at once (and the same
        words are conditions in its status)."""
        if obj.kind != "ModelDeployment":
            return []
        dep = parse_manifest(dict(obj.manifest))
        assert isinstance(dep, ModelDeployment)
        cache = self._ctx.cache
        pushed = (dep.spec.model.name, dep.spec.model.version) in cache.models
        warnings = placement_warnings(dep, cache.devices.values(), self._ctx.region, pushed)
        regions = self._ctx.regions
        if regions is not None and any(
            regionslice.goes_to(obj.manifest, r) for r in regions.regions
        ):
            # a root hub: the deployment runs in its regions (hub.api.regions), not on its devices
            warnings = [w for w in warnings if "matches no device" not in w]
        return warnings

    async def _plan(self, obj: apply.ParsedObject) -> _Planned:
        key = storekeys.object_key(obj.kind, obj.name)
        kv = await self._ctx.store.get(key)
        stored = storekeys.manifest_of(kv.value) if kv is not None else None
        read_revision = kv.mod_revision if kv is not None else 0
        outcome = apply.outcome_of(obj.manifest, stored)
        created = storekeys.created_of(kv.value) if kv is not None else self._ctx.clock()
        secret = None
        if obj.secret is not None:  # the values decide too; they are sealed before any write
            old = record_of(storekeys.loads(kv.value), obj.name) if kv is not None else None
            try:
                secret, new_values = plan_record(self._ctx.secret_keys, obj.secret, old)
            except EdgefleetError as exc:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from None
            if new_values and outcome is apply.Outcome.UNCHANGED:
                outcome = apply.Outcome.CONFIGURED
        if kv is not None and outcome is not apply.Outcome.UNCHANGED:
            _refuse_root_owned(obj.kind, obj.name, kv.value, "change")
        return _Planned(obj, key, read_revision, outcome, read_revision, created, secret)

    def _check_secret_count(self, planned: list[_Planned]) -> None:
        new = {p.obj.name for p in planned if p.obj.kind == "Secret"} - set(self._ctx.cache.secrets)
        total = len(self._ctx.cache.secrets) + len(new)
        if new and total > MAX_SECRETS:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"nothing applied: this hub would hold {total} Secrets, at most {MAX_SECRETS}",
            )

    # -- reading -----------------------------------------------------------------------------
    def _check_kind(self, kind: str) -> None:
        if kind not in LISTED_KINDS:
            raise _invalid(f"unknown kind {kind!r}: must be one of {', '.join(LISTED_KINDS)}")

    def _device_json(self, device: Device) -> dict[str, Any]:
        cache = self._ctx.cache
        content = self._ctx.projector.content_for(device.name)
        doc = device_object(
            device,
            cache.security_policy(),
            cache.desired.get(device.name),
            content.excluded if content is not None else None,
        )
        doc["status"]["region"] = device.all_labels().get(REGION_LABEL, self._ctx.region)
        return doc

    def _assigned(self) -> dict[str, tuple[str, ...]]:
        return {name: record.deployments for name, record in self._ctx.cache.desired.items()}

    def shown_object(self, kind: str, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """An object as ``edgectl get`` shows it at this hub, regions' figures not added."""
        return self._local_object_json(kind, manifest)

    def _object_json(self, kind: str, manifest: Mapping[str, Any]) -> dict[str, Any]:
        doc = self._local_object_json(kind, manifest)
        regions = self._ctx.regions
        if kind == "ModelDeployment":
            doc["status"]["region"] = self._ctx.region
            if regions is not None and regions.regions:
                doc = regions.with_regions(doc)
            waves = self._ctx.waves
            shown = waves.status(str(manifest["metadata"]["name"])) if waves is not None else None
            if shown is not None:  # a root hub's rollout across its regions (hub.decide.wave)
                doc["status"] = {**doc["status"]}
                doc["status"]["rollout"] = {**doc["status"].get("rollout", {}), "waves": shown}
        return doc

    def _local_object_json(self, kind: str, manifest: Mapping[str, Any]) -> dict[str, Any]:
        if kind == "ModelDeployment":
            cache = self._ctx.cache
            dep = cache.deployments.get(str(manifest["metadata"]["name"]))
            if dep is None:
                parsed = parse_manifest(dict(manifest))
                assert isinstance(parsed, ModelDeployment)
                dep = parsed
            name = dep.metadata.name
            model = cache.models.get((dep.spec.model.name, dep.spec.model.version))
            assigned = self._assigned()
            assigned_models: dict[str, tuple[str, str | None]] = {}
            for device, deployments in assigned.items():
                revision = cache.revision_for(name, device) if name in deployments else None
                if revision is not None:
                    sent = cache.models.get(revision.model)
                    assigned_models[device] = (revision.model[1], sent.sha256 if sent else None)
            doc = deployment_object(
                manifest,
                cache.devices.values(),
                assigned,
                dep,
                model_sha256=model.sha256 if model is not None else None,
                model_pushed=model is not None,
                placeable=count_placeable(dep, cache.devices.values(), self._ctx.region),
                assigned_models=assigned_models,
                scheduled=cache.explanations.get(name)
                if dep.spec.replicas.per_device is None
                else None,
                withheld=secrets_withheld(dep, cache.devices.values(), self._ctx.region),
            )
            state = cache.rollouts.get(name)
            if state is not None:
                progress = progress_of(cache, name)
                doc["status"] = with_rollout(
                    doc["status"],
                    state,
                    *rollout_versions(cache.revisions.get(name, {}), state),
                    progress.to_json() if progress is not None else None,
                )
                canary = dep.spec.rollout.canary
                if canary is not None and progress is not None:
                    analysis = self._ctx.rollouts.analysis(name) if self._ctx.rollouts else None
                    doc["status"]["rollout"]["canary"] = canary_status(
                        canary, state, progress.targeted, analysis
                    )
            return doc
        if kind == "Secret":  # names, keys, version: never a value
            record = self._ctx.cache.secrets.get(str(manifest["metadata"]["name"]))
            shown = dict(manifest)
            if record is not None:
                shown["status"] = {
                    "version": record.version,
                    "keys": list(record.keys),
                    "bytes": record.size,
                }
            return shown
        if kind == "SecurityBaseline":
            return {**manifest, "status": fleet_compliance(self._ctx.cache.devices.values())}
        return dict(manifest)

    def _model_records(self) -> dict[str, storekeys.ModelRecord]:
        return {
            f"{m.name}-{m.version}": m
            for m in sorted(self._ctx.cache.models.values(), key=lambda m: (m.name, m.version))
        }

    def _shown(self, kind: str, doc: Mapping[str, Any], kv: KeyValue | None) -> common_pb2.Object:
        """``doc`` with its store metadata (uid, resourceVersion, creationTimestamp)."""
        if kv is None:
            return common_pb2.Object(json=storekeys.dumps(doc))
        created = storekeys.created_of(kv.value) if kind in apply.OBJECT_KINDS else None
        stamped = with_store_metadata(
            doc,
            key=kv.key,
            create_revision=kv.create_revision,
            mod_revision=kv.mod_revision,
            created=created,
        )
        return common_pb2.Object(json=storekeys.dumps(stamped), resource_version=kv.mod_revision)

    async def _view(self, kind: str) -> tuple[str | None, RangeResult, dict[str, _Show]]:
        """What a list of ``kind`` shows now: the store prefix it pages a snapshot of (None: no
        history, shown as now), that prefix's keys now, and each object by its key, shown
        when called (a region's device at a root has a key of its own, after the devices')."""
        cache = self._ctx.cache
        view: dict[str, _Show] = {}
        if kind == storekeys.KIND_DEVICE:
            prefix: str | None = storekeys.DEVICES
            for d in cache.devices.values():
                view[storekeys.device_key(d.name)] = functools.partial(self._device_json, d)
            if self._ctx.regions is not None:  # a root hub: its regions' devices too
                for doc in self._ctx.regions.devices():
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
        elif kind == KIND_REGION:  # read-only, shown from hub.api.regions (none: no region)
            prefix = None
            regions = self._ctx.regions
            here = replica_name(self._ctx)
            for doc in regions.objects(here) if regions is not None else []:
                view[region_key(doc["metadata"]["name"])] = functools.partial(dict, doc)
        else:
            prefix = storekeys.object_prefix(kind)
            for o in cache.objects_of(kind):
                view[storekeys.object_key(kind, o.name)] = functools.partial(
                    self._object_json, kind, o.manifest
                )
        now = await self._ctx.store.range(REGIONS if prefix is None else prefix)
        if kind == KIND_TOKEN:
            for kv in now.kvs:
                record = tokens.TokenRecord.from_json(kv.value)
                view[kv.key] = functools.partial(token_object, record)
        return prefix, now, view

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
            elif self._ctx.regions is not None:  # a device of a region, as it summarised it
                shown = [d for d in self._ctx.regions.devices() if d["metadata"]["name"] == name]
                if shown:
                    return common_pb2.Object(json=storekeys.dumps(shown[0]))
        elif kind == storekeys.KIND_MODEL:
            model = self._model_records().get(name)
            if model is not None:
                doc, key = model_object(model), storekeys.model_key(model.name, model.version)
        elif kind == KIND_TOKEN:
            key = tokens.PREFIX + name
            kv = await self._ctx.store.get(key)
            if kv is not None:
                doc = token_object(tokens.TokenRecord.from_json(kv.value))
        elif kind == KIND_REGION:
            key = region_key(name)
            regions = self._ctx.regions
            doc = regions.object(name, replica_name(self._ctx)) if regions is not None else None
            if doc is None:
                await self._refuse_revoked_region(name)
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

    async def _refuse_revoked_region(self, name: str) -> None:
        """A region revoked here is not shown (the root stops counting it): NOT_FOUND saying
        so, rather than as if it never enrolled."""
        kv = await self._ctx.store.get(region_key(name))
        record = storekeys.loads(kv.value) if kv is not None else {}
        if record.get("revoked"):
            when = rfc3339(record.get("revokedAt"))
            raise Refused(
                grpc.StatusCode.NOT_FOUND,
                f'{KIND_REGION} "{name}" was revoked (at {when}): a revoked region is not '
                "shown; to take it back, make a new token (hub token create --for-region) "
                "and enroll it again (hub init --parent)",
            )

    @_rpc
    async def List(self, request: admin_pb2.ListRequest, context: Any) -> admin_pb2.ListResponse:
        self._check_kind(request.kind)
        try:
            selector = parse_selector(request.label_selector)
        except ValueError as exc:
            raise _invalid(f"label_selector: {exc}") from None
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
            raise _invalid(str(exc)) from None
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
            raise _invalid(problem)
        current = {kv.key: kv for kv in now.kvs}
        at = current
        if prefix is not None and revision != now.revision:
            try:
                at = {kv.key: kv for kv in (await self._ctx.store.range_at(prefix, revision)).kvs}
            except Compacted:
                raise Refused(
                    grpc.StatusCode.OUT_OF_RANGE,
                    f"continue_token: expired (revision {revision} of this list is compacted): "
                    "list again without a continue_token",
                ) from None
        stored = {} if prefix is None else {k: kv.mod_revision for k, kv in current.items()}
        stored_at = {} if prefix is None else {k: kv.mod_revision for k, kv in at.items()}
        keys = paging.snapshot(list(view), stored, stored_at)
        _, show = self._watched(kind) if prefix is not None else (None, None)
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
            item = self._shown(kind, doc, kv)
            size = item.ByteSize() + 8  # and its tag and length
            budget = paging.MAX_PAGE_BYTES
            oversize = paging.oversize_message(kind, _name_of(doc), size, budget)
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
            if request.kind == KIND_REGION:
                raise _invalid(
                    f"kind: {KIND_REGION} cannot be watched (a region's status is not stored, "
                    "it is what its last report says now): list it again (edgectl get regions)"
                )
            if request.resource_version < 0:
                raise _invalid("resource_version: must be 0 or more")
        except Refused as exc:
            await context.abort(exc.code, exc.message)
        prefix, show = self._watched(request.kind)
        start = request.resource_version + 1
        if request.resource_version == 0:
            current = await self._ctx.store.range(prefix)
            for kv in current.kvs:  # one object per message (hub.decide.paging: none is too big)
                added = _watch_event(admin_pb2.WatchEvent.ADDED, kv, show(kv.key, kv.value))
                await _refuse_oversize(context, request.kind, added)
                yield added
            start = current.revision + 1
        changes = self._ctx.store.watch(prefix, start)
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
            for obj in self._ctx.cache.objects_of("ModelDeployment"):
                key = storekeys.object_key("ModelDeployment", obj.name)
                shown.setdefault(key, show(key, storekeys.object_value(obj.manifest)).get("status"))
            while True:
                await asyncio.sleep(STATUS_POLL_S)
                for obj in self._ctx.cache.objects_of("ModelDeployment"):
                    key = storekeys.object_key("ModelDeployment", obj.name)
                    if key not in shown:
                        continue  # not announced yet: its store event comes first
                    doc = self._object_json("ModelDeployment", obj.manifest)
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

    # -- deleting ----------------------------------------------------------------------------
    @_rpc
    async def Delete(
        self, request: admin_pb2.DeleteRequest, context: Any
    ) -> admin_pb2.DeleteResponse:
        self._check_kind(request.kind)
        if not request.name:
            raise _invalid("name: required (an object name)")
        kind, name = request.kind, request.name
        if kind == KIND_REGION:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{KIND_REGION} {name} is not deleted: {REGION_MANAGED}",
            )
        ctx, cache = self._ctx, self._ctx.cache
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
        if kind == storekeys.KIND_MODEL and (model := self._model_records().get(name)):
            users = _model_users(cache, (model.name, model.version))
            if users and not request.force:
                raise Refused(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"model {name} is in use by ModelDeployment {', '.join(users)}: deleting it "
                    "takes that workload off every device; change or delete those deployments "
                    "first, or delete with force",
                )
            if users:
                forced = f" (forced: in use by {', '.join(users)})"
        event = ctx.writer.prepare_event(
            kind, name, "Normal", "Deleted", f"{kind} {name} deleted{forced}"
        )
        if kind == storekeys.KIND_DEVICE:
            if name not in cache.devices:
                return admin_pb2.DeleteResponse(deleted=False)
            session = ctx.sessions.get(name)
            if session is not None:
                session.close("device deleted")
            await ctx.store.txn(
                (),
                [
                    Delete(storekeys.device_key(name)),
                    Delete(storekeys.desired_key(name)),
                    event.put,
                ],
            )
            cache.drop_device(name)
            ctx.projector.mark([name])
        elif kind == KIND_TOKEN:
            if not await tokens.delete_token(ctx.store, name):
                return admin_pb2.DeleteResponse(deleted=False)
        elif kind == storekeys.KIND_MODEL:
            model = self._model_records().get(name)
            if model is None:
                return admin_pb2.DeleteResponse(deleted=False)
            await ctx.store.txn(
                (), [Delete(storekeys.model_key(model.name, model.version)), event.put]
            )
            cache.drop_model(model.name, model.version)
            if ctx.shared_blobs is not None:  # bytes no other model uses leave the store too
                used = {d for m in cache.models.values() for d in m.digests()}
                for digest in model.digests() - used:
                    await ctx.shared_blobs.forget(digest)
        else:
            key = storekeys.object_key(kind, name)
            kv = await ctx.store.get(key)
            if kv is None:
                return admin_pb2.DeleteResponse(deleted=False)
            _refuse_root_owned(kind, name, kv.value, "delete")
            await ctx.store.txn([Compare(key, kv.mod_revision)], [Delete(key), event.put])
            cache.drop_object(kind, name)  # the controllers react (hub.state.feed)
            await cache.feed.settled()  # its rollout and revisions are gone when it answers
        ctx.writer.committed(event)
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
    async def DeviceLogs(
        self, request: admin_pb2.DeviceLogsRequest, context: Any
    ) -> admin_pb2.DeviceLogsResponse:
        """Ask the device over its Sync stream and relay its answer; nothing is stored."""
        device = self._device(request.device_name)
        if len(request.workload) > 253:
            raise _invalid("workload: at most 253 characters")
        if request.tail > MAX_LOG_TAIL:
            raise _invalid(f"tail: at most {MAX_LOG_TAIL}, got {request.tail}")
        session = self._ctx.sessions.get(device.name)
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

    @_rpc
    async def RevokeDevice(
        self, request: admin_pb2.RevokeDeviceRequest, context: Any
    ) -> admin_pb2.RevokeDeviceResponse:
        device = self._device(request.device_name)
        name = device.name
        serials = [s for s in (device.certificate_serial, device.previous_serial) if s]
        revoked = device.with_(revoked=True)
        ctx = self._ctx
        which = ", ".join(serials) or "none on record"
        event = ctx.writer.prepare_event(
            storekeys.KIND_DEVICE,
            name,
            "Warning",
            "Revoked",
            f"{name}: certificates revoked ({which})",
        )
        await ctx.store.txn(
            (),
            [
                *(Put(storekeys.revoked_key(s), name.encode()) for s in serials),
                Put(storekeys.device_key(name), storekeys.dumps(revoked.to_json())),
                event.put,
            ],
        )
        ctx.writer.committed(event)
        ctx.cache.revoked.update(dict.fromkeys(serials, name))
        ctx.cache.put_device(revoked)
        session = ctx.sessions.get(name)
        if session is not None:
            session.close("certificate revoked")
        ctx.projector.mark([name])
        return admin_pb2.RevokeDeviceResponse(serials=serials)

    @_rpc
    async def RevokeRegion(
        self, request: admin_pb2.RevokeRegionRequest, context: Any
    ) -> admin_pb2.RevokeRegionResponse:
        """A regional hub's federation certificates revoked (hub.api.regions.revoke_region)."""
        if not request.region:
            raise _invalid("region: required (an enrolled regional hub)")
        regions = self._ctx.regions
        if regions is None:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, "this hub has no regions")
        try:
            serials = await revoke_region(self._ctx, regions, request.region)
        except KeyError:
            raise Refused(
                grpc.StatusCode.NOT_FOUND,
                f"region {request.region} never enrolled at this hub (hub token create "
                "--for-region, hub init --parent)",
            ) from None
        return admin_pb2.RevokeRegionResponse(serials=serials)

    # -- rollouts -----------------------------------------------------------------------------
    def _rollout_of(self, name: str) -> RolloutState:
        if not name:
            raise _invalid("name: required (a ModelDeployment)")
        if name not in self._ctx.cache.deployments:
            raise _not_found("ModelDeployment", name)
        state = self._ctx.cache.rollouts.get(name)
        if state is None or self._ctx.rollouts is None:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"{name} has no revision yet")
        return state

    @_rpc
    async def ListRevisions(
        self, request: admin_pb2.ListRevisionsRequest, context: Any
    ) -> admin_pb2.ListRevisionsResponse:
        state = self._rollout_of(request.name)
        revisions = self._ctx.cache.revisions.get(request.name, {})
        return admin_pb2.ListRevisionsResponse(
            revisions=[storekeys.dumps(revisions[n].to_json()) for n in sorted(revisions)],
            rollout=storekeys.dumps(state.to_json()),
        )

    @_rpc
    async def RolloutAction(
        self, request: admin_pb2.RolloutActionRequest, context: Any
    ) -> admin_pb2.RolloutActionResponse:
        name = request.name
        state = self._rollout_of(name)
        controller = self._ctx.rollouts
        assert controller is not None
        action = request.action
        if action in (admin_pb2.RolloutActionRequest.PAUSE, admin_pb2.RolloutActionRequest.RESUME):
            verb = "pause" if action == admin_pb2.RolloutActionRequest.PAUSE else "resume"
            waves = self._ctx.waves
            if waves is not None and waves.in_progress(name):  # a rollout across regions
                moved = await waves.act(name, verb)
                if moved is None:
                    raise Refused(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"the rollout of {name} across regions is "
                        f"{waves.states[name].phase.value}: nothing to {verb}",
                    )
                return admin_pb2.RolloutActionResponse(message=f"{name}: {moved.message}")
            try:
                new = await controller.act(name, verb)
            except ActionRefused as exc:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from None
            return admin_pb2.RolloutActionResponse(message=f"{name}: {new.message}")
        if action != admin_pb2.RolloutActionRequest.UNDO:
            raise _invalid("action: must be PAUSE, RESUME or UNDO")
        return await self._undo(name, state, int(request.to_revision))

    async def _undo(
        self, name: str, state: RolloutState, to: int
    ) -> admin_pb2.RolloutActionResponse:
        cache = self._ctx.cache
        revisions = cache.revisions.get(name, {})
        if to == 0:
            to = state.stable if state.stable != state.revision else 0
            if to == 0:
                older = [n for n in revisions if n < state.revision]
                if not older:
                    raise Refused(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"{name} has no revision before {state.revision} to go back to",
                    )
                to = max(older)
        target = revisions.get(to)
        if target is None:
            kept = ", ".join(str(n) for n in sorted(revisions)) or "none"
            raise _invalid(f"to_revision: {name} has no revision {to} (kept: {kept})")
        stored = cache.stored[("ModelDeployment", name)]
        manifest = undo_manifest(stored.manifest, target)
        if template_hash(manifest) == template_hash(stored.manifest):
            return admin_pb2.RolloutActionResponse(
                message=f"{name} already asks for revision {to}'s template: nothing to undo"
            )
        floor = undo_refused(cache, self._ctx.tuf, name, state, to, self._ctx.clock())
        if floor is not None:  # the devices' anti-rollback floor (hub.decide.undo)
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, floor)
        key = storekeys.object_key("ModelDeployment", name)
        current = await self._ctx.store.get(key)  # keeps its creationTimestamp
        created = storekeys.created_of(current.value) if current is not None else None
        try:
            revision = await self._ctx.store.txn(
                [Compare(key, stored.revision)],
                [Put(key, storekeys.object_value(manifest, created))],
            )
        except CompareFailed:
            raise Refused(
                grpc.StatusCode.ABORTED, f"{name} changed meanwhile; try the undo again"
            ) from None
        number = max(cache.revisions.get(name, {}), default=0) + 1  # what the controller makes
        cache.put_object(manifest, revision)  # the rollout controller reacts (hub.state.feed)
        self._ctx.writer.event(
            "ModelDeployment",
            name,
            "Normal",
            "RolloutUndo",
            f"{name} set back to revision {to}'s template ({target.model[1]}) by an operator",
        )
        await cache.feed.settled()  # the new revision exists when it answers
        return admin_pb2.RolloutActionResponse(
            message=f"{name}: rolling back to revision {to} ({target.model[1]}) as revision "
            f"{number}"
        )

    # -- tokens and artifacts ----------------------------------------------------------------
    @_rpc
    async def CreateToken(
        self, request: admin_pb2.CreateTokenRequest, context: Any
    ) -> admin_pb2.CreateTokenResponse:
        ctx = self._ctx
        ttl = ctx.config.tokens.default_ttl_s
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
            own_region=ctx.region,
        )
        if problems:
            raise _invalid("; ".join(problems))
        what = (
            f"regional hub token for {request.for_region}"
            if request.for_region
            else "bootstrap token"
        )
        prepared: list[PreparedEvent] = []

        def event_for(token_id: str) -> Put:
            prepared[:] = [
                ctx.writer.prepare_event(
                    "Token", token_id, "Normal", "Created", f"{what} {token_id}"
                )
            ]
            return prepared[0].put

        token, record = await tokens.create_token(
            ctx.store,
            now=ctx.clock(),
            ttl=ttl,
            single_use=request.single_use or ctx.config.tokens.single_use,
            description=request.description,
            labels=dict(request.labels),
            device_labels=not request.no_device_labels,
            device_label_prefix=prefix,
            event_for=event_for,
            for_region=request.for_region,
        )
        ctx.writer.committed(prepared[0])
        response = admin_pb2.CreateTokenResponse(
            token=token, ca_hash=pki.ca_pin(ctx.ca.certificate), root_hash=root_pin(ctx.trust_root)
        )
        response.expires.FromMilliseconds(int(record.expires * 1000))
        return response

    @_rpc
    async def CreateDashboardToken(
        self, request: admin_pb2.CreateDashboardTokenRequest, context: Any
    ) -> admin_pb2.CreateDashboardTokenResponse:
        """A dashboard token bound to the caller's certificate (:mod:`hub.api.dashboard.access`)."""
        ctx = self._ctx
        if not ctx.dashboard.port:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this hub serves no dashboard: set dashboardListen in hub.toml",
            )
        ttl = dashboard_access.DEFAULT_TTL_S
        if request.HasField("ttl") and (request.ttl.seconds or request.ttl.nanos):
            ttl = request.ttl.seconds + request.ttl.nanos / 1e9
        caller = caller_of(context, ctx.region)
        try:
            token, expires = ctx.dashboard.issue(
                caller.name, caller.serial, now=ctx.clock(), ttl=ttl
            )
        except ValueError as exc:
            raise _invalid(str(exc)) from None
        log.info("dashboard token issued", admin=caller.name, expires=rfc3339(expires))
        response = admin_pb2.CreateDashboardTokenResponse(token=token, port=ctx.dashboard.port)
        response.expires.FromMilliseconds(int(expires * 1000))
        return response

    async def PushArtifact(
        self, request_iterator: AsyncIterator[admin_pb2.PushArtifactRequest], context: Any
    ) -> admin_pb2.PushArtifactResponse:
        await self.authorize(context)
        from hub.api.push import PushRefused, receive_artifact

        try:
            return await receive_artifact(self._ctx, request_iterator, now=self._ctx.clock())
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
                self._ctx, bytes(request.envelope), now=self._ctx.clock()
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
            self._ctx.tuf, request, context
        )
        return response


def _name_of(doc: Mapping[str, Any]) -> str:
    return str(doc.get("metadata", {}).get("name", ""))


async def _refuse_oversize(context: Any, kind: str, event: admin_pb2.WatchEvent) -> None:
    """End a watch, naming the object, rather than let gRPC fail it on a too-large message."""
    size = event.ByteSize()
    if size > paging.MAX_PAGE_BYTES:
        name = _name_of(storekeys.loads(event.object.json))
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
