"""The hub PKI with real gRPC: a grpc.aio server on loopback requiring client certificates from
the hub CA, the generated DeviceService stubs, and identities read from the peer certificate."""

from __future__ import annotations

from datetime import timedelta

import grpc
import pytest
from asynctesting import async_test
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from edgefleet.v1 import device_pb2, device_pb2_grpc
from hub import pki

REGION = "eu-frankfurt"


class _Servicer(device_pb2_grpc.DeviceServiceServicer):
    """Answers RenewCertificate with the caller's identity in the trailing metadata."""

    async def RenewCertificate(
        self, request: device_pb2.RenewCertificateRequest, context: grpc.aio.ServicerContext
    ) -> device_pb2.RenewCertificateResponse:
        identity = pki.identity_from_auth_context(context.auth_context())
        context.set_trailing_metadata((("identity", identity.uri),))
        return device_pb2.RenewCertificateResponse()


@pytest.fixture(scope="module")
def ca() -> pki.CertifiedKey:
    return pki.create_ca(REGION)


async def _serve(ca: pki.CertifiedKey) -> tuple[grpc.aio.Server, int]:
    hub = pki.issue_serving_certificate(
        ca, pki.Identity(pki.Role.HUB, "hub", REGION), ["localhost", "127.0.0.1"]
    )
    credentials = grpc.ssl_server_credentials(
        [(pki.private_key_pem(hub.key), pki.certificate_pem(hub.certificate))],
        root_certificates=pki.certificate_pem(ca.certificate),
        require_client_auth=True,
    )
    server = grpc.aio.server()
    device_pb2_grpc.add_DeviceServiceServicer_to_server(_Servicer(), server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    return server, port


async def _call(ca: pki.CertifiedKey, port: int, client: pki.CertifiedKey | None) -> str:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki.certificate_pem(ca.certificate),
        private_key=pki.private_key_pem(client.key) if client else None,
        certificate_chain=pki.certificate_pem(client.certificate) if client else None,
    )
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
        call = device_pb2_grpc.DeviceServiceStub(channel).RenewCertificate(
            device_pb2.RenewCertificateRequest(), timeout=3
        )
        await call
        trailing = await call.trailing_metadata()
        return dict(trailing)["identity"]


@async_test
async def test_device_identity_reaches_the_server_over_mutual_tls(ca: pki.CertifiedKey) -> None:
    server, port = await _serve(ca)
    try:
        device = pki.Identity(pki.Role.DEVICE, "camera-7", REGION)
        key = pki.generate_key()
        csr = (
            x509.CertificateSigningRequestBuilder()
            .subject_name(x509.Name([]))
            .sign(key, hashes.SHA256())
            .public_bytes(serialization.Encoding.PEM)
        )
        cert = pki.sign_device_csr(ca, csr, device)
        assert await _call(ca, port, pki.CertifiedKey(cert, key)) == device.uri
        ops = pki.Identity(pki.Role.ADMIN, "ops", REGION)
        assert await _call(ca, port, pki.issue_client_certificate(ca, ops)) == ops.uri
    finally:
        await server.stop(None)


@async_test
async def test_foreign_expired_and_missing_client_certificates_are_refused_at_handshake(
    ca: pki.CertifiedKey,
) -> None:
    server, port = await _serve(ca)
    try:
        foreign_ca = pki.create_ca(REGION)
        foreign = pki.issue_client_certificate(
            foreign_ca, pki.Identity(pki.Role.DEVICE, "camera-7", REGION)
        )
        expired = pki.issue_client_certificate(
            ca,
            pki.Identity(pki.Role.DEVICE, "old", REGION),
            now=pki.now_utc() - timedelta(days=30),
            lifetime=timedelta(days=7),
        )
        for client in (foreign, expired, None):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _call(ca, port, client)
            assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(None)
