"""What a root hub knows of its regional hubs (docs/federation.md): their records in the store
(``/regions/R``: the certificate serials, enrollment, revocation), what each last reported and
to which root replica it streams (:mod:`hub.state.sharedreports`).

* :class:`Regions`: shown by AdminService (a REGION column; deployments' status adds every
  region's figures, devices are listed with the region's summary of them) and judged by the
  wave controller (:mod:`hub.controllers.wave`). The replica a region streams to
  (:class:`hub.api.federation.FederationServicer`) writes its reports to the store; every
  replica loads them when it starts and follows them, and the region records (enrollments,
  revocations) of the other replicas, with a watch (:class:`RegionsFollower`), so each sees
  every region, with the age of its last report, whatever replica it streams to.
* **Revoking a region** (:func:`revoke_region`, AdminService ``RevokeRegion``, ``edgectl
  regions revoke R``): its certificate serials go to ``/revoked/`` with the record marked
  revoked and a ``Revoked`` event, in one transaction; its open stream ends with
  UNAUTHENTICATED, every later call with those certificates is refused
  (:func:`hub.api.auth.authorize`), and the root stops counting the region. Enrolling it again
  with a new token gives it a new certificate that works.
* :func:`region_object` (pure): a region as ``edgectl get regions`` shows it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edgefleet.api import API_VERSION
from edgefleet.logs import get_logger
from edgefleet.timestamps import rfc3339
from edgefleet.v1 import federation_pb2
from hub.decide import regionslice
from hub.decide.devices import DevicePhase
from hub.decide.presentation import KIND_REGION
from hub.initializing import HUB_NAME
from hub.state import regionmapping, sharedreports, storekeys
from hub.state.cache import Cache
from hub.state.sharedreports import Link, StoredDevices, StoredReport
from hub.state.store import Compare, EventType, KeyValue, Put, Store
from hub.state.store.electing import Elector
from hub.state.writer import DeviceWriter

log = get_logger(__name__)

REGIONS = "/regions/"


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
    stored_devices: StoredDevices | None = None  # its devices' rows in the store (ditto)
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
        for prefix in (sharedreports.REPORTS, sharedreports.DEVICES, sharedreports.LINKS):
            for kv in (await store.range(prefix)).kvs:
                out.take(kv.key, kv)
        return out

    def take(self, key: str, kv: KeyValue | None) -> None:
        """A record under ``/regions/``, ``/regionreports/``, ``/regiondevices/`` or
        ``/regionlinks/`` as the store has it now (None: deleted). A malformed report, rows or
        link is logged and left out."""
        if key.startswith(REGIONS):
            if kv is not None:
                self._take_record(storekeys.loads(kv.value))
            return
        for prefix in (sharedreports.REPORTS, sharedreports.DEVICES, sharedreports.LINKS):
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
            elif prefix == sharedreports.DEVICES:
                doc = storekeys.loads(kv.value) if kv is not None else None
                state.stored_devices = StoredDevices.from_json(doc) if doc is not None else None
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
                        figures = regionmapping.region_deployment_json(d)
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
            if report is None:
                continue
            rows = report.inventory.devices  # a report received here, or an older root's record
            if not rows and state.stored_devices is not None:
                rows = state.stored_devices.devices.devices  # written apart (sharedreports)
            out += [regionmapping.region_device_json(region, d) for d in rows]
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
            # the region's AgentUpgrades, as its last report says (docs/agent-updates.md)
            "agentUpgrades": {
                u.name: regionmapping.region_agent_upgrade_json(u)
                for u in (report.agent_upgrades if report is not None else ())
            },
            "agentReleases": list(report.agent_release_versions) if report is not None else [],
            "agentReleaseRefusals": dict(sorted(report.agent_release_refusals.items()))
            if report is not None
            else {},
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
    PREFIX = "/region"  # /regions/, /regionreports/, /regiondevices/, /regionlinks/

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


async def revoke_region(
    store: Store,
    cache: Cache,
    writer: DeviceWriter,
    regions: Regions,
    name: str,
    *,
    now: float,
) -> list[str]:
    """Revoke region ``name``'s federation certificates (module doc); the serials revoked.
    A region revoked already: its serials again, nothing written. Raises KeyError when no
    region of that name ever enrolled here."""
    key = region_key(name)
    kv = await store.get(key)
    if kv is None:
        raise KeyError(name)
    doc = storekeys.loads(kv.value)
    serials = [str(doc["certificateSerial"])]
    if doc.get("previousSerial"):
        serials.append(str(doc["previousSerial"]))
    if doc.get("revoked"):
        return serials
    event = writer.prepare_event(
        "Region",
        name,
        "Warning",
        "Revoked",
        f"region {name}: federation certificate revoked ({', '.join(serials)}); its stream is "
        "closed until it enrolls again with a new token",
    )
    revoked = {**doc, "revoked": True, "revokedAt": now}
    await store.txn(
        [Compare(key, kv.mod_revision)],
        [
            *(Put(storekeys.revoked_key(s), name.encode()) for s in serials),
            Put(key, storekeys.dumps(revoked)),
            event.put,
        ],
    )
    writer.committed(event)
    cache.revoked.update(dict.fromkeys(serials, name))
    state = regions.regions.pop(name, None)
    if state is not None:
        state.revoked = True
        if state.stream is not None:
            state.stream.set()  # its open stream ends (FederationServicer.Federate)
    log.info("region revoked", region=name, serials=serials)
    return serials


def replica_name(elector: Elector | None) -> str:
    """This replica, as the store's region links name it."""
    return elector.identity if elector is not None else HUB_NAME
