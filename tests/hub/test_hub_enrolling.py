"""EnrollmentService over real TLS on loopback: a hub made by ``hub init``, a real SQLite store,
CSRs from edged's real identity key. Bad input gets a precise status and writes nothing."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import orjson
from asynctesting import async_test
from hubserving import AdminHub, make_hub_dir

from edged.trust.identity import load_or_create_identity
from edgefleet.v1 import admin_pb2, admin_pb2_grpc, enrollment_pb2, enrollment_pb2_grpc
from hub import pki, tokens


def _enroll_stub(
    hub: AdminHub,
) -> tuple[grpc.aio.Channel, enrollment_pb2_grpc.EnrollmentServiceStub]:
    creds = grpc.ssl_channel_credentials(root_certificates=hub.paths.ca_certificate.read_bytes())
    channel = grpc.aio.secure_channel(f"127.0.0.1:{hub.enroll_port}", creds)
    return channel, enrollment_pb2_grpc.EnrollmentServiceStub(channel)


def _csr(tmp_path: Path, name: str = "device") -> bytes:
    identity = load_or_create_identity(tmp_path / f"id-{name}", tpm="off")
    try:
        return identity.build_csr(name)
    finally:
        identity.close()


async def _code(call: object) -> tuple[grpc.StatusCode, str]:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


@async_test
async def test_enroll_and_every_refusal(tmp_path: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub:
        token, _ = await tokens.create_token(
            hub.ctx.store, now=time.time(), ttl=600, single_use=True, labels={"site": "lab"}
        )
        channel, stub = _enroll_stub(hub)
        async with channel:
            csr = _csr(tmp_path)

            def req(**kw: object) -> enrollment_pb2.EnrollRequest:
                fields: dict[str, object] = {"token": token, "csr_pem": csr, "name": "cam-1"}
                fields.update(kw)
                return enrollment_pb2.EnrollRequest(**fields)  # type: ignore[arg-type]

            refusals = [
                (req(name="Not A Name"), grpc.StatusCode.INVALID_ARGUMENT, "name:"),
                (req(labels={"bad key!": "x"}), grpc.StatusCode.INVALID_ARGUMENT, "labels["),
                (req(csr_pem=b"garbage"), grpc.StatusCode.INVALID_ARGUMENT, "csr_pem:"),
                (req(csr_pem=b""), grpc.StatusCode.INVALID_ARGUMENT, "csr_pem: required"),
                (req(token="nope"), grpc.StatusCode.INVALID_ARGUMENT, "bootstrap token"),
                (
                    req(token="abcdef.0123456789abcdef"),
                    grpc.StatusCode.UNAUTHENTICATED,
                    "does not exist",
                ),
                (
                    req(token=token.split(".")[0] + ".0123456789abcdef"),
                    grpc.StatusCode.UNAUTHENTICATED,
                    "secret is wrong",
                ),
            ]
            for request, code, words in refusals:
                got, details = await _code(stub.Enroll(request, timeout=10))
                assert (got, words in details) == (code, True), (request.name, got, details)
            assert hub.ctx.cache.devices == {}  # nothing written...
            await tokens.validate(hub.ctx.store, token, now=time.time())  # ...nor used up

            resp = await stub.Enroll(req(labels={"zone": "z1"}), timeout=10)
            assert resp.device_name == "cam-1"
            cert = pki.load_certificate(resp.certificate_chain_pem)
            identity = pki.identity_from_certificate(cert)
            assert (identity.role, identity.name) == (pki.Role.DEVICE, "cam-1")
            assert resp.trust_root == hub.ctx.trust_root  # the fleet's root, exactly as signed
            device = hub.ctx.cache.devices["cam-1"]
            assert device.labels == {"site": "lab", "zone": "z1"}
            assert device.certificate_serial == format(cert.serial_number, "x")

            got, details = await _code(stub.Enroll(req(), timeout=10))
            assert got is grpc.StatusCode.PERMISSION_DENIED and "used" in details
            token2, _ = await tokens.create_token(hub.ctx.store, now=time.time(), ttl=600)
            got, details = await _code(stub.Enroll(req(token=token2), timeout=10))
            assert got is grpc.StatusCode.ALREADY_EXISTS and "cam-1" in details


@async_test
async def test_malformed_messages_and_the_enrollment_port_without_a_certificate(
    tmp_path: Path,
) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub:
        channel, _ = _enroll_stub(hub)
        async with channel:
            raw = channel.unary_unary(
                "/edgefleet.v1.EnrollmentService/Enroll",
                request_serializer=lambda b: b,
                response_deserializer=lambda b: b,
            )
            got, _ = await _code(raw(b"\xff\xff\xff\xff not protobuf", timeout=10))
            assert got in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)
            admin = admin_pb2_grpc.AdminServiceStub(channel)  # no client certificate here
            got, details = await _code(admin.List(admin_pb2.ListRequest(kind="Device")))
            assert got is grpc.StatusCode.UNAUTHENTICATED and "certificate" in details
        async with hub.channel() as ch:  # the hub still serves everyone else
            listed = await hub.stub(ch).List(admin_pb2.ListRequest(kind="Device"), timeout=10)
            assert list(listed.items) == []


@async_test
async def test_a_hub_cannot_give_an_enrolling_device_its_own_root(tmp_path: Path) -> None:
    """``edged enroll`` (the device's real code) against a real hub that serves a root of its
    own making: refused with an image root, refused against a pin, refused with neither before
    the token is spent; the fleet's root, pinned, is accepted. Nothing is written on refusal."""
    from edged.hublink.enrolling import EnrollError, enroll
    from edgefleet.trust.signing import create_root, generate_key_pair
    from edgefleet.trust.verifying import root_digest

    for name in ("root", "publisher", "hubkey"):
        generate_key_pair(tmp_path / name)
    fleet_root = create_root(
        root_keys=[tmp_path / "root.key"],
        artifact_keys=[tmp_path / "publisher.pub"],
        out=tmp_path / "image-root.json",
    )
    hub_root = create_root(
        root_keys=[tmp_path / "hubkey.key"], artifact_keys=[tmp_path / "hubkey.pub"]
    )
    fleet_pin, hub_pin = f"sha256:{root_digest(fleet_root)}", f"sha256:{root_digest(hub_root)}"
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub:
        hub.ctx.trust_root = hub_root.to_bytes()  # a compromised hub
        ca_pin = pki.ca_pin(hub.ctx.ca.certificate)

        async def attempt(data: Path, **kw: object) -> str:
            token, _ = await tokens.create_token(hub.ctx.store, now=time.time(), ttl=600)
            try:
                await enroll(
                    data,
                    hub=f"127.0.0.1:{hub.port}",
                    enroll_address=f"127.0.0.1:{hub.enroll_port}",
                    token=token,
                    labels={},
                    name=data.name,
                    ca_hash=ca_pin,
                    **kw,  # type: ignore[arg-type]
                )
            except EnrollError as exc:
                assert not (data / "hub" / "link.json").exists()
                return str(exc)
            return "enrolled"

        absent = tmp_path / "no-image-root.json"
        got = await attempt(tmp_path / "dev-a", root_file=tmp_path / "image-root.json")
        assert "RootConflict" in got, got
        got = await attempt(tmp_path / "dev-b", root_file=absent, root_hash=fleet_pin)
        assert "RootPinMismatch" in got, got
        got = await attempt(tmp_path / "dev-c", root_file=absent)
        assert "no trust root" in got and "--root-hash" in got, got
        assert len(hub.ctx.cache.devices) == 2  # the third never reached the hub
        got = await attempt(tmp_path / "dev-d", root_file=absent, root_hash="sha256:nothex")
        assert "--root-hash must look like" in got, got

        hub.ctx.trust_root = fleet_root.to_bytes()
        assert (
            await attempt(tmp_path / "dev-e", root_file=absent, root_hash=fleet_pin) == "enrolled"
        )
        state = orjson.loads((tmp_path / "dev-e" / "trust" / "state.json").read_bytes())
        assert state["rootDigests"] == {"1": root_digest(fleet_root)}
        # An image root and a pin of another root: the pin must be on the accepted chain.
        got = await attempt(
            tmp_path / "dev-f", root_file=tmp_path / "image-root.json", root_hash=hub_pin
        )
        assert "RootPinMismatch" in got, got
        got = await attempt(tmp_path / "dev-g", root_file=tmp_path / "image-root.json")
        assert got == "enrolled"
