"""Regions' reports shared through the store (hub.state.sharedreports, docs/federation.md "Hub
replicas at the root"): the write decision and a link's liveness as tables (pure), what a
replica shows of a region (:meth:`hub.state.regions.Regions.seen`) as a table, and the publisher
and the follower over each real store (memory, a SQLite file, the session's etcd): a report
written by one "replica" reaches another's :class:`~hub.state.regions.Regions` through the watch,
a newer stream elsewhere fences the older one's writes, and a restart loads the reports."""

from __future__ import annotations

import asyncio
import base64

import pytest
from asynctesting import async_test, eventually
from hubtesting import MakeStore

from edgefleet.v1 import federation_pb2
from hub.state import storekeys
from hub.state.regions import REGIONS, Regions, RegionsFollower, RegionState, region_key
from hub.state.sharedreports import (
    DEVICES_S,
    REFRESH_S,
    STALE_S,
    UNCHANGED_S,
    Link,
    Replaced,
    ReportPublisher,
    StoredDevices,
    StoredReport,
    Write,
    devices_due,
    devices_key,
    due,
    link_alive,
    link_key,
    report_key,
    without_devices,
)


def report(ready: int, generation: int = 7) -> federation_pb2.RegionReport:
    return federation_pb2.RegionReport(
        generation=generation,
        deployments=[
            federation_pb2.RegionDeploymentStatus(
                name="det", desired=2, updated=2, ready=ready, available=ready
            )
        ],
    )


@pytest.mark.parametrize(
    ("pending", "changed", "last_report", "last_link", "now", "expected"),
    [
        (True, True, None, 100.0, 100.0, Write.REPORT),  # the first report: at once
        (True, False, None, 100.0, 100.0, Write.REPORT),  # ... whatever it holds
        (True, True, 100.0, 100.0, 100.5, Write.NOTHING),  # coalesced: within a second
        (True, True, 100.0, 100.0, 101.0, Write.REPORT),  # a second later: the newest report
        # the same as the last written: again after UNCHANGED_S (the link refreshed meanwhile)
        (True, False, 100.0, 100.0, 101.0, Write.NOTHING),
        (True, False, 100.0, 100.0, 100.0 + REFRESH_S, Write.LINK),
        (True, False, 100.0, 100.0 + REFRESH_S, 100.0 + UNCHANGED_S, Write.REPORT),
        (True, False, 100.0, 100.0, 99.0, Write.REPORT),  # the clock went back: write it
        (False, True, 100.0, 100.0, 105.0, Write.NOTHING),  # nothing new, link fresh
        (False, True, 100.0, 100.0, 100.0 + REFRESH_S, Write.LINK),  # the link refreshed
        (True, True, 100.0, 90.0, 100.2, Write.LINK),  # link due, report not: link alone
    ],
)
def test_what_an_open_stream_writes(
    pending: bool,
    changed: bool,
    last_report: float | None,
    last_link: float,
    now: float,
    expected: Write,
) -> None:
    got = due(
        report_pending=pending,
        last_report_write=last_report,
        last_link_write=last_link,
        now=now,
        changed=changed,
    )
    assert got is expected


@pytest.mark.parametrize(
    ("last", "now", "expected"),
    [
        (None, 100.0, True),  # the first rows: at once
        (100.0, 101.0, False),  # rows that changed a second later: not yet
        (100.0, 100.0 + DEVICES_S, True),
        (100.0, 99.0, True),  # the clock went back
    ],
)
def test_when_a_regions_devices_rows_are_written(
    last: float | None, now: float, expected: bool
) -> None:
    assert devices_due(last_devices_write=last, now=now) is expected


def with_devices(ready: int, heartbeats: list[float]) -> federation_pb2.RegionReport:
    out = report(ready)
    out.inventory.total = len(heartbeats)
    for i, at in enumerate(heartbeats):
        out.inventory.devices.add(name=f"d{i}", phase="Ready", last_heartbeat=at)
    return out


def test_a_report_without_its_rows_keeps_its_totals_and_leaves_it_whole() -> None:
    full = with_devices(3, [10.0, 20.0])
    main = without_devices(full)
    assert not main.inventory.devices and main.inventory.total == 2
    assert main.deployments[0].ready == 3
    assert len(full.inventory.devices) == 2  # the report itself unchanged
    stored = StoredDevices(
        "eu", "r1", 5.0, federation_pb2.RegionInventory(devices=full.inventory.devices)
    )
    assert StoredDevices.from_json(storekeys.loads(storekeys.dumps(stored.to_json()))) == stored
    with pytest.raises(ValueError, match="malformed region devices"):
        StoredDevices.from_json(stored.to_json() | {"devices": "%%%"})


def _link(connected: bool = True, seen_at: float = 1000.0) -> Link:
    return Link("eu", "replica r1", connected, 900.0, seen_at)


@pytest.mark.parametrize(
    ("link", "now", "alive"),
    [
        (None, 1000.0, False),
        (_link(), 1000.0, True),
        (_link(), 1000.0 + STALE_S, True),
        (_link(), 1000.1 + STALE_S, False),  # its replica stopped refreshing: not connected
        (_link(connected=False), 1000.0, False),  # its stream ended
        (_link(), 990.0, True),  # the writer's clock a little ahead
        (_link(), 1000.0 - STALE_S - 1, False),  # far ahead: not believed
    ],
)
def test_whether_a_link_says_the_region_is_connected(
    link: Link | None, now: float, alive: bool
) -> None:
    assert link_alive(link, now) is alive


def test_a_stored_report_round_trips_and_a_malformed_one_is_refused() -> None:
    stored = StoredReport("eu", "replica r1", 123.5, report(2))
    assert StoredReport.from_json(storekeys.loads(storekeys.dumps(stored.to_json()))) == stored
    bad = stored.to_json() | {"report": base64.b64encode(b"\xff\xff\xff").decode()}
    with pytest.raises(ValueError, match="malformed region report"):
        StoredReport.from_json(bad)
    with pytest.raises(ValueError, match="malformed region report"):
        StoredReport.from_json({"region": "eu"})
    with pytest.raises(ValueError, match="malformed region link"):
        Link.from_json({"region": "eu", "connected": True})


NOW = 2000.0
OLD = StoredReport("eu", "replica r1", NOW - 600, report(1))
NEW = StoredReport("eu", "replica r1", NOW - 2, report(2))
FRESH = Link("eu", "x", True, NOW - 5, NOW)  # another replica, refreshing its link
DEAD = Link("eu", "x", True, NOW - 90, NOW - 60)  # ... that stopped a minute ago


def _state(**kw: object) -> RegionState:
    state = RegionState("eu", "s1", 0.0)
    for k, v in kw.items():
        setattr(state, k, v)
    return state


@pytest.mark.parametrize(
    ("replicated", "state", "ready", "reported_at", "connected", "current"),
    [
        # a region never heard of: nothing
        (True, _state(), None, None, False, False),
        # a restarted root: the stored report, with its time; disconnected until it streams
        (False, _state(stored=OLD), 1, NOW - 600, False, False),
        # a single hub ignores links (there is no other replica)
        (False, _state(stored=NEW, link=FRESH), 2, NOW - 2, False, False),
        # streaming to another replica that keeps its link fresh: connected, its report current
        (True, _state(stored=NEW, link=FRESH), 2, NOW - 2, True, True),
        # ... a report from before that connection: shown, not current
        (True, _state(stored=OLD, link=FRESH), 1, NOW - 600, True, False),
        # that replica died: its link goes stale and the region shows disconnected
        (True, _state(stored=NEW, link=DEAD), 2, NOW - 2, False, False),
        # streaming here: the report received here wins over an older stored one
        (
            True,
            _state(
                connected=True, connected_at=NOW - 10, report=report(3), reported_at=NOW - 1,
                stored=OLD,
            ),
            3, NOW - 1, True, True,
        ),
        # streaming here, no report yet on this connection: the stored one, not current
        (True, _state(connected=True, connected_at=NOW - 1, stored=NEW), 2, NOW - 2, True, False),
        # it was here, moved to another replica: that replica's newer stored report
        (
            True,
            _state(
                report=report(1), reported_at=NOW - 50,
                stored=NEW, link=Link("eu", "x", True, NOW - 40, NOW),
            ),
            2, NOW - 2, True, True,
        ),
    ],
)  # fmt: skip
def test_what_a_replica_shows_of_a_region(
    replicated: bool,
    state: RegionState,
    ready: int | None,
    reported_at: float | None,
    connected: bool,
    current: bool,
) -> None:
    regions = Regions({"eu": state}, replicated=replicated, clock=lambda: NOW)
    seen = regions.seen(state)
    assert (seen.report.deployments[0].ready if seen.report else None) == ready
    assert (seen.reported_at, seen.connected, seen.current) == (reported_at, connected, current)


def test_a_region_enrolled_again_or_revoked_at_another_replica_ends_its_stream_here() -> None:
    """The region records another replica wrote, as the watch delivers them: a renewal keeps
    the open stream (its certificate is the previous one), a new enrollment ends it, and so
    does a revocation (the region is no longer counted)."""
    regions = Regions()
    regions._take_record({"region": "eu", "certificateSerial": "s1", "enrolledAt": 1.0})
    state = regions.regions["eu"]
    state.stream, state.stream_serial = asyncio.Event(), "s1"
    renewed = {"region": "eu", "certificateSerial": "s2", "previousSerial": "s1", "enrolledAt": 1.0}
    regions._take_record(renewed)
    assert (state.serial, state.previous_serial) == ("s2", "s1") and not state.stream.is_set()
    regions._take_record({"region": "eu", "certificateSerial": "s3", "enrolledAt": 2.0})
    assert state.stream.is_set()
    state.stream = asyncio.Event()
    regions._take_record(
        {"region": "eu", "certificateSerial": "s3", "enrolledAt": 2.0, "revoked": True}
    )
    assert state.stream.is_set() and state.revoked and "eu" not in regions.regions


async def _enroll(store: object, name: str = "eu") -> None:
    doc = {"region": name, "certificateSerial": "s1", "enrolledAt": 1.0}
    await store.put(region_key(name), storekeys.dumps(doc))  # type: ignore[attr-defined]


@async_test
async def test_a_report_written_by_one_replica_reaches_another_and_a_restart(
    make_store: MakeStore,
) -> None:
    """r1 publishes eu's reports (coalesced to one a second); r2's Regions follows the store
    and sees them with their time and eu connected; a second stream on r2 fences r1's next
    write (Replaced); r2's stream closing leaves eu disconnected; a fresh load (a restarted
    replica) shows the last report with its time."""
    store = await make_store()
    try:
        await _enroll(store)
        clock = [1000.0]
        r2 = await Regions.load(store, replicated=True)
        r2.clock = lambda: clock[0]
        stop = asyncio.Event()
        follower = asyncio.create_task(RegionsFollower(store, r2).run(stop))
        try:
            r1 = ReportPublisher(store, "eu", "replica r1")
            await r1.open(clock[0])
            r1.received(report(1), clock[0])
            await r1.publish(clock[0])
            r1.received(report(2), clock[0] + 0.2)
            await r1.publish(clock[0] + 0.5)  # coalesced: not a second since the last write
            assert r1.writes == 1
            eu = r2.regions["eu"]
            await eventually(lambda: eu.stored is not None and eu.link is not None, within=10)
            seen = r2.seen(eu)
            assert seen.connected and seen.current and seen.report == report(1)
            await r1.publish(clock[0] + 1.0)
            assert r1.writes == 2
            await eventually(lambda: r2.seen(eu).report == report(2), within=10)
            assert r2.seen(eu).reported_at == clock[0] + 0.2
            assert r2.summary()[0]["replica"] == "replica r1"

            # eu opens a stream on r2 (r1's not noticed gone): r1 may not write any more
            mine = ReportPublisher(store, "eu", "replica r2")
            await mine.open(clock[0] + 2)
            r1.received(report(9), clock[0] + 2)
            with pytest.raises(Replaced):
                await r1.publish(clock[0] + 3)
            await r1.close(clock[0] + 3)  # nor mark it disconnected
            kv = await store.get(link_key("eu"))
            assert kv is not None
            assert Link.from_json(storekeys.loads(kv.value)).replica == "replica r2"
            mine.received(report(4), clock[0] + 4)
            await mine.close(clock[0] + 5)  # its stream ends: the report not written yet, too
            await eventually(lambda: eu.link is not None and not eu.link.connected, within=10)
            assert not r2.seen(eu).connected and r2.seen(eu).report == report(4)
        finally:
            stop.set()
            await follower
        again = await Regions.load(store, replicated=True)
        again.clock = lambda: clock[0] + 65
        seen = again.seen(again.regions["eu"])
        assert (seen.report, seen.reported_at, seen.connected) == (report(4), clock[0] + 4, False)
        row = again.summary()[0]
        assert (row["connected"], row["reportAgeSeconds"]) == (False, 61.0)
        # a region revoked elsewhere is no longer counted here
        revoked = {"region": "eu", "certificateSerial": "s1", "enrolledAt": 1.0, "revoked": True}
        kv = await store.get(region_key("eu"))
        assert kv is not None
        again.take(kv.key, kv)  # unchanged: still counted
        assert "eu" in again.regions
        await store.put(region_key("eu"), storekeys.dumps(revoked))
        kv = await store.get(region_key("eu"))
        again.take(kv.key, kv)  # type: ignore[union-attr]
        assert "eu" not in again.regions
        assert report_key("eu").startswith("/regionreports/") and REGIONS == "/regions/"
    finally:
        await store.close()


@async_test
async def test_a_regions_rows_are_written_apart_at_most_every_devices_s(
    make_store: MakeStore,
) -> None:
    """A region's report is written less its devices' rows, within a second of a change;
    the rows apart, at most every DEVICES_S, and another replica shows both (a thousand
    devices' rows, changed in nearly every report, written with it each time filled a root's
    disk with the store's history: seed 62's 1-hour run); the rows not written yet go with
    the stream's end."""
    store = await make_store()
    try:
        await _enroll(store)
        r2 = await Regions.load(store, replicated=True)
        stop = asyncio.Event()
        follower = asyncio.create_task(RegionsFollower(store, r2).run(stop))
        try:
            pub = ReportPublisher(store, "eu", "replica r3")
            t = 1000.0
            r2.clock = lambda: t
            await pub.open(t)
            pub.received(with_devices(4, [t]), t)
            await pub.publish(t)
            assert (pub.writes, pub.row_writes) == (1, 1)
            kv = await store.get(report_key("eu"))
            assert kv is not None
            main = StoredReport.from_json(storekeys.loads(kv.value)).report
            assert main == without_devices(with_devices(4, [t]))
            eu = r2.regions["eu"]
            await eventually(lambda: eu.stored_devices is not None, within=10)
            assert [d["metadata"]["name"] for d in r2.devices()] == ["d0"]
            for i in range(1, 30):  # heartbeats every second, the same figures
                pub.received(with_devices(4, [t + i]), t + i)
                await pub.publish(t + i)
            assert (pub.writes, pub.row_writes) == (1, 1)  # nothing: rows not due yet
            pub.received(with_devices(5, [t + 30, t + 30]), t + 30)  # a figure, a new device
            await pub.publish(t + UNCHANGED_S)
            assert (pub.writes, pub.row_writes) == (2, 1)  # the figure at once; rows later
            await eventually(
                lambda: eu.stored is not None and eu.stored.report.deployments[0].ready == 5,
                within=10,
            )
            assert len(r2.devices()) == 1
            await pub.publish(t + DEVICES_S)  # the rows due (the report was written)
            assert (pub.writes, pub.row_writes) == (2, 2)
            await eventually(lambda: len(r2.devices()) == 2, within=10)
            pub.received(with_devices(5, [t + 61, t + 61, t + 61]), t + 61)
            await pub.publish(t + 61)  # the same report 31 s on: again (its time); rows not due
            assert (pub.writes, pub.row_writes) == (3, 2)
            await pub.close(t + 62)  # the rows not written yet go with the stream's end
            await eventually(lambda: len(r2.devices()) == 3, within=10)
            kv = await store.get(devices_key("eu"))
            assert kv is not None
            rows = StoredDevices.from_json(storekeys.loads(kv.value)).devices
            assert [d.last_heartbeat for d in rows.devices] == [t + 61] * 3
        finally:
            stop.set()
            await follower
        # an older root's record, the rows inside the report: read as written
        old = StoredReport("eu", "replica r0", t, with_devices(2, [t, t]))
        await store.put(report_key("eu"), storekeys.dumps(old.to_json()))  # type: ignore[attr-defined]
        await store.delete(devices_key("eu"))  # type: ignore[attr-defined]
        again = await Regions.load(store, replicated=True)
        assert [d["metadata"]["name"] for d in again.devices()] == ["d0", "d1"]
    finally:
        await store.close()
