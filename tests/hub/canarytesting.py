"""A canary rollout on an in-process hub, for its tests: the fleet's devices, a deployment with a
canary analysis, pushing a version, device reports and rollout steps."""

from __future__ import annotations

import orjson
from hubserving import AdminHub

from hub.decide.devices import Device, DevicePhase, RevisionPhase, RevisionReport, WorkloadReport
from hub.decide.rollout import RolloutState
from hub.state import storekeys as objects

DEVICES = [f"dev-{i}" for i in range(4)]


def deployment(version: str) -> bytes:
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
                        "steps": ["25%", {"pause": {}}, "50%"],
                        "analysis": {"minAccuracy": 0.9, "window": "1ms"},
                    },
                },
            },
        }
    )


def sha(version: str) -> str:
    return version.replace(".", "")[:1] * 64


async def push(hub: AdminHub, version: str) -> None:
    model = objects.ModelRecord("det", version, sha(version), 1234, b"{signed}", 1.0)
    await hub.ctx.store.put(objects.model_key("det", version), objects.dumps(model.to_json()))
    hub.ctx.cache.models[("det", version)] = model


async def report(hub: AdminHub, name: str, version: str, accuracy: float | None = None) -> None:
    rev = RevisionReport(
        version, sha(version), RevisionPhase.READY, 1, wanted=True, accuracy=accuracy
    )
    hub.ctx.writer.update(
        Device(
            name=name,
            phase=DevicePhase.READY,
            workloads={"det": WorkloadReport(version, desired_replicas=1, revisions=(rev,))},
        )
    )
    await hub.ctx.writer.flush()


async def step(hub: AdminHub, times: int = 3) -> RolloutState:
    assert hub.ctx.rollouts is not None
    for _ in range(times):
        await hub.ctx.rollouts.reconcile(["det"])
    return hub.ctx.cache.rollouts["det"]
