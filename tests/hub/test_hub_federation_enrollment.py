"""A region's enrollment with its root (docs/federation.md), over real gRPC with real
certificates on loopback (a hub made by ``hub init``, a region enrolled with
``hub.controllers.parentlink.regionenrollment.enroll_with_parent``): its token, its certificate
renewed over the link, revoked, and refused."""

from __future__ import annotations

import asyncio
import collections
import functools
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from asynctesting import async_test
from hubfederationtesting import (
    Root,
    admin_channel,
    deployment,
    hello,
    messages,
)

from edgefleet.v1 import admin_pb2, admin_pb2_grpc, federation_pb2, federation_pb2_grpc
from hub import pki
from hub.controllers.parentlink import regionenrollment
from hub.controllers.parentlink.regionenrollment import enroll_with_parent
from hub.initializing import HubPaths, init_hub
from hub.server import build_context, parent_link
from hub.state import storekeys
from hub.state.regions import Regions, revoke_region


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
            with pytest.raises(regionenrollment.FederationError, match="UNAUTHENTICATED"):
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
        with pytest.raises(regionenrollment.FederationError, match="no CA certificate matching"):
            await enroll_with_parent(
                HubPaths.of(tmp_path), parent=root.address, token=await root.token("us"),
                ca_hash="sha256:" + "0" * 64, region="us",
            )  # fmt: skip


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
        regionenrollment.make_csr(key, "eu"),
        pki.Identity(pki.Role.HUB, "eu", "root"),
        now=now,
        lifetime=timedelta(seconds=100),
    )
    pem = pki.certificate_pem(cert)
    t = now.timestamp()
    # notBefore is backdated for clock skew: life counts from when it was received
    assert regionenrollment.renewal_due(pem, t, 0.7) == pytest.approx(t + 70, abs=1)
    assert regionenrollment.renewal_due(pem, t, 0.9) == pytest.approx(t + 90, abs=1)
    assert regionenrollment.renewal_due(pem, t + 1000, 0.8) == pytest.approx(t + 1000, abs=1)


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
        files = regionenrollment.ParentFiles.load(paths.data_dir)
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
        link = parent_link(region, regionenrollment.ParentFiles.load(paths.data_dir))  # type: ignore[arg-type]
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
