"""Paged List and Watch over real gRPC (issue 29, item 7: listing stopped working at about
4 MiB). A hub from ``hub init`` with its SQLite store, serving AdminService with mutual TLS and
gRPC's 4 MiB message limit (hub.server); assertions on what a client receives."""

from __future__ import annotations

from pathlib import Path

import grpc
import orjson
import pytest
from asynctesting import async_test
from hubserving import AdminHub, make_hub_dir

from edgefleet.v1 import admin_pb2, admin_pb2_grpc
from hub.decide.paging import MAX_PAGE_BYTES

KIND = "ModelDeployment"
LIMIT = 4 * 1024 * 1024  # gRPC's default, the hub's (hub.server.MAX_MESSAGE_BYTES)


def deployment(name: str, *, note: str = "", version: str = "1.0.0") -> bytes:
    """A deployment placed on no device (so no device's desired state bounds it)."""
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": KIND,
        "metadata": {"name": name, "labels": {"team": "risk" if name < "m" else "ops"}},
        "spec": {
            "model": {"name": name, "version": version},  # one deployment per model name
            "replicas": {"perDevice": 1},
            "placement": {"nodeSelector": {"site": "nowhere"}},
        },
    }
    if note:
        doc["metadata"]["annotations"] = {"note": note}  # type: ignore[index]
    return orjson.dumps(doc)


async def apply(stub: admin_pb2_grpc.AdminServiceStub, *docs: bytes) -> None:
    await stub.Apply(admin_pb2.ApplyRequest(documents=list(docs)))


async def refused(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    return info.value.code(), info.value.details() or ""


async def every_page(
    stub: admin_pb2_grpc.AdminServiceStub, limit: int, selector: str = ""
) -> list[admin_pb2.ListResponse]:
    pages, token = [], ""
    while True:
        page = await stub.List(
            admin_pb2.ListRequest(
                kind=KIND, label_selector=selector, limit=limit, continue_token=token
            )
        )
        pages.append(page)
        if not page.continue_token:
            return pages
        token = page.continue_token


def names(pages: list[admin_pb2.ListResponse]) -> list[str]:
    return [orjson.loads(i.json)["metadata"]["name"] for p in pages for i in p.items]


@async_test
async def test_six_large_deployments_are_listed_in_pages_under_the_message_limit(
    tmp_path: Path,
) -> None:
    """The issue's repro: six deployments of about 840 KB each are accepted; listing them
    failed whole with RESOURCE_EXHAUSTED "Sent message larger than max"."""
    async with AdminHub(await make_hub_dir(tmp_path / "hub")) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        for i in range(6):
            await apply(stub, deployment(f"big-{i}", note="x" * 840_000))
        pages = await every_page(stub, 500)
        assert names(pages) == [f"big-{i}" for i in range(6)]
        assert [len(p.items) for p in pages] == [4, 2]
        assert all(p.ByteSize() <= MAX_PAGE_BYTES + 4096 < LIMIT for p in pages)
        assert len({p.resource_version for p in pages}) == 1
        assert pages[0].HasField("remaining_item_count") and pages[0].remaining_item_count == 2
        assert not pages[-1].HasField("remaining_item_count")

        # limit 0 (all in one response, as clients before paging ask): a clear refusal
        code, details = await refused(stub.List(admin_pb2.ListRequest(kind=KIND)))
        assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "the list of ModelDeployment (6 objects) is more than one response" in details
        assert "edgectl get --chunk-size" in details

        # Watch from 0 gives the same objects, one per message
        events: list[admin_pb2.WatchEvent] = []
        call = stub.Watch(admin_pb2.WatchRequest(kind=KIND))
        async for event in call:
            events.append(event)
            if len(events) == 6:
                break
        call.cancel()
        assert [e.type for e in events] == [admin_pb2.WatchEvent.ADDED] * 6
        assert all(e.ByteSize() < LIMIT for e in events)


@async_test
async def test_every_page_is_the_first_pages_snapshot(tmp_path: Path) -> None:
    """Created since the first page: not listed; changed or deleted since: listed as it was;
    nothing twice, nothing missed; a selector applies on every page."""
    async with AdminHub(await make_hub_dir(tmp_path / "hub")) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        await apply(stub, *(deployment(n) for n in ("b", "d", "f", "h", "p", "r")))
        first = await stub.List(admin_pb2.ListRequest(kind=KIND, limit=2))
        assert names([first]) == ["b", "d"]

        await apply(stub, deployment("a"), deployment("e"), deployment("z"))  # created since
        await apply(stub, deployment("f", version="2.0.0"))  # changed since
        await stub.Delete(admin_pb2.DeleteRequest(kind=KIND, name="h"))  # deleted since
        await apply(stub, deployment("p", version="3.0.0"))
        await stub.Delete(admin_pb2.DeleteRequest(kind=KIND, name="p"))
        await apply(stub, deployment("p", version="4.0.0"))  # deleted and created again

        rest, token = [], first.continue_token
        while token:
            page = await stub.List(admin_pb2.ListRequest(kind=KIND, limit=2, continue_token=token))
            assert page.resource_version == first.resource_version
            rest.append(page)
            token = page.continue_token
        assert names(rest) == ["f", "h", "p", "r"]
        docs = {
            orjson.loads(i.json)["metadata"]["name"]: orjson.loads(i.json)
            for p in rest
            for i in p.items
        }
        assert {n: d["spec"]["model"]["version"] for n, d in docs.items()} == dict.fromkeys(
            "fhpr", "1.0.0"
        )
        assert all(
            int(d["metadata"]["resourceVersion"]) <= first.resource_version for d in docs.values()
        )

        # a new list sees the new state
        fresh = await every_page(stub, 3)
        assert names(fresh) == ["a", "b", "d", "e", "f", "p", "r", "z"]
        assert fresh[0].resource_version > first.resource_version

        # with a selector: the matching ones, in pages, the selector bound to the token
        risk = await every_page(stub, 2, "team=risk")
        assert names(risk) == ["a", "b", "d", "e", "f"]
        assert not any(p.HasField("remaining_item_count") for p in risk)
        code, details = await refused(
            stub.List(
                admin_pb2.ListRequest(kind=KIND, limit=2, continue_token=risk[0].continue_token)
            )
        )
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert details.startswith("continue_token: a token of the list of 'ModelDeployment'")


@async_test
async def test_bad_paging_fields_are_refused_naming_them(tmp_path: Path) -> None:
    async with AdminHub(await make_hub_dir(tmp_path / "hub")) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        await apply(stub, *(deployment(n) for n in "abc"))
        first = await stub.List(admin_pb2.ListRequest(kind=KIND, limit=1))
        good = first.continue_token
        forged_future = admin_pb2.ListRequest(
            kind=KIND,
            limit=1,
            continue_token=_token(first.resource_version + 1000, "/objects/ModelDeployment/a"),
        )
        for request, field, words in [
            (admin_pb2.ListRequest(kind=KIND, limit=-1), "limit", "must be 0 (all) or more"),
            (admin_pb2.ListRequest(kind=KIND, continue_token="junk!"), "continue_token", "not a"),
            (admin_pb2.ListRequest(kind=KIND, continue_token=good[:-4]), "continue_token", "not a"),
            (admin_pb2.ListRequest(kind="Device", continue_token=good), "continue_token", "of"),
            (forged_future, "continue_token", "is after the store's"),
        ]:
            code, details = await refused(stub.List(request))
            assert code is grpc.StatusCode.INVALID_ARGUMENT, details
            assert details.startswith(f"{field}: "), details
            assert words in details, details

        # the history of the first page's revision compacted: expired, list again
        await apply(stub, deployment("d"))
        await hub.ctx.store.compact((await hub.ctx.store.range("")).revision)
        code, details = await refused(
            stub.List(admin_pb2.ListRequest(kind=KIND, limit=1, continue_token=good))
        )
        assert code is grpc.StatusCode.OUT_OF_RANGE
        assert "continue_token: expired" in details and "list again" in details
        assert names(await every_page(stub, 1)) == ["a", "b", "c", "d"]


def _token(revision: int, after: str) -> str:
    from hub.decide.paging import ContinueToken

    return ContinueToken(KIND, "", revision, after).encode()


@async_test
async def test_pages_of_devices_models_and_tokens(tmp_path: Path) -> None:
    """The other kinds page the same way (their objects are not stored as manifests)."""
    from hub.decide.devices import Device
    from hub.state import storekeys

    async with AdminHub(await make_hub_dir(tmp_path / "hub")) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        for i in range(5):
            hub.ctx.writer.update(Device(name=f"cam-{i}", labels={"site": "retail"}))
            model = storekeys.ModelRecord("fraud", f"1.{i}.0", "ab" * 32, 1234, b"{}", 1.0)
            await hub.ctx.store.put(
                storekeys.model_key(model.name, model.version), storekeys.dumps(model.to_json())
            )
            hub.ctx.cache.models[(model.name, model.version)] = model
        await hub.ctx.writer.flush()
        for _ in range(3):
            await stub.CreateToken(admin_pb2.CreateTokenRequest())
        for kind, count in (("Device", 5), ("Model", 5), ("BootstrapToken", 4)):
            pages, token = [], ""  # BootstrapToken: hub init's and three
            while True:
                page = await stub.List(
                    admin_pb2.ListRequest(kind=kind, limit=2, continue_token=token)
                )
                pages.append(page)
                token = page.continue_token
                if not token:
                    break
            listed = [orjson.loads(i.json)["metadata"]["name"] for p in pages for i in p.items]
            assert len(listed) == len(set(listed)) == count, (kind, listed)
            assert len(pages) == -(-count // 2)
            whole = await stub.List(admin_pb2.ListRequest(kind=kind))
            assert [orjson.loads(i.json)["metadata"]["name"] for i in whole.items] == listed


@async_test
async def test_an_object_larger_than_a_response_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Apply's 1 MiB per document keeps objects under the budget; were one shown larger (a
    huge status), List and Watch name it rather than fail on gRPC's limit."""
    monkeypatch.setattr("hub.decide.paging.MAX_PAGE_BYTES", 100_000)
    async with AdminHub(await make_hub_dir(tmp_path / "hub")) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        await apply(stub, deployment("a", note="x" * 60_000), deployment("b", note="x" * 60_000))
        pages = await every_page(stub, 10)
        assert [len(p.items) for p in pages] == [1, 1]  # the byte budget, not the limit
        await apply(stub, deployment("huge", note="x" * 150_000))
        watch = stub.Watch(admin_pb2.WatchRequest(kind=KIND))

        async def watched() -> list[str]:
            return [orjson.loads(e.object.json)["metadata"]["name"] async for e in watch]

        for call in (every_page(stub, 10), watched()):
            code, details = await refused(call)
            assert code is grpc.StatusCode.RESOURCE_EXHAUSTED, details
            assert "ModelDeployment 'huge' is shown as" in details
