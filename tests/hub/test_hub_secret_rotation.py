"""Rotating the hub's key for Secrets at rest (``hub secrets rotate-key``): a real hub data
directory, the real SQLite store, real key files.

A rotation stopped after each of its steps (the hub process killed there: nothing after the
step runs) leaves every Secret readable by a hub started afresh on the directory, and running
it again finishes it; a rotation under a running hub (the real ``hub`` command, another
process) neither stops that hub from sealing secrets for devices nor from applying new ones,
which it seals under the new key; afterwards the old key is needed by nothing in the store."""

from __future__ import annotations

import asyncio
import base64
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
from asynctesting import async_test
from cryptography.hazmat.primitives.asymmetric import ec
from hubserving import AdminHub, make_hub_dir

from edgefleet.launching import program_command
from edgefleet.v1 import admin_pb2
from hub.config import load_config
from hub.initializing import HubPaths
from hub.state import storekeys
from hub.state.secretkeys import rotate_key
from hub.state.secrets import (
    KEY_FILE,
    NEXT_KEY_FILE,
    OLD_KEY_FILE,
    SecretKeyError,
    SecretKeys,
    key_id,
    plan_record,
    read_key,
    record_of,
    seal_for,
)
from hub.state.store import Compare, Put, open_hub_store

VALUES = {f"s{i}": f"rot4te-value-{i}-never-shown" for i in range(3)}


def secret(name: str, value: str) -> bytes:
    return orjson.dumps(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "spec": {"stringData": {"token": value}},
        }
    )


async def _hub_with_secrets(tmp_path: Path) -> HubPaths:
    paths = await make_hub_dir(tmp_path / "hub")
    async with AdminHub(paths) as hub, hub.channel() as channel:
        docs = [secret(n, v) for n, v in VALUES.items()]
        await hub.stub(channel).Apply(admin_pb2.ApplyRequest(documents=docs))
    return paths


async def _stored(paths: HubPaths) -> dict[str, tuple[str, dict[str, bytes] | None]]:
    """Each stored Secret: the key id it names, and its values opened with the key ring a hub
    started now would read (None: it does not open)."""
    keys = SecretKeys.load(paths.data_dir, create=False)
    store = await open_hub_store(None, data_dir=paths.data_dir)
    try:
        kvs = (await store.range(storekeys.object_prefix("Secret"))).kvs
    finally:
        await store.close()
    out: dict[str, tuple[str, dict[str, bytes] | None]] = {}
    for kv in kvs:
        doc = storekeys.loads(kv.value)
        name = doc["manifest"]["metadata"]["name"]
        record = record_of(doc, name)
        assert record is not None
        try:
            values: dict[str, bytes] | None = keys.open(record)
        except Exception:
            values = None
        out[name] = (record.key_id, values)
    return out


def _expected() -> dict[str, dict[str, bytes]]:
    return {n: {"token": v.encode()} for n, v in VALUES.items()}


class Killed(Exception):
    """The rotating process dies here: nothing after this step runs."""


@pytest.mark.parametrize("killed_after", ["prepared", "resealed", "old kept", "swapped"])
@async_test
async def test_a_rotation_killed_after_any_step_loses_nothing_and_finishes_when_run_again(
    tmp_path: Path, killed_after: str
) -> None:
    paths = await _hub_with_secrets(tmp_path)
    d = paths.data_dir
    first = read_key(d / KEY_FILE)
    before = await _stored(paths)
    assert {n: kv[0] for n, kv in before.items()} == dict.fromkeys(VALUES, key_id(first))

    async def die(name: str) -> None:
        if name == killed_after:
            raise Killed(name)

    store = await open_hub_store(None, data_dir=d)
    with pytest.raises(Killed):
        await rotate_key(store, d, step=die)
    await store.close()

    # a hub started now reads every Secret, whatever the step
    halfway = await _stored(paths)
    assert {n: v for n, (_, v) in halfway.items()} == _expected()
    async with AdminHub(paths) as hub:
        for name, record in hub.ctx.cache.secrets.items():
            assert hub.ctx.secret_keys.open(record) == _expected()[name]

    # run again: finished, every record under the new key, the old key kept beside it (killed
    # after the swap, the rotation was done but for its second pass: running it again is a
    # new rotation, from the key it had swapped in)
    current = read_key(d / KEY_FILE)
    assert (current == first) is (killed_after != "swapped")
    store = await open_hub_store(None, data_dir=d)
    try:
        done = await rotate_key(store, d)
    finally:
        await store.close()
    new = read_key(d / KEY_FILE)
    assert new not in (first, current) and done.new_key_id == key_id(new)
    assert not (d / NEXT_KEY_FILE).exists()
    assert (d / OLD_KEY_FILE).read_bytes() == current
    assert (d / OLD_KEY_FILE).stat().st_mode & 0o777 == 0o600
    after = await _stored(paths)
    assert {n: kv[0] for n, kv in after.items()} == dict.fromkeys(VALUES, key_id(new))
    # the old key is needed by nothing in the store: without it, everything still opens
    (d / OLD_KEY_FILE).unlink()
    assert {n: v for n, (_, v) in (await _stored(paths)).items()} == _expected()
    # and the store holds no value in the clear
    everything = b"".join(p.read_bytes() for p in d.rglob("*") if p.is_file())
    for value in VALUES.values():
        assert value.encode() not in everything
        assert base64.b64encode(value.encode()) not in everything


@async_test
async def test_a_rotation_under_a_running_hub_keeps_it_sealing_and_applying(
    tmp_path: Path,
) -> None:
    paths = await _hub_with_secrets(tmp_path)
    d = paths.data_dir
    first = read_key(d / KEY_FILE)
    device_key = ec.generate_private_key(ec.SECP256R1())
    async with AdminHub(paths) as hub, hub.channel() as channel:
        ctx = hub.ctx
        assert load_config(paths.config).store == ""  # the default: SQLite in the data dir
        out = await asyncio.to_thread(
            subprocess.run,
            program_command("hub", "secrets", "rotate-key", "--data-dir", str(d)),
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        new = read_key(d / KEY_FILE)
        assert f"3 Secret(s) sealed under the new key {key_id(new)}" in out.stdout
        assert f"the previous key {key_id(first)} is kept" in out.stdout

        # the running hub still seals what it holds for a device (the records it read before
        # the rotation are under the old key, which it keeps)
        refs = [(n, 1) for n in sorted(VALUES)]
        sealed = seal_for("dev-1", device_key.public_key(), refs, ctx.cache.secrets,
                          ctx.secret_keys)  # fmt: skip
        assert [s.name for s in sealed] == sorted(VALUES)
        # a new value applied now is sealed under the new key
        changed = secret("s0", "rot4te-value-0-changed")
        await hub.stub(channel).Apply(admin_pb2.ApplyRequest(documents=[changed]))
        record = ctx.cache.secrets["s0"]
        assert record.version == 2 and record.key_id == key_id(new)
        assert ctx.secret_keys.open(record) == {"token": b"rot4te-value-0-changed"}
    (d / OLD_KEY_FILE).unlink()  # nothing in the store needs it any more
    async with AdminHub(paths) as hub:
        opened = {n: hub.ctx.secret_keys.open(r) for n, r in hub.ctx.cache.secrets.items()}
    assert opened == {**_expected(), "s0": {"token": b"rot4te-value-0-changed"}}


@async_test
async def test_prepare_makes_only_the_next_key_and_a_key_readable_by_others_is_refused(
    tmp_path: Path,
) -> None:
    paths = await _hub_with_secrets(tmp_path)
    d = paths.data_dir
    first = read_key(d / KEY_FILE)
    store = await open_hub_store(None, data_dir=d)
    try:
        done = await rotate_key(store, d, prepare_only=True)
        assert done.prepared_only and read_key(d / KEY_FILE) == first
        prepared = read_key(d / NEXT_KEY_FILE)
        assert {kv[0] for kv in (await _stored(paths)).values()} == {key_id(first)}
        (d / NEXT_KEY_FILE).chmod(0o644)
        with pytest.raises(SecretKeyError, match="readable by others"):
            await rotate_key(store, d)
        (d / NEXT_KEY_FILE).chmod(0o600)
        done = await rotate_key(store, d)  # the prepared key is the one used
        assert done.new_key_id == key_id(prepared) == key_id(read_key(d / KEY_FILE))
    finally:
        await store.close()


@async_test
async def test_an_apply_during_the_rotation_is_read_again_not_overwritten(tmp_path: Path) -> None:
    """A Secret applied again (a new version) between the rotation's read and its write: the
    batch's compare fails, the rotation reads that record again and re-seals the new version;
    the new value is kept, under the new key."""
    from edgefleet.api import ObjectMeta, Secret
    from hub.state.secretkeys import reseal

    paths = await _hub_with_secrets(tmp_path)
    d = paths.data_dir
    keys = SecretKeys.load(d, create=False)
    target = read_key(d / KEY_FILE)[::-1]  # any 32 bytes: the key rotated to
    store = await open_hub_store(None, data_dir=d)
    real_txn = store.txn
    raced = []

    async def txn_after_an_apply(compares: Any, ops: Any) -> int:
        if not raced:  # an apply lands between the rotation's read and its first write
            raced.append(True)
            key = storekeys.object_key("Secret", "s1")
            kv = await store.get(key)
            assert kv is not None
            doc = storekeys.loads(kv.value)
            secret = Secret(metadata=ObjectMeta(name="s1"), data={"token": b"applied-meanwhile"})
            old = record_of(doc, "s1")
            record, _ = plan_record(keys, secret, old)
            doc["secret"] = record.to_json()
            await real_txn([Compare(key, kv.mod_revision)], [Put(key, storekeys.dumps(doc))])
        return await real_txn(compares, ops)

    store.txn = txn_after_an_apply  # type: ignore[method-assign]
    try:
        assert await reseal(store, keys, target) == 3
    finally:
        store.txn = real_txn  # type: ignore[method-assign]
        await store.close()
    assert raced
    store = await open_hub_store(None, data_dir=d)
    try:
        kv = await store.get(storekeys.object_key("Secret", "s1"))
    finally:
        await store.close()
    assert kv is not None
    record = record_of(storekeys.loads(kv.value), "s1")
    assert record is not None and record.version == 2 and record.key_id == key_id(target)
    assert record.open(target) == {"token": b"applied-meanwhile"}
