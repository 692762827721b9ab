"""Device sync tests: a device enrolled with an in-process hub, its channel credentials."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
from hubserving import AdminHub

from edged.trust.identity import load_or_create_identity
from edgefleet.v1 import (
    enrollment_pb2,
    enrollment_pb2_grpc,
)
from hub.state import tokens


async def enrolled_device(hub: AdminHub, tmp_path: Path, name: str) -> grpc.ChannelCredentials:
    identity = load_or_create_identity(tmp_path / name, tpm="off")
    try:
        csr = identity.build_csr(name)
    finally:
        identity.close()
    token, _ = await tokens.create_token(hub.ctx.store, now=time.time(), ttl=600)
    ca = hub.paths.ca_certificate.read_bytes()
    async with grpc.aio.secure_channel(
        f"127.0.0.1:{hub.enroll_port}", grpc.ssl_channel_credentials(ca)
    ) as ch:
        resp = await enrollment_pb2_grpc.EnrollmentServiceStub(ch).Enroll(
            enrollment_pb2.EnrollRequest(token=token, csr_pem=csr, name=name), timeout=10
        )
    key = (tmp_path / name / "identity" / "key.pem").read_bytes()
    return grpc.ssl_channel_credentials(ca, key, bytes(resp.certificate_chain_pem))
