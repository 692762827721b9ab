"""A region reports its AgentUpgrades and the edged releases its hub holds to its root
(docs/agent-updates.md "Waves by region"): a root hub and a regional hub made by ``hub init``
(the region enrolled with the root's token and pin), in this process, over real SQLite stores
and real gRPC with real certificates on loopback; the root shows what the region said in
``get region eu -o json`` (``status.agentUpgrades``, ``status.agentReleases``), bounded
(hostile reports: tests/hub/test_hub_federation_slices.py)."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from wavetesting import Fleet, Hub, slow_test

from edgefleet.api import AgentUpgrade, Wave, parse_manifest
from edgefleet.v1 import admin_pb2, federation_pb2
from edgefleet.versioning import installed_version
from hub.controllers.agentwaves import AgentWaveController
from hub.controllers.parentlink.regionreport import agent_upgrade_status
from hub.decide import regionslice
from hub.decide.agentreleases import AgentReleaseRecord
from hub.decide.agentrevisions import AgentRevision, AgentUpgradeState
from hub.decide.agentupgrade import plan_upgrade
from hub.decide.agentwaves import (
    AgentWavePhase,
    RegionAgentView,
    plan_agent_waves,
    read_region_claim,
    start,
)
from hub.decide.presentation import KIND_REGION
from hub.decide.revisions import RolloutPhase
from hub.state import storekeys
from hub.state.cache import Cache
from hub.state.regions import Regions, RegionState
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


# -- a root's next revision put by the slice, before the region's controller starts it ---------

NEWER = f"{_MAJOR}.{_MINOR}.{_PATCH + 2}"


def root_sent(version: str, root_revision: int) -> dict[str, Any]:
    """An AgentUpgrade as a root's waves send it to a region (hub.controllers.agentwaves)."""
    return {
        "apiVersion": "edgefleet.io/v1",
        "kind": "AgentUpgrade",
        "metadata": {
            "name": "edged-next",
            "annotations": {regionslice.ROOT_REVISION: str(root_revision)},
        },
        "spec": {"version": version, "selector": {"matchLabels": {"site": "retail"}}},
    }


def root_view(
    cache: Cache, root: tuple[int, str] = (0, ""), *, before_the_fix: bool = False
) -> RegionAgentView:
    """What the root at revision ``root`` (number, version) reads of the region's report
    (hub.controllers.agentwaves.views). ``before_the_fix``: the report as a regional hub from
    before commit 251287d made it: the manifest's annotation claimed whatever the record."""
    manifest = cache.stored[("AgentUpgrade", "edged-next")].manifest
    found = agent_upgrade_status(cache, manifest)
    claimed = found.root_revision
    if before_the_fix:
        claimed = int(manifest["metadata"]["annotations"][regionslice.ROOT_REVISION])
    claim = {
        "releases": [NEW, NEWER],
        "name": found.name,
        "rootRevision": claimed,
        "version": found.version,
        "phase": found.phase,
        "pool": found.pool,
        "done": found.done,
        "updating": found.updating,
        "failed": dict(found.failed),
    }
    return read_region_claim("us", claim, upgrade="edged-next", connected=True,
                             inventory_total=2, revision=root[0], version=root[1])  # fmt: skip


def test_a_regions_previous_revision_is_never_claimed_for_the_roots_next_one() -> None:
    """Under load in CI the root's revision 3 (``rollout undo`` after revision 2 rolled back in
    us) was sent to us, and us's report, made before its controller started the new revision,
    said revision 3 RolledBack: the previous record's phase under the new manifest's annotation.
    The root stopped revision 3 (RegionFailed) on what it never did. The region claims the
    root's revision only once its record is of that manifest."""
    cache = Cache()
    cache.put_object(root_sent(NEWER, 2), 1)
    up2 = parse_manifest(root_sent(NEWER, 2))
    assert isinstance(up2, AgentUpgrade)
    commit = (up2.spec.commit.deadline_s, up2.spec.commit.max_tries)
    revisions = (AgentRevision(1, NEW, *commit, 1.0), AgentRevision(2, NEWER, *commit, 2.0))
    cache.agent_upgrades["edged-next"] = AgentUpgradeState(
        "edged-next", 2, revisions, RolloutPhase.ROLLED_BACK, "FailureThresholdReached",
        failed={"us0": "CrashLoop: exited 3 times"},
    )  # fmt: skip
    seen = root_view(cache, (2, NEWER))
    assert (seen.revision, seen.phase) == (2, "RolledBack"), seen

    # the root's revision 3 (undo to NEW) released to us by the slice; no controller pass yet
    cache.put_object(root_sent(NEW, 3), 2)
    waves = (Wave(regions=("eu",)), Wave(regions=("us",)))
    root = replace(start("edged-next", 3, NEW, 10.0), released=frozenset({"eu", "us"}), step=1)
    seen = root_view(cache, (3, NEW))
    assert seen.revision == 0, seen  # the record is revision 2's: no claim for revision 3
    step = plan_agent_waves(waves, root, ("eu", "us"), {"us": seen}, 11.0)
    assert step.state is None or step.state.phase is AgentWavePhase.PROGRESSING, step
    # a regional hub from before the fix claims revision 3 with the record's RolledBack, but
    # names the record's version (NEWER, revision 2's): the root counts it for nothing
    stale = root_view(cache, (3, NEW), before_the_fix=True)
    assert (stale.revision, stale.phase, stale.stale) == (0, "RolledBack", NEWER), stale
    step = plan_agent_waves(waves, root, ("eu", "us"), {"us": stale}, 11.0)
    assert step.state is None or step.state.phase is AgentWavePhase.PROGRESSING, step

    # the controller's pass: revision 3 in the region, its devices already on NEW: Complete
    up3 = parse_manifest(root_sent(NEW, 3))
    assert isinstance(up3, AgentUpgrade)
    state = cache.agent_upgrades["edged-next"]
    for now in (12.0, 13.0):
        planned = plan_upgrade(up3, state, [], {}, installed_version(), now)
        state = planned.state or state
        cache.agent_upgrades["edged-next"] = state
    assert state.revision == 3 and state.phase is RolloutPhase.COMPLETE, state
    seen = root_view(cache, (3, NEW))
    assert (seen.revision, seen.phase) == (3, "Complete"), seen
    step = plan_agent_waves(waves, root, ("eu", "us"), {"us": seen}, 14.0)
    assert step.state is not None and step.state.reason == "WavePassed", step  # us's wave


def test_the_root_counts_no_claim_of_its_revision_naming_another_version(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The root's wave controller reading a report from a regional hub that still runs code
    from before that fix (or a hostile one): us claims the root's revision 3 RolledBack with
    revision 2's version. The root counts it as no claim of revision 3 (its wave neither
    stops nor passes), shows it in the region's row as not counted, and logs it once however
    often it reads the report."""
    upgrade = json.loads(UPGRADE) | {
        "spec": {"version": NEW, "rollout": {"waves": [{"regions": ["us"]}]}}
    }
    cache = Cache()
    cache.put_object(upgrade, 1)
    regions = Regions()
    report = federation_pb2.RegionReport(
        inventory=federation_pb2.RegionInventory(total=2),
        agent_upgrades=[
            federation_pb2.RegionAgentUpgradeStatus(
                name="edged-next", version=NEWER, phase="RolledBack", revision=2,
                pool=2, failed_count=1, failed={"us0": "CrashLoop"}, root_revision=3,
            )
        ],
    )  # fmt: skip
    regions.regions["us"] = RegionState(
        "us", "1", 0.0, connected=True, connected_at=1.0, report=report, reported_at=2.0
    )
    waves = AgentWaveController(None, cache, regions, None)  # type: ignore[arg-type]
    root = replace(start("edged-next", 3, NEW, 10.0), released=frozenset({"us"}))
    waves.states["edged-next"] = root
    caplog.set_level(logging.WARNING)
    for _ in range(3):  # every pass and every status read sees the report again
        seen = waves.views("edged-next")["us"]
        status = waves.status("edged-next")
    assert (seen.revision, seen.stale) == (0, NEWER), seen
    step = plan_agent_waves((Wave(regions=("us",)),), root, ("us",), {"us": seen}, 11.0)
    assert step.state is None or step.state.phase is AgentWavePhase.PROGRESSING, step
    assert status is not None and status["failedDevices"] == {} and status["poolDevices"] == 0
    row = status["waves"][0]["regions"]["us"]
    assert "phase" not in row and f"with edged {NEWER}, not that revision" in row["notCounted"]
    logged = [r for r in caplog.records if "claim not counted" in r.getMessage()]
    assert len(logged) == 1, logged

    # once us runs revision 3 and says so, with its version: counted
    report.agent_upgrades[0].version = NEW
    report.agent_upgrades[0].phase = "Complete"
    seen = waves.views("edged-next")["us"]
    assert (seen.revision, seen.phase, seen.stale) == (3, "Complete", ""), seen
