"""One current certificate per device, over real mutual TLS: a real hub (``hub init``, SQLite),
a device enrolled through the real Enroll RPC with edged's real identity key, renewals through
the real RenewCertificate RPC. The certificate a renewal was asked with works until the device
has connected once with the new one, and never again after (across a hub restart too);
revocation covers both certificates of a hand-over."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
from asynctesting import async_test
from hubserving import AdminHub, make_hub_dir

from edged.trust.identity import load_or_create_identity
from edgefleet.v1 import (
    admin_pb2,
    device_pb2,
    device_pb2_grpc,
    enrollment_pb2,
    enrollment_pb2_grpc,
)
from edgefleet.versioning import installed_version
from hub import pki
from hub.state import tokens


class Device:
    """A device's identity key and the certificates it was given, newest last."""

    def __init__(self, tmp_path: Path, name: str) -> None:
        self.name = name
        self.dir = tmp_path / name
        self.chains: list[bytes] = []

    def csr(self) -> bytes:
        identity = load_or_create_identity(self.dir, tpm="off")
        try:
            return identity.build_csr(self.name)
        finally:
            identity.close()

    def credentials(self, hub: AdminHub, index: int) -> grpc.ChannelCredentials:
        key = (self.dir / "identity" / "key.pem").read_bytes()
        ca = hub.paths.ca_certificate.read_bytes()
        return grpc.ssl_channel_credentials(ca, key, self.chains[index])

    def serial(self, index: int) -> str:
        return format(pki.load_certificate(self.chains[index]).serial_number, "x")

    async def enroll(self, hub: AdminHub) -> None:
        token, _ = await tokens.create_token(hub.ctx.store, now=time.time(), ttl=600)
        ca = hub.paths.ca_certificate.read_bytes()
        async with grpc.aio.secure_channel(
            f"127.0.0.1:{hub.enroll_port}", grpc.ssl_channel_credentials(ca)
        ) as ch:
            resp = await enrollment_pb2_grpc.EnrollmentServiceStub(ch).Enroll(
                enrollment_pb2.EnrollRequest(token=token, csr_pem=self.csr(), name=self.name),
                timeout=10,
            )
        self.chains.append(bytes(resp.certificate_chain_pem))

    async def renew(self, hub: AdminHub, index: int) -> tuple[grpc.StatusCode, str]:
        async with grpc.aio.secure_channel(
            f"127.0.0.1:{hub.port}", self.credentials(hub, index)
        ) as ch:
            try:
                resp = await device_pb2_grpc.DeviceServiceStub(ch).RenewCertificate(
                    device_pb2.RenewCertificateRequest(csr_pem=self.csr()), timeout=10
                )
            except grpc.aio.AioRpcError as exc:
                return exc.code(), exc.details() or ""
        self.chains.append(bytes(resp.certificate_chain_pem))
        return grpc.StatusCode.OK, ""

    async def sync(self, hub: AdminHub, index: int) -> tuple[grpc.StatusCode, str]:
        """Open Sync with certificate ``index``: OK once the desired state arrives."""
        async with grpc.aio.secure_channel(
            f"127.0.0.1:{hub.port}", self.credentials(hub, index)
        ) as ch:
            call = device_pb2_grpc.DeviceServiceStub(ch).Sync(timeout=10)
            try:
                await call.write(
                    device_pb2.DeviceMessage(
                        hello=device_pb2.Hello(
                            edged_version=installed_version(), device_name=self.name
                        )
                    )
                )
                msg = await call.read()
            except grpc.aio.AioRpcError as exc:
                return exc.code(), exc.details() or ""
            if msg is grpc.aio.EOF:
                return await call.code(), await call.details()
            assert msg.WhichOneof("message") == "desired_state"
            call.cancel()
            return grpc.StatusCode.OK, ""


OK = grpc.StatusCode.OK
REFUSED = grpc.StatusCode.UNAUTHENTICATED


@async_test
async def test_a_superseded_certificate_is_refused_after_the_hand_over(tmp_path: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    cam = Device(tmp_path, "cam-1")
    async with AdminHub(paths) as hub:
        await cam.enroll(hub)
        assert (await cam.renew(hub, 0))[0] is OK
        # until the device has connected with certificate 1, certificate 0 still works
        # (the renewal's reply may have been lost)
        assert (await cam.sync(hub, 0))[0] is OK
        assert hub.ctx.cache.devices["cam-1"].previous_serial == cam.serial(0)
        assert (await cam.sync(hub, 1))[0] is OK  # the hand-over
        assert hub.ctx.cache.devices["cam-1"].previous_serial == ""
        code, details = await cam.sync(hub, 0)
        assert code is REFUSED and "superseded" in details
        assert (await cam.renew(hub, 0))[0] is REFUSED  # nor can it renew itself back in
        assert (await cam.sync(hub, 1))[0] is OK
    async with AdminHub(paths) as hub:  # stored, not just remembered
        assert (await cam.sync(hub, 0))[0] is REFUSED
        assert (await cam.sync(hub, 1))[0] is OK
        reasons = [e["reason"] for e in hub.ctx.cache.events if e["object"]["name"] == "cam-1"]
        assert "CertificateRenewed" in reasons and "CertificateHandedOver" in reasons


@async_test
async def test_renewal_and_revocation_together(tmp_path: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    cam = Device(tmp_path, "cam-1")
    async with AdminHub(paths) as hub:
        await cam.enroll(hub)
        assert (await cam.renew(hub, 0))[0] is OK
        assert (await cam.renew(hub, 0))[0] is OK  # asked again with the old one: 2 replaces 1
        assert (await cam.sync(hub, 1))[0] is REFUSED  # only the newest and the asking one
        assert (await cam.sync(hub, 0))[0] is OK
        # revoked in the middle of the hand-over: both certificates are revoked
        async with hub.channel() as ch:
            resp = await hub.stub(ch).RevokeDevice(
                admin_pb2.RevokeDeviceRequest(device_name="cam-1"), timeout=10
            )
        assert set(resp.serials) == {cam.serial(2), cam.serial(0)}
        for index in (0, 1, 2):
            assert (await cam.sync(hub, index))[0] is REFUSED
        assert (await cam.renew(hub, 2))[0] is REFUSED
