"""AdminService over real gRPC: a hub data directory from ``hub init``, a SQLite store, the
servicer on a grpc.aio server on loopback with mutual TLS; assertions on the resulting store
and cache state."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from asynctesting import async_test, eventually
from google.protobuf.duration_pb2 import Duration
from hubserving import REGION, AdminHub, make_hub_dir

from edgefleet.v1 import admin_pb2
from hub import pki
from hub.decide.devices import Device, DevicePhase, RevisionPhase, RevisionReport, WorkloadReport
from hub.state import storekeys as objects
from hub.state import tokens
from hub.state.cache import Cache
from hub.state.snapshots import snapshot_of
from hub.state.store import EventType
from hub.state.storekeys import DesiredRecord

DIGEST = "sha256:" + "ab" * 32


def deployment(name: str = "fraud", *, version: str = "2.4.1", **spec: Any) -> bytes:
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "labels": {"team": "risk"}},
        "spec": {"model": {"name": name, "version": version}, "replicas": {"perDevice": 1}, **spec},
    }
    return orjson.dumps(doc)


def baseline(name: str = "fleet", **spec: Any) -> bytes:
    return orjson.dumps(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "SecurityBaseline",
            "metadata": {"name": name},
            "spec": spec,
        }
    )


async def code_of(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details() or ""


async def served(tmp_path: Path) -> AdminHub:
    return AdminHub(await make_hub_dir(tmp_path / "hub"))


async def seed_devices(hub: AdminHub) -> None:
    hub.ctx.writer.update(
        Device(
            name="cam-1",
            labels={"site": "retail"},
            reported_labels={"accelerator": "npu", "arch": "arm64"},
            phase=DevicePhase.READY,
            certificate_serial="1f2e",
            workloads={"fraud": WorkloadReport("2.4.1", desired_replicas=1, ready_replicas=1)},
        )
    )
    hub.ctx.writer.update(Device(name="cam-2", labels={"site": "depot"}))
    await hub.ctx.writer.flush()


# -- Apply --------------------------------------------------------------------------------------


@async_test
async def test_apply_creates_then_is_unchanged_then_configures(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        first = await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment(), baseline()]))
        assert [(r.kind, r.outcome) for r in first.results] == [
            ("ModelDeployment", admin_pb2.ApplyResult.CREATED),
            ("SecurityBaseline", admin_pb2.ApplyResult.CREATED),
        ]
        revision = first.results[0].resource_version
        assert revision > 0 and first.results[1].resource_version == revision  # one txn

        await hub.ctx.writer.flush()  # the events
        before = (await hub.ctx.store.range("")).revision
        again = await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment(), baseline()]))
        assert [r.outcome for r in again.results] == [admin_pb2.ApplyResult.UNCHANGED] * 2
        assert [r.resource_version for r in again.results] == [revision, revision]
        await hub.ctx.writer.flush()
        assert (await hub.ctx.store.range("")).revision == before  # nothing written

        changed = await stub.Apply(
            admin_pb2.ApplyRequest(documents=[deployment(version="2.5.0"), baseline()])
        )
        assert [r.outcome for r in changed.results] == [
            admin_pb2.ApplyResult.CONFIGURED,
            admin_pb2.ApplyResult.UNCHANGED,
        ]
        assert hub.ctx.cache.deployments["fraud"].spec.model.version == "2.5.0"
        kv = await hub.ctx.store.get(objects.object_key("ModelDeployment", "fraud"))
        assert kv is not None
        assert objects.manifest_of(kv.value)["spec"]["model"]["version"] == "2.5.0"
        assert kv.mod_revision == changed.results[0].resource_version
        reasons = [e["reason"] for e in hub.ctx.cache.events]
        assert [r for r in reasons if r in ("Created", "Configured")] == [
            "Created",
            "Created",
            "Configured",
        ]
        # the deployment's revisions: 1 sent at once, 2 rolled out (to no device here)
        assert [r for r in reasons if r not in ("Created", "Configured")] == [
            "RevisionCreated",
            "RolloutStarted",
            "RolloutComplete",
        ]
        assert sorted(hub.ctx.cache.revisions["fraud"]) == [1, 2]

        # what was stored loads back into an equal cache (hub restart)
        reloaded = await Cache.load(hub.ctx.store)
        assert reloaded.stored == hub.ctx.cache.stored
        assert reloaded.security_policy().require_attestation is False


@async_test
async def test_an_invalid_document_among_valid_ones_writes_nothing_and_names_every_field(
    tmp_path: Path,
) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        before = (await hub.ctx.store.range("")).revision
        bad = deployment("other", replicas={"perDevice": -1})
        bad_baseline = baseline(requireAttestation="yes", allowedCodeDigests=["md5:x"], extra=1)
        code, details = await code_of(
            stub.Apply(
                admin_pb2.ApplyRequest(
                    documents=[deployment(), bad, b"{not json", bad_baseline, b"[]"]
                )
            )
        )
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert "documents[1].spec.replicas.perDevice: " in details
        assert "documents[2]: invalid JSON at line 1" in details
        assert "documents[3].spec.requireAttestation: must be true or false" in details
        assert "documents[3].spec.allowedCodeDigests[0]: " in details
        assert "documents[3].spec.extra: unknown field" in details
        assert "documents[4]: must be a JSON object" in details
        assert (await hub.ctx.store.range("")).revision == before
        assert hub.ctx.cache.stored == {}


@async_test
async def test_duplicates_unknown_kinds_and_empty_requests_are_refused(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        unknown = orjson.dumps({"apiVersion": "edgefleet.io/v1", "kind": "Pod", "metadata": {}})
        cases = {
            'documents[1].metadata.name: ModelDeployment "fraud" is already in documents[0]': [
                deployment(),
                deployment(version="3.0.0"),
            ],
            "documents[0].kind: must be one of ModelDeployment, DeviceHealthPolicy, "
            "SecurityBaseline": [unknown],
            "documents: no documents": [],
        }
        for expected, documents in cases.items():
            code, details = await code_of(stub.Apply(admin_pb2.ApplyRequest(documents=documents)))
            assert code is grpc.StatusCode.INVALID_ARGUMENT
            assert expected in details
        assert hub.ctx.cache.stored == {}


@async_test
async def test_dry_run_validates_and_reports_but_writes_nothing(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        result = await hub.stub(channel).Apply(
            admin_pb2.ApplyRequest(documents=[deployment()], dry_run=True)
        )
        assert result.results[0].outcome == admin_pb2.ApplyResult.CREATED
        assert (await hub.ctx.store.range(objects.OBJECTS)).kvs == ()


class RacingStore:
    """The hub's store, with another writer changing each key just after the hub reads it."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def get(self, key: str) -> Any:
        kv = await type(self._store).get(self._store, key)
        await self._store.put(key, objects.object_value({"raced": True}))
        return kv


@async_test
async def test_a_concurrent_change_aborts_the_whole_apply(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        store = hub.ctx.store
        racing = RacingStore(store)
        store.get = racing.get  # type: ignore[method-assign]  # the servicers' store, racing
        try:
            code, details = await code_of(
                hub.stub(channel).Apply(
                    admin_pb2.ApplyRequest(documents=[deployment(), baseline()])
                )
            )
        finally:
            del store.get  # type: ignore[method-assign]
        assert code is grpc.StatusCode.ABORTED
        assert "nothing was written; try again" in details
        for kind, name in (("ModelDeployment", "fraud"), ("SecurityBaseline", "fleet")):
            kv = await store.get(objects.object_key(kind, name))
            assert kv is not None and objects.manifest_of(kv.value) == {"raced": True}
        assert hub.ctx.cache.stored == {}


@async_test
async def test_oversized_requests_are_refused(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        huge = b'{"pad": "' + b"x" * (5 << 20) + b'"}'
        code, _ = await code_of(stub.Apply(admin_pb2.ApplyRequest(documents=[huge])))
        assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
        large = b'{"pad": "' + b"x" * (1 << 20) + b'"}'
        code, details = await code_of(stub.Apply(admin_pb2.ApplyRequest(documents=[large])))
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert "documents[0]: is larger than 1048576 bytes" in details
        # the hub keeps serving
        ok = await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment()]))
        assert ok.results[0].outcome == admin_pb2.ApplyResult.CREATED


# -- authorization -------------------------------------------------------------------------------


@async_test
async def test_a_device_certificate_may_not_call_admin_service(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub:
        device = pki.issue_client_certificate(
            hub.ctx.ca, pki.Identity(pki.Role.DEVICE, "cam-1", REGION)
        )
        async with hub.channel(device) as channel:
            stub = hub.stub(channel)
            for call in (
                stub.Apply(admin_pb2.ApplyRequest(documents=[deployment()])),
                stub.List(admin_pb2.ListRequest(kind="Device")),
                stub.RevokeDevice(admin_pb2.RevokeDeviceRequest(device_name="cam-1")),
            ):
                code, details = await code_of(call)
                assert code is grpc.StatusCode.PERMISSION_DENIED
                assert "a device certificate may not call this service" in details
            watch = stub.Watch(admin_pb2.WatchRequest(kind="Device"))
            code, _ = await code_of(watch.read())
            assert code is grpc.StatusCode.PERMISSION_DENIED
        assert hub.ctx.cache.stored == {}


@async_test
async def test_a_certificate_from_another_ca_is_refused_at_the_handshake(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub:
        foreign_ca = pki.create_ca(REGION)
        foreign = pki.issue_client_certificate(
            foreign_ca, pki.Identity(pki.Role.ADMIN, "admin", REGION)
        )
        async with hub.channel(foreign) as channel:
            code, _ = await code_of(hub.stub(channel).List(admin_pb2.ListRequest(kind="Device")))
            assert code is grpc.StatusCode.UNAVAILABLE


@async_test
async def test_a_revoked_admin_certificate_is_refused(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub:
        admin = hub.admin()
        hub.ctx.cache.revoked[format(admin.certificate.serial_number, "x")] = "admin"
        async with hub.channel() as channel:
            code, details = await code_of(
                hub.stub(channel).List(admin_pb2.ListRequest(kind="Device"))
            )
        assert code is grpc.StatusCode.UNAUTHENTICATED
        assert "has been revoked" in details


# -- reading -------------------------------------------------------------------------------------


@async_test
async def test_get_and_list_show_kubernetes_shaped_objects(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        await seed_devices(hub)
        await _push_record(hub, "fraud", "2.4.1")
        await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment()]))
        none = DesiredRecord(0, (), "")
        await eventually(lambda: hub.ctx.cache.desired.get("cam-1", none).deployments != ())
        generation = hub.ctx.cache.desired["cam-1"].generation

        got = await stub.Get(admin_pb2.GetRequest(kind="Device", name="cam-1"))
        doc = orjson.loads(got.json)
        assert got.resource_version > 0
        assert doc["kind"] == "Device" and doc["apiVersion"] == "edgefleet.io/v1"
        metadata = doc["metadata"]
        assert metadata["name"] == "cam-1"
        assert metadata["labels"] == {"accelerator": "npu", "arch": "arm64", "site": "retail"}
        assert metadata["resourceVersion"] == str(got.resource_version)
        uid = metadata["uid"]
        assert len(uid) == 36
        assert doc["spec"] == {"labels": {"site": "retail"}, "cordoned": False}
        status = doc["status"]
        assert status["phase"] == "Ready"
        assert status["generationDesired"] == generation and status["deployments"] == ["fraud"]
        assert status["workloads"]["fraud"]["readyReplicas"] == 1
        assert {"health", "attestation", "facts", "generationAcked", "taints"} <= set(status)
        cam2 = orjson.loads(
            (await stub.Get(admin_pb2.GetRequest(kind="Device", name="cam-2"))).json
        )
        assert [t["key"] for t in cam2["status"]["taints"]] == ["node.edgefleet.io/not-ready"]

        dep = orjson.loads(
            (await stub.Get(admin_pb2.GetRequest(kind="ModelDeployment", name="fraud"))).json
        )
        assert dep["spec"]["model"] == {"name": "fraud", "version": "2.4.1"}
        created = dep["metadata"]["creationTimestamp"]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", created)
        assert dep["metadata"]["uid"] != uid
        assert dep["status"]["desiredDevices"] == 1
        assert dep["status"]["readyDevices"] == 1
        assert dep["status"]["versions"] == {"2.4.1": {"devices": 1, "ready": 1}}

        listed = await stub.List(admin_pb2.ListRequest(kind="Device"))
        assert [orjson.loads(i.json)["metadata"]["name"] for i in listed.items] == [
            "cam-1",
            "cam-2",
        ]
        assert listed.resource_version >= max(i.resource_version for i in listed.items)
        assert len((await stub.List(admin_pb2.ListRequest(kind="Model"))).items) == 1
        await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment(version="2.4.2")]))
        updated = orjson.loads(
            (await stub.Get(admin_pb2.GetRequest(kind="ModelDeployment", name="fraud"))).json
        )
        assert updated["metadata"]["creationTimestamp"] == created  # kept across updates
        assert updated["metadata"]["uid"] == dep["metadata"]["uid"]
        assert int(updated["metadata"]["resourceVersion"]) > int(dep["metadata"]["resourceVersion"])
        again = orjson.loads(
            (await stub.Get(admin_pb2.GetRequest(kind="Device", name="cam-1"))).json
        )
        assert again["metadata"]["uid"] == uid  # stable while the object exists


@async_test
async def test_label_selectors(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        await seed_devices(hub)

        async def names(selector: str) -> list[str]:
            listed = await stub.List(admin_pb2.ListRequest(kind="Device", label_selector=selector))
            return [orjson.loads(i.json)["metadata"]["name"] for i in listed.items]

        assert await names("") == ["cam-1", "cam-2"]
        assert await names("site=retail") == ["cam-1"]
        assert await names("site==depot") == ["cam-2"]
        assert await names("site!=retail") == ["cam-2"]
        assert await names("accelerator") == ["cam-1"]
        assert await names("!accelerator") == ["cam-2"]
        assert await names("accelerator=npu, site=depot") == []
        assert await names("site in (depot,lab)") == ["cam-2"]
        assert await names("site notin (depot),accelerator") == ["cam-1"]
        for bad in ("site=a=b", "site in (a,b", "a,,b", "Bad Key=x"):
            code, details = await code_of(
                stub.List(admin_pb2.ListRequest(kind="Device", label_selector=bad))
            )
            assert code is grpc.StatusCode.INVALID_ARGUMENT
            assert details.startswith("label_selector: ")


@async_test
async def test_unknown_kinds_and_names(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        code, details = await code_of(stub.List(admin_pb2.ListRequest(kind="Pod")))
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert details == (
            "unknown kind 'Pod': must be one of Device, Model, ModelDeployment, "
            "DeviceHealthPolicy, SecurityBaseline, Secret, PriorityClass, AgentUpgrade, "
            "ModelConfig, BootstrapToken, Region, Placement"
        )
        code, details = await code_of(stub.Get(admin_pb2.GetRequest(kind="Device", name="nope")))
        assert code is grpc.StatusCode.NOT_FOUND
        assert details == 'Device "nope" not found'


# -- changing devices and objects ----------------------------------------------------------------


@async_test
async def test_delete_objects_and_devices(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        await seed_devices(hub)
        await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment()]))
        session = hub.ctx.sessions.open("cam-2", "aa")

        gone = await stub.Delete(admin_pb2.DeleteRequest(kind="ModelDeployment", name="fraud"))
        assert gone.deleted
        assert "fraud" not in hub.ctx.cache.deployments
        assert await hub.ctx.store.get(objects.object_key("ModelDeployment", "fraud")) is None
        again = await stub.Delete(admin_pb2.DeleteRequest(kind="ModelDeployment", name="fraud"))
        assert not again.deleted

        assert (await stub.Delete(admin_pb2.DeleteRequest(kind="Device", name="cam-2"))).deleted
        assert "cam-2" not in hub.ctx.cache.devices
        assert session.closed and session.close_reason == "device deleted"
        await hub.ctx.writer.flush()
        assert await hub.ctx.store.get(objects.device_key("cam-2")) is None
        assert [e["reason"] for e in hub.ctx.cache.events][-2:] == ["Deleted", "Deleted"]


@async_test
async def test_cordon_and_uncordon(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        await seed_devices(hub)
        await stub.Cordon(admin_pb2.CordonRequest(device_name="cam-1"))
        assert hub.ctx.cache.devices["cam-1"].cordoned
        kv = await hub.ctx.store.get(objects.device_key("cam-1"))
        assert kv is not None and orjson.loads(kv.value)["cordoned"] is True  # persisted
        doc = orjson.loads((await stub.Get(admin_pb2.GetRequest(kind="Device", name="cam-1"))).json)
        assert "node.edgefleet.io/unschedulable" in [t["key"] for t in doc["status"]["taints"]]

        await stub.Uncordon(admin_pb2.CordonRequest(device_name="cam-1"))
        assert not hub.ctx.cache.devices["cam-1"].cordoned
        kv = await hub.ctx.store.get(objects.device_key("cam-1"))
        assert kv is not None and orjson.loads(kv.value)["cordoned"] is False
        reasons = [e["reason"] for e in hub.ctx.cache.events]
        assert reasons == ["Cordoned", "Uncordoned"]
        code, _ = await code_of(stub.Cordon(admin_pb2.CordonRequest(device_name="nope")))
        assert code is grpc.StatusCode.NOT_FOUND


@async_test
async def test_revoke_writes_the_serial_and_closes_the_session(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        await seed_devices(hub)
        session = hub.ctx.sessions.open("cam-1", "1f2e")
        response = await hub.stub(channel).RevokeDevice(
            admin_pb2.RevokeDeviceRequest(device_name="cam-1")
        )
        assert list(response.serials) == ["1f2e"]
        kv = await hub.ctx.store.get(objects.revoked_key("1f2e"))
        assert kv is not None and kv.value == b"cam-1"
        assert hub.ctx.cache.revoked["1f2e"] == "cam-1"
        assert hub.ctx.cache.devices["cam-1"].revoked
        assert session.closed and session.close_reason == "certificate revoked"
        assert (await Cache.load(hub.ctx.store)).revoked == {"1f2e": "cam-1"}
        assert hub.ctx.cache.events[-1]["type"] == "Warning"


@async_test
async def test_events_newest_last_filtered_and_limited(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        await seed_devices(hub)
        await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment()]))
        await stub.Cordon(admin_pb2.CordonRequest(device_name="cam-1"))
        await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment(version="9")]))

        def parse(r: admin_pb2.ListEventsResponse) -> list[tuple[str, str]]:
            return [(e["object"]["name"], e["reason"]) for e in map(orjson.loads, r.events)]

        every = parse(await stub.ListEvents(admin_pb2.ListEventsRequest()))
        rollout = {"RevisionCreated", "RolloutStarted", "DevicesUpdated", "RolloutComplete"}
        assert [e for e in every if e[1] not in rollout] == [
            ("fraud", "Created"),
            ("cam-1", "Cordoned"),
            ("fraud", "Configured"),
        ]
        of_fraud = await stub.ListEvents(
            admin_pb2.ListEventsRequest(kind="ModelDeployment", name="fraud", limit=1)
        )
        assert len(parse(of_fraud)) == 1 and parse(of_fraud)[0][0] == "fraud"


# -- watch ---------------------------------------------------------------------------------------


async def next_event(stream: AsyncIterator[admin_pb2.WatchEvent]) -> tuple[int, dict[str, Any]]:
    event = await asyncio.wait_for(anext(stream), 3)
    return event.type, orjson.loads(event.object.json)


async def next_change(
    stream: AsyncIterator[admin_pb2.WatchEvent], specs: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    """The next event that is not a status change alone: a deployment watch also sends a
    MODIFIED event when a computed status changes (a rollout controller making a revision
    after the apply returned), with the spec it had."""
    while True:
        kind, doc = await next_event(stream)
        name, spec = doc["metadata"]["name"], doc.get("spec")
        if kind == admin_pb2.WatchEvent.MODIFIED and specs.get(name) == spec:
            continue
        specs[name] = spec
        return kind, doc


@async_test
async def test_watch_lists_current_objects_then_sees_applies_and_deletes(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment("a")]))
        call = stub.Watch(admin_pb2.WatchRequest(kind="ModelDeployment"))
        stream = call.__aiter__()
        specs: dict[str, Any] = {}
        kind, doc = await next_change(stream, specs)
        assert (kind, doc["metadata"]["name"]) == (admin_pb2.WatchEvent.ADDED, "a")
        assert "status" in doc

        await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment("b")]))
        kind, doc = await next_change(stream, specs)
        assert (kind, doc["metadata"]["name"]) == (admin_pb2.WatchEvent.ADDED, "b")
        await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment("a", version="3")]))
        kind, doc = await next_change(stream, specs)
        assert kind == admin_pb2.WatchEvent.MODIFIED
        assert doc["spec"]["model"]["version"] == "3"
        await stub.Delete(admin_pb2.DeleteRequest(kind="ModelDeployment", name="b"))
        kind, doc = await next_change(stream, specs)
        assert (kind, doc["metadata"]["name"]) == (admin_pb2.WatchEvent.DELETED, "b")

        call.cancel()
        await eventually(lambda: hub.ctx.store.inner.watching == 0)  # type: ignore[attr-defined]


@async_test
async def test_watch_from_a_listed_revision_misses_nothing(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        await seed_devices(hub)
        listed = await stub.List(admin_pb2.ListRequest(kind="Device"))
        await stub.Cordon(admin_pb2.CordonRequest(device_name="cam-2"))
        call = stub.Watch(
            admin_pb2.WatchRequest(kind="Device", resource_version=listed.resource_version)
        )
        kind, doc = await next_event(call.__aiter__())
        assert kind == admin_pb2.WatchEvent.MODIFIED
        assert doc["metadata"]["name"] == "cam-2" and doc["spec"]["cordoned"] is True
        call.cancel()


# -- tokens and artifacts ------------------------------------------------------------------------


@async_test
async def test_create_token(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        response = await stub.CreateToken(
            admin_pb2.CreateTokenRequest(
                single_use=True, description="line 3", labels={"site": "retail"}
            )
        )
        assert response.ca_hash == pki.ca_pin(hub.ctx.ca.certificate)
        assert response.root_hash == ""  # this hub has no trust root
        from edgefleet.trust.signing import create_root, generate_key_pair
        from edgefleet.trust.verifying import root_digest
        from hub.state.trustroots import HubRoots, install_roots

        generate_key_pair(tmp_path / "root")
        root = create_root(root_keys=[tmp_path / "root.key"], artifact_keys=[tmp_path / "root.pub"])
        install_roots(hub.ctx.cache, HubRoots((root.to_bytes(),)))
        with_root = await stub.CreateToken(admin_pb2.CreateTokenRequest())
        assert with_root.root_hash == f"sha256:{root_digest(root)}"
        record = await tokens.validate(hub.ctx.store, response.token, now=hub.ctx.clock())
        assert record.single_use and record.labels == {"site": "retail"}
        assert abs(response.expires.ToSeconds() - record.expires) < 1
        code, details = await code_of(
            stub.CreateToken(admin_pb2.CreateTokenRequest(labels={"bad key!": "x"}))
        )
        assert code is grpc.StatusCode.INVALID_ARGUMENT and details.startswith("labels[")


@async_test
async def test_create_a_regional_hubs_token(tmp_path: Path) -> None:
    """``for_region``: a token that enrolls the regional hub of that region and no device
    (hub.api.enrollment refuses it to devices); nothing else of a device token applies to it."""
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        before = await hub.ctx.store.range("/")
        bad = [
            (admin_pb2.CreateTokenRequest(for_region="Not_A_Label"), "for_region: "),
            (admin_pb2.CreateTokenRequest(for_region=hub.ctx.region), "this hub's own region"),
            (
                admin_pb2.CreateTokenRequest(for_region="eu", labels={"site": "a"}),
                "a regional hub's token enrolls no device",
            ),
            (
                admin_pb2.CreateTokenRequest(for_region="eu", no_device_labels=True),
                "a regional hub's token enrolls no device",
            ),
        ]
        for request, words in bad:
            code, details = await code_of(stub.CreateToken(request))
            assert (code, words in details) == (grpc.StatusCode.INVALID_ARGUMENT, True), details
        assert (await hub.ctx.store.range("/")).revision == before.revision  # nothing written
        response = await stub.CreateToken(admin_pb2.CreateTokenRequest(for_region="eu"))
        token_id = response.token.split(".")[0]
        kv = await hub.ctx.store.get(tokens.PREFIX + token_id)
        assert kv is not None
        assert tokens.TokenRecord.from_json(kv.value).for_region == "eu"
        assert response.ca_hash == pki.ca_pin(hub.ctx.ca.certificate)


@async_test
async def test_push_artifact_needs_a_header_first(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:

        async def requests() -> AsyncIterator[admin_pb2.PushArtifactRequest]:
            yield admin_pb2.PushArtifactRequest(chunk=b"x")

        code, details = await code_of(hub.stub(channel).PushArtifact(requests()))
        assert code is not grpc.StatusCode.OK
        assert hub.ctx.cache.models == {}  # nothing stored
        assert details


@async_test
async def test_models_are_listed_got_and_deleted_by_name_and_version(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        model = objects.ModelRecord("fraud", "2.4.1", "ab" * 32, 1234, b"{signed}", 1.0)
        await hub.ctx.store.put(objects.model_key("fraud", "2.4.1"), objects.dumps(model.to_json()))
        hub.ctx.cache.models[("fraud", "2.4.1")] = model
        listed = await stub.List(admin_pb2.ListRequest(kind="Model"))
        assert [orjson.loads(i.json)["spec"] for i in listed.items] == [
            {"name": "fraud", "version": "2.4.1"}
        ]
        got = await stub.Get(admin_pb2.GetRequest(kind="Model", name="fraud-2.4.1"))
        assert orjson.loads(got.json)["status"]["length"] == 1234 and got.resource_version > 0
        deleted = await stub.Delete(admin_pb2.DeleteRequest(kind="Model", name="fraud-2.4.1"))
        assert deleted.deleted and hub.ctx.cache.models == {}
        assert await hub.ctx.store.get(objects.model_key("fraud", "2.4.1")) is None


@async_test
async def test_create_token_bounds_change_nothing_and_the_event_comes_with_the_token(
    tmp_path: Path,
) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        before = await hub.ctx.store.range("/")
        year = 366 * 24 * 3600
        bad = [
            (admin_pb2.CreateTokenRequest(ttl=Duration(seconds=10_000 * year)), "ttl: must be"),
            (admin_pb2.CreateTokenRequest(ttl=Duration(seconds=315_576_000_000)), "ttl: must be"),
            (admin_pb2.CreateTokenRequest(ttl=Duration(seconds=-5)), "ttl: must be"),
            (admin_pb2.CreateTokenRequest(ttl=Duration(nanos=1000)), "ttl: must be"),
            (
                admin_pb2.CreateTokenRequest(labels={f"k{i}": "v" for i in range(65)}),
                "labels: at most 64",
            ),
            (
                admin_pb2.CreateTokenRequest(no_device_labels=True, device_label_prefix="a/"),
                "device_label_prefix:",
            ),
            (
                admin_pb2.CreateTokenRequest(device_label_prefix="Not a key!"),
                "device_label_prefix:",
            ),
        ]
        for request, words in bad:
            code, details = await code_of(stub.CreateToken(request))
            assert (code, words in details) == (grpc.StatusCode.INVALID_ARGUMENT, True), details
        assert (await hub.ctx.store.range("/")).revision == before.revision  # nothing written

        response = await stub.CreateToken(
            admin_pb2.CreateTokenRequest(
                ttl=Duration(seconds=year), no_device_labels=True, labels={"site": "a"}
            )
        )
        token_id = response.token.split(".")[0]
        kv = await hub.ctx.store.get(tokens.PREFIX + token_id)
        assert kv is not None
        events = [
            e
            for e in (await hub.ctx.store.range("/events/")).kvs
            if e.mod_revision == kv.mod_revision
        ]
        assert [objects.loads(e.value)["reason"] for e in events] == ["Created"]
        record = tokens.TokenRecord.from_json(kv.value)
        assert (record.device_labels, record.labels) == (False, {"site": "a"})


@async_test
async def test_apply_refuses_a_desired_state_a_device_could_not_receive(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        await seed_devices(hub)
        model = objects.ModelRecord("fraud", "2.4.1", "ab" * 32, 1234, b"{signed}", 1.0)
        await hub.ctx.store.put(objects.model_key("fraud", "2.4.1"), objects.dumps(model.to_json()))
        hub.ctx.cache.models[("fraud", "2.4.1")] = model
        for i in range(5):  # a device serves one deployment per model name: one model each
            hub.ctx.cache.models[(f"d{i}", "2.4.1")] = model

        def big(name: str) -> bytes:
            doc = orjson.loads(deployment(name))
            doc["spec"]["model"] = {"name": name, "version": "2.4.1"}
            doc["spec"]["placement"] = {"nodeSelector": {"site": "retail"}}
            doc["metadata"]["annotations"] = {"note": "x" * 900_000}
            return orjson.dumps(doc)

        # the issue's case: five deployments with large annotations, 4.7 MB for cam-1
        for i in range(4):
            await stub.Apply(admin_pb2.ApplyRequest(documents=[big(f"d{i}")]))
        for dry_run in (True, False):
            code, details = await code_of(
                stub.Apply(admin_pb2.ApplyRequest(documents=[big("d4")], dry_run=dry_run))
            )
            assert code is grpc.StatusCode.FAILED_PRECONDITION, details
            assert "cam-1 (4.3 MiB)" in details and "cam-2" not in details
        assert await hub.ctx.store.get(objects.object_key("ModelDeployment", "d4")) is None
        assert "d4" not in hub.ctx.cache.deployments


@async_test
async def test_events_are_written_in_the_transaction_of_the_change(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        await seed_devices(hub)

        async def reasons_at(revision: int) -> list[str]:
            kvs = (await hub.ctx.store.range("/events/")).kvs
            return [objects.loads(kv.value)["reason"] for kv in kvs if kv.mod_revision == revision]

        applied = await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment(), baseline()]))
        revision = applied.results[0].resource_version
        assert await reasons_at(revision) == ["Created", "Created"]

        await stub.Delete(admin_pb2.DeleteRequest(kind="ModelDeployment", name="fraud"))
        deleted = await hub.ctx.store.range("/events/")
        assert objects.loads(deleted.kvs[-1].value)["reason"] == "Deleted"
        assert await hub.ctx.store.get(objects.object_key("ModelDeployment", "fraud")) is None
        history = hub.ctx.store.watch("/objects/ModelDeployment/", 1)
        async for change in history:
            if change.type is EventType.DELETE:
                assert change.revision == deleted.kvs[-1].mod_revision
                break
        await history.aclose()  # type: ignore[attr-defined]

        await stub.RevokeDevice(admin_pb2.RevokeDeviceRequest(device_name="cam-1"))
        record = await hub.ctx.store.get(objects.device_key("cam-1"))
        assert record is not None
        assert await reasons_at(record.mod_revision) == ["Revoked"]


# -- guard rails ---------------------------------------------------------------------------------


async def _push_record(hub: AdminHub, name: str, version: str) -> None:
    model = objects.ModelRecord(name, version, "ab" * 32, 1234, b"{signed}", 1.0)
    await hub.ctx.store.put(objects.model_key(name, version), objects.dumps(model.to_json()))
    hub.ctx.cache.models[(name, version)] = model


@async_test
async def test_apply_warns_about_an_unpushed_version_and_a_placement_matching_nothing(
    tmp_path: Path,
) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        await seed_devices(hub)
        nowhere = deployment("fraud", placement={"nodeSelector": {"site": "moon"}})
        (result,) = (await stub.Apply(admin_pb2.ApplyRequest(documents=[nowhere]))).results
        assert result.outcome == admin_pb2.ApplyResult.CREATED  # accepted...
        assert len(result.warnings) == 2  # ...but says so at once
        assert "fraud version 2.4.1 has not been pushed" in result.warnings[0]
        assert "nodeSelector site=moon matches no device" in result.warnings[1]
        got = await stub.Get(admin_pb2.GetRequest(kind="ModelDeployment", name="fraud"))
        conditions = {c["type"]: c for c in orjson.loads(got.json)["status"]["conditions"]}
        assert conditions["ModelPushed"]["reason"] == "ModelNotPushed"
        assert conditions["Placed"]["reason"] == "NoMatchingDevices"
        assert conditions["Available"]["reason"] == "NoDevices"  # not "AllDevicesAvailable"

        await _push_record(hub, "fraud", "2.4.1")
        fine = deployment("fraud", placement={"nodeSelector": {"site": "retail"}})
        (result,) = (await stub.Apply(admin_pb2.ApplyRequest(documents=[fine]))).results
        assert list(result.warnings) == []
        got = await stub.Get(admin_pb2.GetRequest(kind="ModelDeployment", name="fraud"))
        types = [c["type"] for c in orjson.loads(got.json)["status"]["conditions"]]
        assert types == ["Available", "Progressing"]


@async_test
async def test_canary_steps_are_accepted_and_shown(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        canary = deployment(
            "fraud",
            rollout={
                "canary": {
                    "steps": ["5%", {"pause": {}}, "100%"],
                    "analysis": {"minAccuracy": 0.9},
                }
            },
        )
        await stub.Apply(admin_pb2.ApplyRequest(documents=[canary]))
        got = await stub.Get(admin_pb2.GetRequest(kind="ModelDeployment", name="fraud"))
        doc = orjson.loads(got.json)
        assert doc["spec"]["rollout"]["canary"]["steps"] == ["5%", {"pause": {}}, "100%"]
        shown = doc["status"]["rollout"]["canary"]
        assert shown["step"] == 1 and shown["stepCount"] == 3 and shown["weight"] == 5


@async_test
async def test_deleting_a_model_in_use_is_refused_unless_forced(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        await _push_record(hub, "fraud", "2.4.1")
        on_a = {"nodeSelector": {"site": "a"}}
        await stub.Apply(
            admin_pb2.ApplyRequest(
                documents=[deployment("fraud", placement=on_a), deployment("fraud-eu")]
            )
        )
        # fraud-eu's model is "fraud-eu", so only one user; add a second of the same model
        # (on other devices: a device serves one deployment per model name)
        other = orjson.loads(deployment("fraud-b", placement={"nodeSelector": {"site": "b"}}))
        other["spec"]["model"]["name"] = "fraud"
        await stub.Apply(admin_pb2.ApplyRequest(documents=[orjson.dumps(other)]))
        request = admin_pb2.DeleteRequest(kind="Model", name="fraud-2.4.1")
        code, details = await code_of(stub.Delete(request))
        assert code is grpc.StatusCode.FAILED_PRECONDITION
        assert "in use by ModelDeployment fraud, fraud-b" in details
        assert ("fraud", "2.4.1") in hub.ctx.cache.models
        assert await hub.ctx.store.get(objects.model_key("fraud", "2.4.1")) is not None

        forced = admin_pb2.DeleteRequest(kind="Model", name="fraud-2.4.1", force=True)
        assert (await stub.Delete(forced)).deleted
        assert ("fraud", "2.4.1") not in hub.ctx.cache.models
        await hub.ctx.writer.flush()
        (event,) = [e for e in hub.ctx.cache.events if e["reason"] == "Deleted"]
        assert "forced: in use by fraud, fraud-b" in event["message"]


@async_test
async def test_watching_deployments_sees_every_status_change(tmp_path: Path) -> None:
    """Status is computed, not stored: a device report that changes it is a MODIFIED event."""
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        await seed_devices(hub)
        await _push_record(hub, "fraud", "2.4.1")
        await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment()]))
        hub.ctx.cache.desired["cam-1"] = DesiredRecord(7, ("fraud",), "d")
        call = stub.Watch(admin_pb2.WatchRequest(kind="ModelDeployment"))
        stream = call.__aiter__()
        kind, doc = await next_event(stream)
        assert kind == admin_pb2.WatchEvent.ADDED
        before = doc["status"]["readyDevices"]
        device = hub.ctx.cache.devices["cam-1"]
        failing = WorkloadReport(
            "2.4.1",
            desired_replicas=1,
            revisions=(RevisionReport("2.4.1", "ab" * 32, RevisionPhase.FAILED, 0, reason="Boom"),),
        )
        hub.ctx.writer.update(device.with_(workloads={"fraud": failing}))
        kind, doc = await next_event(stream)
        assert kind == admin_pb2.WatchEvent.MODIFIED
        assert doc["status"]["readyDevices"] != before or doc["status"]["failing"]
        assert "cam-1" in doc["status"]["failing"]
        call.cancel()


@async_test
async def test_a_model_a_rollout_still_sends_is_in_use(tmp_path: Path) -> None:
    async with await served(tmp_path) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        await seed_devices(hub)  # cam-1 serves fraud 2.4.1
        await _push_record(hub, "fraud", "2.4.1")
        await _push_record(hub, "fraud", "2.5.0")
        await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment()]))
        # the projector places fraud on cam-1 before revision 2 is made, so that it targets
        # cam-1 (a record set here by hand was overwritten by a projection still in flight,
        # made before the apply: revision 2 then targeted no device and was Complete)
        none = DesiredRecord(0, (), "")
        await eventually(
            lambda: "fraud" in hub.ctx.cache.desired.get("cam-1", none).deployments, 30
        )
        assert hub.ctx.cache.rollouts["fraud"].phase.value == "Complete"  # revision 1
        await stub.Apply(admin_pb2.ApplyRequest(documents=[deployment(version="2.5.0")]))
        state = hub.ctx.cache.rollouts["fraud"]
        assert (state.revision, state.stable, state.phase.value) == (2, 1, "Progressing")
        request = admin_pb2.DeleteRequest(kind="Model", name="fraud-2.4.1")
        code, details = await code_of(stub.Delete(request))
        assert code is grpc.StatusCode.FAILED_PRECONDITION
        assert "in use by ModelDeployment fraud (stable revision 1)" in details


@async_test
async def test_baselines_go_to_every_device_with_its_desired_state(tmp_path: Path) -> None:
    from hub.decide.desired import build_desired

    async with await served(tmp_path) as hub, hub.channel() as channel:
        await seed_devices(hub)
        await hub.stub(channel).Apply(
            admin_pb2.ApplyRequest(documents=[baseline(requireSandbox=True)])
        )
        device = hub.ctx.cache.devices["cam-2"]
        content = build_desired(
            device, snapshot_of(hub.ctx.cache), previous=frozenset(), region=REGION
        )
        sent = [orjson.loads(m) for m in content.manifests]
        assert [(m["kind"], m["spec"].get("requireSandbox")) for m in sent] == [
            ("SecurityBaseline", True)
        ]
