"""The root hub's side of federation (docs/federation.md): regional hubs enroll, stream in,
get their slice of the fleet, and report their status.

* **HubEnrollmentService** (enrollment port, server TLS): a bootstrap token made for a region
  (``hub token create --for-region R``; a device token cannot enroll a hub nor a region token
  a device), a CSR; the answer is a hub-role certificate
  ``spiffe://edgefleet/<root region>/hub/<region>`` from the root CA, the root CA and the
  fleet's trust roots. The region's record ``/regions/R`` (its certificate serial) is written
  with its ``Enrolled`` event in one transaction; enrolling a region again replaces the serial,
  so the older certificate is refused from then on.
* **Revoking a region** (:func:`revoke_region`, AdminService ``RevokeRegion``, ``edgectl
  regions revoke R``): its certificate serials go to ``/revoked/`` with the record marked
  revoked and a ``Revoked`` event, in one transaction; its open stream ends with
  UNAUTHENTICATED, every later call with those certificates is refused
  (:func:`hub.api.auth.authorize`),
  and the root stops counting the region. Enrolling it again with a new token gives it a new
  certificate that works.
* **FederationService** (mutual TLS, hub role, an enrolled region's current certificate):
  ``Federate``: a RegionHello naming the certificate's region, then the root sends the
  region's slice (:func:`hub.decide.regionslice.plan_slice`) at once and whenever its digest changes
  (looked at ``SLICE_GATHER_S`` after every device is marked, :meth:`Regions.changed`, as
  an apply, a push, a new revision or a wave state written do; and every ``SLICE_POLL_S``
  for the rest), with a
  generation that only grows (the root's store revision when the slice changed). The region
  acknowledges (SliceApplied) and reports (RegionReport, bounded by
  :func:`hub.decide.regionslice.check_report`, at most ``REPORT_RATE`` a second with a burst): a
  message
  over a bound ends the stream with INVALID_ARGUMENT or RESOURCE_EXHAUSTED and nothing of it
  is kept. A second stream of a region replaces the first.
  ``FetchFederatedArtifact``: a blob named by the caller's slice, from an offset.
  ``RenewFederationCertificate``: a new certificate for the caller's own region (the root's
  ``[certificates] regionLifetime``); the record keeps the certificate it was asked with as
  ``previousSerial`` (accepted until the region renews again: a reply lost on the way does not
  lock the region out) with a ``CertificateRenewed`` event, in one transaction.
* :class:`Regions`: what the root knows of its regions: shown by AdminService (a REGION
  column; deployments' status adds every region's figures, devices are listed with the
  region's summary of them) and judged by the wave controller. The replica a region streams
  to writes its reports to the store (:mod:`hub.state.sharedreports`); every replica loads them when
  it starts and follows them, and the region records (enrollments, revocations) of the other
  replicas, with a watch (:class:`RegionsFollower`), so each sees every region, with the age
  of its last report, whatever replica it streams to.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import grpc

from edgefleet.api import API_VERSION
from edgefleet.api.meta import dns_label
from edgefleet.artifacts.streaming import OffsetPastEnd, read_chunks
from edgefleet.errors import (
    ArtifactError,
    CompareFailed,
    CsrRejected,
    EdgefleetError,
    PkiError,
    TokenError,
)
from edgefleet.logs import get_logger
from edgefleet.timestamps import rfc3339
from edgefleet.v1 import federation_pb2, federation_pb2_grpc
from hub import pki
from hub.api.auth import Caller, authorize
from hub.api.enrollment import REFUSED, source_of
from hub.api.ratelimit import Rate, RateLimiter
from hub.context import HubContext
from hub.decide import regionslice
from hub.decide.devices import DevicePhase
from hub.decide.presentation import KIND_REGION
from hub.initializing import HUB_NAME
from hub.pki import Role
from hub.state import sharedreports, storekeys, tokens, tufrelay
from hub.state.sharedreports import Link, ReportPublisher, StoredReport
from hub.state.store import Compare, EventType, KeyValue, Put, Store

log = get_logger(__name__)

REGIONS = "/regions/"
HELLO_TIMEOUT_S = 30.0
SLICE_POLL_S = 0.5
SLICE_GATHER_S = 0.02  # after a change: the rest of an apply's changes come with it
REPORT_RATE = Rate(2.0, 20)  # reports per second per region, burst


def region_key(region: str) -> str:
    return f"{REGIONS}{region}"


@dataclass(slots=True)
class RegionState:
    """One region as the root knows it now."""

    name: str
    serial: str
    enrolled_at: float
    previous_serial: str = ""  # the certificate a renewal was asked with, still accepted
    not_after: float | None = None  # when the current certificate expires (None: not recorded)
    connected: bool = False
    connected_at: float | None = None
    last_message: float | None = None
    generation_sent: int = 0
    generation_applied: int = 0
    digest_sent: str = ""
    tuf_sent: str = ""  # the digest of the TUF metadata set last sent (hub.state.tufrelay)
    revoked: bool = False  # set with ``stream``: the stream ends as revoked
    report: federation_pb2.RegionReport | None = None  # the last one received here
    reported_at: float | None = None  # when ``report`` was received
    stored: StoredReport | None = None  # its last report in the store (whatever replica took it)
    link: Link | None = (
        None  # the replica it streams to, as the store says (hub.state.sharedreports)
    )
    artifacts: frozenset[str] = frozenset()  # blobs the region's slice names (may be fetched)
    stream: asyncio.Event | None = None  # set: this stream must end (another replaced it)
    stream_serial: str = ""  # the certificate the open stream came with

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "region": self.name,
            "certificateSerial": self.serial,
            "enrolledAt": self.enrolled_at,
        }
        if self.previous_serial:
            doc["previousSerial"] = self.previous_serial
        if self.not_after is not None:
            doc["certificateNotAfter"] = self.not_after
        return doc


@dataclass(frozen=True, slots=True)
class Seen:
    """What this replica knows of a region now: its last report (here or in the store),
    when it was received, and whether the region is connected (here, or to another replica
    that refreshed its link within ``hub.state.sharedreports.STALE_S``)."""

    report: federation_pb2.RegionReport | None
    reported_at: float | None
    connected: bool
    current: bool = False  # connected, and the report was received on this connection


@dataclass(slots=True)
class Regions:
    """The root's regions: their records (from the store) and what each last said."""

    regions: dict[str, RegionState] = field(default_factory=dict)
    # the open streams' wake-ups: set when what a slice is made of may have changed
    wakers: set[asyncio.Event] = field(default_factory=set)
    replicated: bool = False  # replicas on etcd: a region may stream to another replica
    clock: Callable[[], float] = time.time

    def changed(self) -> None:
        """What slices are made of may have changed: every stream looks again soon."""
        for waker in self.wakers:
            waker.set()

    @classmethod
    async def load(cls, store: Any, *, replicated: bool = False) -> Regions:
        """The regions' records, and their last reports and links (a restarted root shows
        the reports at once, with their age)."""
        out = cls(replicated=replicated)
        for kv in (await store.range(REGIONS)).kvs:
            out.take(kv.key, kv)
        for prefix in (sharedreports.REPORTS, sharedreports.LINKS):
            for kv in (await store.range(prefix)).kvs:
                out.take(kv.key, kv)
        return out

    def take(self, key: str, kv: KeyValue | None) -> None:
        """A record under ``/regions/``, ``/regionreports/`` or ``/regionlinks/`` as the store
        has it now (None: deleted). A malformed report or link is logged and left out."""
        if key.startswith(REGIONS):
            if kv is not None:
                self._take_record(storekeys.loads(kv.value))
            return
        for prefix in (sharedreports.REPORTS, sharedreports.LINKS):
            if key.startswith(prefix):
                name = key[len(prefix) :]
                break
        else:
            return
        state = self.regions.get(name)
        if state is None:
            return  # not enrolled (or revoked): not counted
        try:
            if prefix == sharedreports.REPORTS:
                doc = storekeys.loads(kv.value) if kv is not None else None
                state.stored = StoredReport.from_json(doc) if doc is not None else None
            else:
                doc = storekeys.loads(kv.value) if kv is not None else None
                state.link = Link.from_json(doc) if doc is not None else None
        except ValueError as exc:
            log.warning("region record refused", region=name, key=key, error=str(exc))

    def _take_record(self, doc: Mapping[str, Any]) -> None:
        name = str(doc["region"])
        if doc.get("revoked"):  # a revoked region is not counted until it enrolls again
            state = self.regions.pop(name, None)
            if state is not None:
                state.revoked = True
                if state.stream is not None:
                    state.stream.set()  # its stream here ends (FederationServicer.Federate)
            return
        serial, previous = str(doc["certificateSerial"]), str(doc.get("previousSerial", ""))
        not_after = doc.get("certificateNotAfter")  # absent in records of older roots
        expires = float(not_after) if not_after is not None else None
        state = self.regions.get(name)
        if state is None:
            self.regions[name] = RegionState(
                name, serial, float(doc["enrolledAt"]), previous, expires
            )
        elif (state.serial, state.previous_serial) != (serial, previous):
            state.serial, state.previous_serial, state.not_after = serial, previous, expires
            if state.stream is not None and state.stream_serial not in (serial, previous):
                state.stream.set()  # enrolled again at another replica: its certificate is old

    def seen(self, state: RegionState) -> Seen:
        """What this replica knows of ``state``'s region now (see :class:`Seen`)."""
        here = state.connected
        link = state.link
        elsewhere = self.replicated and sharedreports.link_alive(link, self.clock())
        report, at = state.report, state.reported_at
        stored = state.stored
        newer = stored is not None and (at is None or stored.reported_at > at)
        if stored is not None and newer and not (here and report is not None):
            report, at = stored.report, stored.reported_at
        since: float | None = None
        if here:
            since = state.connected_at
        elif elsewhere and link is not None:
            since = link.connected_at
        current = since is not None and at is not None and at >= since
        return Seen(report, at, here or elsewhere, current)

    def deployment_status(self, name: str, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Each region the deployment goes to -> its figures (None: not reported yet)."""
        shown: dict[str, dict[str, Any] | None] = {}
        for region, state in sorted(self.regions.items()):
            if not regionslice.goes_to(manifest, region):
                continue
            figures: dict[str, Any] | None = None
            seen = self.seen(state)
            if seen.report is not None:
                for d in seen.report.deployments:
                    if d.name == name:
                        figures = regionslice.region_deployment_json(d)
                        break
            if figures is not None:
                figures["connected"] = seen.connected
                figures.update(_age(seen, self.clock()))
            shown[region] = figures
        return shown

    def with_regions(self, doc: dict[str, Any]) -> dict[str, Any]:
        """A deployment as the root shows it: its status with every region's added."""
        name = str(doc["metadata"]["name"])
        doc = dict(doc)
        doc["status"] = regionslice.add_regions(
            doc.get("status", {}), self.deployment_status(name, doc)
        )
        return doc

    def devices(self) -> list[dict[str, Any]]:
        """Every region's devices, as their regions last summarised them."""
        out: list[dict[str, Any]] = []
        for region, state in sorted(self.regions.items()):
            report = self.seen(state).report
            if report is not None:
                out += [regionslice.region_device_json(region, d) for d in report.inventory.devices]
        return out

    def objects(self, here: str) -> list[dict[str, Any]]:
        """Every region as ``edgectl get regions`` shows it (:func:`region_object`), by name."""
        now = self.clock()
        return [
            region_object(state, self.seen(state), now=now, here=here)
            for _, state in sorted(self.regions.items())
        ]

    def object(self, name: str, here: str) -> dict[str, Any] | None:
        """Region ``name`` as ``edgectl get region NAME`` shows it; None: not enrolled here
        (or revoked)."""
        state = self.regions.get(name)
        if state is None:
            return None
        return region_object(state, self.seen(state), now=self.clock(), here=here)

    def summary(self) -> list[dict[str, Any]]:
        """One line per region: connected, generations, devices by phase, its report's age."""
        out = []
        now = self.clock()
        for region, state in sorted(self.regions.items()):
            seen = self.seen(state)
            inv = seen.report.inventory if seen.report is not None else None
            out.append(
                {
                    "region": region,
                    "connected": seen.connected,
                    "streamsHere": state.connected,
                    **_age(seen, now),
                    **({"replica": state.link.replica} if state.link is not None else {}),
                    "generationSent": state.generation_sent,
                    "generationApplied": state.generation_applied,
                    "devices": inv.total if inv is not None else None,
                    "devicesByPhase": dict(inv.by_phase) if inv is not None else {},
                }
            )
        return out


def region_object(state: RegionState, seen: Seen, *, now: float, here: str) -> dict[str, Any]:
    """A region as ``edgectl get regions`` shows it (pure): its connection (to which root
    replica, since when, last seen), its last report's age, its devices and deployments in
    summary (counts only: the object stays small whatever the region's size), the slice
    generation it acknowledged and its federation certificate. ``here`` is this replica's
    name in the region links (a region streaming here is connected here, whatever the store's
    link says)."""
    link = state.link
    if state.connected:
        replica: str | None = here
        connected_at, last_seen = state.connected_at, state.last_message
    elif link is not None:
        replica, connected_at, last_seen = link.replica, link.connected_at, link.seen_at
    else:
        replica = connected_at = last_seen = None
    report = seen.report
    devices: dict[str, Any] | None = None
    applied = report.generation if report is not None else None
    if report is not None:
        inv = report.inventory
        devices = {
            "total": inv.total,
            "ready": inv.by_phase.get(DevicePhase.READY.value, 0),
            "byPhase": dict(sorted(inv.by_phase.items())),
        }
    if state.connected and state.generation_applied:  # its SliceApplied: newer than a report
        applied = max(applied or 0, state.generation_applied)
    age = _age(seen, now)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND_REGION,
        "metadata": {"name": state.name, "creationTimestamp": rfc3339(state.enrolled_at)},
        "status": {
            "connected": seen.connected,
            "replica": replica,
            "streamsHere": state.connected,
            "connectedAt": rfc3339(connected_at),
            "lastSeenAt": rfc3339(last_seen),
            "reportedAt": rfc3339(seen.reported_at),
            "reportAgeSeconds": age.get("reportAgeSeconds"),
            "devices": devices,
            "deployments": len(report.deployments) if report is not None else None,
            "generationApplied": applied,
            "generationSent": state.generation_sent if state.connected else None,
            "certificate": {
                "serial": state.serial,
                "previousSerial": state.previous_serial or None,
                "notAfter": rfc3339(state.not_after),
            },
        },
    }


def _age(seen: Seen, now: float) -> dict[str, Any]:
    """``reportedAt`` and ``reportAgeSeconds`` of a region's last report (none: nothing)."""
    if seen.reported_at is None:
        return {}
    return {
        "reportedAt": rfc3339(seen.reported_at),  # every time field shown: RFC 3339
        "reportAgeSeconds": round(max(0.0, now - seen.reported_at), 1),
    }


class RegionsFollower:
    """The ``regions-follower`` component (every root replica): the store's region records,
    reports and links reach :class:`Regions` through a watch (:meth:`Regions.take`), whatever
    replica wrote them. A failed watch (compacted, store gone) raises: the supervisor restarts
    it, and it lists everything again."""

    name = "regions-follower"
    PREFIX = "/region"  # /regions/, /regionreports/, /regionlinks/

    def __init__(self, store: Store, regions: Regions) -> None:
        self.store = store
        self.regions = regions

    async def run(self, stop: asyncio.Event) -> None:
        follow = asyncio.ensure_future(self._follow())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait([follow, stopped], return_when=asyncio.FIRST_COMPLETED)
            if follow.done():
                follow.result()
        finally:
            for task in (follow, stopped):
                task.cancel()
            await asyncio.gather(follow, stopped, return_exceptions=True)

    async def _follow(self) -> None:
        listed = await self.store.range(self.PREFIX)
        for kv in sorted(listed.kvs, key=lambda kv: not kv.key.startswith(REGIONS)):
            self.regions.take(kv.key, kv)
        async for event in self.store.watch(self.PREFIX, listed.revision + 1):
            self.regions.take(event.kv.key, None if event.type is EventType.DELETE else event.kv)


async def revoke_region(ctx: HubContext, regions: Regions, name: str) -> list[str]:
    """Revoke region ``name``'s federation certificates (module doc); the serials revoked.
    A region revoked already: its serials again, nothing written. Raises KeyError when no
    region of that name ever enrolled here."""
    key = region_key(name)
    kv = await ctx.store.get(key)
    if kv is None:
        raise KeyError(name)
    doc = storekeys.loads(kv.value)
    serials = [str(doc["certificateSerial"])]
    if doc.get("previousSerial"):
        serials.append(str(doc["previousSerial"]))
    if doc.get("revoked"):
        return serials
    event = ctx.writer.prepare_event(
        "Region",
        name,
        "Warning",
        "Revoked",
        f"region {name}: federation certificate revoked ({', '.join(serials)}); its stream is "
        "closed until it enrolls again with a new token",
    )
    revoked = {**doc, "revoked": True, "revokedAt": ctx.clock()}
    await ctx.store.txn(
        [Compare(key, kv.mod_revision)],
        [
            *(Put(storekeys.revoked_key(s), name.encode()) for s in serials),
            Put(key, storekeys.dumps(revoked)),
            event.put,
        ],
    )
    ctx.writer.committed(event)
    ctx.cache.revoked.update(dict.fromkeys(serials, name))
    state = regions.regions.pop(name, None)
    if state is not None:
        state.revoked = True
        if state.stream is not None:
            state.stream.set()  # its open stream ends (FederationServicer.Federate)
    log.info("region revoked", region=name, serials=serials)
    return serials


def replica_name(ctx: HubContext) -> str:
    """This replica, as the store's region links name it."""
    elector = ctx.elector
    return elector.identity if elector is not None else HUB_NAME


def region_lifetime(ctx: HubContext) -> timedelta:
    return timedelta(seconds=ctx.config.certificates.region_lifetime_s)


class HubEnrollmentServicer(federation_pb2_grpc.HubEnrollmentServiceServicer):
    """A regional hub joins the root (module doc)."""

    def __init__(self, ctx: HubContext, regions: Regions) -> None:
        self.ctx = ctx
        self.regions = regions
        limits = ctx.config.enrollment
        self.per_source = RateLimiter(Rate(limits.per_source_rate, limits.per_source_burst))

    async def EnrollHub(
        self, request: federation_pb2.EnrollHubRequest, context: grpc.aio.ServicerContext
    ) -> federation_pb2.EnrollHubResponse:
        ctx = self.ctx
        now = ctx.clock()
        source = source_of(context.peer() or "")
        if not self.per_source.allow(source, now):
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, "too many enrollments; retry later"
            )
        problems: list[str] = []
        try:
            dns_label(request.region)
        except ValueError as exc:
            problems.append(f"region: {exc}")
        if request.region in (ctx.region, HUB_NAME):
            problems.append(f"region: {request.region!r} is this hub's own region or name")
        if len(request.csr_pem) > 16 * 1024:
            problems.append("csr_pem: at most 16 KiB")
        try:
            token_id = tokens.token_id_of(request.token)
        except TokenError as exc:
            problems.append(f"token: {exc}")
        if problems:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems))
        try:
            record = await tokens.validate(ctx.store, request.token, now=now)
        except TokenError as exc:
            log.warning(
                "hub enrollment refused", reason=exc.reason.value, token=token_id, source=source
            )
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSED)
            raise AssertionError("unreachable") from None
        if record.for_region != request.region:
            log.warning(
                "hub enrollment refused",
                reason="WrongPurpose",
                token=token_id,
                region=request.region,
            )
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSED)
        identity = pki.Identity(Role.HUB, request.region, ctx.region)
        try:
            certificate = pki.sign_child_hub_csr(
                ctx.ca, request.csr_pem, identity, lifetime=region_lifetime(ctx)
            )
        except (CsrRejected, PkiError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"csr_pem: {exc}")
            raise AssertionError("unreachable") from None
        try:
            await tokens.consume(ctx.store, request.token, now=now)
        except TokenError:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSED)
        state = RegionState(
            request.region,
            format(certificate.serial_number, "x"),
            now,
            not_after=certificate.not_valid_after_utc.timestamp(),
        )
        event = ctx.writer.prepare_event(
            "Region",
            request.region,
            "Normal",
            "Enrolled",
            f"regional hub enrolled with token {record.id}",
        )
        key = region_key(request.region)
        existing = await ctx.store.get(key)
        try:
            await ctx.store.txn(
                [Compare(key, existing.mod_revision if existing else 0)],
                [Put(key, storekeys.dumps(state.to_json())), event.put],
            )
        except CompareFailed:
            await context.abort(
                grpc.StatusCode.ABORTED, f"region {request.region} enrolled meanwhile"
            )
        old = self.regions.regions.get(request.region)
        if old is not None:
            state.stored, state.link = old.stored, old.link  # its last report stays shown
            if old.stream is not None:
                old.stream.set()  # its certificate is superseded
        self.regions.regions[request.region] = state
        ctx.writer.committed(event)
        log.info("region enrolled", region=request.region, token=record.id, source=source)
        return federation_pb2.EnrollHubResponse(
            certificate_chain_pem=pki.certificate_pem(certificate),
            ca_certificate_pem=pki.certificate_pem(ctx.ca.certificate),
            trust_roots=list(ctx.cache.trust_roots),
            root_region=ctx.region,
            hub_addresses=list(ctx.config.replica_addresses),
        )


class FederationServicer(federation_pb2_grpc.FederationServiceServicer):
    """The root's end of the regions' streams (module doc)."""

    def __init__(self, ctx: HubContext, regions: Regions) -> None:
        self.ctx = ctx
        self.regions = regions
        self.reports = RateLimiter(REPORT_RATE)
        self._closing: set[asyncio.Task[None]] = set()  # publishers' last writes (see Federate)
        self._generations: dict[str, tuple[str, int]] = {}  # region -> (slice digest, generation)

    async def _caller(self, context: grpc.aio.ServicerContext) -> tuple[Caller, RegionState]:
        caller = await authorize(
            context, region=self.ctx.region, revoked=self.ctx.cache.revoked, roles={Role.HUB}
        )
        state = self.regions.regions.get(caller.name)
        if state is None:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED, f"region {caller.name} is not enrolled here"
            )
            raise AssertionError("unreachable")
        if caller.serial not in (state.serial, state.previous_serial):
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"certificate {caller.serial} of region {caller.name} was superseded by a later "
                "enrollment",
            )
        return caller, state

    def _slice(self, region: str) -> regionslice.Slice:
        cache = self.ctx.cache
        revision_models = {
            name: [r.model for r in revisions.values()]
            for name, revisions in cache.revisions.items()
        }
        waves = self.ctx.waves  # a deployment in waves: the stable revision until released
        return regionslice.plan_slice(
            region,
            [
                waves.manifest_for(region, o.manifest) if waves is not None else o.manifest
                for o in cache.stored.values()
            ],
            cache.models,
            revision_models,
            cache.trust_roots,
        )

    async def Federate(
        self,
        request_iterator: AsyncIterator[federation_pb2.RegionMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[federation_pb2.RootMessage]:
        it = request_iterator.__aiter__()
        # The first message is read before the caller is checked, as Sync does: a refusal sent
        # while the region is still writing its hello reaches it as gRPC's INTERNAL (its
        # client turns the failed write into that), not as the refusal it should log. The
        # caller passed mutual TLS; the read is bounded in size (the server's message limit)
        # and time.
        try:
            first: federation_pb2.RegionMessage | None = await asyncio.wait_for(
                it.__anext__(), HELLO_TIMEOUT_S
            )
        except (TimeoutError, StopAsyncIteration):
            first = None
        caller, state = await self._caller(context)
        if first is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the stream must open with hello")
            return
        if first.WhichOneof("kind") != "hello":
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the first message must be hello, got {first.WhichOneof('kind')}",
            )
        if first.hello.region != caller.name:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"region {caller.name} may not speak for region {first.hello.region!r}",
            )
        if state.stream is not None:
            state.stream.set()  # a second stream replaces the first
        replaced = asyncio.Event()
        state.stream, state.stream_serial = replaced, caller.serial
        now = self.ctx.clock()
        state.connected, state.connected_at, state.last_message = True, now, now
        state.generation_applied = first.hello.generation
        state.digest_sent = ""  # the whole slice again on every connection
        state.tuf_sent = ""
        self.ctx.writer.event(
            "Region", caller.name, "Normal", "Connected", "the regional hub connected"
        )
        log.info("region connected", region=caller.name, generation=first.hello.generation)
        # the region's reports and link go to the store, for every replica (hub.state.sharedreports)
        publisher = ReportPublisher(self.ctx.store, caller.name, self._replica())
        await self._publish(publisher.open(now), caller.name)
        failure: list[tuple[grpc.StatusCode, str]] = []
        reader = asyncio.ensure_future(self._read(state, it, failure, publisher))
        waiter = asyncio.ensure_future(replaced.wait())
        woken = asyncio.Event()
        self.regions.wakers.add(woken)
        try:
            while not reader.done() and not replaced.is_set():
                try:
                    await self._publish(publisher.publish(self.ctx.clock()), caller.name)
                except sharedreports.Replaced:
                    log.info("region stream replaced on another replica", region=caller.name)
                    await context.abort(
                        grpc.StatusCode.ABORTED,
                        "replaced by a newer stream of this region (on another hub replica)",
                    )
                # TUF metadata first: a device the slice reaches finds its targets listed
                tuf = self._tuf_message(caller.name, state)
                if tuf is not None:
                    yield federation_pb2.RootMessage(tuf=tuf)
                s = self._slice(caller.name)
                if s.digest != state.digest_sent:
                    generation = await self._generation(caller.name, s.digest)
                    message = regionslice.slice_message(s, generation)
                    size = message.ByteSize()
                    if (
                        size > regionslice.MAX_SLICE_BYTES
                        or len(s.objects) > regionslice.MAX_SLICE_OBJECTS
                    ):
                        log.error("region slice too large", region=caller.name, bytes=size)
                        self.ctx.writer.event(
                            "Region",
                            caller.name,
                            "Warning",
                            "SliceTooLarge",
                            f"the region's slice is {size} bytes and {len(s.objects)} objects "
                            f"(at most {regionslice.MAX_SLICE_BYTES} and "
                            f"{regionslice.MAX_SLICE_OBJECTS}): "
                            "not sent; the region keeps its last slice",
                        )
                    else:
                        state.artifacts = frozenset(d for m in s.models for d in m.digests())
                        yield federation_pb2.RootMessage(slice=message)
                        log.info(
                            "region slice sent",
                            region=caller.name,
                            generation=generation,
                            objects=len(s.objects),
                        )
                    state.digest_sent = s.digest
                    state.generation_sent = generation
                waking = asyncio.ensure_future(woken.wait())
                try:
                    await asyncio.wait(
                        [reader, waiter, waking],
                        timeout=SLICE_POLL_S,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    waking.cancel()
                if woken.is_set():
                    await asyncio.sleep(SLICE_GATHER_S)
                    woken.clear()
            if failure:
                await context.abort(*failure[0])
            if state.revoked:
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED,
                    f"certificate {caller.serial} of region {caller.name} has been revoked: "
                    "enroll the region again with a new token (hub token create --for-region)",
                )
            if replaced.is_set():
                await context.abort(
                    grpc.StatusCode.ABORTED, "replaced by a newer stream of this region"
                )
        finally:
            self.regions.wakers.discard(woken)
            reader.cancel()
            waiter.cancel()
            # not awaited here: the generator may be closing for a cancellation
            closing = asyncio.ensure_future(
                self._publish(publisher.close(self.ctx.clock()), caller.name)
            )
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
            if state.stream is replaced:
                state.connected = False
                state.stream = None
                self.ctx.writer.event(
                    "Region",
                    caller.name,
                    "Warning",
                    "Disconnected",
                    "the regional hub's stream ended",
                )
                log.info("region disconnected", region=caller.name)

    def _replica(self) -> str:
        return replica_name(self.ctx)

    @staticmethod
    async def _publish(write: Any, region: str) -> None:
        """Run a publisher's store write; a store that fails is logged (the next pass writes
        again; meanwhile the other replicas see the region's last stored report, then, past
        ``sharedreports.STALE_S``, the region as disconnected)."""
        try:
            await write
        except sharedreports.Replaced:
            raise
        except EdgefleetError as exc:
            log.warning("region report not stored", region=region, error=str(exc))

    def _tuf_message(self, region: str, state: RegionState) -> federation_pb2.TufMetadataSet | None:
        """This hub's TUF metadata when the region has not been sent it as it is now (a push,
        a new root or targets, a timestamp signed again); None otherwise."""
        tuf = self.ctx.tuf
        if tuf is None:
            return None
        files, digest = tuf.files()
        if digest == state.tuf_sent:
            return None
        state.tuf_sent = digest
        message = tufrelay.set_message(files, digest)
        size = message.ByteSize()
        if size > tufrelay.MAX_SET_BYTES:
            log.error("region tuf metadata too large", region=region, bytes=size)
            self.ctx.writer.event(
                "Region",
                region,
                "Warning",
                "TufMetadataTooLarge",
                f"the TUF metadata is {size} bytes (at most {tufrelay.MAX_SET_BYTES}): not "
                "sent; the region keeps serving the last it received",
            )
            return None
        log.info("region tuf metadata sent", region=region, files=len(files), bytes=size)
        return message

    async def _generation(self, region: str, digest: str) -> int:
        """The generation of a slice: the same for the same content, else the store's
        revision now (it only grows, across root restarts too)."""
        known = self._generations.get(region)
        if known is not None and known[0] == digest:
            return known[1]
        revision = (await self.ctx.store.range(REGIONS)).revision
        generation = max(revision, known[1] + 1 if known else 1)
        self._generations[region] = (digest, generation)
        return generation

    async def _read(
        self,
        state: RegionState,
        it: AsyncIterator[federation_pb2.RegionMessage],
        failure: list[tuple[grpc.StatusCode, str]],
        publisher: ReportPublisher,
    ) -> None:
        async for message in it:
            now = self.ctx.clock()
            state.last_message = now
            kind = message.WhichOneof("kind")
            if kind == "applied":
                if message.applied.generation > state.generation_sent:
                    failure.append(
                        (
                            grpc.StatusCode.INVALID_ARGUMENT,
                            f"applied.generation: {message.applied.generation} was never sent",
                        )
                    )
                    return
                state.generation_applied = message.applied.generation
            elif kind == "report":
                if not self.reports.allow(state.name, time.monotonic()):
                    failure.append(
                        (
                            grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"reports faster than {REPORT_RATE.per_second:g}/s",
                        )
                    )
                    return
                problems = regionslice.check_report(message.report)
                if problems:
                    log.warning("region input refused", region=state.name, problems=problems[:5])
                    failure.append((grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems[:20])))
                    return
                state.report, state.reported_at = message.report, now
                publisher.received(message.report, now)
            else:
                failure.append(
                    (grpc.StatusCode.INVALID_ARGUMENT, f"unexpected {kind} on an open stream")
                )
                return

    async def RenewFederationCertificate(
        self,
        request: federation_pb2.RenewFederationCertificateRequest,
        context: grpc.aio.ServicerContext,
    ) -> federation_pb2.RenewFederationCertificateResponse:
        caller, state = await self._caller(context)  # enrolled, not revoked, current
        ctx = self.ctx
        if len(request.csr_pem) > 16 * 1024:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "csr_pem: at most 16 KiB")
        identity = pki.Identity(Role.HUB, caller.name, ctx.region)  # the caller's own, only
        try:
            certificate = pki.sign_child_hub_csr(
                ctx.ca, request.csr_pem, identity, lifetime=region_lifetime(ctx)
            )
        except (CsrRejected, PkiError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"csr_pem: {exc}")
            raise AssertionError("unreachable") from None
        serial = format(certificate.serial_number, "x")
        not_after = certificate.not_valid_after_utc.timestamp()
        renewed = RegionState(caller.name, serial, state.enrolled_at, caller.serial, not_after)
        key = region_key(caller.name)
        kv = await ctx.store.get(key)
        current = storekeys.loads(kv.value) if kv is not None else {}
        if kv is None or current.get("revoked") or current.get("certificateSerial") != state.serial:
            await context.abort(
                grpc.StatusCode.ABORTED,
                f"region {caller.name} was enrolled again or revoked meanwhile",
            )
            raise AssertionError("unreachable")
        event = ctx.writer.prepare_event(
            "Region",
            caller.name,
            "Normal",
            "CertificateRenewed",
            f"federation certificate {serial} issued; {caller.serial} is accepted until the "
            "region renews again",
        )
        try:
            await ctx.store.txn(
                [Compare(key, kv.mod_revision)],
                [Put(key, storekeys.dumps(renewed.to_json())), event.put],
            )
        except CompareFailed:
            await context.abort(
                grpc.StatusCode.ABORTED, f"region {caller.name} changed meanwhile; ask again"
            )
        ctx.writer.committed(event)
        if self.regions.regions.get(caller.name) is state and not state.revoked:
            state.serial, state.previous_serial = serial, caller.serial
            state.not_after = not_after
        log.info("region certificate renewed", region=caller.name, serial=serial)
        return federation_pb2.RenewFederationCertificateResponse(
            certificate_chain_pem=pki.certificate_pem(certificate)
        )

    async def FetchFederatedArtifact(
        self,
        request: federation_pb2.FetchFederatedArtifactRequest,
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[federation_pb2.FederatedChunk]:
        caller, state = await self._caller(context)
        if request.sha256 not in state.artifacts:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"artifact {request.sha256[:16]} is not in region {caller.name}'s slice",
            )
        shared = self.ctx.shared_blobs
        if shared is not None and not self.ctx.blobs.has(request.sha256):
            try:  # replicas: pushed through another one; its bytes are in the store
                await shared.ensure_local(request.sha256)
            except ArtifactError as exc:
                log.error("shared artifact refused", sha256=request.sha256, error=str(exc))
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"artifact copy failed: {exc}")
        path = self.ctx.blobs.path_for(request.sha256)
        try:
            async for offset, data in read_chunks(path, request.offset):
                yield federation_pb2.FederatedChunk(offset=offset, data=data)
        except FileNotFoundError:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"artifact {request.sha256} is not stored"
            )
        except OffsetPastEnd as exc:
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"offset {request.offset} is past the end ({exc.size} bytes)",
            )
