"""Regions' reports shared through the store, so that every root replica sees every region.

A regional hub streams to one root replica (:class:`hub.api.federation.FederationServicer`); with
hub replicas on etcd (docs/etcd.md) the leader's wave controller, and the admin reads of every
other replica, must still see what that region last reported. The replica a region streams to
writes (:class:`ReportPublisher`, one per stream, through the store itself, not the leader's
fenced store: any replica writes it, as any replica writes the records of its devices)::

    /regionreports/REGION   {"region", "replica", "reportedAt", "report": base64 of the
                            RegionReport as received (bounded by
                            hub.state.regionmapping.check_report)}
    /regionlinks/REGION     {"region", "replica", "connected", "connectedAt", "seenAt"}

* the report when it changed, at most once every :data:`WRITE_INTERVAL_S` (reports arrive at
  most ~1 a second; a newer one replaces one not written yet), with the link in the same
  transaction; a report that differs from the last one written only in its devices'
  ``last_heartbeat`` (:func:`material_digest`) at most once every :data:`HEARTBEATS_S`: with
  a thousand devices some heartbeat changes in every report, and each write of a ~70 KB
  report stays in the store's history (value and previous value) for its retention: a root
  over a 1,351-device region wrote one every ~5 s and filled a 64 MiB disk with 60 MB of
  history in 35 minutes (the soak harness's 1-hour run, seed 62). The other replicas show
  those heartbeats up to that much older; the replica the region streams to shows them as
  they come;
* the link alone when the stream opens, every :data:`REFRESH_S` while it is open (``seenAt``:
  the replica vouches for the stream then), and with ``connected: false`` when it ends;
* every write after the first is conditional on the link's mod revision this stream last
  wrote: when another stream of the region (on another replica) wrote it meanwhile, this
  stream was replaced and writes nothing more (the stream ends, as a second stream of a
  region on one replica replaces the first).

Every replica (the leader included) follows both prefixes with a watch
(:meth:`hub.state.regions.Regions.follow_store`) and loads them when it starts, so a restarted root
shows the last reports at once, each with its age (``reportedAt``). A region is connected
when the replica it streams to is this one, or when its link says so and was refreshed within
:data:`STALE_S` (:func:`link_alive`: a replica that died stops refreshing, and its regions
then show as disconnected, and a wave waits for them as unreachable, never judged as fresh).

The decisions here (:func:`due`, :func:`link_alive`) are pure; the publisher does the I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from edgefleet.errors import CompareFailed, EdgefleetError
from edgefleet.logs import get_logger
from edgefleet.v1 import federation_pb2
from hub.state import storekeys
from hub.state.store import Compare, Put, Store

log = get_logger(__name__)

REPORTS = "/regionreports/"
LINKS = "/regionlinks/"
WRITE_INTERVAL_S = 1.0  # at most one report write a second per region (coalesced)
REFRESH_S = 10.0  # the link of an open stream is written again at least this often
STALE_S = 30.0  # a link not refreshed for this long: the region is not connected (anywhere)
HEARTBEATS_S = 30.0  # a report whose only change is its devices' heartbeats: at most this often


def report_key(region: str) -> str:
    return f"{REPORTS}{region}"


def link_key(region: str) -> str:
    return f"{LINKS}{region}"


@dataclass(frozen=True, slots=True)
class StoredReport:
    """A region's last report, as the replica it streamed to stored it."""

    region: str
    replica: str
    reported_at: float  # when that replica received it (its clock)
    report: federation_pb2.RegionReport

    def to_json(self) -> dict[str, Any]:
        return {
            "region": self.region,
            "replica": self.replica,
            "reportedAt": self.reported_at,
            "report": base64.b64encode(self.report.SerializeToString()).decode(),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> StoredReport:
        """Raises ValueError naming what is malformed."""
        try:
            raw = base64.b64decode(str(doc["report"]), validate=True)
            report = federation_pb2.RegionReport.FromString(raw)
            return cls(str(doc["region"]), str(doc["replica"]), float(doc["reportedAt"]), report)
        except (KeyError, TypeError, binascii.Error) as exc:
            raise ValueError(f"malformed region report record: {exc!r}") from exc
        except Exception as exc:  # protobuf's DecodeError
            raise ValueError(f"malformed region report record: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Link:
    """Which replica a region streams to, and when that replica last vouched for it."""

    region: str
    replica: str
    connected: bool
    connected_at: float
    seen_at: float

    def to_json(self) -> dict[str, Any]:
        return {
            "region": self.region,
            "replica": self.replica,
            "connected": self.connected,
            "connectedAt": self.connected_at,
            "seenAt": self.seen_at,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Link:
        try:
            return cls(
                str(doc["region"]),
                str(doc["replica"]),
                bool(doc["connected"]),
                float(doc["connectedAt"]),
                float(doc["seenAt"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed region link record: {exc!r}") from exc


def link_alive(link: Link | None, now: float, stale_s: float = STALE_S) -> bool:
    """Whether ``link`` says its region is connected to a replica now (pure): it says
    connected and was refreshed within ``stale_s`` (a clock behind by a little is allowed)."""
    return link is not None and link.connected and -stale_s <= now - link.seen_at <= stale_s


def material_digest(report: federation_pb2.RegionReport) -> bytes:
    """A digest of ``report`` that leaves out its devices' ``last_heartbeat`` (pure): two
    reports with the same digest differ in nothing but when their devices were last heard."""
    if not any(d.last_heartbeat for d in report.inventory.devices):
        return hashlib.sha256(report.SerializeToString(deterministic=True)).digest()
    copy = federation_pb2.RegionReport()
    copy.CopyFrom(report)
    for device in copy.inventory.devices:
        device.ClearField("last_heartbeat")
    return hashlib.sha256(copy.SerializeToString(deterministic=True)).digest()


class Write(Enum):
    NOTHING = "nothing"
    LINK = "link"  # the link alone (a refresh)
    REPORT = "report"  # the report, with the link


def due(
    *,
    report_pending: bool,
    last_report_write: float | None,
    last_link_write: float,
    now: float,
    material: bool = True,
    interval_s: float = WRITE_INTERVAL_S,
    refresh_s: float = REFRESH_S,
    heartbeats_s: float = HEARTBEATS_S,
) -> Write:
    """What an open stream's publisher writes now (pure): a report received and not written
    yet, once ``interval_s`` passed since the last report write, or ``heartbeats_s`` when it
    is not ``material`` (it differs from the last one written in heartbeats only); else the
    link, once ``refresh_s`` passed since it was last written."""
    if report_pending:
        if last_report_write is None:
            return Write.REPORT
        since = now - last_report_write
        if since >= (interval_s if material else heartbeats_s) or since < 0:
            return Write.REPORT
    if now - last_link_write >= refresh_s:
        return Write.LINK
    return Write.NOTHING


class Replaced(EdgefleetError):
    """Another stream of the region (on another replica) wrote its link meanwhile."""


class ReportPublisher:
    """Writes one stream's region report and link to the store (see the module doc)."""

    def __init__(self, store: Store, region: str, replica: str) -> None:
        self.store = store
        self.region = region
        self.replica = replica
        self._link_mod = 0
        self._opened = False
        self._connected_at = 0.0
        self._last_link = 0.0
        self._last_report: float | None = None
        self._pending: tuple[float, federation_pb2.RegionReport] | None = None
        self._pending_digest = b""
        self._written_digest = b""  # material_digest of the last report written
        self.writes = 0
        """Report writes made (tests, figures)."""

    def _link(self, now: float, connected: bool = True) -> Put:
        link = Link(self.region, self.replica, connected, self._connected_at, now)
        return Put(link_key(self.region), storekeys.dumps(link.to_json()))

    async def open(self, now: float) -> None:
        """The stream opened: it is the region's newest, so its link is written whatever
        was there."""
        self._connected_at = now
        self._link_mod = await self.store.txn((), [self._link(now)])
        self._last_link = now
        self._opened = True

    def received(self, report: federation_pb2.RegionReport, now: float) -> None:
        """A report checked and kept (the newest replaces one not written yet)."""
        self._pending = (now, report)
        self._pending_digest = material_digest(report)

    async def publish(self, now: float) -> None:
        """Write what is due now. Raises Replaced when another stream took the region."""
        if not self._opened:  # the store failed when the stream opened: open it now
            await self.open(now)
        what = due(
            report_pending=self._pending is not None,
            last_report_write=self._last_report,
            last_link_write=self._last_link,
            now=now,
            material=self._pending_digest != self._written_digest,
        )
        if what is Write.NOTHING:
            return
        ops = [self._link(now)]
        pending, digest = self._pending, self._pending_digest
        if what is Write.REPORT and pending is not None:
            stored = StoredReport(self.region, self.replica, pending[0], pending[1])
            ops.append(Put(report_key(self.region), storekeys.dumps(stored.to_json())))
        try:
            self._link_mod = await self.store.txn(
                [Compare(link_key(self.region), self._link_mod)], ops
            )
        except CompareFailed:
            raise Replaced(f"region {self.region} streams to another replica now") from None
        self._last_link = now
        if what is Write.REPORT:
            self._last_report = now
            self._written_digest = digest
            self._pending = None if self._pending is pending else self._pending
            self.writes += 1

    async def close(self, now: float) -> None:
        """The stream ended: the report not written yet, and the link saying disconnected,
        unless another stream took the region meanwhile."""
        ops = [self._link(now, connected=False)]
        if self._pending is not None:
            at, report = self._pending
            stored = StoredReport(self.region, self.replica, at, report)
            ops.append(Put(report_key(self.region), storekeys.dumps(stored.to_json())))
        try:
            await self.store.txn([Compare(link_key(self.region), self._link_mod)], ops)
        except CompareFailed:
            return  # replaced: the other stream's link stands
