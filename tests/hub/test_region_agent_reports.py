"""A region reports its AgentUpgrades and the edged releases its hub holds to its root
(docs/agent-updates.md "Waves by region"): a root hub and a regional hub made by ``hub init``
(the region enrolled with the root's token and pin), in this process, over real SQLite stores
and real gRPC with real certificates on loopback; the root shows what the region said in
``get region eu -o json`` (``status.agentUpgrades``, ``status.agentReleases``), bounded
(hostile reports: tests/hub/test_hub_federation_slices.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from wavetesting import Fleet, Hub, slow_test

from edgefleet.v1 import admin_pb2
from edgefleet.versioning import installed_version
from hub.decide.agentreleases import AgentReleaseRecord
from hub.decide.presentation import KIND_REGION
from hub.state import storekeys
from hub.state.store import Put, open_hub_store

_MAJOR, _MINOR, _PATCH = (int(x) for x in installed_version().split(".")[:3])
NEW = f"{_MAJOR}.{_MINOR}.{_PATCH + 1}"

UPGRADE = json.dumps(
    {
        "apiVersion": "edgefleet.io/v1",
        "kind": "AgentUpgrade",
        "metadata": {"name": "edged-next"},
        "spec": {"version": NEW},
    }
).encode()


async def hold_release(data: Path, version: str) -> None:
    """The region's hub holds a release of ``version`` (as ``edgectl agent push`` there would
    leave it: its record; the bytes are not needed to be listed)."""
    record = AgentReleaseRecord(version, "x86_64", "cp311", "0" * 64, 10, b"env", 1.0)
    store = await open_hub_store(None, data_dir=data)
    try:
        await store.txn([], [Put(record.key, storekeys.dumps(record.to_json()))])
    finally:
        await store.close()


@pytest.mark.scenario
@slow_test
async def test_the_root_shows_a_regions_agent_upgrades_and_releases(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    await fleet.make()
    async with fleet.root() as root:
        eu_paths = await fleet.region(root, "eu")
        await hold_release(eu_paths.data_dir, NEW)
        async with Hub(eu_paths) as eu:
            await eu.apply(UPGRADE)

            async def shown() -> dict[str, Any]:
                async with root.channel() as channel:  # what edgectl get region eu -o json gets
                    got = await root.stub(channel).Get(
                        admin_pb2.GetRequest(kind=KIND_REGION, name="eu")
                    )
                status: dict[str, Any] = json.loads(got.json)["status"]
                return status

            for _ in range(600):
                status = await shown()
                if "edged-next" in status.get("agentUpgrades") or {}:
                    break
                await asyncio.sleep(0.1)
            upgrade = status["agentUpgrades"]["edged-next"]
            assert upgrade["version"] == NEW and upgrade["phase"] in ("Pending", "Complete")
            assert upgrade["poolDevices"] == 0 and upgrade["failedDevices"] == {}
            assert status["agentReleases"] == [NEW]
