"""EnrollmentService over real TLS on loopback: a hub made by ``hub init``, a real SQLite store,
CSRs from edged's real identity key. Bad input gets a precise status and writes nothing."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import orjson
import pytest
from asynctesting import async_test
from hubserving import AdminHub, make_hub_dir

from edged.hublink.enrolling import EnrollError, enroll
from edged.trust.identity import load_or_create_identity
from edgefleet.trust.envelopes import Envelope
from edgefleet.trust.signing import create_root, generate_key_pair
from edgefleet.trust.verifying import root_digest
from edgefleet.v1 import admin_pb2, admin_pb2_grpc, enrollment_pb2, enrollment_pb2_grpc
from hub import pki
from hub.api.enrollment import REFUSED, enrollment_labels, source_of
from hub.initializing import HubPaths
from hub.state import tokens
from hub.state.trustroots import HubRoots, install_roots


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
                (req(token="nope"), grpc.StatusCode.INVALID_ARGUMENT, "token: a bootstrap"),
                # the token's labels win: a device cannot move itself to another site
                (req(labels={"site": "retail"}), grpc.StatusCode.INVALID_ARGUMENT, "'site'"),
                # every refused token looks the same from outside
                (req(token="abcdef.0123456789abcdef"), grpc.StatusCode.UNAUTHENTICATED, REFUSED),
                (
                    req(token=token.split(".")[0] + ".0123456789abcdef"),
                    grpc.StatusCode.UNAUTHENTICATED,
                    REFUSED,
                ),
            ]
            for request, code, words in refusals:
                got, details = await _code(stub.Enroll(request, timeout=10))
                assert (got, words in details) == (code, True), (request.name, got, details)
            assert hub.ctx.cache.devices == {}  # nothing written...
            await tokens.validate(hub.ctx.store, token, now=time.time())  # ...nor used up

            resp = await stub.Enroll(req(labels={"zone": "z1", "site": "lab"}), timeout=10)
            assert resp.device_name == "cam-1"
            cert = pki.load_certificate(resp.certificate_chain_pem)
            identity = pki.identity_from_certificate(cert)
            assert (identity.role, identity.name) == (pki.Role.DEVICE, "cam-1")
            assert resp.trust_root == hub.ctx.trust_root  # the fleet's root, exactly as signed
            device = hub.ctx.cache.devices["cam-1"]
            assert device.labels == {"site": "lab", "zone": "z1"}
            assert device.certificate_serial == format(cert.serial_number, "x")

            got, details = await _code(stub.Enroll(req(), timeout=10))
            assert (got, details) == (grpc.StatusCode.UNAUTHENTICATED, REFUSED)  # used up
            token2, _ = await tokens.create_token(hub.ctx.store, now=time.time(), ttl=600)
            got, details = await _code(stub.Enroll(req(token=token2), timeout=10))
            assert got is grpc.StatusCode.ALREADY_EXISTS and "cam-1" in details


@async_test
async def test_a_store_that_fails_is_unavailable_and_spends_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the soak harness's 1-hour run (docs/soak.md): an enrollment at a replica while
    etcd changed leader raised StoreUnavailable out of Enroll (UNKNOWN, "Unexpected"); it is
    UNAVAILABLE now, and a token the failed attempt did not use still enrolls."""
    from edgefleet.errors import StoreUnavailable

    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub:
        token, _ = await tokens.create_token(
            hub.ctx.store, now=time.time(), ttl=600, single_use=True
        )
        real = tokens.validate

        async def failing(*args: object, **kw: object) -> tokens.TokenRecord:
            raise StoreUnavailable("etcd 127.0.0.1:2379: get: UNAVAILABLE: leader changed")

        monkeypatch.setattr(tokens, "validate", failing)
        channel, stub = _enroll_stub(hub)
        async with channel:
            request = enrollment_pb2.EnrollRequest(
                token=token, csr_pem=_csr(tmp_path), name="cam-1"
            )
            got, details = await _code(stub.Enroll(request, timeout=10))
            assert got is grpc.StatusCode.UNAVAILABLE, (got, details)
            assert "store failed" in details and "try again" in details
            assert hub.ctx.cache.devices == {}
            monkeypatch.setattr(tokens, "validate", real)
            resp = await stub.Enroll(request, timeout=10)
            assert resp.device_name == "cam-1"


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
        install_roots(hub.ctx.cache, HubRoots((roots.hub.to_bytes(),)))
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
        install_roots(hub.ctx.cache, HubRoots((roots.fleet.to_bytes(),)))
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


def _record(**kw: object) -> tokens.TokenRecord:
    fields: dict[str, object] = {"id": "abcdef", "secret_sha256": "", "created": 0, "expires": 1}
    fields.update(kw)
    return tokens.TokenRecord(**fields)  # type: ignore[arg-type]


RESERVED = ("site", "zone", "restricted.example.com/")


@pytest.mark.parametrize(
    ("record", "requested", "labels", "problem"),
    [
        # the token's labels win; asking for the same value is no override
        (_record(labels={"site": "factory"}), {}, {"site": "factory"}, None),
        (_record(labels={"site": "factory"}), {"site": "factory"}, {"site": "factory"}, None),
        (_record(labels={"site": "factory"}), {"site": "retail"}, None, "'site']: set to"),
        # devices may add labels of their own, but not reserved ones
        (_record(), {"camera": "ptz"}, {"camera": "ptz"}, None),
        (_record(), {"zone": "z1"}, None, "'zone']: reserved"),
        (_record(), {"restricted.example.com/x": "1"}, None, "reserved"),
        (_record(labels={"zone": "z1"}), {"zone": "z1"}, {"zone": "z1"}, None),
        # a token can forbid self-labels, or allow only a prefix
        (_record(device_labels=False), {"camera": "ptz"}, None, "does not let devices"),
        (_record(device_labels=False, labels={"a": "1"}), {"a": "1"}, {"a": "1"}, None),
        (_record(device_label_prefix="dev.example.com/"), {"camera": "x"}, None, "only keys"),
        (
            _record(device_label_prefix="dev.example.com/"),
            {"dev.example.com/camera": "x"},
            {"dev.example.com/camera": "x"},
            None,
        ),
    ],
)
def test_enrollment_labels_table(
    record: tokens.TokenRecord,
    requested: dict[str, str],
    labels: dict[str, str] | None,
    problem: str | None,
) -> None:
    got, problems = enrollment_labels(record, requested, RESERVED)
    if problem is None:
        assert (got, problems) == (labels, [])
    else:
        assert len(problems) == 1 and problem in problems[0], problems


@pytest.mark.parametrize(
    ("peer", "source"),
    [
        ("ipv4:127.0.0.1:54321", "127.0.0.1"),
        ("ipv6:[::1]:54321", "::1"),
        ("ipv6:[2001:db8::7]:1", "2001:db8::7"),
        ("unix:/run/x.sock", "unix:/run/x.sock"),
    ],
)
def test_source_of_table(peer: str, source: str) -> None:
    assert source_of(peer) == source


def _set_enrollment(paths: HubPaths, **values: float) -> None:
    text = paths.config.read_text()
    for key, value in values.items():
        text = re.sub(rf"^{key} = .*$", f"{key} = {value:g}", text, flags=re.M)
    paths.config.write_text(text)


@async_test
async def test_every_refused_token_looks_the_same_and_the_hub_says_why(tmp_path: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub:
        now = time.time()
        store = hub.ctx.store
        good, _ = await tokens.create_token(store, now=now, ttl=600)
        expired, _ = await tokens.create_token(store, now=now - 1000, ttl=600)
        used, _ = await tokens.create_token(store, now=now, ttl=600, single_use=True)
        await tokens.consume(store, used, now=now)
        bad_secret = good.split(".")[0] + ".0123456789abcdef"
        channel, stub = _enroll_stub(hub)
        async with channel:
            answers = set()
            for token in ("zzzzzz.0123456789abcdef", bad_secret, expired, used):
                request = enrollment_pb2.EnrollRequest(
                    token=token, csr_pem=_csr(tmp_path), name="cam-9"
                )
                answers.add(await _code(stub.Enroll(request, timeout=10)))
            assert answers == {(grpc.StatusCode.UNAUTHENTICATED, REFUSED)}
        assert hub.ctx.cache.devices == {}
        await hub.ctx.writer.flush()
        refused = {
            (e["object"]["name"], e["message"].split(": ", 1)[-1])
            for e in hub.ctx.cache.events
            if e["reason"] == "EnrollmentRefused"
        }
        ids = {t: t.split(".")[0] for t in (good, expired, used)}
        assert refused == {
            (ids[good], "the secret is wrong"),
            (ids[expired], f"bootstrap token {ids[expired]} has expired"),
            (ids[used], f"bootstrap token {ids[used]} was for a single use and has been used"),
        }  # and none for the made-up id: guessing ids writes nothing to the store


@async_test
async def test_enrollment_is_rate_limited_per_source_and_per_token(tmp_path: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    _set_enrollment(paths, perSourceBurst=15, perSourceRate=0.01, perTokenFailureBurst=5)
    _set_enrollment(paths, perTokenFailureRate=0.01)
    async with AdminHub(paths) as hub:
        good, _ = await tokens.create_token(hub.ctx.store, now=time.time(), ttl=600)
        wrong = good.split(".")[0] + ".0123456789abcdef"
        csr = _csr(tmp_path)
        channel, stub = _enroll_stub(hub)
        async with channel:

            async def enroll(token: str, name: str) -> tuple[grpc.StatusCode, str]:
                request = enrollment_pb2.EnrollRequest(token=token, csr_pem=csr, name=name)
                return await _code(stub.Enroll(request, timeout=10))

            # guessing one token's secret: 5 refusals, then that token id is held off,
            # even with the right secret (the price of bounding guesses from many addresses)
            codes = [(await enroll(wrong, "x"))[0] for _ in range(7)]
            assert (
                codes
                == [grpc.StatusCode.UNAUTHENTICATED] * 5 + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2
            )
            got, details = await enroll(good, "cam-1")
            assert got is grpc.StatusCode.RESOURCE_EXHAUSTED and "retry in" in details
            # ...but only for the address that guessed: a device elsewhere has the secret
            relay = SourceRelay(hub.enroll_port, "127.0.0.2")
            try:
                creds = grpc.ssl_channel_credentials(hub.paths.ca_certificate.read_bytes())
                options = [("grpc.ssl_target_name_override", "localhost")]
                async with grpc.aio.secure_channel(
                    f"127.0.0.1:{relay.port}", creds, options=options
                ) as other:
                    request = enrollment_pb2.EnrollRequest(token=good, csr_pem=csr, name="cam-9")
                    resp = await enrollment_pb2_grpc.EnrollmentServiceStub(other).Enroll(
                        request, timeout=10
                    )
                    assert resp.device_name == "cam-9"
            finally:
                relay.close()
            # another token still works from this source until the source's burst is spent
            other, _ = await tokens.create_token(hub.ctx.store, now=time.time(), ttl=600)
            assert (await enroll(other, "cam-2"))[0] is grpc.StatusCode.OK
            spent = [(await enroll(other, f"cam-{i}"))[0] for i in range(3, 12)]
            assert spent[-1] is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert grpc.StatusCode.OK in spent
        assert "cam-1" not in hub.ctx.cache.devices


class SourceRelay:
    """127.0.0.1:port -> ``target`` on loopback, connecting from ``source`` (another address
    of the loopback network), so that the hub sees another peer."""

    def __init__(self, target: int, source: str) -> None:
        self.target, self.source = target, source
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            hub = socket.create_connection(
                ("127.0.0.1", self.target), source_address=(self.source, 0)
            )
            for a, b in ((client, hub), (hub, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()


EK, OTHER_EK = "ee" * 32, "0f" * 32
SHARED_EK_CASES = [
    # (id, the device records (name, bound ek, offered ek), the new device's ek, allowed, holders)
    ("no TPM", [("a", EK, "")], "", False, None),
    ("a new TPM", [("a", EK, "")], OTHER_EK, False, None),
    ("bound to another record", [("a", EK, "")], EK, False, "a"),
    ("offered to another record, not activated yet", [("a", "", EK)], EK, False, "a"),
    ("the operator allows it", [("a", EK, "")], EK, True, None),
    ("two records hold it", [("b", EK, ""), ("a", EK, "")], EK, False, "a, b"),
    ("the record of the same name", [("new", EK, "")], EK, False, None),
]


@pytest.mark.parametrize(
    ("devices", "ek", "allowed", "holders"),
    [c[1:] for c in SHARED_EK_CASES],
    ids=[c[0] for c in SHARED_EK_CASES],
)
def test_one_tpm_backs_one_device_record(
    devices: list[tuple[str, str, str]], ek: str, allowed: bool, holders: str | None
) -> None:
    from hub.api.enrollment import shared_ek_refusal
    from hub.decide.devices import Device

    records = [
        Device(name, ek_sha256=bound, ak_offer={"ekSha256": offered} if offered else None)
        for name, bound, offered in devices
    ]
    got = shared_ek_refusal(ek, records, allowed=allowed, name="new")
    if holders is None:
        assert got is None
        return
    assert got is not None and got.startswith("EkInUse")
    assert f"device(s) {holders}:" in got and "--allow-shared-ek" in got


def test_a_token_that_allows_a_shared_ek_says_so_and_older_tokens_do_not() -> None:
    fields = {"id": "id", "secret_sha256": "00" * 32, "created": 1.0, "expires": 2.0}
    record = tokens.TokenRecord(**fields, allow_shared_ek=True)
    assert tokens.TokenRecord.from_json(record.to_json()).allow_shared_ek is True
    plain = tokens.TokenRecord(**fields)
    assert b"allowSharedEk" not in plain.to_json()
    assert tokens.TokenRecord.from_json(plain.to_json()).allow_shared_ek is False
