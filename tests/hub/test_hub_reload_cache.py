"""A replica's cache reload (:func:`hub.controllers.replicas.reload_cache`) keeps the device
records the cache took from the store after the reload's snapshot: the watch tells each
change once, so a record the reload dropped was lost for good (the soak harness, seed 35: a
device enrolled at a replica just restarted was NOT_FOUND at that replica ever after, while
the other replica had it). Real in-memory store; the interleaving is made by hand: the
snapshot is read, then the device is written and taken into the cache, then the reload
assigns the snapshot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from asynctesting import async_test

from hub.controllers import replicas
from hub.decide.devices import Device
from hub.state import storekeys
from hub.state.cache import Cache
from hub.state.sessions import Sessions
from hub.state.store import open_hub_store
from hub.state.writer import DeviceWriter


async def _write(store: object, device: Device) -> int:
    value = json.dumps(device.to_json()).encode()
    return await store.put(storekeys.device_key(device.name), value)  # type: ignore[attr-defined, no-any-return]


@async_test
async def test_a_device_taken_after_the_snapshot_survives_the_reload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await open_hub_store("memory://", data_dir=tmp_path)
    old = Device(name="old")
    await _write(store, old)
    cache = await Cache.load(store)
    writer = DeviceWriter(store, cache, conditional=True)
    snapshot = await Cache.load(store)  # the reload reads here ...
    assert "new" not in snapshot.devices

    new = Device(name="new")  # ... a device is enrolled meanwhile, taken into the cache
    revision = await _write(store, new)
    cache.put_device(new)
    writer.observed("new", revision, new.to_json())

    async def load(_store: object) -> Cache:  # the snapshot as read, each time afresh
        return Cache(devices=dict(snapshot.devices), devices_revision=snapshot.devices_revision)

    monkeypatch.setattr(Cache, "load", classmethod(lambda cls, s: load(s)))
    await replicas.reload_cache(cache, store, Sessions(), writer)
    assert set(cache.devices) == {"old", "new"}

    # without the writer's revisions (the reload as it was) the record is lost
    cache.put_device(new)
    await replicas.reload_cache(cache, store, Sessions())
    assert set(cache.devices) == {"old"}


@async_test
async def test_a_device_deleted_before_the_snapshot_is_dropped(
    tmp_path: Path,
) -> None:
    store = await open_hub_store("memory://", data_dir=tmp_path)
    gone = Device(name="gone")
    revision = await _write(store, gone)
    cache = await Cache.load(store)
    writer = DeviceWriter(store, cache, conditional=True)
    writer.observed("gone", revision, gone.to_json())
    await store.delete(storekeys.device_key("gone"))
    await replicas.reload_cache(cache, store, Sessions(), writer)
    assert "gone" not in cache.devices
