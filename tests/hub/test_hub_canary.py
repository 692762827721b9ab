"""The rollout controller on canary steps, over a real SQLite store and real gRPC: device
reports are written as the Sync stream would (through the device writer); the controller is
stepped by hand. A hub started again on the same store goes on from the stored step and
takes none twice."""

from __future__ import annotations

from pathlib import Path

import orjson
from asynctesting import async_test
from canarytesting import DEVICES, deployment, push, report, step
from hubserving import AdminHub, make_hub_dir

from edgefleet.v1 import admin_pb2
from hub.decide.rollout import RolloutPhase
from hub.state import storekeys as objects


async def events(hub: AdminHub, reason: str) -> int:
    return sum(1 for e in hub.ctx.cache.events if e.get("reason") == reason)


@async_test
async def test_canary_steps_resume_from_the_store_and_none_is_taken_twice(tmp_path: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        for name in DEVICES:
            await report(hub, name, "1.0.0")
        await push(hub, "1.0.0")
        await push(hub, "2.0.0")
        await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment("1.0.0")]))
        for name in DEVICES:
            hub.ctx.cache.desired[name] = objects.DesiredRecord(7, ("det",), "d")
        await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment("2.0.0")]))
        state = await step(hub)
        assert (state.step, state.updated) == (0, frozenset({"dev-0"}))  # 25%: one device
        await report(hub, "dev-0", "2.0.0")  # ready, accuracy not reported yet: waits
        state = await step(hub)
        assert state.step == 0 and state.step_ready_at > 0
        await report(hub, "dev-0", "2.0.0", accuracy=0.95)
        state = await step(hub)
        assert (state.step, state.phase, state.reason) == (1, RolloutPhase.PAUSED, "CanaryPause")
        got = orjson.loads(
            (await stub.Get(admin_pb2.GetRequest(kind="ModelDeployment", name="det"))).json
        )
        canary = got["status"]["rollout"]["canary"]
        assert canary["step"] == 2 and canary["analysis"]["verdict"] == "Pass"
        passed = await events(hub, "CanaryStepPassed")
        assert passed == 1

    # a hub started again on the same store: at the pause, nothing is taken again
    async with AdminHub(paths) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        for name in DEVICES:
            hub.ctx.cache.desired[name] = objects.DesiredRecord(7, ("det",), "d")
        again = await step(hub)
        assert (again.step, again.phase, again.updated) == (1, RolloutPhase.PAUSED, state.updated)
        assert again.steps == state.steps
        await stub.RolloutAction(
            admin_pb2.RolloutActionRequest(name="det", action=admin_pb2.RolloutActionRequest.RESUME)
        )
        moved = await step(hub)
        assert moved.step == 2 and moved.updated == frozenset({"dev-0", "dev-1"})  # 50%
        # a canary device below minAccuracy: every device goes back, the figures said
        await report(hub, "dev-1", "2.0.0", accuracy=0.5)
        back = await step(hub)
        assert (back.phase, back.reason) == (RolloutPhase.ROLLED_BACK, "AnalysisFailed")
        assert "accuracy 0.5000 on the validation set is below minAccuracy 0.9" in back.message
        # the canary devices go back in turn, within the budget (1): each serves revision
        # 2 until it is its turn (hub.decide.rolloutholds.hold)
        assert back.held == {"dev-1": back.revision} and back.returning == {"dev-0"}
        assert all(back.revision_for(d) == back.stable for d in DEVICES if d != "dev-1")
        await report(hub, "dev-0", "1.0.0")
        back = await step(hub)
        assert not back.held and back.returning == {"dev-1"}
        await report(hub, "dev-1", "1.0.0")
        back = await step(hub)
        assert not back.held and not back.returning
        assert all(back.revision_for(d) == back.stable for d in DEVICES)
        assert back.phase is RolloutPhase.ROLLED_BACK
