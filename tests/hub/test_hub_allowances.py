"""Rollback allowances through the hub: AdminService PushRollbackAllowance over real gRPC,
verified against the hub's real trust root (the quickstart one), kept with the model's record
in SQLite and put in the desired state of the devices sent that version."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import orjson
import pytest
from asynctesting import async_test
from hubserving import AdminHub, make_hub_dir

from edgefleet.trust import signing
from edgefleet.v1 import admin_pb2
from hub.decide.desired import build_desired
from hub.decide.devices import Device, DevicePhase
from hub.state import storekeys as objects
from hub.state.snapshots import snapshot_of
from hub.trustsetup import make_quickstart_trust, publisher_key_path

SHA = "ab" * 32


def allowance(tmp_path: Path, key: Path, *, version: str = "1.0.0", sha: str = SHA) -> bytes:
    env = signing.sign_rollback_allowance(name="det", version=version, sha256=sha, keys=[key])
    out = tmp_path / f"allow-{version}-{sha[:4]}-{key.stem}.json"
    signing.write_envelope(env, out)
    return out.read_bytes()


async def refused(stub: object, envelope: bytes) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.PushRollbackAllowance(  # type: ignore[attr-defined]
            admin_pb2.PushRollbackAllowanceRequest(envelope=envelope)
        )
    return info.value.code(), info.value.details() or ""


@async_test
async def test_an_allowance_is_checked_kept_and_sent_with_its_version(tmp_path: Path) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    make_quickstart_trust(paths)
    key = publisher_key_path(paths)
    async with AdminHub(paths) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        good = allowance(tmp_path, key)
        code, details = await refused(stub, good)  # the model is not pushed yet
        assert code is grpc.StatusCode.FAILED_PRECONDITION and "push it first" in details
        model = objects.ModelRecord("det", "1.0.0", SHA, 1234, b"{signed}", 1.0)
        await hub.ctx.store.put(objects.model_key("det", "1.0.0"), objects.dumps(model.to_json()))
        hub.ctx.cache.models[("det", "1.0.0")] = model

        signing.generate_key_pair(tmp_path / "stranger")
        code, details = await refused(stub, allowance(tmp_path, tmp_path / "stranger.key"))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and details.startswith("UnknownKey")
        code, details = await refused(stub, allowance(tmp_path, key, sha="cd" * 32))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "other bytes" in details
        code, details = await refused(stub, b"{not an envelope")
        assert code is grpc.StatusCode.INVALID_ARGUMENT

        got = await stub.PushRollbackAllowance(
            admin_pb2.PushRollbackAllowanceRequest(envelope=good)
        )
        assert (got.name, got.version, got.stored) == ("det", "1.0.0", True)
        again = await stub.PushRollbackAllowance(
            admin_pb2.PushRollbackAllowanceRequest(envelope=good)
        )
        assert again.stored is False
        stored = await hub.ctx.store.get(objects.model_key("det", "1.0.0"))
        assert stored is not None
        record = objects.ModelRecord.from_json(orjson.loads(stored.value))
        assert record.rollback_allowance == good

        # a device sent 1.0.0 gets the allowance with its metadata
        dep = orjson.dumps(
            {
                "apiVersion": "edgefleet.io/v1",
                "kind": "ModelDeployment",
                "metadata": {"name": "det"},
                "spec": {"model": {"name": "det", "version": "1.0.0"}},
            }
        )
        await stub.Apply(admin_pb2.ApplyRequest(documents=[dep]))
        device = Device("cam-1", phase=DevicePhase.READY)
        content = build_desired(
            device, snapshot_of(hub.ctx.cache), previous=frozenset(), region=hub.ctx.region
        )
        assert content.rollback_allowances == (good,)
        assert content.artifact_metadata == (b"{signed}",)


@async_test
async def test_a_hub_with_tuf_refuses_a_separate_allowance_and_says_where_it_goes(
    tmp_path: Path,
) -> None:
    """With TUF, devices honour only the allowance in the publisher's own delegated targets
    (issue 29, item 9): any artifacts key could sign a separate one, also the key of a
    publisher not delegated that model name. The hub refuses it before anything is kept."""
    paths = await make_hub_dir(tmp_path / "hub")
    make_quickstart_trust(paths, tuf=True)
    key = publisher_key_path(paths)
    async with AdminHub(paths) as hub, hub.channel() as channel:
        assert hub.ctx.tuf is not None
        stub = hub.stub(channel)
        model = objects.ModelRecord("det", "1.0.0", SHA, 1234, b"{signed}", 1.0)
        await hub.ctx.store.put(objects.model_key("det", "1.0.0"), objects.dumps(model.to_json()))
        hub.ctx.cache.models[("det", "1.0.0")] = model
        code, details = await refused(stub, allowance(tmp_path, key))
        assert code is grpc.StatusCode.FAILED_PRECONDITION
        assert details.startswith("RollbackAllowanceNotInTargets"), details
        assert "--allow-rollback" in details and "delegated targets" in details
        stored = await hub.ctx.store.get(objects.model_key("det", "1.0.0"))
        assert stored is not None
        assert not objects.ModelRecord.from_json(orjson.loads(stored.value)).rollback_allowance


@pytest.mark.parametrize(
    ("tuf", "reason"), [(False, None), (True, "RollbackAllowanceNotInTargets")]
)
def test_verify_allowance_refuses_any_envelope_with_tuf(
    tmp_path: Path, tuf: bool, reason: str | None
) -> None:
    """The pure check: a valid allowance by a trusted artifacts key, with and without TUF."""
    import time

    from edgefleet.errors import TrustError
    from edgefleet.trust.envelopes import parse_envelope_bytes
    from edgefleet.trust.verifying import verify_initial_root
    from hub.api.allowances import verify_allowance
    from hub.trustsetup import trust_root_path

    paths = asyncio.run(make_hub_dir(tmp_path / "hub"))
    make_quickstart_trust(paths)
    now = time.time()
    root = verify_initial_root(
        parse_envelope_bytes(trust_root_path(paths).read_bytes(), what="r"), now
    )
    envelope = allowance(tmp_path, publisher_key_path(paths))
    if reason is None:
        assert verify_allowance(root, envelope, now, tuf=tuf).name == "det"
        return
    with pytest.raises(TrustError) as info:
        verify_allowance(root, envelope, now, tuf=tuf)
    assert info.value.reason == reason
