"""A root's rollout across its regions without waves (hub.decide.regionrollout), in this
process: a root hub and two regional hubs (eu, us) made by ``hub init``, each with its real
controllers over real SQLite and gRPC with real certificates on loopback, one device per
region whose reports are written as its Sync stream would (tests/hub/wavetesting.py).

* revision 2 sent to every region at once, both regions' devices refusing it: the root's
  status says RolledBack naming the regions, the revision they serve again as the stable one,
  never Complete; its Progressing condition False;
* then a rollout in waves: the regions not in a wave yet keep revision 1, the last that
  completed everywhere, not revision 2 that they rolled back (the wave state of revision 2
  was Complete from the start: sent to every region, judged by none).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from wavetesting import Fleet, Hub, deployment, devices, push, rolled_out, slow_test, until

from hub.decide.wave import WavePhase


async def rollout_of(root: Hub) -> dict[str, Any]:
    doc = await root.get()
    return dict(doc["status"].get("rollout") or {})


def region_reports(root: Hub, region: str, phase: str, version: str) -> bool:
    state = root.ctx.regions.regions.get(region) if root.ctx.regions else None
    if state is None or not state.connected or state.report is None:
        return False
    return any(
        d.name == "det" and d.rollout_phase == phase and d.versions.get(version)
        for d in state.report.deployments
    )


@slow_test
async def test_regions_roll_a_revision_back_the_root_says_so_and_waves_start_from_before_it(
    tmp_path: Path,
) -> None:
    fleet = Fleet(tmp_path)
    await fleet.make()
    async with fleet.root() as root:
        eu_paths, us_paths = await fleet.region(root, "eu"), await fleet.region(root, "us")
        for version in ("1.0.0", "2.0.0", "3.0.0"):
            await push(root, version)
        await root.apply(deployment("1.0.0"))
        hold = {"3.0.0": asyncio.Event()}
        async with (
            Hub(eu_paths) as eu,
            Hub(us_paths) as us,
            devices(eu, us, refuse=frozenset({"2.0.0"}), hold=hold),
        ):
            for hub in (eu, us):
                await until(lambda h=hub: rolled_out(h, "1.0.0"), f"{hub.ctx.region} on 1.0.0")

            async def complete() -> bool:
                return (await rollout_of(root)).get("phase") == "Complete"

            await until(complete, "the root to say 1.0.0 Complete in every region")

            await root.apply(deployment("2.0.0"))  # to every region at once: no waves
            seen: list[tuple[str, str]] = []

            async def rolled_back() -> dict[str, Any] | None:
                rollout = await rollout_of(root)
                if rollout.get("version") == "2.0.0":
                    seen.append((rollout.get("phase", ""), rollout.get("reason", "")))
                    if "rolled back in region(s) eu, us" in rollout.get("message", ""):
                        return rollout  # (one region first, then both)
                return None

            rollout = await until(
                rolled_back,
                "the root to say its regions rolled 2.0.0 back",
                detail=lambda: str(seen),
            )
            assert all(phase != "Complete" for phase, _ in seen), seen
            assert (rollout["phase"], rollout["reason"]) == ("RolledBack", "RegionRolledBack")
            assert "UnknownKey" in rollout["message"], rollout  # the regions' own reasons
            assert (rollout["stableRevision"], rollout["stableVersion"]) == (1, "1.0.0"), rollout
            status = (await root.get())["status"]
            progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
            assert (progressing["status"], progressing["reason"]) == ("False", "RolledBack")
            for region in ("eu", "us"):
                await until(
                    lambda r=region: region_reports(root, r, "RolledBack", "1.0.0"),
                    f"{region} reports 2.0.0 rolled back",
                )
            events = await until(
                lambda: [
                    e for e in root.events("RegionRolledBack") if "region(s) eu, us" in e["message"]
                ],
                "a RegionRolledBack event naming both regions",
                detail=lambda: str(root.events("RegionRolledBack")),
            )
            assert events[-1]["type"] == "Warning", events
            assert "revision 2 (2.0.0) was rolled back" in events[-1]["message"], events

            # in waves now: us, not in a wave yet, keeps 1.0.0 (not 2.0.0, which it rolled back)
            await root.apply(deployment("3.0.0", [{"regions": ["eu"]}]))
            waves = root.ctx.waves
            assert waves is not None
            await until(lambda: eu.version() == "3.0.0", "eu sent 3.0.0")
            state = waves.states["det"]
            assert (state.phase, state.stable, state.stable_version) == (
                WavePhase.PROGRESSING,
                1,
                "1.0.0",
            ), state
            await until(lambda: us.version() == "1.0.0", "us sent the stable revision, 1.0.0")
            await asyncio.sleep(1.0)  # the slices streamed meanwhile: us stays there
            assert us.version() == "1.0.0"
            hold["3.0.0"].set()
            await until(
                lambda: waves.states["det"].phase is WavePhase.COMPLETE, "the waves complete"
            )
            for hub in (eu, us):
                await until(lambda h=hub: rolled_out(h, "3.0.0"), f"{hub.ctx.region} on 3.0.0")
            await until(complete, "the root to say 3.0.0 Complete")
