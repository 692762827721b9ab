"""A rollout reads a device's report only as of the generation that carried the revision to
it (observedGeneration), over a real SQLite store, the real projector and real gRPC; device
reports are written as the Sync stream would, the controller is stepped by hand.

The race this closes (seen in the TUF rollback e2e test): the hub gives a device the new
revision, and a report the device made *before* receiving it arrives next. When it shows the
new version serving (a rollout back to a version whose replicas still drain) the rollout was
declared complete at once, and the refusal that followed was never rolled back; when it shows
the last attempt's refusal of the same version, the retry was rolled back at once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
from asynctesting import async_test
from hubserving import AdminHub, make_hub_dir
from polltesting import eventually

from edgefleet.v1 import admin_pb2
from hub.controllers.rollout import fresh_report
from hub.decide.devices import Device, DevicePhase, RevisionPhase, RevisionReport, WorkloadReport
from hub.decide.rollout import RolloutPhase, RolloutState, TargetPhase, view_device
from hub.state import storekeys as objects
from hub.state.cache import Cache


def deployment(version: str) -> bytes:
    return orjson.dumps(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "ModelDeployment",
            "metadata": {"name": "det"},
            "spec": {"model": {"name": "det", "version": version}},
        }
    )


def sha(version: str) -> str:
    return version.replace(".", "")[:1] * 64


async def push(hub: AdminHub, version: str) -> None:
    model = objects.ModelRecord("det", version, sha(version), 1234, b"{signed}", 1.0)
    await hub.ctx.store.put(objects.model_key("det", version), objects.dumps(model.to_json()))
    hub.ctx.cache.models[("det", version)] = model


async def report(
    hub: AdminHub, version: str, generation: int, phase: RevisionPhase = RevisionPhase.READY
) -> None:
    ready = 1 if phase is RevisionPhase.READY else 0
    rev = RevisionReport(version, sha(version), phase, ready, wanted=True)
    hub.ctx.writer.update(
        Device(
            name="dev",
            phase=DevicePhase.READY,
            workloads={"det": WorkloadReport(version, desired_replicas=1, revisions=(rev,))},
            observed_generation=generation,
        )
    )
    await hub.ctx.writer.flush()


async def step(hub: AdminHub) -> RolloutState:
    assert hub.ctx.rollouts is not None
    for _ in range(3):
        await hub.ctx.rollouts.reconcile(["det"])
    return hub.ctx.cache.rollouts["det"]


async def carried(hub: AdminHub, number: int) -> int:
    """The generation that carried revision ``number`` of det to the device, once the hub's
    projector (its one batch loop, as in production) has written it."""
    hub.ctx.projector.mark(["dev"])
    for _ in range(500):
        record = hub.ctx.cache.desired.get("dev")
        since = record.carried("det", number) if record is not None else None
        if since is not None:
            await asyncio.sleep(0.05)  # a batch still writing would change it: settled
            assert hub.ctx.cache.desired["dev"].carried("det", number) == since
            return since
        await asyncio.sleep(0.01)
    raise AssertionError(f"revision {number} never projected: {hub.ctx.cache.desired}")


@async_test
async def test_a_report_made_before_the_revision_arrived_neither_completes_nor_breaks_it(
    tmp_path: Path,
) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        for version in ("1.0.0", "2.0.0"):
            await push(hub, version)
        await report(hub, "1.0.0", generation=1)
        await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment("1.0.0")]))
        assert (await step(hub)).phase is RolloutPhase.COMPLETE  # the first revision
        first = await carried(hub, 1)
        await report(hub, "1.0.0", generation=first)

        await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment("2.0.0")]))
        state = await step(hub)
        assert state.revision == 2 and state.updated == frozenset({"dev"})
        since = await carried(hub, 2)
        assert since > first

        # made before generation `since` reached the device: 2.0.0 ready (say, a copy of
        # what it ran once) is not this rollout's doing, nor is a refusal from before
        await report(hub, "2.0.0", generation=since - 1)
        state = await step(hub)
        assert state.phase is RolloutPhase.PROGRESSING, state.message
        await report(hub, "2.0.0", generation=since - 1, phase=RevisionPhase.REFUSED)
        state = await step(hub)
        assert state.phase is RolloutPhase.PROGRESSING, state.message

        # a later generation for another reason keeps a report of `since` fresh
        await report(hub, "2.0.0", generation=since)
        state = await step(hub)
        assert (state.phase, state.reason) == (RolloutPhase.COMPLETE, "RolloutComplete")

        # the same for a refusal made after the revision arrived: rolled back
        await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment("1.0.0")]))
        state = await step(hub)
        assert state.revision == 3 and hub.ctx.cache.revisions["det"][3].source == 1
        again = await carried(hub, 3)
        assert again > since  # the same documents as revision 1, a generation of its own
        await report(hub, "1.0.0", generation=again - 1)  # revision 1's report, say
        assert (await step(hub)).phase is RolloutPhase.PROGRESSING
        await report(hub, "1.0.0", generation=again, phase=RevisionPhase.REFUSED)
        state = await step(hub)
        assert state.phase is RolloutPhase.ROLLED_BACK, state.message


def test_fresh_is_from_the_generation_that_first_carried_the_revision() -> None:
    cache = Cache()
    cache.desired["dev"] = objects.DesiredRecord(9, ("det",), "d", (("det", 4, 6),))
    rev = RevisionReport("2.0.0", sha("2.0.0"), RevisionPhase.READY, 1, wanted=True)
    report = WorkloadReport("2.0.0", desired_replicas=1, revisions=(rev,))

    def device(generation: int) -> Device:
        return Device("dev", phase=DevicePhase.READY, workloads={"det": report},
                      observed_generation=generation)  # fmt: skip

    assert not fresh_report(cache, device(5), "det", 4)
    assert fresh_report(cache, device(6), "det", 4)  # generation 9 is another change
    assert not fresh_report(cache, device(9), "det", 3)  # not the revision it carries
    assert not fresh_report(cache, device(9), "other", 4)
    assert fresh_report(cache, device(0), "det", 4)  # an edged too old to say: its word
    view = view_device(device(5), "det", "2.0.0", sha("2.0.0"), fresh=False)
    assert view.target is TargetPhase.PROGRESSING and view.serving
    assert view_device(device(6), "det", "2.0.0", sha("2.0.0")).target is TargetPhase.READY


def test_the_record_keeps_what_carried_each_revision_across_the_store() -> None:
    record = objects.DesiredRecord(9, ("a", "b"), "d", (("a", 2, 4), ("b", 7, 9)))
    back = objects.DesiredRecord.from_json(orjson.loads(objects.dumps(record.to_json())))
    assert back == record
    assert back.numbers() == (("a", 2), ("b", 7))
    old = objects.DesiredRecord.from_json({"generation": 3, "deployments": ["a"], "digest": "x"})
    assert old.revisions == () and old.carried("a", 1) is None


@async_test
async def test_a_revision_applied_before_the_last_was_projected_waits_for_its_devices(
    tmp_path: Path,
) -> None:
    """Two applies in a row, the second before the projector has placed the devices of the
    first (its batch held here): revision 2 targets no device yet. It is not declared
    complete on that empty set ("serves on every targeted device (0)"), which would then send
    it to every device at once when the projector catches up; it waits, and once the devices
    are placed it goes by its budget (maxSurge 1: one device first)."""
    async with AdminHub(await make_hub_dir(tmp_path / "hub")) as hub, hub.channel() as channel:
        ctx = hub.ctx
        for version in ("1.0.0", "2.0.0"):
            await push(hub, version)
        for i in range(4):
            ctx.writer.update(Device(name=f"dev-{i}", phase=DevicePhase.READY, last_heartbeat=1.0))
        await ctx.writer.flush()
        release = asyncio.Event()
        project = ctx.projector.project

        async def held(names: object) -> None:
            await release.wait()
            await project(names)  # type: ignore[arg-type]

        ctx.projector.project = held  # type: ignore[method-assign]
        stub = hub.stub(channel)
        manifest = orjson.loads(deployment("1.0.0"))
        manifest["spec"]["rollout"] = {"maxSurge": 1, "maxUnavailable": 0}
        await stub.Apply(admin_pb2.ApplyRequest(documents=[orjson.dumps(manifest)]))
        manifest["spec"]["model"]["version"] = "2.0.0"
        await stub.Apply(admin_pb2.ApplyRequest(documents=[orjson.dumps(manifest)]))

        def state() -> RolloutState | None:
            return ctx.cache.rollouts.get("det")

        rollouts = ctx.rollouts
        assert rollouts is not None
        await eventually(
            lambda: (s := state()) is not None and s.revision == 2,
            30,
            "revision 2",
            interval=0.01,
            detail=lambda: repr(state()),
        )
        # two more of the controller's passes: the one that made revision 2 ends, and a whole
        # one after it looks at revision 2 with its devices not placed (and waits PLACE_WAIT)
        passes = rollouts.reconciled
        await eventually(
            lambda: rollouts.reconciled >= passes + 2,
            30,
            "two passes of the rollout controller",
            interval=0.01,
            detail=lambda: f"{rollouts.reconciled - passes} passes; {state()!r}",
        )
        held_state = state()
        assert held_state is not None and held_state.revision == 2, held_state
        assert held_state.phase is RolloutPhase.PROGRESSING, held_state
        assert ctx.cache.targeted("det") == [] and not held_state.updated
        release.set()
        rev = RevisionReport("1.0.0", sha("1.0.0"), RevisionPhase.READY, 1, wanted=True)
        serving = {"det": WorkloadReport("1.0.0", desired_replicas=1, revisions=(rev,))}
        for i in range(4):  # the devices placed serve revision 1
            ctx.writer.update(ctx.cache.devices[f"dev-{i}"].with_(workloads=serving))
        for _ in range(500):
            if (s := state()) is not None and s.updated:
                break
            await asyncio.sleep(0.01)
        after = state()
        assert after is not None and after.phase is RolloutPhase.PROGRESSING, after
        assert len(after.updated) == 1 and after.stable == 1, after  # maxSurge 1
        assert len(ctx.cache.targeted("det")) == 4


@async_test
async def test_a_canary_report_made_before_the_revision_came_decides_no_analysis(
    tmp_path: Path,
) -> None:
    """The canary analysis, like completion, reads only what a device reported after it
    received the revision: a report made before (the accuracy another config was measured
    with, the same model version; or one a rollback left) neither fails nor passes the canary.
    Seen in CI: a config revision rolled back for the accuracy 0.0 of the rolled-back config
    before it, measured before the canary device had the new one."""
    import canarytesting

    async with AdminHub(await make_hub_dir(tmp_path / "hub")) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        for name in canarytesting.DEVICES:
            await canarytesting.report(hub, name, "1.0.0")
        for version in ("1.0.0", "2.0.0"):
            await canarytesting.push(hub, version)
        await stub.Apply(admin_pb2.ApplyRequest(documents=[canarytesting.deployment("1.0.0")]))
        await stub.Apply(admin_pb2.ApplyRequest(documents=[canarytesting.deployment("2.0.0")]))
        state = await canarytesting.step(hub)
        assert state.revision == 2 and state.updated, state
        (canary,) = state.updated
        for _ in range(200):  # the projector carries revision 2 to the canary
            record = hub.ctx.cache.desired.get(canary)
            if record is not None and record.carried("det", 2):
                break
            await asyncio.sleep(0.01)
        assert record is not None
        carried = record.carried("det", 2)
        assert carried

        async def canary_report(generation: int, accuracy: float) -> RolloutState:
            rev = RevisionReport(
                "2.0.0", canarytesting.sha("2.0.0"), RevisionPhase.READY, 1, wanted=True,
                accuracy=accuracy,
            )  # fmt: skip
            workload = WorkloadReport("2.0.0", desired_replicas=1, revisions=(rev,))
            hub.ctx.writer.update(
                Device(
                    name=canary, phase=DevicePhase.READY, workloads={"det": workload},
                    observed_generation=generation,
                )
            )  # fmt: skip
            await hub.ctx.writer.flush()
            return await canarytesting.step(hub)

        stale = await canary_report(carried - 1, 0.0)  # made before revision 2 came
        assert stale.phase is RolloutPhase.PROGRESSING, stale
        fresh = await canary_report(carried, 0.5)  # made after: it decides
        assert (fresh.phase, fresh.reason) == (RolloutPhase.ROLLED_BACK, "AnalysisFailed"), fresh
        assert "accuracy 0.5000" in fresh.message, fresh
