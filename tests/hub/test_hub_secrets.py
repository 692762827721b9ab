"""Secrets at the hub: applied over real gRPC with mutual TLS into a real SQLite store, sealed
at rest (the store file's bytes never hold a value), versioned, shown without values; and the
pure choice of which device gets which secret."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from asynctesting import async_test
from hubserving import AdminHub, make_hub_dir

from edgefleet.v1 import admin_pb2
from hub.state import secrets as hub_secrets
from hub.state import storekeys
from hub.state.secrets import (
    SecretKeyError,
    SecretKeys,
    SecretRecord,
    load_or_create_key,
    plan_record,
    secret_refs,
)
from hub.state.snapshots import snapshot_of

VALUE = "v4lue-that-must-never-appear"
ROTATED = "r0tated-value-never-shown-either"


def secret(name: str = "tls", value: str = VALUE, **extra: Any) -> bytes:
    return orjson.dumps(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "Secret",
            "metadata": {"name": name, **extra},
            "spec": {
                "stringData": {"token": value},
                "data": {"raw": base64.b64encode(value.encode() + b"-raw").decode()},
            },
        }
    )


def _everything(hub: AdminHub) -> bytes:
    """Every byte of the hub's data directory (store file, WAL, logs, keys but the key)."""
    out = b""
    for path in sorted(hub.paths.data_dir.rglob("*")):
        if path.is_file() and path.name != "secrets.key":
            out += path.read_bytes()
    return out


@async_test
async def test_apply_seals_versions_and_never_shows_a_value(tmp_path: Path) -> None:
    async with AdminHub(await make_hub_dir(tmp_path / "hub")) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        key_file = hub.paths.data_dir / "secrets.key"
        assert key_file.stat().st_mode & 0o777 == 0o600 and len(key_file.read_bytes()) == 32

        first = await stub.Apply(admin_pb2.ApplyRequest(documents=[secret()]))
        assert first.results[0].outcome == admin_pb2.ApplyResult.CREATED
        again = await stub.Apply(admin_pb2.ApplyRequest(documents=[secret()]))
        assert again.results[0].outcome == admin_pb2.ApplyResult.UNCHANGED
        assert hub.ctx.cache.secrets["tls"].version == 1

        rotated = await stub.Apply(admin_pb2.ApplyRequest(documents=[secret(value=ROTATED)]))
        assert rotated.results[0].outcome == admin_pb2.ApplyResult.CONFIGURED
        record = hub.ctx.cache.secrets["tls"]
        assert record.version == 2 and record.keys == ("raw", "token")
        assert hub.ctx.secret_keys.open(record)["token"] == ROTATED.encode()

        labelled = await stub.Apply(
            admin_pb2.ApplyRequest(documents=[secret(value=ROTATED, labels={"a": "b"})])
        )
        assert labelled.results[0].outcome == admin_pb2.ApplyResult.CONFIGURED
        assert hub.ctx.cache.secrets["tls"].version == 2  # metadata only: same version

        shown = orjson.loads((await stub.Get(admin_pb2.GetRequest(kind="Secret", name="tls"))).json)
        assert shown["spec"] == {"keys": ["raw", "token"]}
        assert shown["status"] == {
            "version": 2,
            "keys": ["raw", "token"],
            "bytes": len(ROTATED) * 2 + 4,
        }
        listed = await stub.List(admin_pb2.ListRequest(kind="Secret"))
        events = await stub.ListEvents(admin_pb2.ListEventsRequest(kind="Secret", name="tls"))
        await hub.ctx.writer.flush()
        stored = await hub.ctx.store.get(storekeys.object_key("Secret", "tls"))
        assert stored is not None
        seen = shown.__repr__().encode() + listed.SerializeToString() + events.SerializeToString()
        seen += stored.value + _everything(hub)
        for value in (VALUE, ROTATED):
            for form in (value.encode(), base64.b64encode(value.encode() + b"-raw")):
                assert form not in seen


@async_test
async def test_a_secret_is_read_back_after_a_restart_and_refused_without_the_key(
    tmp_path: Path,
) -> None:
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub, hub.channel() as channel:
        await hub.stub(channel).Apply(admin_pb2.ApplyRequest(documents=[secret()]))
    async with AdminHub(paths) as hub:
        record = hub.ctx.cache.secrets["tls"]
        assert hub.ctx.secret_keys.open(record)["token"] == VALUE.encode()
    os.chmod(paths.data_dir / "secrets.key", 0o644)
    with pytest.raises(SecretKeyError, match="readable by others"):
        load_or_create_key(paths.data_dir)


@async_test
async def test_the_number_of_secrets_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("hub.api.admin.applying.MAX_SECRETS", 2)
    async with AdminHub(await make_hub_dir(tmp_path / "hub")) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        await stub.Apply(admin_pb2.ApplyRequest(documents=[secret("a"), secret("b")]))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Apply(admin_pb2.ApplyRequest(documents=[secret("c")]))
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "at most 2" in (info.value.details() or "")
        assert set(hub.ctx.cache.secrets) == {"a", "b"}


@async_test
async def test_an_embedded_key_in_a_deployment_is_refused_at_apply(tmp_path: Path) -> None:
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": "d", "annotations": {"tls": "-----BEGIN EC PRIVATE KEY-----\nx"}},
        "spec": {"model": {"name": "m", "version": "1.0.0"}},
    }
    async with AdminHub(await make_hub_dir(tmp_path / "hub")) as hub, hub.channel() as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await hub.stub(channel).Apply(admin_pb2.ApplyRequest(documents=[orjson.dumps(doc)]))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "documents[0].metadata.annotations.tls: embeds a PEM block (ec private key)" in (
            info.value.details() or ""
        )
        assert not hub.ctx.cache.stored


def _record(name: str, version: int) -> SecretRecord:
    return SecretRecord(name, version, ("k",), hub_secrets.SealedAtRest(b"n" * 12, b"c"))


@pytest.mark.parametrize(
    ("mounted", "require", "trusted", "expected"),
    [
        ({"a", "b"}, False, False, (("a", 3), ("b", 1))),  # no baseline asks: every device
        ({"a"}, True, True, (("a", 3),)),  # trusted under requireAttestation
        ({"a"}, True, False, ()),  # not trusted (Untrusted, Unknown): nothing
        ({"a", "gone"}, False, False, (("a", 3),)),  # a secret not applied (yet)
        (set(), False, True, ()),  # mounts nothing: gets nothing
    ],
)  # fmt: skip
def test_which_secrets_a_device_gets(
    mounted: set[str], require: bool, trusted: bool, expected: tuple[tuple[str, int], ...]
) -> None:
    records = {"a": _record("a", 3), "b": _record("b", 1), "c": _record("c", 9)}
    assert secret_refs(mounted, records, require_attestation=require, trusted=trusted) == expected


@pytest.mark.parametrize(
    ("require", "trusted", "tpm_attested", "expected"),
    [
        (False, False, False, (("b", 1),)),  # a: requireTpm, the device is software-attested
        (False, True, True, (("a", 3), ("b", 1))),  # TPM-attested: both
        (True, False, True, ()),  # requireAttestation and not trusted: nothing at all
    ],
)  # fmt: skip
def test_a_secret_requiring_a_tpm_goes_only_to_tpm_attested_devices(
    require: bool, trusted: bool, tpm_attested: bool, expected: tuple[tuple[str, int], ...]
) -> None:
    records = {"a": _record("a", 3), "b": _record("b", 1)}
    got = secret_refs(
        {"a", "b"},
        records,
        require_attestation=require,
        trusted=trusted,
        tpm_secrets=frozenset({"a"}),
        tpm_attested=tpm_attested,
    )
    assert got == expected


def test_a_secret_sealed_under_another_key_is_sealed_again_when_applied() -> None:
    from edgefleet.api import ObjectMeta, Secret
    from edgefleet.sealing import new_key

    old_key, new = SecretKeys(new_key()), SecretKeys(new_key())
    s = Secret(metadata=ObjectMeta(name="tls"), data={"token": b"x"})
    first, changed = plan_record(old_key, s, None)
    assert changed and first.version == 1 and first.key_id == old_key.current_id
    same, changed = plan_record(old_key, s, first)
    assert same is first and not changed
    again, changed = plan_record(new, s, first)  # a store restored without its key
    assert changed and again.version == 2 and again.open(new.current) == {"token": b"x"}


@async_test
async def test_turning_require_tpm_on_keeps_the_version_and_is_a_new_generation(
    tmp_path: Path,
) -> None:
    """spec.requireTpm turned on with the same values: the same version (nothing to re-seal at
    rest), the deployment taken off a device without a TPM sealing key (with the reason), and a
    new generation for a TPM-attested device (its copy is sealed again, to its TPM key)."""
    from hub.decide.desired import build_desired
    from hub.decide.devices import Attestation, Device, DevicePhase, TrustState

    def doc(require_tpm: bool) -> bytes:
        spec: dict[str, Any] = {"stringData": {"token": VALUE}}
        if require_tpm:
            spec["requireTpm"] = True
        return orjson.dumps(
            {"apiVersion": "edgefleet.io/v1", "kind": "Secret", "metadata": {"name": "tls"},
             "spec": spec}
        )  # fmt: skip

    deployment = orjson.dumps(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "ModelDeployment",
            "metadata": {"name": "d"},
            "spec": {
                "model": {"name": "m", "version": "1.0.0"},
                "secrets": [{"name": "tls", "mountPath": "/s/tls"}],
            },
        }
    )
    trusted = Attestation(TrustState.TRUSTED)
    tpm = Device("cam-1", phase=DevicePhase.READY, attestation=trusted,
                 attestation_key_pem="AK", sealing_key_pem="SK")  # fmt: skip
    soft = Device("cam-2", phase=DevicePhase.READY, attestation=trusted)
    async with AdminHub(await make_hub_dir(tmp_path / "hub")) as hub, hub.channel() as channel:
        stub = hub.stub(channel)
        model = storekeys.ModelRecord("m", "1.0.0", "ab" * 32, 1, b"{signed}", 1.0)
        hub.ctx.cache.models[("m", "1.0.0")] = model
        await stub.Apply(admin_pb2.ApplyRequest(documents=[doc(False), deployment]))

        def content(device: Device) -> Any:
            return build_desired(
                device, snapshot_of(hub.ctx.cache), previous=frozenset(), region=hub.ctx.region
            )

        before_tpm, before_soft = content(tpm), content(soft)
        assert before_tpm.secrets == before_soft.secrets == (("tls", 1),)
        got = await stub.Apply(admin_pb2.ApplyRequest(documents=[doc(True)]))
        assert got.results[0].outcome == admin_pb2.ApplyResult.CONFIGURED
        assert hub.ctx.cache.secrets["tls"].version == 1
        assert hub.ctx.cache.tpm_secrets() == {"tls"}
        after_tpm, after_soft = content(tpm), content(soft)
        assert after_tpm.secrets == (("tls", 1),) and after_tpm.digest != before_tpm.digest
        assert after_soft.secrets == () and after_soft.deployments == ()
        assert after_soft.excluded["d"].startswith("secret tls requires a TPM (spec.requireTpm)")
        shown = orjson.loads((await stub.Get(admin_pb2.GetRequest(kind="Secret", name="tls"))).json)
        assert shown["spec"] == {"keys": ["token"], "requireTpm": True}
