"""The Federate stream end to end (docs/federation.md): a root made by ``hub init`` over real
gRPC with real certificates on loopback sends slices to a region and hears its reports; ``get
regions`` shows them; a region applies what the root no longer sends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from asynctesting import async_test, eventually
from hubfederationtesting import (
    Root,
    admin_channel,
    hello,
    inventory_report,
    messages,
    model_value,
    record,
    report,
)

from edgefleet.timestamps import rfc3339
from edgefleet.v1 import admin_pb2, admin_pb2_grpc, federation_pb2, federation_pb2_grpc
from hub import pki
from hub.controllers.parentlink import regionenrollment
from hub.decide import regionslice
from hub.initializing import init_hub
from hub.server import build_context, parent_link
from hub.state import storekeys
from hub.state.regions import Regions, revoke_region
from hub.trustsetup import quickstart_trust


@async_test
async def test_the_stream_sends_the_slice_and_refuses_what_is_out_of_bounds(tmp_path: Path) -> None:
    async with Root(tmp_path) as root:
        paths = await root.enroll("eu")
        async with root.region_channel(paths) as channel:
            stub = federation_pb2_grpc.FederationServiceStub(channel)
            call = stub.Federate(messages(hello("eu"), hold=2))
            first = await call.read()
            assert first.slice.generation > 0 and first.slice.trust_roots
            call.cancel()

            call = stub.Federate(messages(hello("us")))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call.read()
            assert err.value.code() is grpc.StatusCode.PERMISSION_DENIED
            call.cancel()

            big = report(devices=regionslice.MAX_REPORT_DEVICES + 1)
            call = stub.Federate(messages(hello("eu"), federation_pb2.RegionMessage(report=big)))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                while True:
                    await call.read()
            assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "report.inventory.devices" in (err.value.details() or "")
            call.cancel()

            flood = [federation_pb2.RegionMessage(report=report()) for _ in range(60)]
            call = stub.Federate(messages(hello("eu"), *flood))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                while True:
                    await call.read()
            # the root ends the stream with RESOURCE_EXHAUSTED; a client still writing may see
            # its own write fail first (gRPC's INTERNAL "execute_batch"), as elsewhere under load
            assert err.value.code() in (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                grpc.StatusCode.INTERNAL,
            )

            fetch = stub.FetchFederatedArtifact(
                federation_pb2.FetchFederatedArtifactRequest(sha256="a" * 64)
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await fetch.read()
            assert err.value.code() is grpc.StatusCode.PERMISSION_DENIED

        # an admin certificate may not federate; a region enrolled again supersedes its old one
        admin = pki.load_certified_key(root.paths.admin_certificate, root.paths.admin_key)
        async with root.channel(
            pki.certificate_pem(admin.certificate), pki.private_key_pem(admin.key)
        ) as channel:
            call = federation_pb2_grpc.FederationServiceStub(channel).Federate(
                messages(hello("eu"))
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call.read()
            assert err.value.code() is grpc.StatusCode.PERMISSION_DENIED
            call.cancel()
        await root.enroll("eu")
        async with root.region_channel(paths) as channel:
            call = federation_pb2_grpc.FederationServiceStub(channel).Federate(
                messages(hello("eu"))
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call.read()
            assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
            call.cancel()
        await asyncio.sleep(0.6)  # the request generators' last wait


@async_test
async def test_a_change_at_the_root_reaches_an_open_stream_without_waiting_for_the_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hub.api import federation

    monkeypatch.setattr(federation, "SLICE_POLL_S", 60.0)  # only the wake-up can send it in time
    async with Root(tmp_path) as root:
        paths = await root.enroll("eu")
        async with root.region_channel(paths) as channel:
            stub = federation_pb2_grpc.FederationServiceStub(channel)
            call = stub.Federate(messages(hello("eu"), hold=30))
            first = await asyncio.wait_for(call.read(), 10)
            policy = {
                "apiVersion": "edgefleet.io/v1",
                "kind": "DeviceHealthPolicy",
                "metadata": {"name": "health"},
                "spec": {},
            }
            root.ctx.cache.put_object(policy, 99)
            root.ctx.projector.mark_all()  # what an apply does once it is stored
            second = await asyncio.wait_for(call.read(), 10)
            assert second.slice.generation > first.slice.generation
            assert any(b"DeviceHealthPolicy" in o for o in second.slice.objects)
            assert len(root.ctx.regions.wakers) == 1
            call.cancel()
        await asyncio.sleep(0.1)
        assert root.ctx.regions.wakers == set()  # the ended stream's is gone


async def list_regions(stub: admin_pb2_grpc.AdminServiceStub) -> dict[str, dict[str, Any]]:
    listed = await stub.List(admin_pb2.ListRequest(kind="Region"), timeout=30)
    docs = [storekeys.loads(item.json) for item in listed.items]
    return {d["metadata"]["name"]: d for d in docs}


@async_test
async def test_get_regions_shows_each_regions_link_report_and_certificate(tmp_path: Path) -> None:
    async with Root(tmp_path) as root, admin_channel(root) as admin:
        stub = admin_pb2_grpc.AdminServiceStub(admin)
        assert await list_regions(stub) == {}  # no region enrolled: an empty list
        paths = await root.enroll("eu")
        await root.enroll("us")
        cert = pki.load_certificate((paths.data_dir / "federation.crt").read_bytes())
        ended = asyncio.Event()
        phases = {"Ready": 2, "NotReady": 1}

        async def region_side(
            generation: asyncio.Queue[int],
        ) -> AsyncIterator[federation_pb2.RegionMessage]:
            yield hello("eu")
            applied = federation_pb2.SliceApplied(generation=await generation.get())
            yield federation_pb2.RegionMessage(applied=applied)
            yield federation_pb2.RegionMessage(report=inventory_report(phases, deployments=2))
            await ended.wait()

        async with root.region_channel(paths) as channel:
            sent: asyncio.Queue[int] = asyncio.Queue()
            call = federation_pb2_grpc.FederationServiceStub(channel).Federate(region_side(sent))
            generation = (await asyncio.wait_for(call.read(), 30)).slice.generation
            sent.put_nowait(generation)
            regions = root.ctx.regions
            assert regions is not None
            await eventually(lambda: regions.regions["eu"].reported_at is not None, within=30)
            shown = await list_regions(stub)
            assert list(shown) == ["eu", "us"]
            eu = shown["eu"]
            assert eu["kind"] == "Region" and int(eu["metadata"]["resourceVersion"]) > 0
            status = eu["status"]
            assert status["connected"] is True and status["streamsHere"] is True
            assert status["replica"] == "hub"  # the only replica: the name its links use
            assert status["devices"] == {
                "total": 3,
                "ready": 2,
                "byPhase": {"NotReady": 1, "Ready": 2},
            }
            assert status["deployments"] == 2
            assert status["generationApplied"] == status["generationSent"] == generation
            assert status["reportAgeSeconds"] >= 0 and status["reportedAt"].endswith("Z")
            assert status["certificate"] == {
                "serial": format(cert.serial_number, "x"),
                "previousSerial": None,
                "notAfter": rfc3339(cert.not_valid_after_utc.timestamp()),
            }
            us = shown["us"]["status"]
            assert (us["connected"], us["replica"], us["devices"], us["reportedAt"]) == (
                False,
                None,
                None,
                None,
            )
            one = await stub.Get(admin_pb2.GetRequest(kind="Region", name="eu"), timeout=30)
            assert storekeys.loads(one.json)["status"]["devices"]["total"] == 3
            call.cancel()  # the region goes away
            ended.set()
        # the stream ended: not connected, its last report still shown with its age
        await eventually(lambda: not regions.regions["eu"].connected, within=30)
        status = (await list_regions(stub))["eu"]["status"]
        assert (status["connected"], status["streamsHere"]) == (False, False)
        # another replica (or this one restarted) reads the link the stream's end wrote
        for _ in range(300):
            loaded = await Regions.load(root.ctx.store)
            link = loaded.regions["eu"].link
            if link is not None and not link.connected:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the stream's end was not written to the store")
        elsewhere = loaded.object("eu", here="other")
        assert elsewhere is not None
        assert (elsewhere["status"]["connected"], elsewhere["status"]["replica"]) == (False, "hub")
        assert elsewhere["status"]["lastSeenAt"] is not None
        assert status["devices"]["total"] == 3 and status["generationSent"] is None

        async def refused(call: Any) -> tuple[grpc.StatusCode, str]:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            return err.value.code(), err.value.details() or ""

        code, text = await refused(stub.Get(admin_pb2.GetRequest(kind="Region", name="ap")))
        assert code is grpc.StatusCode.NOT_FOUND and 'Region "ap" not found' in text
        await revoke_region(
            root.ctx.store, root.ctx.cache, root.ctx.writer, regions, "us", now=time.time()
        )
        code, text = await refused(stub.Get(admin_pb2.GetRequest(kind="Region", name="us")))
        assert code is grpc.StatusCode.NOT_FOUND and "was revoked" in text
        assert list(await list_regions(stub)) == ["eu"]
        # read-only: apply and delete say how regions are managed, watch says to list again
        doc = orjson.dumps(
            {"apiVersion": "edgefleet.io/v1", "kind": "Region", "metadata": {"name": "x"}}
        )
        code, text = await refused(stub.Apply(admin_pb2.ApplyRequest(documents=[doc])))
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert "Region objects are not applied" in text and "regions revoke" in text
        code, text = await refused(stub.Delete(admin_pb2.DeleteRequest(kind="Region", name="eu")))
        assert code is grpc.StatusCode.FAILED_PRECONDITION and "hub init --parent" in text
        assert "eu" in regions.regions
        watch = stub.Watch(admin_pb2.WatchRequest(kind="Region"))
        code, text = await refused(watch.read())
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "cannot be watched" in text


@async_test
async def test_a_region_removes_root_models_from_its_store_when_no_longer_used(
    tmp_path: Path,
) -> None:
    result = await init_hub(
        tmp_path / "eu", region="eu", hub_address="127.0.0.1:7443", trust_setup=quickstart_trust
    )
    ctx = await build_context(result.paths.data_dir)
    try:
        old, own = record("old", "1.0.0"), record("own", "1.0.0")
        for r, generation in ((old, 3), (own, None)):
            await ctx.store.put(storekeys.model_key(r.name, r.version), model_value(r, generation))
            ctx.cache.models[(r.name, r.version)] = r
        files = regionenrollment.ParentFiles("127.0.0.1:1", "eu", "root", b"", b"", b"")
        link = parent_link(ctx, files)
        empty = federation_pb2.RegionSlice(generation=5, digest="x")
        await link._apply(empty, stub=None)
        assert await ctx.store.get(storekeys.model_key("old", "1.0.0")) is None
        assert ("old", "1.0.0") not in ctx.cache.models
        assert await ctx.store.get(storekeys.model_key("own", "1.0.0")) is not None
        assert ("own", "1.0.0") in ctx.cache.models
        assert any(
            e["object"] == {"kind": storekeys.KIND_MODEL, "name": "old-1.0.0"}
            for e in ctx.cache.events
        )
    finally:
        await ctx.store.close()
