"""Fuzzing the hub's gRPC message handlers (hypothesis), against a real hub: ``hub init``'s
certificates, SQLite, mutual TLS (``hubserving.ThreadedHub``), a device enrolled through the
real Enroll RPC. Generated Sync streams (a Hello with arbitrary fields, then arbitrary messages
or raw bytes) and Enroll requests must get one of the documented answers — never UNKNOWN or
INTERNAL — and leave a hub that still serves and a device record that still reads back.

Bounded for CI: 150 streams and 150 enrollments by default; EDGEFLEET_NIGHTLY=1 runs 20,000
of each."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import orjson
import pytest
from hubserving import ThreadedHub, make_hub_dir
from hypothesis import given
from hypothesis import strategies as st
from propertytesting import examples

from edged.trust.identity import load_or_create_identity
from edgefleet.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    device_pb2,
    device_pb2_grpc,
    enrollment_pb2,
    enrollment_pb2_grpc,
)
from edgefleet.versioning import installed_version
from hub.decide.devices import Device
from hub.state import tokens

C = grpc.StatusCode
# FAILED_PRECONDITION: an edged version outside the hub's window (AgentVersionOutsideWindow)
SYNC_ANSWERS = {
    C.OK, C.INVALID_ARGUMENT, C.RESOURCE_EXHAUSTED, C.PERMISSION_DENIED, C.FAILED_PRECONDITION
}  # fmt: skip
ENROLL_ANSWERS = {C.INVALID_ARGUMENT, C.UNAUTHENTICATED, C.RESOURCE_EXHAUSTED, C.ALREADY_EXISTS}


class Fleet:
    def __init__(self, threaded: ThreadedHub, tmp_path: Path) -> None:
        assert threaded.hub is not None
        self.threaded, self.hub = threaded, threaded.hub
        ca = threaded.paths.ca_certificate.read_bytes()
        self.enroll_channel = grpc.secure_channel(
            f"127.0.0.1:{self.hub.enroll_port}", grpc.ssl_channel_credentials(ca)
        )
        self.enroll = enrollment_pb2_grpc.EnrollmentServiceStub(self.enroll_channel)  # type: ignore[no-untyped-call]
        identity = load_or_create_identity(tmp_path / "cam", tpm="off")
        try:
            self.csr = identity.build_csr("cam-1")
        finally:
            identity.close()
        token, _ = threaded.run(tokens.create_token(self.hub.ctx.store, now=time.time(), ttl=600))
        self.token = token
        resp = self.enroll.Enroll(
            enrollment_pb2.EnrollRequest(token=token, csr_pem=self.csr, name="cam-1"), timeout=10
        )
        key = (tmp_path / "cam" / "identity" / "key.pem").read_bytes()
        creds = grpc.ssl_channel_credentials(ca, key, bytes(resp.certificate_chain_pem))
        self.channel = grpc.secure_channel(f"127.0.0.1:{self.hub.port}", creds)
        self.device = device_pb2_grpc.DeviceServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.raw_sync = self.channel.stream_stream(
            "/edgefleet.v1.DeviceService/Sync",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )

    def close(self) -> None:
        self.channel.close()
        self.enroll_channel.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp_path = tmp_path_factory.mktemp("fuzz")
    paths = asyncio.run(make_hub_dir(tmp_path / "hub"))
    text = paths.config.read_text()
    for key, value in {"perSourceBurst": 100_000, "statusBurst": 100_000}.items():
        text = re.sub(rf"^{key} = .*$", f"{key} = {value}", text, flags=re.M)
    paths.config.write_text(text)
    with ThreadedHub(paths) as threaded:
        f = Fleet(threaded, tmp_path)
        yield f
        f.close()


def _sized(most: int) -> st.SearchStrategy[str]:
    return st.builds(
        lambda piece, n: (piece * (n // max(1, len(piece)) + 1))[:n] if piece else "",
        st.text(max_size=5),
        st.integers(0, most),
    )


_health = st.builds(
    common_pb2.Health, schedulable=st.booleans(), reasons=st.lists(_sized(1500), max_size=4)
)
_hello = st.builds(
    device_pb2.Hello,
    device_name=st.sampled_from(["cam-1", "", "cam-2", "x" * 100]),
    labels=st.dictionaries(_sized(70), _sized(70), max_size=5),
    health=_health,
    applied_generation=st.integers(0, 2**64 - 1),
    # mostly this hub's own version, so that what follows the Hello is fuzzed too
    edged_version=st.one_of(st.just(installed_version()), _sized(200)),
)
_workload = st.builds(
    device_pb2.WorkloadStatus,
    name=_sized(300),
    revision=_sized(200),
    ready_replicas=st.integers(0, 2**32 - 1),
    desired_replicas=st.integers(0, 2**32 - 1),
    model_version=_sized(200),
    conditions=st.lists(
        st.builds(common_pb2.Condition, type=_sized(200), message=_sized(1500)), max_size=3
    ),
)
_message = st.one_of(
    st.builds(lambda s: device_pb2.DeviceMessage(status=s),
              st.builds(device_pb2.Status, workloads=st.lists(_workload, max_size=3),
                        health=_health, observed_generation=st.integers(0, 2**64 - 1))),
    st.builds(lambda g: device_pb2.DeviceMessage(ack=device_pb2.Ack(generation=g)),
              st.integers(0, 2**64 - 1)),
    st.just(device_pb2.DeviceMessage(heartbeat=device_pb2.Heartbeat())),
    st.builds(lambda n, e: device_pb2.DeviceMessage(
        attestation_evidence=device_pb2.AttestationEvidence(nonce=n, evidence=e)),
        st.binary(max_size=100), st.binary(max_size=2000)),
    st.builds(lambda h: device_pb2.DeviceMessage(hello=h), _hello),
    st.just(device_pb2.DeviceMessage()),
)  # fmt: skip
_wire = st.one_of(_message.map(lambda m: m.SerializeToString()), st.binary(max_size=300))


def _sync_code(fleet: Fleet, first: bytes, rest: list[bytes]) -> grpc.StatusCode:
    call = fleet.raw_sync(iter([first, *rest]), timeout=20)
    try:
        for _ in call:
            pass
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return C.OK


@examples(150, nightly=20_000)
@given(_hello, st.lists(_wire, max_size=6))
def test_fuzzed_sync_streams_get_documented_answers(
    fleet: Fleet, hello: device_pb2.Hello, rest: list[bytes]
) -> None:
    first = device_pb2.DeviceMessage(hello=hello).SerializeToString()
    assert _sync_code(fleet, first, rest) in SYNC_ANSWERS
    device = fleet.hub.ctx.cache.devices["cam-1"]
    assert Device.from_json(device.to_json()) == device


@examples(150, nightly=20_000)
@given(
    st.one_of(st.just("valid"), _sized(40)),
    st.one_of(st.just(b"csr"), st.binary(max_size=300)),
    _sized(80),
    st.dictionaries(_sized(70), _sized(70), max_size=4),
)
def test_fuzzed_enrollments_get_documented_answers(
    fleet: Fleet, token: str, csr: bytes, name: str, labels: dict[str, str]
) -> None:
    request = enrollment_pb2.EnrollRequest(
        token=fleet.token if token == "valid" else token,
        csr_pem=fleet.csr if csr == b"csr" else csr,
        name=name or "cam-1",
        labels=labels,
    )
    try:
        response = fleet.enroll.Enroll(request, timeout=10)
    except grpc.RpcError as exc:
        assert exc.code() in ENROLL_ANSWERS, (exc.code(), exc.details())
        return
    # a well-formed request with the valid token and CSR: enrolled, under the name asked for
    assert response.device_name == request.name
    device = fleet.hub.ctx.cache.devices[request.name]
    assert dict(device.labels) == dict(request.labels)


def test_the_hub_still_serves_after_the_fuzzing(fleet: Fleet) -> None:
    paths = fleet.threaded.paths
    creds = grpc.ssl_channel_credentials(
        paths.ca_certificate.read_bytes(),
        paths.admin_key.read_bytes(),
        paths.admin_certificate.read_bytes(),
    )
    with grpc.secure_channel(f"127.0.0.1:{fleet.hub.port}", creds) as channel:
        admin = admin_pb2_grpc.AdminServiceStub(channel)  # type: ignore[no-untyped-call]
        listed = admin.List(admin_pb2.ListRequest(kind="Device"), timeout=10)
    names = {orjson.loads(i.json)["metadata"]["name"] for i in listed.items}
    assert "cam-1" in names
