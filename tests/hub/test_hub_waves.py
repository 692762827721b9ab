"""Federated rollouts in waves at the hub (docs/federation.md, "Rollouts in waves"): a root hub
and two regional hubs (eu, us) made by ``hub init`` (the regions enrolled with the root's
token and pin), in this process, each with its real controllers (projector, rollouts, the
root's wave controller, the regions' federation link) over real SQLite stores and real gRPC
with real certificates on loopback. Each region has one device whose reports are written as
its Sync stream would (through the region's device writer), answering what the region sends
it: that revision Ready, or Refused.

* wave 1 (eu) passes -> us gets the new revision only then; a root restarted mid-wave goes on
  from its stored state; ``edgectl rollout status`` at the root shows the waves;
* wave 1 fails (eu's device refuses the new revision, eu rolls back) -> the root rolls every
  region back; us never got the new revision;
* wave 1 does not pass within ``progressDeadlineSeconds`` -> the root rolls every region back
  (``ProgressDeadlineExceeded``), ``edgectl rollout status`` exits 1;
* a model variant for eu (``federation.edgefleet.io/model.eu``) -> eu runs it, through the
  waves;
* two root replicas on a real etcd: the one that does not lead shows the waves as the leader
  moves them; regions streaming to the one that does not lead pass the leader's waves (their
  reports shared through the store), and a root restarted shows them from the store with
  their age;
* ``spec.rollout.waves`` is refused at a regional hub and at a hub without regions.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import grpc
import pytest
from asynctesting import async_test
from etcdtesting import EtcdServer
from hubserving import AdminHub, make_hub_dir
from wavetesting import (
    DEADLINE,
    Fleet,
    Hub,
    deployment,
    devices,
    push,
    rolled_out,
    slow_test,
    until,
)

from edgefleet.api import Precision
from edgefleet.timestamps import rfc3339
from edgefleet.v1 import admin_pb2
from hub.controllers.parentlink.regionreport import build_report
from hub.decide.wave import WavePhase
from hub.initializing import HubPaths

WAVES = [{"regions": ["eu"]}]


def reported(root: Hub, region: str, version: str) -> bool:
    state = root.ctx.regions.regions.get(region) if root.ctx.regions else None
    if state is None or not state.connected or state.report is None:
        return False
    return any(
        d.name == "det" and d.rollout_phase == "Complete" and d.versions.get(version)
        for d in state.report.deployments
    )


async def everywhere_on(root: Hub, eu: Hub, us: Hub, version: str) -> None:
    for hub in (eu, us):
        await until(lambda h=hub: rolled_out(h, version), f"{hub.ctx.region} on {version}")

    def now(region: str) -> str:  # the region's state at the time of the failure
        s = root.ctx.regions.regions.get(region) if root.ctx.regions else None
        hub = eu if region == "eu" else us
        own = build_report(hub.ctx.cache, 0, region=hub.ctx.region, rollouts=hub.ctx.rollouts)
        return (
            f"connected {s and s.connected}, at {s and s.reported_at}, report {s and s.report}"
            f"; the region's own report now: {own}"
            f"; its desired states: {sorted(hub.ctx.cache.desired)}"
        )

    for region in ("eu", "us"):
        await until(
            lambda r=region: reported(root, r, version),
            f"{region} reports {version}",
            detail=lambda r=region: now(r),
        )


@pytest.mark.scenario
@slow_test
async def test_wave_one_passes_then_the_other_region_follows_across_a_root_restart(
    tmp_path: Path,
) -> None:
    fleet = Fleet(tmp_path)
    await fleet.make()
    hold = {"2.0.0": asyncio.Event()}
    root = await fleet.root().__aenter__()
    running = [root]
    try:
        eu_paths, us_paths = await fleet.region(root, "eu"), await fleet.region(root, "us")
        await push(root, "1.0.0")
        await push(root, "2.0.0")
        await root.apply(deployment("1.0.0", WAVES))  # a first revision goes everywhere
        async with Hub(eu_paths) as eu, Hub(us_paths) as us, devices(eu, us, hold=hold):
            await everywhere_on(root, eu, us, "1.0.0")
            await root.apply(deployment("2.0.0", WAVES))
            waves = root.ctx.waves
            assert waves is not None
            await until(lambda: eu.version() == "2.0.0", "eu sent 2.0.0")
            state = waves.states["det"]
            assert (state.phase, state.released, state.step) == (
                WavePhase.PROGRESSING,
                frozenset({"eu"}),
                0,
            )
            await asyncio.sleep(1.5)  # eu rolls out (held): us keeps the stable revision
            assert us.version() == "1.0.0" and max(us.ctx.cache.revisions["det"]) == 1

            # the root restarts mid-wave: it goes on from its stored state
            running.remove(root)
            await root.__aexit__(None, None, None)
            root = await fleet.root().__aenter__()
            running.append(root)
            waves = root.ctx.waves
            assert waves is not None
            assert waves.states["det"].released == frozenset({"eu"})
            await until(lambda: reported(root, "us", "1.0.0"), "us reconnects")
            assert us.version() == "1.0.0"
            hold["2.0.0"].set()  # eu's device gets ready on 2.0.0: wave 1 passes
            await until(
                lambda: waves.states["det"].phase is WavePhase.COMPLETE, "the waves complete"
            )
            final = waves.states["det"]
            assert final.stable == final.revision
            passed_at = next(h["at"] for h in final.history if h["wave"] == 1)
            await everywhere_on(root, eu, us, "2.0.0")
            us_new = max(us.ctx.cache.revisions["det"].values(), key=lambda r: r.number)
            assert us_new.model == ("det", "2.0.0") and us_new.created_at >= passed_at
            reasons = [e["reason"] for e in root.ctx.cache.events]
            for reason in ("WaveStarted", "WavePassed", "RolloutComplete"):
                assert reason in reasons, reasons

            from edgectl.rollouts import render

            doc = await root.get()
            shown = doc["status"]["rollout"]["waves"]
            assert [(w["wave"], w["state"]) for w in shown["waves"]] == [
                (1, "Passed"),
                (2, "Passed"),
            ]
            text, phase = render(doc)
            assert phase == "Complete"
            assert "wave 1 [Passed]: regions eu" in text
            assert "then [Passed]: the remaining regions us" in text
    finally:
        for hub in running:
            await hub.__aexit__(None, None, None)


@slow_test
async def test_a_failed_wave_rolls_every_region_back(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    await fleet.make()
    async with fleet.root() as root:
        eu_paths, us_paths = await fleet.region(root, "eu"), await fleet.region(root, "us")
        await push(root, "1.0.0")
        await push(root, "2.0.0")
        # a wave naming a region not enrolled is refused, naming the field
        async with root.channel() as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await root.stub(channel).Apply(
                    admin_pb2.ApplyRequest(documents=[deployment("1.0.0", [{"regions": ["ap"]}])])
                )
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "spec.rollout.waves[0].regions[0]: 'ap' is not an enrolled region" in str(
            err.value.details()
        )
        await root.apply(deployment("1.0.0", WAVES))
        async with (
            Hub(eu_paths) as eu,
            Hub(us_paths) as us,
            devices(eu, us, refuse=frozenset({"2.0.0"})),
        ):
            await everywhere_on(root, eu, us, "1.0.0")
            # a regional hub refuses waves: they are the root's
            async with eu.channel() as channel:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await eu.stub(channel).Apply(
                        admin_pb2.ApplyRequest(documents=[deployment("1.0.0", WAVES)])
                    )
            assert "spec.rollout.waves: this is a regional hub" in str(err.value.details())

            await root.apply(deployment("2.0.0", WAVES))
            waves = root.ctx.waves
            assert waves is not None
            await until(
                lambda: waves.states["det"].phase is WavePhase.ROLLED_BACK, "the waves roll back"
            )
            state = waves.states["det"]
            assert "failed in region eu at wave 1 of 1 (eu)" in state.message
            assert "UnknownKey" in state.message  # the region's figures and reasons
            events = root.events("RolledBack")
            assert events and events[-1]["type"] == "Warning"
            assert "region eu" in events[-1]["message"]
            # eu is sent the stable revision again; us never got the new one
            await until(lambda: eu.version() == "1.0.0", "eu back on 1.0.0")
            await everywhere_on(root, eu, us, "1.0.0")
            assert all(r.model[1] == "1.0.0" for r in us.ctx.cache.revisions["det"].values())
            assert us.version() == "1.0.0"

            from edgectl.rollouts import render

            text, phase = render(await root.get())
            assert phase == "RolledBack"
            assert "wave 1 [Failed]: regions eu" in text and "wave 1 failed:" in text


@pytest.mark.scenario
@slow_test
async def test_a_wave_not_passed_within_the_progress_deadline_rolls_every_region_back(
    tmp_path: Path,
) -> None:
    """eu's own rollout of 2.0.0 stops at a canary pause (which no region deadline bounds):
    the root's wave 1 (eu) does not pass within progressDeadlineSeconds, and every region is
    sent 1.0.0 again; ``edgectl rollout status`` at the root exits 1 with the reason."""
    from edgectltesting import edgectl

    canary = {"steps": [{"pause": {}}, "100%"]}
    fleet = Fleet(tmp_path)
    await fleet.make()
    async with fleet.root() as root:
        eu_paths, us_paths = await fleet.region(root, "eu"), await fleet.region(root, "us")
        await push(root, "1.0.0")
        await push(root, "2.0.0")
        await root.apply(deployment("1.0.0", WAVES))
        async with Hub(eu_paths) as eu, Hub(us_paths) as us, devices(eu, us):
            await everywhere_on(root, eu, us, "1.0.0")
            await root.apply(deployment("2.0.0", WAVES, canary, deadline=3))
            waves = root.ctx.waves
            assert waves is not None
            await until(lambda: eu.version() == "2.0.0", "eu sent 2.0.0")
            await until(
                lambda: waves.states["det"].phase is WavePhase.ROLLED_BACK, "the waves roll back"
            )
            state = waves.states["det"]
            assert state.reason == "ProgressDeadlineExceeded", state.message
            assert (
                "did not pass wave 1 of 1 (eu) within progressDeadlineSeconds 3 s: "
                "not finished in eu (eu: "
            ) in state.message
            assert "devices updated" in state.message  # eu's figures
            assert "every region (eu) is sent revision 1 (1.0.0) again" in state.message
            events = root.events("RolledBack")
            assert events and events[-1]["type"] == "Warning"
            assert events[-1]["message"] == state.message
            assert state.history[-1]["regions"]["eu"]["desiredDevices"] == 1
            # eu is sent 1.0.0 again (a new rollout there, from its stable revision: its
            # device never left 1.0.0); us never got 2.0.0
            await until(lambda: eu.version() == "1.0.0", "eu back on 1.0.0")
            sent = eu.ctx.cache.revision_for("det", "cam-eu-0")
            assert sent is not None and sent.model == ("det", "1.0.0")
            assert all(r.model[1] == "1.0.0" for r in us.ctx.cache.revisions["det"].values())
            assert rolled_out(us, "1.0.0")

            shown = await asyncio.to_thread(
                edgectl, root.paths.admin_config, "rollout", "status", "det"
            )
            assert shown.returncode == 1, shown
            assert "rolled back (ProgressDeadlineExceeded)" in shown.stderr, shown.stderr
            assert "wave 1 [Failed]: regions eu" in shown.stdout, shown.stdout


@pytest.mark.scenario
@slow_test
async def test_a_root_replica_that_does_not_lead_shows_the_waves_where_they_are(
    tmp_path: Path, etcd_server: EtcdServer, etcd_namespace: str
) -> None:
    """Two root replicas on one real etcd (copies of one data directory), r0 leading; eu's
    hub streams to r0. As r0's wave controller moves (wave 1 passes, then it waits for us,
    unreachable; then an operator pauses it), r1 (following, its controllers idle) shows the
    same state in ``status.rollout.waves`` and sends each region the same revision."""
    fleet = Fleet(tmp_path)
    await fleet.make(store=f"etcd://{etcd_server.endpoint}{etcd_namespace}")
    shutil.copytree(fleet.root_paths.data_dir, tmp_path / "r1")
    async with fleet.root() as leader:
        assert leader.ctx.elector is not None
        await until(lambda: leader.ctx.elector and leader.ctx.elector.leading, "r0 leads")
        eu_paths = await fleet.region(leader, "eu")
        await fleet.region(leader, "us")  # enrolled, never running: unreachable
        await push(leader, "1.0.0")
        await push(leader, "2.0.0")
        await leader.apply(deployment("1.0.0", WAVES))
        async with Hub(HubPaths.of(tmp_path / "r1")) as follower, Hub(eu_paths) as eu:
            assert follower.ctx.elector is not None and not follower.ctx.elector.leading
            assert follower.ctx.waves is not None and leader.ctx.waves is not None
            async with devices(eu):
                await until(lambda: rolled_out(eu, "1.0.0"), "eu on 1.0.0")
                await leader.apply(deployment("2.0.0", WAVES))
                waves = leader.ctx.waves
                await until(
                    lambda: (
                        waves.states["det"].reason == "RegionUnreachable"
                        and waves.states["det"].step == 1
                    ),
                    "wave 1 passes, then the wave waits for us",
                    detail=lambda: waves.states["det"].message,
                )

            def shown_on_follower() -> dict[str, Any] | None:
                assert follower.ctx.waves is not None
                return follower.ctx.waves.status("det")

            await until(
                lambda: (shown_on_follower() or {}).get("reason") == "RegionUnreachable",
                "the follower shows the waves' current state",
                detail=lambda: str(shown_on_follower()),
            )
            on_follower = (await follower.get())["status"]["rollout"]["waves"]
            on_leader = (await leader.get())["status"]["rollout"]["waves"]
            for key in ("revision", "stableRevision", "phase", "reason", "message", "step"):
                assert on_follower[key] == on_leader[key], key
            assert (on_follower["revision"], on_follower["step"]) == (2, 2)
            assert [w["state"] for w in on_follower["waves"]] == ["Passed", "Progressing"]
            assert on_follower["conditions"][0]["status"] == "False"
            assert on_follower["history"] == on_leader["history"]
            # the slices a follower streams are the leader's: both regions released
            assert follower.ctx.waves.states["det"].released == frozenset({"eu", "us"})
            stored = follower.ctx.cache.stored[("ModelDeployment", "det")].manifest
            for region in ("eu", "us"):
                sent = follower.ctx.waves.manifest_for(region, stored)
                assert sent == leader.ctx.waves.manifest_for(region, stored)
                assert sent["spec"]["model"]["version"] == "2.0.0"
            # an operator's pause at the leader: the follower shows it; it refuses one itself
            async with leader.channel() as channel:
                await leader.stub(channel).RolloutAction(
                    admin_pb2.RolloutActionRequest(
                        name="det", action=admin_pb2.RolloutActionRequest.PAUSE
                    )
                )
            await until(
                lambda: (shown_on_follower() or {}).get("phase") == "Paused",
                "the follower shows the pause",
            )

            from edgectl.rollouts import render

            text, phase = render(await follower.get())
            assert phase == "Paused" and "wave 1 [Passed]: regions eu" in text, text


CANARY = {
    "steps": ["100%"],
    "analysis": {"maxErrorRateIncrease": 0.05, "minRequests": 10, "window": "2s"},
}


def seen_on(hub: Hub, region: str, version: str) -> bool:
    """``hub`` sees ``region`` connected, its rollout of ``version`` Complete, whatever
    replica the region streams to (hub.state.sharedreports)."""
    regions = hub.ctx.regions
    state = regions.regions.get(region) if regions is not None else None
    if regions is None or state is None:
        return False
    seen = regions.seen(state)
    return seen.connected and any(
        d.name == "det" and d.rollout_phase == "Complete" and d.versions.get(version)
        for d in (seen.report.deployments if seen.report is not None else ())
    )


@pytest.mark.scenario
@slow_test
async def test_regions_streaming_to_a_replica_that_does_not_lead_pass_the_leaders_waves(
    tmp_path: Path, etcd_server: EtcdServer, etcd_namespace: str
) -> None:
    """Two root replicas on one real etcd: r0 leads on another port, r1 (following) is at
    the address the regions enroll with and stream to. The regions' reports reach r0 through
    the store: its wave 1 (eu) passes (its analysis across regions too) and us follows, never
    held as unreachable; r1 shows the analysis across regions as well, sampling the reports
    itself; both replicas show each region's figures, connected, with the time of its
    report. Then the
    root restarts (both replicas stop, the regions too; r0 alone starts again): it shows the
    regions' last reports from the store with their age, the regions disconnected."""
    fleet = Fleet(tmp_path)
    await fleet.make(store=f"etcd://{etcd_server.endpoint}{etcd_namespace}")
    shutil.copytree(fleet.root_paths.data_dir, tmp_path / "r1")
    async with Hub(fleet.root_paths) as leader:
        assert leader.ctx.elector is not None and leader.ctx.waves is not None
        await until(lambda: leader.ctx.elector and leader.ctx.elector.leading, "r0 leads")
        async with Hub(HubPaths.of(tmp_path / "r1"), listen=fleet.address) as follower:
            assert follower.ctx.elector is not None and not follower.ctx.elector.leading
            eu_paths = await fleet.region(follower, "eu")  # enrolled at r1
            us_paths = await fleet.region(follower, "us")
            await until(
                lambda: {"eu", "us"} <= set(leader.ctx.regions.regions),  # type: ignore[union-attr]
                "the leader knows the regions enrolled at r1",
            )
            await push(leader, "1.0.0")
            await push(leader, "2.0.0")
            await leader.apply(deployment("1.0.0", WAVES, CANARY))
            async with Hub(eu_paths) as eu, Hub(us_paths) as us, devices(eu, us):
                for hub in (eu, us):
                    await until(lambda h=hub: rolled_out(h, "1.0.0"), f"{hub.ctx.region} on 1.0.0")
                for region in ("eu", "us"):
                    await until(lambda r=region: seen_on(leader, r, "1.0.0"), f"r0 sees {region}")
                regions = leader.ctx.regions
                assert regions is not None
                assert not regions.regions["eu"].connected  # not streaming to r0 ...
                assert follower.ctx.regions and follower.ctx.regions.regions["eu"].connected
                await leader.apply(deployment("2.0.0", WAVES, CANARY))
                waves = leader.ctx.waves

                def analysis_on_follower() -> dict[str, Any] | None:
                    assert follower.ctx.waves is not None
                    shown: dict[str, Any] | None = (follower.ctx.waves.status("det") or {}).get(
                        "analysis"
                    )
                    return shown

                await until(
                    lambda: (analysis_on_follower() or {}).get("canary", {}).get("requests"),
                    "r1 shows the analysis across regions, with eu's figures",
                    detail=lambda: str(analysis_on_follower()),
                )
                await until(
                    lambda: (
                        waves.states["det"].revision == 2
                        and waves.states["det"].phase is WavePhase.COMPLETE
                    ),
                    "the leader's waves pass eu, then us, on reports shared through the store",
                    detail=lambda: waves.states["det"].message,
                )
                assert [h["outcome"] for h in waves.states["det"].history][-2:] == [
                    "Passed",
                    "Passed",
                ], waves.states["det"].history
                assert not leader.events("WaveWaiting"), leader.events("WaveWaiting")
                for hub in (eu, us):
                    await until(lambda h=hub: rolled_out(h, "2.0.0"), f"{hub.ctx.region} on 2.0.0")
                await until(lambda: seen_on(leader, "us", "2.0.0"), "r0 sees us on 2.0.0")
                for replica in (leader, follower):
                    shown = (await replica.get())["status"]["regions"]
                    for region in ("eu", "us"):
                        assert shown[region]["connected"] is True, (region, shown)
                        assert shown[region]["reportAgeSeconds"] < DEADLINE, shown[region]
                        assert shown[region]["versions"] == {"2.0.0": 1}, shown[region]
            # the regions' hubs stop: r1 closes their links, and r0 shows them disconnected
            for region in ("eu", "us"):
                await until(
                    lambda r=region: not regions.seen(regions.regions[r]).connected,
                    f"r0 sees {region} disconnected",
                )
            reported_at = {
                r: leader.ctx.regions.seen(s).reported_at  # type: ignore[union-attr]
                for r, s in leader.ctx.regions.regions.items()  # type: ignore[union-attr]
            }
    # the root restarts, its regions away: their last reports from the store, with their age
    await asyncio.sleep(1.0)
    async with Hub(fleet.root_paths) as again:
        shown = (await again.get())["status"]["regions"]
        for region in ("eu", "us"):
            figures = shown[region]
            assert figures["connected"] is False, figures  # never shown as fresh
            assert figures["reportedAt"] == rfc3339(reported_at[region]), figures
            assert figures["reportAgeSeconds"] >= 1.0, figures
            assert figures["versions"] == {"2.0.0": 1}, figures
        summary = {row["region"]: row for row in again.ctx.regions.summary()}  # type: ignore[union-attr]
        assert summary["eu"]["connected"] is False and summary["eu"]["reportAgeSeconds"] >= 1.0


@pytest.mark.scenario
@slow_test
async def test_a_region_runs_its_model_variant_and_the_waves_move_it(tmp_path: Path) -> None:
    """``federation.edgefleet.io/model.eu: det-int8``: eu runs det-int8 at the deployment's
    versions (fetching only those artifacts), us runs det (at fp16, its own override); a new
    version goes in waves."""
    variant = {
        "federation.edgefleet.io/model.eu": "det-int8",
        "federation.edgefleet.io/precision.us": "fp16",  # us: det's fp16 extra
    }
    fleet = Fleet(tmp_path)
    await fleet.make()
    async with fleet.root() as root:
        eu_paths, us_paths = await fleet.region(root, "eu"), await fleet.region(root, "us")
        for name in ("det", "det-int8"):
            for version in ("1.0.0", "2.0.0"):
                await push(root, version, name)
        # an override for the root's own region would apply to nothing: refused
        async with root.channel() as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await root.stub(channel).Apply(
                    admin_pb2.ApplyRequest(
                        documents=[
                            deployment(
                                "1.0.0", annotations={"federation.edgefleet.io/model.root": "x"}
                            )
                        ]
                    )
                )
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert (
            'documents[0].metadata.annotations["federation.edgefleet.io/model.root"]: names '
            "this hub's own region 'root'"
        ) in str(err.value.details())
        await root.apply(deployment("1.0.0", WAVES, annotations=variant))
        async with Hub(eu_paths) as eu, Hub(us_paths) as us, devices(eu, us):
            await everywhere_on(root, eu, us, "1.0.0")

            def model_of(hub: Hub) -> tuple[str, str] | None:
                sent = hub.ctx.cache.revision_for("det", f"cam-{hub.ctx.region}-0")
                return sent.model if sent is not None else None

            assert model_of(eu) == ("det-int8", "1.0.0")
            assert model_of(us) == ("det", "1.0.0")
            await root.apply(deployment("2.0.0", WAVES, annotations=variant))
            waves = root.ctx.waves
            assert waves is not None
            await until(
                lambda: waves.states["det"].phase is WavePhase.COMPLETE, "the waves complete"
            )
            assert waves.states["det"].history[0]["regions"]["eu"]["rollout"]["phase"] == (
                "Complete"
            )
            await everywhere_on(root, eu, us, "2.0.0")
            assert model_of(eu) == ("det-int8", "2.0.0")
            assert model_of(us) == ("det", "2.0.0")
            assert us.ctx.cache.deployments["det"].spec.runtime.precision == Precision.FP16
            assert eu.ctx.cache.deployments["det"].spec.runtime.precision is None
            assert {m for m in eu.ctx.cache.models if m[0] == "det"} == set()
            assert {m for m in us.ctx.cache.models if m[0] == "det-int8"} == set()


@async_test
async def test_waves_are_refused_at_a_hub_without_regions(tmp_path: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub, hub.channel() as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await hub.stub(channel).Apply(
                admin_pb2.ApplyRequest(documents=[deployment("1.0.0", WAVES)])
            )
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "documents[0].spec.rollout.waves: this hub has no regional hubs enrolled" in str(
            err.value.details()
        )
        assert "det" not in hub.ctx.cache.deployments


@pytest.mark.scenario
@slow_test
async def test_errors_after_a_region_completed_fail_the_analysis_across_regions(
    tmp_path: Path,
) -> None:
    """eu's own canary passes (no errors while it analyses), then its device answers half of
    the requests with errors: the root, holding wave 1 for the analysis window, compares eu's
    error rate with us's on the stable revision and rolls every region back."""
    canary = {
        "steps": ["100%"],
        "analysis": {"maxErrorRateIncrease": 0.05, "minRequests": 10, "window": "2s"},
    }
    fleet = Fleet(tmp_path)
    await fleet.make()
    async with fleet.root() as root:
        eu_paths, us_paths = await fleet.region(root, "eu"), await fleet.region(root, "us")
        await push(root, "1.0.0")
        await push(root, "2.0.0")
        await root.apply(deployment("1.0.0", WAVES, canary))
        async with (
            Hub(eu_paths) as eu,
            Hub(us_paths) as us,
            devices(eu, us, failing=frozenset({"2.0.0"})),
        ):
            await everywhere_on(root, eu, us, "1.0.0")
            await root.apply(deployment("2.0.0", WAVES, canary))
            waves = root.ctx.waves
            assert waves is not None
            await until(lambda: rolled_out(eu, "2.0.0"), "eu's own rollout completes")
            await until(
                lambda: waves.states["det"].phase is WavePhase.ROLLED_BACK, "the waves roll back"
            )
            state = waves.states["det"]
            assert state.reason == "AnalysisFailed", state.message
            assert "failed the analysis across regions at wave 1 of 1 (eu)" in state.message
            assert "above maxErrorRateIncrease 5.00%" in state.message
            assert state.history[-1]["analysis"]["canary"]["errors"] > 0
            await until(lambda: eu.version() == "1.0.0", "eu back on 1.0.0")
            assert all(r.model[1] == "1.0.0" for r in us.ctx.cache.revisions["det"].values())


@pytest.mark.scenario
@slow_test
async def test_a_percent_wave_holds_every_region_at_its_weight_first(tmp_path: Path) -> None:
    """Two devices a region; waves: 50% of every region, then eu, then (the rest) us."""
    waves_spec = [{"percent": "50%"}, {"regions": ["eu"]}]
    fleet = Fleet(tmp_path)
    await fleet.make()
    async with fleet.root() as root:
        eu_paths, us_paths = await fleet.region(root, "eu"), await fleet.region(root, "us")
        await push(root, "1.0.0")
        await push(root, "2.0.0")
        await root.apply(deployment("1.0.0", waves_spec))
        async with Hub(eu_paths) as eu, Hub(us_paths) as us, devices(eu, us, per_region=2):
            await everywhere_on(root, eu, us, "1.0.0")
            await root.apply(deployment("2.0.0", waves_spec))
            waves = root.ctx.waves
            assert waves is not None
            await until(
                lambda: waves.states["det"].phase is WavePhase.COMPLETE, "the waves complete"
            )
            first = waves.states["det"].history[0]
            assert first["wave"] == 1 and first["outcome"] == "Passed"
            for region in ("eu", "us"):  # each held at one of its two devices
                figures = first["regions"][region]
                assert figures["rollout"]["reason"] == "WeightHeld", figures
                assert figures["updatedDevices"] == 1, figures
            await everywhere_on(root, eu, us, "2.0.0")
            for hub in (eu, us):
                state = hub.ctx.cache.rollouts["det"]
                assert len(state.updated) == 2 and state.phase.value == "Complete"
                events = [e["reason"] for e in hub.ctx.cache.events]
                assert "WeightHeld" in events, events


@pytest.mark.scenario
@slow_test
async def test_a_region_unreachable_during_its_wave_holds_it_until_it_is_back(
    tmp_path: Path,
) -> None:
    fleet = Fleet(tmp_path)
    await fleet.make()
    hold = {"2.0.0": asyncio.Event()}
    async with fleet.root() as root:
        eu_paths, us_paths = await fleet.region(root, "eu"), await fleet.region(root, "us")
        await push(root, "1.0.0")
        await push(root, "2.0.0")
        await root.apply(deployment("1.0.0", WAVES))
        async with Hub(us_paths) as us:
            eu = await Hub(eu_paths).__aenter__()
            try:
                async with devices(eu, us, hold=hold):
                    await everywhere_on(root, eu, us, "1.0.0")
                    await root.apply(deployment("2.0.0", WAVES))
                    await until(lambda: eu.version() == "2.0.0", "eu sent 2.0.0")
            finally:
                await eu.__aexit__(None, None, None)  # eu's hub goes away mid-wave
            waves = root.ctx.waves
            assert waves is not None
            await until(lambda: waves.states["det"].reason == "RegionUnreachable", "the wave waits")
            state = waves.states["det"]
            assert state.phase is WavePhase.PROGRESSING and state.step == 0
            assert "region eu is unreachable" in state.message
            doc = await root.get()
            shown = doc["status"]["rollout"]["waves"]
            assert shown["conditions"][0]["status"] == "False"
            eu_row = shown["waves"][0]["regions"]["eu"]  # its last report, and how old it is
            assert eu_row["connected"] is False and eu_row["reportAgeSeconds"] >= 0, eu_row
            from edgectl.rollouts import render

            text, _ = render(doc)
            assert "unreachable (last report" in text, text
            assert us.version() == "1.0.0"
            hold["2.0.0"].set()
            async with Hub(eu_paths) as eu_again, devices(eu_again, us, hold=hold):
                await until(
                    lambda: waves.states["det"].phase is WavePhase.COMPLETE, "the waves complete"
                )
                await everywhere_on(root, eu_again, us, "2.0.0")
            assert any(e["reason"] == "WaveWaiting" for e in root.ctx.cache.events)
