"""EnrollmentService over real TLS on loopback: a hub made by ``hub init``, a real SQLite store,
CSRs from edged's real identity key. Bad input gets a precise status and writes nothing."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import orjson
from asynctesting import async_test
from hubserving import AdminHub, make_hub_dir

from edged.hublink.enrolling import EnrollError, enroll
from edged.trust.identity import load_or_create_identity
from edgefleet.trust.envelopes import Envelope
from edgefleet.trust.signing import create_root, generate_key_pair
from edgefleet.trust.verifying import root_digest
from edgefleet.v1 import admin_pb2, admin_pb2_grpc, enrollment_pb2, enrollment_pb2_grpc
from hub import pki, tokens
from hub.trustroots import HubRoots, install_roots


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


@dataclass
class Roots:
    fleet: Envelope  # the fleet's root, in the image (image-root.json)
    hub: Envelope  # a root the hub made with a key of its own
    image: Path
    absent: Path

    @property
    def fleet_pin(self) -> str:
        return f"sha256:{root_digest(self.fleet)}"

    @property
    def hub_pin(self) -> str:
        return f"sha256:{root_digest(self.hub)}"


def _roots(tmp_path: Path) -> Roots:
    for name in ("root", "publisher", "hubkey"):
        generate_key_pair(tmp_path / name)
    fleet = create_root(
        root_keys=[tmp_path / "root.key"],
        artifact_keys=[tmp_path / "publisher.pub"],
        out=tmp_path / "image-root.json",
    )
    hub = create_root(root_keys=[tmp_path / "hubkey.key"], artifact_keys=[tmp_path / "hubkey.pub"])
    return Roots(fleet, hub, tmp_path / "image-root.json", tmp_path / "no-image-root.json")


async def _attempt(hub: AdminHub, data: Path, **kw: object) -> str:
    """``edged enroll`` (the device's real code); "enrolled" or the error (nothing written)."""
    token, _ = await tokens.create_token(hub.ctx.store, now=time.time(), ttl=600)
    try:
        await enroll(
            data,
            hub=f"127.0.0.1:{hub.port}",
            enroll_address=f"127.0.0.1:{hub.enroll_port}",
            token=token,
            labels={},
            name=data.name,
            ca_hash=pki.ca_pin(hub.ctx.ca.certificate),
            **kw,  # type: ignore[arg-type]
        )
    except EnrollError as exc:
        assert not (data / "hub" / "link.json").exists()
        return str(exc)
    return "enrolled"


@async_test
async def test_a_hub_cannot_give_an_enrolling_device_its_own_root(tmp_path: Path) -> None:
    """A compromised hub serves a root of its own making: refused against the image's root,
    refused against a pin, and with neither the device refuses before spending the token."""
    roots = _roots(tmp_path)
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub:
        install_roots(hub.ctx, HubRoots((roots.hub.to_bytes(),)))
        got = await _attempt(hub, tmp_path / "dev-a", root_file=roots.image)
        assert "RootConflict" in got, got
        got = await _attempt(
            hub, tmp_path / "dev-b", root_file=roots.absent, root_hash=roots.fleet_pin
        )
        assert "RootPinMismatch" in got, got
        got = await _attempt(hub, tmp_path / "dev-c", root_file=roots.absent)
        assert "no trust root" in got and "--root-hash" in got, got
        got = await _attempt(hub, tmp_path / "dev-d", root_file=roots.absent, root_hash="sha256:x")
        assert "--root-hash must look like" in got, got
        assert sorted(hub.ctx.cache.devices) == ["dev-a", "dev-b"]  # c, d never reached it


@async_test
async def test_the_fleet_root_is_taken_by_pin_or_from_the_image(tmp_path: Path) -> None:
    roots = _roots(tmp_path)
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub:
        install_roots(hub.ctx, HubRoots((roots.fleet.to_bytes(),)))
        got = await _attempt(
            hub, tmp_path / "dev-e", root_file=roots.absent, root_hash=roots.fleet_pin
        )
        assert got == "enrolled", got
        state = orjson.loads((tmp_path / "dev-e" / "trust" / "state.json").read_bytes())
        assert state["rootDigests"] == {"1": root_digest(roots.fleet)}
        # An image root and a pin of another root: the pin must be on the accepted chain.
        got = await _attempt(
            hub, tmp_path / "dev-f", root_file=roots.image, root_hash=roots.hub_pin
        )
        assert "RootPinMismatch" in got, got
        assert await _attempt(hub, tmp_path / "dev-g", root_file=roots.image) == "enrolled"
