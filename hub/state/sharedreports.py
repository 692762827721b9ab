"""Regions' reports shared through the store, so that every root replica sees every region.

A regional hub streams to one root replica (:class:`hub.api.federation.FederationServicer`); with
hub replicas on etcd (docs/etcd.md) the leader's wave controller, and the admin reads of every
other replica, must still see what that region last reported. The replica a region streams to
writes (:class:`ReportPublisher`, one per stream, through the store itself, not the leader's
fenced store: any replica writes it, as any replica writes the records of its devices)::

    /regionreports/REGION   {"region", "replica", "reportedAt", "report": base64 of the
                            RegionReport as received (bounded by
                            hub.state.regionmapping.check_report), less its devices'
                            rows (inventory.devices; total and by_phase kept)}
    /regiondevices/REGION   {"region", "replica", "reportedAt", "devices": base64 of a
                            RegionInventory holding those rows}
    /regionlinks/REGION     {"region", "replica", "connected", "connectedAt", "seenAt"}

* the report when it changed, at most once every :data:`WRITE_INTERVAL_S` (reports arrive at
  most ~1 a second; a newer one replaces one not written yet), and at least every
  :data:`UNCHANGED_S` while the region reports (its ``reportedAt``), with the link in the
  same transaction;
* the devices' rows when they changed, at most once every :data:`DEVICES_S`. They are most of
  a big region's report (70 KB of 72 for 1,351 devices), something in them changes in nearly
  every report (a heartbeat, a phase, an enrollment), and each write stays in the store's
  history, value and previous value, for its retention (15 min): a root over a 1,351-device
  region that wrote the whole report every 1-5 s filled a 64 MiB disk with 60 MB of history
  in 35 minutes (the soak harness's 1-hour run, seed 62), and a 20,000-device region would
  have written ~1.4 MB a second. The rows are shown only (``get devices`` at the root): the
  replicas the region does not stream to show them up to a minute old; the figures, phases
  and totals the waves judge are written within a second as before;
* the link alone when the stream opens, every :data:`REFRESH_S` while it is open (``seenAt``:
  the replica vouches for the stream then), and with ``connected: false`` when it ends;
* every write after the first is conditional on the link's mod revision this stream last
  wrote: when another stream of the region (on another replica) wrote it meanwhile, this
  stream was replaced and writes nothing more (the stream ends, as a second stream of a
  region on one replica replaces the first).

Every replica (the leader included) follows the three prefixes with a watch
(:meth:`hub.state.regions.Regions.follow_store`) and loads them when it starts, so a restarted root
shows the last reports at once, each with its age (``reportedAt``). A region is connected
when the replica it streams to is this one, or when its link says so and was refreshed within
:data:`STALE_S` (:func:`link_alive`: a replica that died stops refreshing, and its regions
then show as disconnected, and a wave waits for them as unreachable, never judged as fresh).

A record of an older root (the devices' rows inside the report, no ``/regiondevices/``) is read
as it was written.

The decisions here (:func:`due`, :func:`devices_due`, :func:`link_alive`, the parts and their
digests) are pure; the publisher does the I/O.
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
DEVICES = "/regiondevices/"
LINKS = "/regionlinks/"
WRITE_INTERVAL_S = 1.0  # at most one report write a second per region (coalesced)
REFRESH_S = 10.0  # the link of an open stream is written again at least this often
STALE_S = 30.0  # a link not refreshed for this long: the region is not connected (anywhere)
UNCHANGED_S = 30.0  # a report the same as the last one written: written again this often
DEVICES_S = 60.0  # the devices' rows, when they changed: at most this often


def report_key(region: str) -> str:
    return f"{REPORTS}{region}"


def link_key(region: str) -> str:
    return f"{LINKS}{region}"


def devices_key(region: str) -> str:
    return f"{DEVICES}{region}"


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
class StoredDevices:
    """A region's devices' rows, as the replica it streamed to last stored them."""

    region: str
    replica: str
    reported_at: float  # when that replica received the report they came with
    devices: federation_pb2.RegionInventory  # only ``devices`` is set

    def to_json(self) -> dict[str, Any]:
        return {
            "region": self.region,
            "replica": self.replica,
            "reportedAt": self.reported_at,
            "devices": base64.b64encode(self.devices.SerializeToString()).decode(),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> StoredDevices:
        """Raises ValueError naming what is malformed."""
        try:
            raw = base64.b64decode(str(doc["devices"]), validate=True)
            devices = federation_pb2.RegionInventory.FromString(raw)
            return cls(str(doc["region"]), str(doc["replica"]), float(doc["reportedAt"]), devices)
        except (KeyError, TypeError, binascii.Error) as exc:
            raise ValueError(f"malformed region devices record: {exc!r}") from exc
        except Exception as exc:  # protobuf's DecodeError
            raise ValueError(f"malformed region devices record: {exc}") from exc


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


def without_devices(report: federation_pb2.RegionReport) -> federation_pb2.RegionReport:
    """``report`` less its devices' rows (pure: a copy; the totals stay)."""
    out = federation_pb2.RegionReport()
    out.CopyFrom(report)
    if out.HasField("inventory"):
        out.inventory.ClearField("devices")
    return out


def devices_of(report: federation_pb2.RegionReport) -> federation_pb2.RegionInventory:
    """The devices' rows of ``report``, alone (pure)."""
    return federation_pb2.RegionInventory(devices=report.inventory.devices)


def digest(message: Any) -> bytes:
    return hashlib.sha256(message.SerializeToString(deterministic=True)).digest()


def devices_due(
    *, last_devices_write: float | None, now: float, interval_s: float = DEVICES_S
) -> bool:
    """Whether rows that changed are written now (pure): the first, then at most every
    ``interval_s`` (and at once when the clock went back)."""
    if last_devices_write is None:
        return True
    since = now - last_devices_write
    return since >= interval_s or since < 0


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
    changed: bool = True,
    interval_s: float = WRITE_INTERVAL_S,
    refresh_s: float = REFRESH_S,
    unchanged_s: float = UNCHANGED_S,
) -> Write:
    """What an open stream's publisher writes now (pure): a report received and not written
    yet, once ``interval_s`` passed since the last report write, or ``unchanged_s`` when it
    has not ``changed`` from the last one written (less the devices' rows); else the link,
    once ``refresh_s`` passed since it was last written."""
    if report_pending:
        if last_report_write is None:
            return Write.REPORT
        since = now - last_report_write
        if since >= (interval_s if changed else unchanged_s) or since < 0:
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
        # the pending report less its rows, and the digests of that and of its rows: made once
        # when it comes (a 20,000-device report's rows are ~1.4 MB to copy and hash)
        self._main = federation_pb2.RegionReport()
        self._main_digest = b""
        self._rows_digest = b""
        self._report_done = True  # the pending report's part without rows is written
        self._rows_done = True  # ... and its devices' rows (or they are as last written)
        self._written = b""  # digest of the last report written, less its rows
        self._written_rows = b""  # digest of the last devices' rows written
        self._last_rows: float | None = None
        self.writes = 0
        """Report writes made (tests, figures)."""
        self.row_writes = 0
        """Writes of the devices' rows made (tests, figures)."""

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
        self._main = without_devices(report)
        self._main_digest = digest(self._main)
        self._rows_digest = digest(devices_of(report))
        self._report_done = False
        self._rows_done = self._rows_digest == self._written_rows

    async def publish(self, now: float) -> None:
        """Write what is due now. Raises Replaced when another stream took the region."""
        if not self._opened:  # the store failed when the stream opened: open it now
            await self.open(now)
        pending = self._pending
        main, main_digest, rows_digest = self._main, self._main_digest, self._rows_digest
        what = due(
            report_pending=pending is not None and not self._report_done,
            last_report_write=self._last_report,
            last_link_write=self._last_link,
            now=now,
            changed=main_digest != self._written,
        )
        rows = (
            pending is not None
            and not self._rows_done
            and devices_due(last_devices_write=self._last_rows, now=now)
        )
        if what is Write.NOTHING and not rows:
            return
        ops = [self._link(now)]
        if what is Write.REPORT and pending is not None:
            stored = StoredReport(self.region, self.replica, pending[0], main)
            ops.append(Put(report_key(self.region), storekeys.dumps(stored.to_json())))
        if rows and pending is not None:
            ops.append(self._rows(pending))
        try:
            self._link_mod = await self.store.txn(
                [Compare(link_key(self.region), self._link_mod)], ops
            )
        except CompareFailed:
            raise Replaced(f"region {self.region} streams to another replica now") from None
        self._last_link = now
        if what is Write.REPORT:
            self._last_report = now
            self._written = main_digest
            self.writes += 1
        if rows:
            self._last_rows = now
            self._written_rows = rows_digest
            self.row_writes += 1
        if self._pending is pending:  # no newer report came meanwhile
            self._report_done = self._report_done or what is Write.REPORT
            self._rows_done = self._rows_done or rows
            if self._report_done and self._rows_done:
                self._pending = None

    def _rows(self, pending: tuple[float, federation_pb2.RegionReport]) -> Put:
        stored = StoredDevices(self.region, self.replica, pending[0], devices_of(pending[1]))
        return Put(devices_key(self.region), storekeys.dumps(stored.to_json()))

    async def close(self, now: float) -> None:
        """The stream ended: the report not written yet, and the link saying disconnected,
        unless another stream took the region meanwhile."""
        ops = [self._link(now, connected=False)]
        pending = self._pending
        if pending is not None:
            if not self._report_done:
                stored = StoredReport(self.region, self.replica, pending[0], self._main)
                ops.append(Put(report_key(self.region), storekeys.dumps(stored.to_json())))
            if not self._rows_done:
                ops.append(self._rows(pending))
        try:
            await self.store.txn([Compare(link_key(self.region), self._link_mod)], ops)
        except CompareFailed:
            return  # replaced: the other stream's link stands
