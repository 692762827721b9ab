"""``edgectl rollout promote|abort|restart`` against a real hub: the ``edgectl`` console script
in subprocesses, the hub's AdminService over mutual TLS with its rollout controller on SQLite
(tests/hubserving.py). The devices are records written as a Sync stream would (a canary of four
devices on ``det``); the rollout steps are also taken at once in the test (the controller's
``reconcile``) so each command meets a known state."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from edgectltesting import edgectl
from hubserving import AdminHub, ThreadedHub, make_hub_dir

from edgefleet.v1 import admin_pb2
from hub.decide.devices import Device, DevicePhase, RevisionPhase, RevisionReport, WorkloadReport
from hub.decide.rollout import RolloutPhase, RolloutState
from hub.state import storekeys

DEVICES = [f"dev-{i}" for i in range(4)]
ACTOR = 'admin "admin"'  # hub init's admin certificate


def deployment(version: str, steps: list[Any]) -> str:
    return orjson.dumps(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "ModelDeployment",
            "metadata": {"name": "det"},
            "spec": {
                "model": {"name": "det", "version": version},
                "rollout": {
                    "maxSurge": 0,
                    "maxUnavailable": 1,
                    "canary": {
                        "steps": steps,
                        "analysis": {"minAccuracy": 0.9, "window": "1ms"},
                    },
                },
            },
        }
    ).decode()


STEPS = ["25%", {"pause": {}}, "50%", {"pause": {"duration": "1h"}}, "75%"]


def sha(version: str) -> str:
    return version.replace(".", "")[:1] * 64


async def push(hub: AdminHub, version: str) -> None:
    model = storekeys.ModelRecord("det", version, sha(version), 1234, b"{signed}", 1.0)
    await hub.ctx.store.put(storekeys.model_key("det", version), storekeys.dumps(model.to_json()))
    hub.ctx.cache.models[("det", version)] = model


async def report(hub: AdminHub, names: list[str], version: str, agent: str = "") -> None:
    rev = RevisionReport(version, sha(version), RevisionPhase.READY, 1, wanted=True, accuracy=1.0)
    for name in names:
        hub.ctx.writer.update(
            Device(
                name=name,
                phase=DevicePhase.READY,
                workloads={"det": WorkloadReport(version, desired_replicas=1, revisions=(rev,))},
                agent_version=agent,
            )
        )
    await hub.ctx.writer.flush()


async def target(hub: AdminHub) -> None:
    for name in DEVICES:  # as the projector leaves them: each device is sent det
        hub.ctx.cache.desired[name] = storekeys.DesiredRecord(7, ("det",), "d")


async def step(hub: AdminHub, times: int = 3) -> RolloutState:
    assert hub.ctx.rollouts is not None
    for _ in range(times):
        await target(hub)
        await hub.ctx.rollouts.reconcile(["det"])
    return hub.ctx.cache.rollouts["det"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedHub]:
    import asyncio

    paths = asyncio.run(make_hub_dir(tmp_path_factory.mktemp("rollouts") / "hub"))
    with ThreadedHub(paths) as threaded:
        assert threaded.hub is not None
        threaded.run(report(threaded.hub, DEVICES, "1.0.0"))
        threaded.run(push(threaded.hub, "1.0.0"))
        threaded.run(push(threaded.hub, "2.0.0"))
        threaded.run(target(threaded.hub))
        yield threaded


def state_of(hub: ThreadedHub, times: int = 3) -> RolloutState:
    assert hub.hub is not None
    state: RolloutState = hub.run(step(hub.hub, times))
    return state


def events(config: Path) -> str:
    done = edgectl(config, "get", "events", "--for", "deployment/det")
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_promote_abort_resume_promote_full_then_restart(hub: ThreadedHub) -> None:
    config = hub.paths.admin_config
    assert hub.hub is not None
    applied = edgectl(config, "apply", "-f", "-", stdin=deployment("1.0.0", STEPS))
    assert applied.returncode == 0, applied.stderr
    assert state_of(hub).phase is RolloutPhase.COMPLETE
    applied = edgectl(config, "apply", "-f", "-", stdin=deployment("2.0.0", STEPS))
    assert applied.returncode == 0, applied.stderr
    state = state_of(hub)
    assert (state.revision, state.updated) == (2, frozenset({"dev-0"}))
    hub.run(report(hub.hub, ["dev-0"], "2.0.0"))
    state = state_of(hub)
    assert (state.phase, state.reason, state.step) == (RolloutPhase.PAUSED, "CanaryPause", 1)

    # promote: past the pause until resume (step 2 of 5)
    done = edgectl(config, "rollout", "promote", "deployment/det")
    assert done.returncode == 0, done.stderr
    assert f"det: promoted by {ACTOR} past the pause of canary step 2" in done.stdout
    state = state_of(hub)
    assert state.step == 2 and "dev-1" in state.updated  # 50%
    # at a weight step: nothing to promote, said why, nothing changed
    done = edgectl(config, "rollout", "promote", "det")
    assert done.returncode == 1
    assert "at canary step 3 of 5 (50%), not at a pause: nothing to promote" in done.stderr
    assert "--full skips the remaining steps" in done.stderr

    # abort: every device back on the stable revision, and it stays so
    done = edgectl(config, "rollout", "abort", "det")
    assert done.returncode == 0, done.stderr
    assert f"revision 2 aborted by {ACTOR}; every device is back on revision 1" in done.stdout
    hub.run(report(hub.hub, ["dev-0", "dev-1"], "2.0.0"))
    state = state_of(hub)
    assert (state.phase, state.reason) == (RolloutPhase.ROLLED_BACK, "Aborted")
    assert all(state.revision_for(d) == 1 for d in DEVICES)
    status = edgectl(config, "rollout", "status", "det")
    assert status.returncode == 1 and "(Aborted)" in status.stdout
    got = orjson.loads(edgectl(config, "get", "deployment/det", "-o", "json").stdout)
    progressing = [c for c in got["status"]["conditions"] if c["type"] == "Progressing"]
    assert progressing[0]["reason"] == "RolloutAborted"
    history = edgectl(config, "rollout", "history", "det").stdout
    assert "aborted" in history.splitlines()[-1]
    assert "RolloutAborted" not in events(config)  # the event is the rollout's reason
    assert f"rollout revision 2 aborted by {ACTOR}" in events(config)
    done = edgectl(config, "rollout", "abort", "det")
    assert done.returncode == 1 and "is RolledBack: nothing to abort" in done.stderr

    # resume retries it; promote --full goes past every step
    assert edgectl(config, "rollout", "resume", "det").returncode == 0
    done = edgectl(config, "rollout", "promote", "det", "--full")
    assert done.returncode == 0, done.stderr
    assert "past every remaining canary step" in done.stdout
    hub.run(report(hub.hub, DEVICES, "2.0.0"))
    for _ in range(4):
        state = state_of(hub)
        hub.run(report(hub.hub, DEVICES, "2.0.0"))
    assert state.phase is RolloutPhase.COMPLETE and state.stable == 2, state

    # an edged that would keep its workers: refused, naming it
    hub.run(report(hub.hub, ["dev-3"], "2.0.0", agent="0.1.0"))
    done = edgectl(config, "rollout", "restart", "det")
    assert done.returncode == 1
    assert "edged before 0.2 keeps its workers for it" in done.stderr
    assert "on dev-3 (0.1.0); upgrade them first" in done.stderr
    hub.run(report(hub.hub, ["dev-3"], "2.0.0", agent="0.2.0"))

    # restart: the same template again as a new revision with new workers
    done = edgectl(config, "rollout", "restart", "deployment/det")
    assert done.returncode == 0, done.stderr
    assert "det: revision 2 restarted: rolling out its template again as revision 3" in done.stdout
    state = state_of(hub, 1)
    assert (state.revision, state.stable) == (3, 2) and state.restarted_at
    revision = hub.hub.ctx.cache.revisions["det"][3]
    assert revision.manifest["metadata"]["annotations"] == {
        "edgefleet.io/restartedAt": state.restarted_at
    }
    assert revision.manifest["spec"] == hub.hub.ctx.cache.revisions["det"][2].manifest["spec"]
    history = edgectl(config, "rollout", "history", "det").stdout
    assert f"restarted {state.restarted_at}" in history.splitlines()[-1]
    assert f"rollout revision 2 restarted by {ACTOR}" in events(config)
    # the same manifest applied again makes no other revision
    applied = edgectl(config, "apply", "-f", "-", stdin=deployment("2.0.0", STEPS))
    assert applied.returncode == 0, applied.stderr
    assert max(hub.hub.ctx.cache.revisions["det"]) == 3


def test_an_agentupgrade_cannot_be_promoted_aborted_or_restarted_yet(hub: ThreadedHub) -> None:
    config = hub.paths.admin_config
    for verb in ("promote", "abort", "restart"):
        done = edgectl(config, "rollout", verb, "agentupgrade/fleet")
        assert done.returncode == 2
        assert f"rollout {verb} is not supported yet for an AgentUpgrade" in done.stderr

    async def call(action: int) -> str:
        assert hub.hub is not None
        async with hub.hub.channel() as channel:
            try:
                await hub.hub.stub(channel).RolloutAction(
                    admin_pb2.RolloutActionRequest(name="fleet", action=action, kind="AgentUpgrade")
                )
            except grpc.aio.AioRpcError as exc:
                return f"{exc.code().name}: {exc.details()}"
        return "answered"

    got = hub.run(call(admin_pb2.RolloutActionRequest.ABORT))
    assert got.startswith("FAILED_PRECONDITION: rollout abort is not supported yet")


def test_a_rollout_action_on_a_missing_deployment_is_not_found(hub: ThreadedHub) -> None:
    done = edgectl(hub.paths.admin_config, "rollout", "promote", "nope")
    assert done.returncode != 0 and 'ModelDeployment "nope" not found' in done.stderr
