"""``ArtifactReceiver.receive`` (AdminService PushArtifact) through a real grpc.aio server
with mutual TLS on loopback, a real hub data directory made by ``hub init`` (CA, admin
certificate, the quickstart trust root and publisher key), real SQLite and a real blob store.
The servicer is a minimal one of this test's own (the real AdminService authorizes the admin,
then calls the same receiver)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from asynctesting import async_test

from edgefleet.demo import build_mlp
from edgefleet.trust import signing
from edgefleet.v1 import admin_pb2, admin_pb2_grpc
from hub.api.push import PushRefused
from hub.initializing import HubPaths, init_hub
from hub.state import storekeys as objects
from hub.trustsetup import quickstart_trust
from hub.wiring import HubParts, artifact_receiver, build_context

CHUNK = 64 * 1024


class _Servicer(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, ctx: HubParts) -> None:
        self.receiver = artifact_receiver(ctx)

    async def PushArtifact(
        self,
        request_iterator: AsyncIterator[admin_pb2.PushArtifactRequest],
        context: grpc.aio.ServicerContext,
    ) -> admin_pb2.PushArtifactResponse:
        try:
            return await self.receiver.receive(request_iterator, now=time.time())
        except PushRefused as exc:
            await context.abort(exc.code, str(exc))
            raise AssertionError("unreachable") from None


@dataclass
class Hub:
    ctx: HubParts
    stub: admin_pb2_grpc.AdminServiceStub


@pytest.fixture
def hub_dir(tmp_path: Path) -> Path:
    d = tmp_path / "hub"
    asyncio.run(init_hub(d, region="eu-dublin", trust_setup=quickstart_trust))
    return d


@asynccontextmanager
async def _serve(d: Path, *, trust_root: bool = True) -> AsyncIterator[Hub]:
    ctx = await build_context(d)
    if not trust_root:
        ctx.cache.trust_roots = ()  # the current root is the chain's last
        ctx.trust_root = b""
    paths = ctx.paths
    server = grpc.aio.server()
    admin_pb2_grpc.add_AdminServiceServicer_to_server(_Servicer(ctx), server)
    credentials = grpc.ssl_server_credentials(
        [(paths.hub_key.read_bytes(), paths.hub_certificate.read_bytes())],
        root_certificates=paths.ca_certificate.read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    client = grpc.ssl_channel_credentials(
        root_certificates=paths.ca_certificate.read_bytes(),
        private_key=paths.admin_key.read_bytes(),
        certificate_chain=paths.admin_certificate.read_bytes(),
    )
    try:
        async with grpc.aio.secure_channel(f"localhost:{port}", client) as channel:
            yield Hub(ctx, admin_pb2_grpc.AdminServiceStub(channel))
    finally:
        await server.stop(None)
        await ctx.writer.flush()
        await ctx.store.close()


def _requests(envelope: bytes, data: bytes) -> Iterator[admin_pb2.PushArtifactRequest]:
    yield admin_pb2.PushArtifactRequest(header=admin_pb2.ArtifactHeader(signed_metadata=envelope))
    for i in range(0, len(data), CHUNK):
        yield admin_pb2.PushArtifactRequest(chunk=data[i : i + CHUNK])


async def _push(hub: Hub, envelope: bytes, data: bytes) -> admin_pb2.PushArtifactResponse:
    response: admin_pb2.PushArtifactResponse = await hub.stub.PushArtifact(
        _requests(envelope, data), timeout=5
    )
    return response


def _model(tmp: Path, name: str = "model.onnx", size: int = 200_000) -> Path:
    """A real ONNX model of about ``size`` bytes (an MLP 64 -> hidden -> 10)."""
    return build_mlp(tmp / name, (64, max(2, size // 300), 10), seed=sum(name.encode()))


def _sign(path: Path, key: Path, *, version: str = "1.0.0", **kw: float) -> bytes:
    _, env = signing.sign_artifact(
        path, name="mlp", version=version, keys=[key], out=path.with_suffix(".meta"), **kw
    )
    return env.to_bytes()


async def _assert_nothing_stored(hub: Hub) -> None:
    assert hub.ctx.blobs.digests() == set()
    assert list((hub.ctx.blobs.root / "staging").iterdir()) == []
    assert not (await hub.ctx.store.range(objects.MODELS)).kvs
    assert hub.ctx.cache.models == {}


async def _refused(hub: Hub, envelope: bytes, data: bytes) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _push(hub, envelope, data)
    return info.value


@async_test
async def test_push_is_verified_stored_recorded_and_idempotent(
    hub_dir: Path, tmp_path: Path
) -> None:
    model = _model(tmp_path)
    envelope = _sign(model, HubPaths.of(hub_dir).data_dir / "publisher.key")
    data = model.read_bytes()
    async with _serve(hub_dir) as hub:
        first = await _push(hub, envelope, data)
        sha = signing.describe_file(model, "model")["sha256"]
        assert (first.sha256, first.length, first.stored) == (sha, len(data), True)
        assert hub.ctx.blobs.path_for(sha).read_bytes() == data
        kv = await hub.ctx.store.get(objects.model_key("mlp", "1.0.0"))
        assert kv is not None
        record = objects.ModelRecord.from_json(objects.loads(kv.value))
        assert (record.sha256, record.length, record.envelope) == (sha, len(data), envelope)
        assert hub.ctx.cache.models[("mlp", "1.0.0")] == record
        assert [e["reason"] for e in hub.ctx.cache.events] == ["Pushed"]

        assert not first.reused_bytes
        again = await _push(hub, envelope, data)
        assert (again.sha256, again.stored, again.reused_bytes) == (sha, False, False)
        assert [e["reason"] for e in hub.ctx.cache.events] == ["Pushed"]

        other = _model(tmp_path, "other.onnx")
        different = _sign(other, hub.ctx.paths.data_dir / "publisher.key")
        err = await _refused(hub, different, other.read_bytes())
        assert err.code() is grpc.StatusCode.ALREADY_EXISTS
        assert "VersionExists: mlp 1.0.0 was already pushed" in (err.details() or "")
        assert hub.ctx.blobs.digests() == {sha}
        assert hub.ctx.cache.models[("mlp", "1.0.0")] == record
    # the record survives a restart of the hub (real SQLite)
    async with _serve(hub_dir) as hub:
        assert hub.ctx.cache.models[("mlp", "1.0.0")].sha256 == sha


@async_test
async def test_newer_metadata_for_the_same_bytes_replaces_the_envelope(
    hub_dir: Path, tmp_path: Path
) -> None:
    model = _model(tmp_path, size=1000)
    key = hub_dir / "publisher.key"
    old = _sign(model, key, metadata_version=1)
    new = _sign(model, key, metadata_version=2)
    async with _serve(hub_dir) as hub:
        await _push(hub, old, model.read_bytes())
        response = await _push(hub, new, model.read_bytes())
        assert not response.stored  # the same version and bytes: its metadata renewed
        assert hub.ctx.cache.models[("mlp", "1.0.0")].envelope == new
        await _push(hub, old, model.read_bytes())  # older metadata: kept as it is
        assert hub.ctx.cache.models[("mlp", "1.0.0")].envelope == new
        assert [e["reason"] for e in hub.ctx.cache.events] == ["Pushed", "MetadataUpdated"]


@async_test
async def test_the_push_and_its_event_are_one_transaction(hub_dir: Path, tmp_path: Path) -> None:
    """The record and its event share one store revision, written before the push is answered:
    a hub killed after the record was written can never have lost its event."""
    model = _model(tmp_path, size=1000)
    key = hub_dir / "publisher.key"
    async with _serve(hub_dir) as hub:
        for version in (1, 2):  # Pushed, then MetadataUpdated
            await _push(hub, _sign(model, key, metadata_version=version), model.read_bytes())
            record = await hub.ctx.store.get(objects.model_key("mlp", "1.0.0"))
            events = (await hub.ctx.store.range(objects.EVENTS)).kvs  # nothing flushed yet
            assert record is not None and len(events) == version
            assert events[-1].mod_revision == record.mod_revision
            assert objects.loads(events[-1].value)["reason"] == (
                "Pushed" if version == 1 else "MetadataUpdated"
            )


@async_test
async def test_signed_by_a_key_the_root_does_not_list_is_refused(
    hub_dir: Path, tmp_path: Path
) -> None:
    signing.generate_key_pair(tmp_path / "stranger")
    model = _model(tmp_path)
    envelope = _sign(model, tmp_path / "stranger.key")
    async with _serve(hub_dir) as hub:
        err = await _refused(hub, envelope, model.read_bytes())
        assert err.code() is grpc.StatusCode.PERMISSION_DENIED
        assert (err.details() or "").startswith("UnknownKey: header.signed_metadata: signed only")
        await _assert_nothing_stored(hub)


@async_test
async def test_expired_metadata_is_refused(hub_dir: Path, tmp_path: Path) -> None:
    model = _model(tmp_path)
    envelope = _sign(
        model, hub_dir / "publisher.key", now=time.time() - 10 * 86400, expires_in_s=86400
    )
    async with _serve(hub_dir) as hub:
        err = await _refused(hub, envelope, model.read_bytes())
        assert err.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert (err.details() or "").startswith("MetadataExpired: header.signed_metadata of mlp")
        await _assert_nothing_stored(hub)


@async_test
async def test_a_version_that_cannot_be_compared_is_refused(hub_dir: Path, tmp_path: Path) -> None:
    """A signed "dev" would lock the name on every device (no later version compares to it):
    refused at the door. edgectl cannot sign it, so it is signed by hand here."""
    from edgefleet.trust.envelopes import ARTIFACT_TYPE, sign_envelope

    model = _model(tmp_path)
    doc = signing.build_artifact_metadata(model, name="mlp", version="1.0.0")
    doc["version"] = "dev"
    key = signing.load_private_key(hub_dir / "publisher.key")
    envelope = sign_envelope(ARTIFACT_TYPE, doc, [key]).to_bytes()
    async with _serve(hub_dir) as hub:
        err = await _refused(hub, envelope, model.read_bytes())
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert (err.details() or "").startswith("VersionNotComparable: "), err.details()
        await _assert_nothing_stored(hub)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda b: b + b"x" * (3 * CHUNK), "LengthExceeded"),
        (lambda b: b[:-1], "LengthMismatch"),
        (lambda b: bytes([b[0] ^ 1]) + b[1:], "DigestMismatch"),
    ],
    ids=["longer", "shorter", "other-bytes"],
)
def test_bytes_that_are_not_the_signed_ones_are_refused_and_nothing_is_stored(
    hub_dir: Path, tmp_path: Path, change: object, reason: str
) -> None:
    @async_test
    async def run() -> None:
        model = _model(tmp_path)
        envelope = _sign(model, hub_dir / "publisher.key")
        assert callable(change)
        async with _serve(hub_dir) as hub:
            err = await _refused(hub, envelope, change(model.read_bytes()))
            assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert (err.details() or "").startswith(f"{reason}: ")
            await _assert_nothing_stored(hub)

    run()


@async_test
async def test_malformed_header_and_missing_header_are_refused(
    hub_dir: Path, tmp_path: Path
) -> None:
    async with _serve(hub_dir) as hub:
        err = await _refused(hub, b"{not json", b"abc")
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert (err.details() or "").startswith("MalformedEnvelope: header.signed_metadata")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await hub.stub.PushArtifact(
                iter([admin_pb2.PushArtifactRequest(chunk=b"abc")]), timeout=5
            )
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "first message must be a header, got chunk" in (info.value.details() or "")
        await _assert_nothing_stored(hub)


@async_test
async def test_a_hub_without_a_trust_root_refuses_every_push(hub_dir: Path, tmp_path: Path) -> None:
    model = _model(tmp_path)
    envelope = _sign(model, hub_dir / "publisher.key")
    async with _serve(hub_dir, trust_root=False) as hub:
        err = await _refused(hub, envelope, model.read_bytes())
        assert err.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert (err.details() or "").startswith("NoTrustRoot: this hub has no trust root")
        await _assert_nothing_stored(hub)


@async_test
async def test_a_file_that_is_not_onnx_is_refused_and_nothing_stored(
    hub_dir: Path, tmp_path: Path
) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(bytes(range(256)) * 200)  # 51,200 bytes, signed correctly: not a model
    envelope = _sign(junk, HubPaths.of(hub_dir).data_dir / "publisher.key")
    async with _serve(hub_dir) as hub:
        err = await _refused(hub, envelope, junk.read_bytes())
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "NotAnOnnxModel" in (err.details() or "")
        assert "not an ONNX model" in (err.details() or "")
        await _assert_nothing_stored(hub)


# -- extras ----------------------------------------------------------------------------------


def _with_extras(
    envelope: bytes, data: bytes, files: list[tuple[str, bytes]]
) -> Iterator[admin_pb2.PushArtifactRequest]:
    yield from _requests(envelope, data)
    for name, content in files:
        yield admin_pb2.PushArtifactRequest(file=admin_pb2.FileStart(name=name))
        for i in range(0, len(content), CHUNK):
            yield admin_pb2.PushArtifactRequest(chunk=content[i : i + CHUNK])


def _signed_with_extras(tmp_path: Path, hub_dir: Path) -> tuple[Path, bytes, dict[str, bytes]]:
    model = _model(tmp_path)
    extras = {"validation.npz": bytes(range(256)) * 700, "labels.txt": b"cat\ndog\n"}
    for name, content in extras.items():
        (tmp_path / name).write_bytes(content)
    _, env = signing.sign_artifact(
        model,
        name="mlp",
        version="1.0.0",
        keys=[HubPaths.of(hub_dir).data_dir / "publisher.key"],
        extras=[tmp_path / n for n in extras],
        out=model.with_suffix(".meta"),
    )
    return model, env.to_bytes(), extras


@async_test
async def test_every_file_of_the_metadata_is_carried_verified_and_fetchable(
    hub_dir: Path, tmp_path: Path
) -> None:
    model, envelope, extras = _signed_with_extras(tmp_path, hub_dir)
    async with _serve(hub_dir) as hub:
        files = sorted(extras.items())
        response = await hub.stub.PushArtifact(
            _with_extras(envelope, model.read_bytes(), files), timeout=5
        )
        digests = {n: signing.describe_file(tmp_path / n, "extra")["sha256"] for n in extras}
        assert dict(response.extras) == digests and response.stored
        for name, sha in digests.items():
            assert hub.ctx.blobs.path_for(sha).read_bytes() == extras[name]
        record = hub.ctx.cache.models[("mlp", "1.0.0")]
        assert record.extras == digests
        assert record.digests() == {record.sha256, *digests.values()}
        again = await hub.stub.PushArtifact(
            _with_extras(envelope, model.read_bytes(), files), timeout=5
        )
        assert not again.stored and dict(again.extras) == digests
    async with _serve(hub_dir) as hub:  # the record keeps them across a restart
        assert hub.ctx.cache.models[("mlp", "1.0.0")].extras == digests


def _labels(content: bytes) -> Any:
    return lambda x: [("labels.txt", content), ("validation.npz", x["validation.npz"])]


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        (lambda x: [("labels.txt", x["labels.txt"])], "FileMissing"),
        (lambda x: [*sorted(x.items()), ("other.bin", b"x")], "FileNotSigned"),
        (_labels(b"cat\n"), "LengthMismatch"),
        (_labels(b"cat\ndog\nfox\n"), "LengthExceeded"),
        (_labels(b"cat\ndot\n"), "DigestMismatch"),
        (lambda x: [*sorted(x.items()), ("labels.txt", x["labels.txt"])], "FileRepeated"),
    ],
)
@async_test
async def test_extras_missing_unsigned_or_altered_are_refused_and_nothing_stored(
    hub_dir: Path, tmp_path: Path, files: Any, reason: str
) -> None:
    model, envelope, extras = _signed_with_extras(tmp_path, hub_dir)
    async with _serve(hub_dir) as hub:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await hub.stub.PushArtifact(
                _with_extras(envelope, model.read_bytes(), files(extras)), timeout=5
            )
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert reason in (info.value.details() or "")
        await _assert_nothing_stored(hub)


# -- a hub that keeps a TUF repository (hub init --tuf) ------------------------------------------


@pytest.fixture
def tuf_hub_dir(tmp_path: Path) -> Path:
    from hub.trustsetup import quickstart_trust_with_tuf

    d = tmp_path / "tufhub"
    asyncio.run(init_hub(d, region="eu-dublin", trust_setup=quickstart_trust_with_tuf))
    return d


def _delegated(hub: Hub, envelope: bytes, key: Path, role: str = "lab", **extra: Any) -> bytes:
    from edgefleet.trust import tufmeta
    from edgefleet.trust.documents import parse_artifact
    from edgefleet.trust.envelopes import ARTIFACT_TYPE, decode_payload, parse_envelope_bytes

    env = parse_envelope_bytes(envelope, what="m")
    meta = parse_artifact(decode_payload(env, expected_type=ARTIFACT_TYPE, what="m"))
    assert hub.ctx.tuf is not None
    return tufmeta.add_artifact(
        hub.ctx.tuf.read(tufmeta.role_file(role)),
        meta,
        [tufmeta.tuf_signer(key)],
        expires=time.time() + 86400,
        **extra,
    )


async def _push_tuf(
    hub: Hub, envelope: bytes, data: bytes, role: str, delegated: bytes
) -> admin_pb2.PushArtifactResponse:
    def requests() -> Iterator[admin_pb2.PushArtifactRequest]:
        header = admin_pb2.ArtifactHeader(
            signed_metadata=envelope, delegated_role=role, delegated_targets=delegated
        )
        yield admin_pb2.PushArtifactRequest(header=header)
        yield admin_pb2.PushArtifactRequest(chunk=data)

    response: admin_pb2.PushArtifactResponse = await hub.stub.PushArtifact(requests(), timeout=5)
    return response


@async_test
async def test_a_tuf_hub_keeps_the_publishers_targets_and_refuses_pushes_without(
    tuf_hub_dir: Path, tmp_path: Path
) -> None:
    key = tuf_hub_dir / "publisher.key"
    model = _model(tmp_path, size=2000)
    envelope = _sign(model, key)
    data = model.read_bytes()
    async with _serve(tuf_hub_dir) as hub:
        assert hub.ctx.tuf is not None
        # without the publisher's delegated targets: refused, nothing stored
        err = await _refused(hub, envelope, model.read_bytes())
        assert err.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "TargetsMissing" in (err.details() or "")
        await _assert_nothing_stored(hub)
        # signed by a key the delegation does not list (the hub's own online key): refused
        online = tuf_hub_dir / "tuf" / "online.key"
        err = await _refused_tuf(hub, envelope, data, "lab", _delegated(hub, envelope, online))
        assert err.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "SignatureThresholdNotMet" in (err.details() or "")
        # a role the top-level targets do not delegate
        err = await _refused_tuf(hub, envelope, data, "nobody", _delegated(hub, envelope, key))
        assert err.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "UnknownRole" in (err.details() or "")
        await _assert_nothing_stored(hub)
        # the publisher's targets listing it: stored, and a new snapshot and timestamp
        before = hub.ctx.tuf.read("snapshot.json")
        first = _delegated(hub, envelope, key)
        await _push_tuf(hub, envelope, data, "lab", first)
        assert hub.ctx.tuf.read("lab.json") == first
        assert hub.ctx.tuf.read("snapshot.json") != before
        # the publisher's next version, then the first one again: older than the one held
        await _push_tuf(hub, envelope, data, "lab", _delegated(hub, envelope, key))
        err = await _refused_tuf(hub, envelope, data, "lab", first)
        assert err.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "MetadataRollback" in (err.details() or "")


async def _refused_tuf(
    hub: Hub, envelope: bytes, data: bytes, role: str, delegated: bytes
) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _push_tuf(hub, envelope, data, role, delegated)
    return info.value


@async_test
async def test_a_hub_without_tuf_refuses_delegated_targets_rather_than_ignore_them(
    hub_dir: Path, tmp_path: Path
) -> None:
    model = _model(tmp_path, size=2000)
    envelope = _sign(model, hub_dir / "publisher.key")
    data = model.read_bytes()
    async with _serve(hub_dir) as hub:
        err = await _refused_tuf(hub, envelope, data, "lab", b"{}")
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "NoTufRepository" in (err.details() or "")
        await _assert_nothing_stored(hub)
