"""Moving ``replicas.total`` placements within maxUnavailable and maxSurge (``hub.decide.moves``):
the pure planner as a table, and the scheduler controller applying it in a real hub over
real mutual-TLS gRPC (devices enrolled with the real Enroll RPC, reporting in Status
messages; a real SQLite store). Faked: nothing (the devices are gRPC clients, not edged)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from asynctesting import async_test, eventually
from devicesynctesting import enrolled_device
from hubserving import AdminHub, make_hub_dir

from edgefleet.api import parse_manifest
from edgefleet.v1 import device_pb2, device_pb2_grpc
from edgefleet.versioning import installed_version
from hub.decide.moves import MoveStep, Replica, plan_move
from hub.decide.rollout import Budget
from hub.state import storekeys
from hub.state.cache import Cache

S = Replica(serving=True)  # serves, may drain
N = Replica(serving=False)  # does not serve (not started, loading, NotReady)
HARD = Replica(serving=True, may_drain=False)  # serves, but must stop now (a hard eviction)


@dataclass(frozen=True)
class Row:
    why: str
    total: int
    budget: Budget
    target: set[str]
    sent: set[str]
    replicas: dict[str, Replica]
    sent_now: set[str]
    draining: set[str] = frozenset()  # type: ignore[assignment]
    waiting: set[str] = frozenset()  # type: ignore[assignment]


ROWS = [
    Row(
        "first placement: everything starts",
        3,
        Budget(surge=1, unavailable=0),
        {"a", "b", "c"},
        set(),
        {},
        {"a", "b", "c"},
    ),
    Row(
        "nothing moves: nothing changes",
        2,
        Budget(1, 0),
        {"a", "b"},
        {"a", "b"},
        {"a": S, "b": S},
        {"a", "b"},
    ),
    Row(
        "one moves, maxUnavailable 0: the old one serves until the new one does",
        2,
        Budget(1, 0),
        {"a", "c"},
        {"a", "b"},
        {"a": S, "b": S, "c": N},
        {"a", "b", "c"},
        draining={"b"},
    ),
    Row(
        "the replacement serves: the old one stops",
        2,
        Budget(1, 0),
        {"a", "c"},
        {"a", "b", "c"},
        {"a": S, "b": S, "c": S},
        {"a", "c"},
    ),
    Row(
        "maxUnavailable 1 of 2: the old one may stop at once",
        2,
        Budget(0, 1),
        {"a", "c"},
        {"a", "b"},
        {"a": S, "b": S, "c": N},
        {"a", "c"},
    ),
    Row(
        "the old device's replica does not serve (its device died): it stops at once",
        2,
        Budget(1, 0),
        {"a", "c"},
        {"a", "b"},
        {"a": S, "b": N, "c": N},
        {"a", "c"},
    ),
    Row(
        "a hard eviction (NoExecute, preemption) stops at once whatever the budget",
        2,
        Budget(1, 0),
        {"a", "c"},
        {"a", "b"},
        {"a": S, "b": HARD, "c": N},
        {"a", "c"},
    ),
    Row(
        "an old device unknown to the hub (removed) stops",
        1,
        Budget(1, 0),
        {"c"},
        {"b"},
        {"c": N},
        {"c"},
    ),
    Row(
        "all 4 move, maxSurge 1, maxUnavailable 0: one new starts, every old one serves",
        4,
        Budget(1, 0),
        {"e", "f", "g", "h"},
        {"a", "b", "c", "d"},
        {x: S for x in "abcd"},
        {"a", "b", "c", "d", "e"},
        draining={"a", "b", "c", "d"},
        waiting={"f", "g", "h"},
    ),
    Row(
        "then the first new one serves: one old stops, one more new starts",
        4,
        Budget(1, 0),
        {"e", "f", "g", "h"},
        {"a", "b", "c", "d", "e"},
        {**{x: S for x in "abcde"}},
        {"a", "b", "c", "e", "f"},
        draining={"a", "b", "c"},
        waiting={"g", "h"},
    ),
    Row(
        "all 4 move, maxSurge 0, maxUnavailable 1: one old stops, one new starts",
        4,
        Budget(0, 1),
        {"e", "f", "g", "h"},
        {"a", "b", "c", "d"},
        {x: S for x in "abcd"},
        {"a", "b", "c", "e"},
        draining={"a", "b", "c"},
        waiting={"f", "g", "h"},
    ),
    Row(
        "a new replica that never serves holds the old ones (never below total - maxUnavailable)",
        2,
        Budget(0, 1),
        {"c", "d"},
        {"a", "c"},
        {"a": S, "c": N, "d": N},
        {"a", "c"},
        draining={"a"},
        waiting={"d"},
    ),
    Row(
        "scaled down: the replica beyond total stops (a hard eviction)",
        1,
        Budget(1, 0),
        {"a"},
        {"a", "b"},
        {"a": S, "b": HARD},
        {"a"},
    ),
    Row(
        "a deployment that lost its placements (0 placed) keeps what serves",
        2,
        Budget(0, 1),
        set(),
        {"a", "b"},
        {"a": S, "b": S},
        {"a"},
        draining={"a"},
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.why for r in ROWS])
def test_plan_move(row: Row) -> None:
    step = plan_move(row.total, row.budget, row.target, row.sent, row.replicas)
    assert step.sent == row.sent_now
    assert step.draining == set(row.draining)
    assert step.waiting == set(row.waiting)
    assert step.stopped == row.sent - row.sent_now
    # the invariant: never fewer serving than total - maxUnavailable, unless already fewer
    # (what a hard eviction stops does not count: it cannot wait)
    before = sum(
        row.replicas.get(d, N).serving and (d in row.target or row.replicas[d].may_drain)
        for d in row.sent
    )
    floor = row.total - row.budget.unavailable
    assert step.serving >= min(before, floor)
    # and never more sent than total + maxSurge beyond what already ran
    assert len(step.sent) <= max(row.total + row.budget.surge, len(row.sent & step.sent))


def test_the_note_says_what_waits_for_what() -> None:
    step = MoveStep(sent=frozenset("abe"), draining=frozenset("ab"), waiting=frozenset("fg"))
    assert step.note(Budget(1, 0)) == (
        "moving: 2 replica(s) on a, b serve until their replacements are ready "
        "(maxUnavailable 0); 2 placement(s) wait to start (maxSurge 1)"
    )


PLACED_NOT_SENT = "replicas.total: the scheduler placed no replica here"


@async_test
async def test_a_moved_replica_serves_until_its_replacement_reports_ready(
    tmp_path: Path,
) -> None:
    """Over real mutual-TLS gRPC: three enrolled devices report their labels and workloads
    in Status messages; a ``total: 2`` deployment with ``maxUnavailable: 0`` moves off a
    device relabelled out of its nodeSelector only once the new device reports it serving."""
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub:
        cache, scheduler, projector = hub.ctx.cache, hub.ctx.scheduler, hub.ctx.projector
        assert scheduler is not None
        calls = {}
        channels = []
        for name in ("d1", "d2", "d3"):
            creds = await enrolled_device(hub, tmp_path, name)
            ch = grpc.aio.secure_channel(f"127.0.0.1:{hub.port}", creds)
            channels.append(ch)
            call = device_pb2_grpc.DeviceServiceStub(ch).Sync()
            hello = device_pb2.Hello(
                edged_version=installed_version(), device_name=name, labels={"site": "shop"}
            )
            await call.write(device_pb2.DeviceMessage(hello=hello))
            await call.read()
            calls[name] = call

        async def report(name: str, labels: dict[str, str], serving: bool) -> None:
            workloads = []
            if serving:
                rev = device_pb2.RevisionStatus(
                    model_version="1.0.0", phase="Ready", ready_replicas=1, wanted=True
                )
                workloads.append(
                    device_pb2.WorkloadStatus(
                        name="mv",
                        model_version="1.0.0",
                        ready_replicas=1,
                        desired_replicas=1,
                        revisions=[rev],
                    )
                )
            status = device_pb2.Status(labels=labels, workloads=workloads)
            await calls[name].write(device_pb2.DeviceMessage(status=status))

        def sent_to(name: str) -> bool:
            content = projector.contents.get(name)
            return content is not None and content.excluded.get("mv") != PLACED_NOT_SENT

        try:
            manifest = {
                "apiVersion": "edgefleet.io/v1",
                "kind": "ModelDeployment",
                "metadata": {"name": "mv"},
                "spec": {
                    "model": {"name": "mv", "version": "1.0.0"},
                    "replicas": {"total": 2},
                    "placement": {"nodeSelector": {"site": "shop"}},
                    "rollout": {"maxUnavailable": 0, "maxSurge": 1},
                },
            }
            cache.put_object(parse_manifest(manifest).to_dict(), 1)
            await scheduler.pass_now()
            first = set(cache.placements["mv"])
            assert len(first) == 2
            (spare,) = {"d1", "d2", "d3"} - first
            for name in sorted(first):
                await report(name, {"site": "shop"}, serving=True)
            await eventually(lambda: all(_serves(cache, n) for n in first), within=10)

            # one placed device leaves the shop: the replacement starts, the old one serves on
            leaving = sorted(first)[0]
            await report(leaving, {"site": "depot"}, serving=True)
            await eventually(
                lambda: cache.devices[leaving].reported_labels == {"site": "depot"}, within=10
            )
            await scheduler.pass_now()
            assert cache.placements["mv"] == (first - {leaving}) | {spare}
            assert cache.draining["mv"] == {leaving}
            assert cache.sent_placements["mv"] == first | {spare}
            await eventually(lambda: sent_to(spare) and sent_to(leaving), within=10)
            moved = [e for e in cache.events if e["reason"] == "Rescheduled"]
            assert moved[-1]["message"] == (
                f"replica taken off {leaving}: no longer fits: not matching nodeSelector "
                "site=shop (it serves until its replacement is ready)"
            )
            explained = cache.explanations["mv"].message()
            assert f"moving: 1 replica(s) on {leaving} serve until" in explained
            # stored: a restarted hub knows the move
            again = await Cache.load(hub.ctx.store)
            assert again.draining == {"mv": frozenset({leaving})}

            # nothing changes while the replacement has not reported serving
            await scheduler.advance_now()
            assert cache.draining["mv"] == {leaving}

            # the replacement serves: the old replica stops
            await report(spare, {"site": "shop"}, serving=True)
            await eventually(lambda: _serves(cache, spare), within=10)
            await scheduler.advance_now()
            assert "mv" not in cache.draining
            assert cache.sent_placements["mv"] == cache.placements["mv"]
            await eventually(lambda: not sent_to(leaving), within=10)
            done = [e for e in cache.events if e["reason"] == "Moved"]
            assert done[-1]["message"] == (
                f"replica(s) on {leaving} stopped: 2/2 serving where placed"
            )
            assert "moving" not in cache.explanations["mv"].message()
        finally:
            for call in calls.values():
                await call.done_writing()
                await call.code()
            for ch in channels:
                await ch.close()


def _serves(cache: Cache, name: str) -> bool:
    report = cache.devices[name].workloads.get("mv")
    return report is not None and any(r.serves for r in report.revisions)


@async_test
async def test_a_device_measured_over_max_latency_p95_loses_the_replica_with_its_figure(
    tmp_path: Path,
) -> None:
    """Over real gRPC: a device's Status carries the revision's self-benchmark; over the
    deployment's ``placement.maxLatencyP95`` its replica moves (after the replacement serves,
    as any move), the figure is the reason, and the device stays off while its record keeps
    the figure (also after the model left it)."""
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub:
        cache, scheduler = hub.ctx.cache, hub.ctx.scheduler
        assert scheduler is not None
        sha = "ab" * 32
        cache.models[("lat", "1.0.0")] = storekeys.ModelRecord(
            "lat", "1.0.0", sha, 1234, b"{signed}", 1.0
        )
        calls = {}
        channels = []
        for name in ("d1", "d2"):
            creds = await enrolled_device(hub, tmp_path, name)
            ch = grpc.aio.secure_channel(f"127.0.0.1:{hub.port}", creds)
            channels.append(ch)
            call = device_pb2_grpc.DeviceServiceStub(ch).Sync()
            hello = device_pb2.Hello(
                edged_version=installed_version(), device_name=name, labels={"site": "shop"}
            )
            await call.write(device_pb2.DeviceMessage(hello=hello))
            await call.read()
            calls[name] = call

        async def report(name: str, p95: float | None) -> None:
            rev = device_pb2.RevisionStatus(
                model_version="1.0.0", sha256=sha, phase="Ready", ready_replicas=1, wanted=True
            )
            if p95 is not None:
                rev.benchmark.CopyFrom(device_pb2.RevisionBenchmark(p95_seconds=p95, runs=20))
            w = device_pb2.WorkloadStatus(
                name="lat", model_version="1.0.0", ready_replicas=1, desired_replicas=1,
                revisions=[rev],
            )  # fmt: skip
            status = device_pb2.Status(labels={"site": "shop"}, workloads=[w])
            await calls[name].write(device_pb2.DeviceMessage(status=status))

        try:
            manifest = {
                "apiVersion": "edgefleet.io/v1",
                "kind": "ModelDeployment",
                "metadata": {"name": "lat"},
                "spec": {
                    "model": {"name": "lat", "version": "1.0.0"},
                    "replicas": {"total": 1},
                    "placement": {"maxLatencyP95": "50ms"},
                    "rollout": {"maxUnavailable": 0, "maxSurge": 1},
                },
            }
            cache.put_object(parse_manifest(manifest).to_dict(), 1)
            await scheduler.pass_now()
            (first,) = cache.placements["lat"]
            (other,) = {"d1", "d2"} - {first}
            assert "have not measured the model's p95 yet" in cache.explanations["lat"].message()

            await report(first, 0.0834)  # serves, but too slow here
            await eventually(lambda: cache.devices[first].latencies == {sha: 0.0834}, within=10)
            await scheduler.pass_now()
            assert cache.placements["lat"] == {other} and cache.draining["lat"] == {first}
            moved = [e for e in cache.events if e["reason"] == "Rescheduled"]
            assert moved[-1]["message"] == (
                f"replica taken off {first}: no longer fits: measured p95 83.4ms over "
                "maxLatencyP95 50ms (it serves until its replacement is ready)"
            )
            await report(other, 0.012)
            await eventually(lambda: cache.devices[other].latencies == {sha: 0.012}, within=10)
            await scheduler.advance_now()
            assert cache.sent_placements["lat"] == {other}

            # the figure stays with the device record: with d2 gone from the fleet's
            # candidates (cordoned), d1 is still not chosen, and says why
            await hub.ctx.writer.flush()
            stored = await Cache.load(hub.ctx.store)
            assert stored.devices[first].latencies == {sha: 0.0834}
            cache.devices[other] = cache.devices[other].with_(cordoned=True)
            cache.put_object(parse_manifest({**manifest, "spec": {
                **manifest["spec"], "replicas": {"total": 2}}}).to_dict(), 2)  # fmt: skip
            await scheduler.pass_now()
            assert cache.placements["lat"] == {other}
            assert "1 over maxLatencyP95 50ms (measured p95 up to 83.4ms)" in (
                cache.explanations["lat"].message()
            )
        finally:
            for call in calls.values():
                await call.done_writing()
                # what the hub sent that this test did not read (the deployment's desired
                # states, once its rollout controller made the revision): a call's status comes
                # after its messages
                with contextlib.suppress(grpc.aio.AioRpcError):
                    while await call.read() is not grpc.aio.EOF:
                        pass  # read and dropped: only the call's status matters here
                await call.code()
            for ch in channels:
                await ch.close()
