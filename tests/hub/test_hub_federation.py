"""Federation at the hub (docs/federation.md): the pure slice, apply and report decisions as
tables, and the root's two services over real gRPC with real certificates on loopback (a hub
made by ``hub init``, a region enrolled with ``hub.controllers.parentlink.enroll_with_parent``)."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from asynctesting import async_test, eventually

from edgefleet.api import parse_manifest
from edgefleet.launching import free_port_pair
from edgefleet.timestamps import rfc3339
from edgefleet.v1 import admin_pb2, admin_pb2_grpc, federation_pb2, federation_pb2_grpc
from hub import pki
from hub.controllers import parentlink
from hub.controllers.parentlink import StoredValue, enroll_with_parent, plan_apply
from hub.decide import regionslice
from hub.initializing import HubPaths, init_hub
from hub.server import build_context, parent_link, start_server
from hub.state import regionmapping, storekeys, tokens
from hub.state import regions as regions_module
from hub.state.regions import Regions, RegionState, revoke_region
from hub.state.store import Delete, Put
from hub.trustsetup import quickstart_trust


def deployment(
    name: str, regions: list[str] | None = None, version: str = "1.0.0"
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {"model": {"name": name, "version": version}, "replicas": {"perDevice": 1}},
    }
    if regions is not None:
        doc["spec"]["placement"] = {"regions": regions}
    return parse_manifest(doc).to_dict()


def record(name: str, version: str, envelope: bytes = b"{}") -> storekeys.ModelRecord:
    return storekeys.ModelRecord(
        name, version, f"{name}{version}".ljust(64, "0")[:64], 10, envelope, 1.0
    )


# -- pure --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("regions", "region", "expected"),
    [(None, "eu", True), ([], "eu", True), (["eu"], "eu", True), (["us"], "eu", False)],
)
def test_a_deployment_goes_to_the_regions_it_names_or_to_all(
    regions: list[str] | None, region: str, expected: bool
) -> None:
    assert regionslice.goes_to(deployment("d", regions), region) is expected


def test_other_kinds_go_everywhere_and_unknown_kinds_nowhere() -> None:
    assert regionslice.goes_to({"kind": "SecurityBaseline", "metadata": {"name": "b"}}, "eu")
    assert not regionslice.goes_to({"kind": "Secret", "metadata": {"name": "s"}}, "eu")


def test_a_slice_carries_the_models_of_its_deployments_and_their_revisions() -> None:
    models = {
        ("a", "1.0.0"): record("a", "1.0.0"),
        ("a", "0.9.0"): record("a", "0.9.0"),
        ("b", "1.0.0"): record("b", "1.0.0"),
    }
    objects = [deployment("a", ["eu"]), deployment("b", ["us"]), deployment("c")]
    s = regionslice.plan_slice("eu", objects, models, {"a": [("a", "0.9.0")]}, [b"root"])
    assert [o["metadata"]["name"] for o in s.objects] == ["a", "c"]
    assert [(m.name, m.version) for m in s.models] == [("a", "0.9.0"), ("a", "1.0.0")]  # c unpushed
    again = regionslice.plan_slice(
        "eu", list(reversed(objects)), models, {"a": [("a", "0.9.0")]}, [b"root"]
    )
    assert again.digest == s.digest
    other = regionslice.plan_slice("eu", objects, models, {}, [b"root2"])
    assert other.digest != s.digest
    message = regionmapping.slice_message(s, 7)
    assert message.models[1].envelope == b"{}" and message.generation == 7


def test_applying_a_slice_replaces_local_objects_drops_old_root_objects_keeps_own() -> None:
    a, b = deployment("a"), deployment("b")
    root_owned_old = storekeys.federated_object_value(deployment("old"), 1.0, 3)
    stored = {
        storekeys.object_key("ModelDeployment", "a"): StoredValue(
            "k", storekeys.object_value(a, 1.0), 5
        ),
        storekeys.object_key("ModelDeployment", "old"): StoredValue("k", root_owned_old, 6),
        storekeys.object_key("ModelDeployment", "mine"): StoredValue(
            "k", storekeys.object_value(deployment("mine"), 1.0), 7
        ),
        storekeys.object_key("ModelDeployment", "b"): StoredValue(
            "k", storekeys.federated_object_value(b, 2.0, 4), 8
        ),
    }
    plan = plan_apply(9, "d", [a, b], [record("a", "1.0.0")], stored, {}, now=100.0)
    assert [o["metadata"]["name"] for o in plan.put_objects] == ["a"]  # b unchanged, mine kept
    assert plan.dropped_objects == (("ModelDeployment", "old"),)
    assert [(c.key, c.mod_revision) for c in plan.compares] == [
        (storekeys.object_key("ModelDeployment", "a"), 5),
        (storekeys.object_key("ModelDeployment", "old"), 6),
        (storekeys.model_key("a", "1.0.0"), 0),
    ]
    puts = {op.key: op for op in plan.ops if isinstance(op, Put)}
    assert (
        storekeys.federated_generation(puts[storekeys.object_key("ModelDeployment", "a")].value)
        == 9
    )
    assert storekeys.created_of(puts[storekeys.object_key("ModelDeployment", "a")].value) == 1.0
    assert storekeys.loads(puts[parentlink.STATE_KEY].value) == {"generation": 9, "digest": "d"}
    assert any(isinstance(op, Delete) for op in plan.ops)
    model_doc = storekeys.loads(puts[storekeys.model_key("a", "1.0.0")].value)
    assert storekeys.ModelRecord.from_json(model_doc).envelope == b"{}"  # relayed as it came
    # the same slice again changes nothing but the state key
    stored_models = {
        storekeys.model_key("a", "1.0.0"): StoredValue(
            "k", puts[storekeys.model_key("a", "1.0.0")].value, 10
        )
    }
    stored[storekeys.object_key("ModelDeployment", "a")] = StoredValue(
        "k", puts[storekeys.object_key("ModelDeployment", "a")].value, 10
    )
    del stored[storekeys.object_key("ModelDeployment", "old")]
    again = plan_apply(9, "d", [a, b], [record("a", "1.0.0")], stored, stored_models, now=101.0)
    assert again.compares == () and len(again.ops) == 1


def report(devices: int = 1, **fields: Any) -> federation_pb2.RegionReport:
    deployments = [federation_pb2.RegionDeploymentStatus(name="a", desired=2, updated=1, ready=1)]
    inventory = federation_pb2.RegionInventory(
        total=devices,
        devices=[federation_pb2.RegionDevice(name=f"d{i}", phase="Ready") for i in range(devices)],
    )
    r = federation_pb2.RegionReport(generation=1, deployments=deployments, inventory=inventory)
    for k, v in fields.items():
        setattr(r, k, v)
    return r


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda r: r.deployments.add(name="a"), "report.deployments[1].name: 'a' twice"),
        (lambda r: setattr(r.deployments[0], "ready", 9), "must not exceed desired"),
        (
            lambda r: setattr(r.deployments[0], "name", "x" * 300),
            "report.deployments[0].name: at most 253",
        ),
        (lambda r: r.deployments[0].failing.update({"d": "y" * 2000}), "at most 1024 characters"),
        (lambda r: setattr(r.inventory, "total", 0), "report.inventory.total"),
        (
            lambda r: r.inventory.devices[0].labels.update({"bad key!": "v"}),
            "report.inventory.devices[0].labels",
        ),
        (
            lambda r: r.inventory.devices[0].labels.update({"k": "bad value!"}),
            "report.inventory.devices[0].labels['k']: must be a label value",
        ),
        (
            lambda r: r.inventory.devices[0].labels.update({f"k{i}": "v" for i in range(65)}),
            "labels: at most 64",
        ),
    ],
)
def test_a_report_over_a_bound_is_refused_naming_the_field(change: Any, problem: str) -> None:
    r = report()
    assert regionmapping.check_report(r) == []
    change(r)
    assert any(problem in p for p in regionmapping.check_report(r)), regionmapping.check_report(r)


def test_too_many_devices_in_a_report() -> None:
    r = report(devices=regionslice.MAX_REPORT_DEVICES + 1)
    assert any("report.inventory.devices: at most" in p for p in regionmapping.check_report(r))


def test_the_root_adds_every_regions_figures() -> None:
    own = {"desiredDevices": 1, "readyDevices": 1, "failing": {"x": "Failed"}, "versions": {}}
    regions: dict[str, dict[str, Any] | None] = {
        "eu": {
            "desiredDevices": 2,
            "readyDevices": 1,
            "failing": {"d1": "Refused"},
            "versions": {"1.0.0": 2},
        },
        "us": None,
    }
    out = regionslice.add_regions(own, regions)
    assert out["desiredDevices"] == 3 and out["readyDevices"] == 2
    assert out["failing"] == {"eu/d1": "Refused", "x": "Failed"}
    assert out["versions"]["1.0.0"]["devices"] == 2
    assert out["regions"]["us"] is None


# -- the root's services over real gRPC ------------------------------------------------------


class Root:
    def __init__(self, tmp: Path, *, region_lifetime_s: float | None = None) -> None:
        self.tmp = tmp
        self.region_lifetime_s = region_lifetime_s  # [certificates] regionLifetime, if not default

    async def __aenter__(self) -> Root:
        port = free_port_pair()
        result = await init_hub(
            self.tmp / "root",
            region="root",
            hub_address=f"127.0.0.1:{port}",
            trust_setup=quickstart_trust,
        )
        self.paths = result.paths
        self.ctx = await build_context(self.paths.data_dir)
        if self.region_lifetime_s is not None:
            c = self.ctx.config
            self.ctx.config = dataclasses.replace(
                c,
                certificates=dataclasses.replace(
                    c.certificates, region_lifetime_s=self.region_lifetime_s
                ),
            )
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self.ctx.writer.run(self._stop))]
        self.running = await start_server(self.ctx, listen=f"127.0.0.1:{port}")
        self.address = f"127.0.0.1:{port}"
        self.pin = result.ca_pin
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.running.server.stop(None)
        self._stop.set()
        await asyncio.gather(*self._tasks)
        await self.ctx.store.close()

    async def token(self, region: str = "") -> str:
        token, _ = await tokens.create_token(
            self.ctx.store, now=self.ctx.clock(), ttl=600, for_region=region
        )
        return token

    async def enroll(self, region: str) -> HubPaths:
        paths = HubPaths.of(self.tmp / f"region-{region}-{len(list(self.tmp.iterdir()))}")
        paths.data_dir.mkdir()
        await enroll_with_parent(
            paths,
            parent=self.address,
            token=await self.token(region),
            ca_hash=self.pin,
            region=region,
        )
        return paths

    def channel(self, cert: bytes, key: bytes) -> grpc.aio.Channel:
        creds = grpc.ssl_channel_credentials(self.paths.ca_certificate.read_bytes(), key, cert)
        return grpc.aio.secure_channel(self.address, creds)

    def region_channel(self, paths: HubPaths) -> grpc.aio.Channel:
        d = paths.data_dir
        return self.channel(
            (d / "federation.crt").read_bytes(), (d / "federation.key").read_bytes()
        )


async def messages(
    *items: federation_pb2.RegionMessage, hold: float = 0.5
) -> AsyncIterator[federation_pb2.RegionMessage]:
    for item in items:
        yield item
    await asyncio.sleep(hold)


def hello(region: str) -> federation_pb2.RegionMessage:
    return federation_pb2.RegionMessage(hello=federation_pb2.RegionHello(region=region))


@async_test
async def test_a_region_enrolls_with_its_token_only(tmp_path: Path) -> None:
    async with Root(tmp_path) as root:
        paths = await root.enroll("eu")
        cert = pki.load_certificate((paths.data_dir / "federation.crt").read_bytes())
        identity = pki.identity_from_certificate(cert)
        assert (identity.role, identity.name, identity.region) == (pki.Role.HUB, "eu", "root")
        assert (paths.data_dir / "trust-root.json").read_bytes() == (
            root.paths.data_dir / "trust-root.json"
        ).read_bytes()
        for token, region in ((await root.token(), "us"), (await root.token("eu"), "us")):
            target = HubPaths.of(tmp_path / f"x-{region}-{token[:6]}")
            target.data_dir.mkdir()
            with pytest.raises(parentlink.FederationError, match="UNAUTHENTICATED"):
                await enroll_with_parent(
                    target, parent=root.address, token=token, ca_hash=root.pin, region=region
                )
            assert not (target.data_dir / "parent.json").exists()
        # a region's token enrolls no device (the same answer as any refused token)
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import NameOID

        from edgefleet.v1 import enrollment_pb2, enrollment_pb2_grpc
        from hub.api.enrollment import REFUSED

        key = pki.generate_key()
        csr = (
            x509.CertificateSigningRequestBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cam")]))
            .sign(key, hashes.SHA256())
            .public_bytes(serialization.Encoding.PEM)
        )
        host, port = root.address.split(":")
        creds = grpc.ssl_channel_credentials(root.paths.ca_certificate.read_bytes())
        async with grpc.aio.secure_channel(f"{host}:{int(port) + 1}", creds) as channel:
            request = enrollment_pb2.EnrollRequest(
                token=await root.token("us"), csr_pem=csr, name="cam"
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await enrollment_pb2_grpc.EnrollmentServiceStub(channel).Enroll(request, timeout=10)
            assert (err.value.code(), err.value.details()) == (
                grpc.StatusCode.UNAUTHENTICATED,
                REFUSED,
            )
        assert "cam" not in root.ctx.cache.devices
        with pytest.raises(parentlink.FederationError, match="no CA certificate matching"):
            await enroll_with_parent(
                HubPaths.of(tmp_path), parent=root.address, token=await root.token("us"),
                ca_hash="sha256:" + "0" * 64, region="us",
            )  # fmt: skip


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


def with_annotations(doc: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    return {**doc, "metadata": {**doc["metadata"], "annotations": annotations}}


def test_a_region_gets_its_replica_override() -> None:
    total = deployment("a")
    total["spec"]["replicas"] = {"total": 2}
    doc = with_annotations(total, {"federation.edgefleet.io/replicas.eu": "5"})
    s = regionslice.plan_slice("eu", [doc], {}, {}, [])
    assert s.objects[0]["spec"]["replicas"] == {"total": 5}
    assert regionslice.plan_slice("us", [doc], {}, {}, []).objects[0]["spec"]["replicas"] == {
        "total": 2
    }
    per = with_annotations(deployment("b"), {"federation.edgefleet.io/replicas.eu": "3"})
    assert regionslice.with_overrides(per, "eu")["spec"]["replicas"] == {"perDevice": 3}


def test_a_region_gets_its_model_variant_at_the_deployments_versions() -> None:
    doc = with_annotations(
        deployment("det", version="2.0.0"),
        {
            "federation.edgefleet.io/model.eu": "det-int8",
            "federation.edgefleet.io/replicas.eu": "2",
        },
    )
    models = {
        (n, v): record(n, v) for n in ("det", "det-int8") for v in ("1.0.0", "2.0.0", "3.0.0")
    }
    revisions = {"det": [("det", "1.0.0"), ("det", "2.0.0")]}
    eu = regionslice.plan_slice("eu", [doc], models, revisions, [])
    assert eu.objects[0]["spec"]["model"] == {"name": "det-int8", "version": "2.0.0"}
    assert eu.objects[0]["spec"]["replicas"] == {"perDevice": 2}  # both overrides
    assert [(m.name, m.version) for m in eu.models] == [
        ("det-int8", "1.0.0"),
        ("det-int8", "2.0.0"),
    ]
    us = regionslice.plan_slice("us", [doc], models, revisions, [])
    assert us.objects[0]["spec"]["model"] == {"name": "det", "version": "2.0.0"}
    assert [(m.name, m.version) for m in us.models] == [("det", "1.0.0"), ("det", "2.0.0")]
    assert regionslice.with_overrides(doc, "us") is doc


def test_a_region_gets_its_precision_variant() -> None:
    doc = with_annotations(deployment("det"), {"federation.edgefleet.io/precision.eu": "int8"})
    doc["spec"]["runtime"] = {"maxBatchSize": 4}
    doc = parse_manifest(doc).to_dict()
    eu = regionslice.plan_slice("eu", [doc], {}, {}, []).objects[0]
    assert eu["spec"]["runtime"] == {**doc["spec"]["runtime"], "precision": "int8"}
    assert eu["spec"]["model"] == doc["spec"]["model"]  # the same artifact, another extra
    assert parse_manifest(dict(eu)).to_dict() == eu  # a canonical manifest the region accepts
    assert regionslice.plan_slice("us", [doc], {}, {}, []).objects[0] == doc


@pytest.mark.parametrize(
    ("annotations", "problem"),
    [
        (
            {"federation.edgefleet.io/replicas.eu": "0"},
            "must be a whole number from 1 to 100000, got '0'",
        ),
        ({"federation.edgefleet.io/replicas.eu": "two"}, "got 'two'"),
        ({"federation.edgefleet.io/replicas.EU_1": "2"}, "the region: must be a DNS label"),
        ({"federation.edgefleet.io/model.eu": "Det Int8"}, "the model name: must be a DNS label"),
        ({"federation.edgefleet.io/model.eu": ""}, "the model name:"),
        ({"federation.edgefleet.io/model.EU_1": "det-int8"}, "the region: must be a DNS label"),
        (
            {"federation.edgefleet.io/runtime.eu": "fp16"},
            "not supported: the per-region overrides are federation.edgefleet.io/replicas.<region>"
            " (a replica count), federation.edgefleet.io/model.<region> (a model variant) and "
            "federation.edgefleet.io/precision.<region> (a precision variant)",
        ),
        ({"federation.edgefleet.io/max-weight": "10"}, "not applied by hand"),
        (
            {"federation.edgefleet.io/precision.eu": "int4"},
            'must be one of fp32, fp16, int8, got "int4"',
        ),
    ],
)
def test_a_bad_override_is_refused_at_apply_naming_the_annotation(
    annotations: dict[str, str], problem: str
) -> None:
    from edgefleet.errors import ValidationError
    from hub.decide import apply

    doc = with_annotations(deployment("a"), annotations)
    with pytest.raises(ValidationError) as err:
        apply.parse_documents([storekeys.dumps(doc)])
    text = "\n".join(str(p) for p in err.value.problems)
    key = next(iter(annotations))
    assert f'documents[0].metadata.annotations["{key}"]' in text, text
    assert problem in text, text
    assert apply.parse_documents([storekeys.dumps(deployment("a"))])  # no override: fine


def test_a_model_variant_is_refused_where_it_cannot_apply() -> None:
    from edgefleet.errors import ValidationError
    from hub.decide import apply

    pinned = deployment("a")
    pinned["spec"]["model"]["sha256"] = "ab" * 32
    baseline = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "SecurityBaseline",
        "metadata": {"name": "fleet"},
        "spec": {"requireAttestation": False},
    }
    for doc, problem in (
        (pinned, "spec.model may not pin the artifact itself (it sets sha256)"),
        (baseline, "a model override applies to a ModelDeployment only"),
    ):
        annotated = with_annotations(doc, {"federation.edgefleet.io/model.eu": "a-int8"})
        with pytest.raises(ValidationError) as err:
            apply.parse_documents([storekeys.dumps(annotated)])
        text = "\n".join(str(p) for p in err.value.problems)
        assert problem in text, text


def admin_channel(root: Root) -> grpc.aio.Channel:
    admin = pki.load_certified_key(root.paths.admin_certificate, root.paths.admin_key)
    return root.channel(pki.certificate_pem(admin.certificate), pki.private_key_pem(admin.key))


@async_test
async def test_a_revoked_region_is_cut_off_until_it_enrolls_again(tmp_path: Path) -> None:
    async with Root(tmp_path) as root:
        paths = await root.enroll("eu")
        serial = format(
            pki.load_certificate((paths.data_dir / "federation.crt").read_bytes()).serial_number,
            "x",
        )
        async with root.region_channel(paths) as channel, admin_channel(root) as admin:
            stub = federation_pb2_grpc.FederationServiceStub(channel)
            admin_stub = admin_pb2_grpc.AdminServiceStub(admin)
            ended = asyncio.Event()

            async def held_open() -> AsyncIterator[federation_pb2.RegionMessage]:
                yield hello("eu")
                await ended.wait()

            call = stub.Federate(held_open())
            assert (await call.read()).slice.generation > 0
            response = await admin_stub.RevokeRegion(
                admin_pb2.RevokeRegionRequest(region="eu"), timeout=30
            )
            assert list(response.serials) == [serial]
            # the open stream is closed, naming the revocation
            with pytest.raises(grpc.aio.AioRpcError) as err:
                while True:
                    await asyncio.wait_for(call.read(), 30)
            assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
            assert "revoked" in (err.value.details() or "")
            ended.set()
            # every later call with that certificate is refused
            call = stub.Federate(messages(hello("eu")))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call.read()
            assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
            assert f"certificate {serial} of hub eu has been revoked" in (err.value.details() or "")
            call.cancel()
            fetch = stub.FetchFederatedArtifact(
                federation_pb2.FetchFederatedArtifactRequest(sha256="a" * 64)
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await fetch.read()
            assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
            # revoking again answers the same; a region that never enrolled is NOT_FOUND
            again = await admin_stub.RevokeRegion(
                admin_pb2.RevokeRegionRequest(region="eu"), timeout=30
            )
            assert list(again.serials) == [serial]
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await admin_stub.RevokeRegion(
                    admin_pb2.RevokeRegionRequest(region="us"), timeout=30
                )
            assert err.value.code() is grpc.StatusCode.NOT_FOUND
        # the root no longer counts it, now or after a restart, and says why
        regions = root.ctx.regions
        assert regions is not None and "eu" not in regions.regions
        assert regions.deployment_status("a", deployment("a")) == {}
        assert "eu" not in (await Regions.load(root.ctx.store)).regions
        revoked = [
            e
            for e in root.ctx.cache.events
            if e["object"] == {"kind": "Region", "name": "eu"} and e["reason"] == "Revoked"
        ]
        assert len(revoked) == 1 and serial in revoked[0]["message"]
        # enrolled again with a new token: a new certificate that works
        fresh = await root.enroll("eu")
        async with root.region_channel(fresh) as channel:
            call = federation_pb2_grpc.FederationServiceStub(channel).Federate(
                messages(hello("eu"), hold=1)
            )
            assert (await call.read()).slice.generation > 0
            call.cancel()
        assert "eu" in (await Regions.load(root.ctx.store)).regions
        await asyncio.sleep(1.2)  # the request generators' last wait


def inventory_report(phases: dict[str, int], deployments: int = 1) -> federation_pb2.RegionReport:
    rows = [
        federation_pb2.RegionDevice(name=f"{phase.lower()}-{i}", phase=phase)
        for phase, n in phases.items()
        for i in range(n)
    ]
    return federation_pb2.RegionReport(
        generation=1,
        deployments=[
            federation_pb2.RegionDeploymentStatus(name=f"dep-{i}") for i in range(deployments)
        ],
        inventory=federation_pb2.RegionInventory(total=len(rows), by_phase=phases, devices=rows),
    )


def test_a_region_object_is_small_whatever_the_regions_size() -> None:
    """``get regions`` is bounded by the number of regions: a Region carries counts, never
    the region's device or deployment lists (a report may list 20,000 devices)."""
    state = RegionState("eu", "ab", 1.0, not_after=2.0)
    big = inventory_report({"Ready": regionslice.MAX_REPORT_DEVICES}, deployments=2000)
    seen = regions_module.Seen(big, 5.0, connected=True)
    doc = regions_module.region_object(state, seen, now=7.0, here="hub")
    assert len(storekeys.dumps(doc)) < 1024
    assert doc["status"]["devices"] == {
        "total": regionslice.MAX_REPORT_DEVICES,
        "ready": regionslice.MAX_REPORT_DEVICES,
        "byPhase": {"Ready": regionslice.MAX_REPORT_DEVICES},
    }
    assert doc["status"]["deployments"] == 2000 and doc["status"]["reportAgeSeconds"] == 2.0


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


def slow_test(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Like :func:`asynctesting.async_test`, with a guard sized for a certificate's life."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        async def main() -> None:
            await asyncio.wait_for(fn(*args, **kwargs), 240)
            await asyncio.sleep(0.2)  # tasks cancelled by the link finish
            leaked = asyncio.all_tasks() - {asyncio.current_task()}
            assert not leaked, f"leaked tasks: {leaked}"

        asyncio.run(main())

    return wrapper


def serial_of(pem: bytes) -> str:
    return format(pki.load_certificate(pem).serial_number, "x")


def test_renewal_is_due_70_to_90_percent_into_the_life_as_received() -> None:
    ca = pki.create_ca("root")
    key = pki.generate_key()
    now = pki.now_utc()
    cert = pki.sign_child_hub_csr(
        ca,
        parentlink._csr(key, "eu"),
        pki.Identity(pki.Role.HUB, "eu", "root"),
        now=now,
        lifetime=timedelta(seconds=100),
    )
    pem = pki.certificate_pem(cert)
    t = now.timestamp()
    # notBefore is backdated for clock skew: life counts from when it was received
    assert parentlink.renewal_due(pem, t, 0.7) == pytest.approx(t + 70, abs=1)
    assert parentlink.renewal_due(pem, t, 0.9) == pytest.approx(t + 90, abs=1)
    assert parentlink.renewal_due(pem, t + 1000, 0.8) == pytest.approx(t + 1000, abs=1)


@pytest.mark.scenario
@slow_test
async def test_a_region_renews_its_certificate_over_the_link(tmp_path: Path) -> None:
    async with Root(tmp_path, region_lifetime_s=30.0) as root:
        token = await root.token("eu")

        async def setup(paths: HubPaths, ca: pki.CertifiedKey) -> None:
            await enroll_with_parent(
                paths, parent=root.address, token=token, ca_hash=root.pin, region="eu"
            )

        paths = (
            await init_hub(
                tmp_path / "eu", region="eu", hub_address="127.0.0.1:7443", trust_setup=setup
            )
        ).paths
        cert_file = paths.data_dir / "federation.crt"
        first = cert_file.read_bytes()
        region = await build_context(paths.data_dir)
        files = parentlink.ParentFiles.load(paths.data_dir)
        assert files is not None
        link = parent_link(region, files)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(link.run(stop)), asyncio.create_task(region.writer.run(stop))]
        try:
            for _ in range(900):  # due 21-27 s in; up to 180 s for a loaded machine
                if link.renewed_at is not None:
                    break
                await asyncio.sleep(0.2)
            assert link.renewed_at is not None, "no renewal before the deadline"
        finally:
            stop.set()
            await asyncio.gather(*tasks)
            await region.store.close()
        second = cert_file.read_bytes()
        assert second != first and link.files.certificate == second  # the next connection's
        identity = pki.identity_from_certificate(pki.load_certificate(second))
        assert (identity.role, identity.name, identity.region) == (pki.Role.HUB, "eu", "root")
        assert cert_file.stat().st_mode & 0o777 == 0o644
        assert [p.name for p in paths.data_dir.iterdir() if p.name.endswith(".tmp")] == []
        record = storekeys.loads((await root.ctx.store.get("/regions/eu")).value)  # type: ignore[union-attr]
        assert (record["certificateSerial"], record["previousSerial"]) == (
            serial_of(second),
            serial_of(first),
        )
        not_after = pki.load_certificate(second).not_valid_after_utc.timestamp()
        assert record["certificateNotAfter"] == not_after  # edgectl get regions -o wide
        assert root.ctx.regions.regions["eu"].not_after == not_after  # type: ignore[union-attr]
        assert any(
            e["object"] == {"kind": "Region", "name": "eu"} and e["reason"] == "CertificateRenewed"
            for e in root.ctx.cache.events
        )

        async def federates(pem: bytes) -> grpc.StatusCode:
            key = (paths.data_dir / "federation.key").read_bytes()
            async with root.channel(pem, key) as channel:
                call = federation_pb2_grpc.FederationServiceStub(channel).Federate(
                    messages(hello("eu"), hold=0.2)
                )
                try:
                    await call.read()
                    return grpc.StatusCode.OK
                except grpc.aio.AioRpcError as exc:
                    return exc.code()
                finally:
                    call.cancel()

        # the new certificate works; the one it was asked with too, until the next renewal
        assert await federates(second) is grpc.StatusCode.OK
        assert await federates(first) is grpc.StatusCode.OK
        link = parent_link(region, parentlink.ParentFiles.load(paths.data_dir))  # type: ignore[arg-type]
        await link.renew()
        third = cert_file.read_bytes()
        assert await federates(third) is grpc.StatusCode.OK
        assert await federates(first) is grpc.StatusCode.UNAUTHENTICATED
        # a revoked region is refused a certificate
        regions = root.ctx.regions
        assert regions is not None
        await revoke_region(
            root.ctx.store, root.ctx.cache, root.ctx.writer, regions, "eu", now=time.time()
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await link.renew()
        assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert cert_file.read_bytes() == third
        await asyncio.sleep(0.5)  # the request generators' last wait


def model_value(r: storekeys.ModelRecord, generation: int | None) -> bytes:
    doc = r.to_json()
    if generation is not None:
        doc["federated"] = {"generation": generation}
    return storekeys.dumps(doc)


def test_root_models_no_longer_sent_nor_used_are_removed_never_the_regions_own() -> None:
    records = {v: record("m", v) for v in ("1.0.0", "2.0.0", "3.0.0", "4.0.0", "5.0.0", "6.0.0")}
    owned = {"1.0.0", "2.0.0", "3.0.0", "4.0.0", "6.0.0"}  # 5.0.0 was pushed at the region
    stored_models = {
        storekeys.model_key("m", v): StoredValue(
            "k", model_value(r, 3 if v in owned else None), 10 + i
        )
        for i, (v, r) in enumerate(sorted(records.items()))
    }
    local = deployment("mine", version="3.0.0")  # the region's own deployment uses m 3.0.0
    local["spec"]["model"]["name"] = "m"
    stored_objects = {
        storekeys.object_key("ModelDeployment", "mine"): StoredValue(
            "k", storekeys.object_value(local, 1.0), 5
        )
    }
    plan = plan_apply(
        9,
        "d",
        [deployment("m", version="2.0.0")],  # sent without its model record: still used
        [records["6.0.0"]],  # still sent
        stored_objects,
        stored_models,
        now=100.0,
        kept={("m", "4.0.0")},  # a revision of the region's may go back to it
    )
    assert plan.dropped_models == (("m", "1.0.0"),)
    key = storekeys.model_key("m", "1.0.0")
    assert [op.key for op in plan.ops if isinstance(op, Delete)] == [key]
    assert (key, 10) in [(c.key, c.mod_revision) for c in plan.compares]
    # nothing sent and nothing used: every root-owned model goes, the region's push stays
    bare = plan_apply(10, "e", [], [], {}, stored_models, now=101.0)
    assert sorted(v for _, v in bare.dropped_models) == sorted(owned)


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
        files = parentlink.ParentFiles("127.0.0.1:1", "eu", "root", b"", b"", b"")
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


@async_test
async def test_a_refused_region_hears_the_refusal_not_a_broken_call(tmp_path: Path) -> None:
    """The root reads the hello before it refuses a caller: a refusal sent while the region
    still writes its hello would reach it as the client's own INTERNAL (its failed write), and
    the region would log a broken link instead of why it was refused. A new connection each
    time, as a region that reconnects makes: its hello goes out as the root answers."""
    async with Root(tmp_path) as root:
        paths = await root.enroll("eu")
        await root.enroll("eu")  # enrolled again: the first certificate is superseded
        codes: collections.Counter[str] = collections.Counter()
        for _ in range(40):
            async with root.region_channel(paths) as channel:
                stub = federation_pb2_grpc.FederationServiceStub(channel)
                call = stub.Federate(messages(hello("eu"), hold=0.05))
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call.read()
                codes[err.value.code().name] += 1
                call.cancel()
        assert codes == {"UNAUTHENTICATED": 40}
        await asyncio.sleep(0.2)  # the request generators' last wait
