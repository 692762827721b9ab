"""A ModelConfig change rolled out in waves across regions (docs/model-config.md, "Federation"):
a root hub and two regional hubs (eu, us) in this process with their real controllers over
real SQLite and gRPC (tests/hub/wavetesting.py), one simulated device per region.

A config change at the root is a new revision of a deployment in waves: eu (wave 1) is sent
the new config with it, us keeps the stable revision's config through the pause wave that
follows, and gets the new one only once resumed; each region's rollout of it completes, so
the waves complete. A config for a model whose deployment in waves has another deployment
beside it is refused, naming both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from wavetesting import Fleet, Hub, deployment, devices, push, slow_test, until

from edgefleet.v1 import admin_pb2
from hub.decide.wave import WavePhase

WAVES = [{"regions": ["eu"]}, {"pause": {}}]


def config(threshold: float) -> bytes:
    return orjson.dumps(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "ModelConfig",
            "metadata": {"name": "det"},
            "spec": {"model": "det", "data": {"threshold": threshold}},
        }
    )


def threshold_at(hub: Hub) -> Any:
    stored = hub.ctx.cache.stored.get(("ModelConfig", "det"))
    return stored.manifest["spec"]["data"]["threshold"] if stored is not None else None


def complete_at(hub: Hub, revision_at_least: int) -> bool:
    state = hub.ctx.cache.rollouts.get("det")
    return (
        state is not None
        and state.phase.value == "Complete"
        and state.revision >= revision_at_least
    )


@slow_test
async def test_a_config_change_goes_wave_by_wave(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    await fleet.make()
    root = await fleet.root().__aenter__()
    try:
        eu_paths, us_paths = await fleet.region(root, "eu"), await fleet.region(root, "us")
        await push(root, "1.0.0")
        await root.apply(deployment("1.0.0", WAVES))
        async with Hub(eu_paths) as eu, Hub(us_paths) as us, devices(eu, us):
            await until(lambda: complete_at(eu, 1) and complete_at(us, 1), "1.0.0 everywhere")
            waves = root.ctx.waves
            assert waves is not None

            # the first config: a new revision, in waves; then a change of it
            await root.apply(config(0.5))
            await until(lambda: threshold_at(eu) == 0.5, "eu sent the first config")
            state = waves.states["det"]
            await until(lambda: waves.states["det"].phase is WavePhase.PAUSED, "the pause after eu")
            assert threshold_at(us) is None  # us keeps the stable revision: no config yet
            await resume(root)
            await until(lambda: threshold_at(us) == 0.5, "us sent the first config")
            await until(
                lambda: waves.states["det"].phase is WavePhase.COMPLETE, "the waves complete"
            )

            await root.apply(config(0.6))
            await until(lambda: threshold_at(eu) == 0.6, "eu sent the changed config")
            await until(lambda: waves.states["det"].phase is WavePhase.PAUSED, "the pause after eu")
            state = waves.states["det"]
            assert state.released == frozenset({"eu"}), state
            assert threshold_at(us) == 0.5  # the stable revision's config, through the pause
            eu_rollout = eu.ctx.cache.rollouts["det"]
            assert eu_rollout.phase.value == "Complete", eu_rollout  # eu's own rollout of it
            await resume(root)
            await until(lambda: threshold_at(us) == 0.6, "us sent the changed config")
            await until(
                lambda: waves.states["det"].phase is WavePhase.COMPLETE, "the waves complete"
            )
            # each region's revisions: one per config, made by its own rollout
            for hub in (eu, us):
                assert max(hub.ctx.cache.revisions["det"]) >= 3

            # a second deployment of the model beside the one in waves: refused, naming both
            other = orjson.loads(deployment("1.0.0"))
            other["metadata"]["name"] = "det-local"
            other["spec"]["placement"] = {"regions": ["eu"]}
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await root.apply(orjson.dumps(other))
            assert "beside another deployment of its model" in str(err.value.details())
    finally:
        await root.__aexit__(None, None, None)


async def resume(root: Hub) -> None:
    async with root.channel() as channel:
        await root.stub(channel).RolloutAction(
            admin_pb2.RolloutActionRequest(name="det", action=admin_pb2.RolloutActionRequest.RESUME)
        )
