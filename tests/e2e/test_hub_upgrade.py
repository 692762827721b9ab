"""Hub upgrades (docs/agent-updates.md, "Upgrading hubs"): a store written by the previous
release's hub, built from git history (tests/releasetesting.py), served by this hub.

SQLite: the previous hub's ``hub init``, a device enrolled, a model pushed and a deployment
applied by it; then this hub serves the same data directory: it migrates the store to its
schema, knows the device and the deployment, and rolls out a new version. The previous hub
still serves the migrated store (a hub can be rolled back: the migration is compatible); a
store of a newer schema than this hub reads is refused, nothing written.

etcd: two replicas of the previous release share a real etcd; they are upgraded one at a time
while the fleet is served (the device serves, edgectl answers through each replica), the old
replica serving the store the new one migrated.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from etcdtesting import require_etcd, running_etcd
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import Edged, wait_for
from hubfleettesting import apply, push, serving
from hubreplicatesting import NAMESPACE, leader_port
from releasetesting import CURRENT, Release, previous_release

from edgefleet.launching import free_port_pair, program_command
from hub.state.migrations import SCHEMA, SCHEMA_KEY
from hub.state.store import EtcdStore, SqliteStore, Store

X = np.ones((1, 64), dtype=np.float32)


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Release:
    return previous_release(tmp_path_factory.mktemp("releases"))


def _get(hub: HubProcess, *args: str) -> Any:
    return json.loads(hub.edgectl("get", *args, "-o", "json").stdout)


def _hub(data: Path, log: Path, release: Release, port: int | None = None) -> HubProcess:
    return HubProcess(data, log, port=port, env=release.env(), cwd=release.cwd)


def _device(
    hub: HubProcess, tmp_path: Path, edged_factory: Callable[..., Edged], release: Release
) -> Edged:
    data = tmp_path / "dev-a"
    out = enroll(hub, data, "dev-a", {"site": "a"}, env=release.env(), cwd=release.cwd)
    assert out.returncode == 0, out.stdout + out.stderr
    e = edged_factory(None, data=data, config=SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "x"))
    e.env, e.cwd = release.env(), release.cwd
    return e.start()


def _ready(hub: HubProcess, name: str = "det") -> bool:
    return bool(_get(hub, "deployments", name)["status"]["readyDevices"] == 1)


def _schema(read: Callable[[Callable[[Store], Any]], Any]) -> dict[str, Any] | None:
    async def get(store: Store) -> dict[str, Any] | None:
        kv = await store.get(SCHEMA_KEY)
        return None if kv is None else dict(orjson.loads(kv.value))

    result: dict[str, Any] | None = read(get)
    return result


def _sqlite(path: Path) -> Callable[[Callable[[Store], Any]], Any]:
    def read(fn: Callable[[Store], Any]) -> Any:
        async def main() -> Any:
            store = await SqliteStore.open(path)
            try:
                return await fn(store)
            finally:
                await store.close()

        return asyncio.run(main())

    return read


def test_this_hub_serves_and_migrates_a_store_the_previous_hub_wrote(
    tmp_path: Path, edged_factory: Callable[..., Edged], previous: Release
) -> None:
    old = _hub(tmp_path / "hub", tmp_path / "old-hub.log", previous).init().start()
    try:
        e = _device(old, tmp_path, edged_factory, previous)
        push(old, tmp_path, "det", "1.0.0")
        apply(old, tmp_path, name="det", model="det", version="1.0.0", site="a")
        wait_for(lambda: serving(e, "det", "1.0.0"), 90, "the device to serve det 1.0.0")
        wait_for(lambda: _ready(old), 60, "the previous hub to see det ready")
    finally:
        old.stop()
    db = tmp_path / "hub" / "hub.db"
    assert _schema(_sqlite(db)) is None  # the previous release has no schema key

    new = _hub(tmp_path / "hub", tmp_path / "new-hub.log", CURRENT, port=old.port).start()
    try:
        assert e.infer("det", X)[0] == 200  # the device served all along
        wait_for(  # its Hello, to this hub: the version is kept from then on
            lambda: _get(new, "devices", "dev-a")["status"]["agentVersion"] == previous.version,
            90,
            "the device to reconnect to this hub",
        )
        wait_for(lambda: _ready(new), 60, "this hub to see det ready")
        push(new, tmp_path, "det", "2.0.0", seed=2)  # this hub works on the migrated store
        apply(new, tmp_path, name="det", model="det", version="2.0.0", site="a")
        wait_for(lambda: serving(e, "det", "2.0.0"), 90, "the device to serve det 2.0.0")
        assert e.infer("det", X)[0] == 200
    finally:
        new.stop()
    schema = _schema(_sqlite(db))
    assert schema is not None and schema["version"] == SCHEMA, schema
    assert schema["hub"] == CURRENT.version and schema["oldestReader"] == 0, schema
    assert '"event":"store migration"' in (tmp_path / "new-hub.log").read_text()

    # the migration was compatible: the previous hub still serves the store (a way back)
    back = _hub(tmp_path / "hub", tmp_path / "back-hub.log", previous, port=old.port).start()
    try:
        assert [d["metadata"]["name"] for d in _get(back, "devices")["items"]] == ["dev-a"]
        assert _get(back, "deployments", "det")["spec"]["model"]["version"] == "2.0.0"
    finally:
        back.stop()
    assert e.terminate() == 0

    # a store of a newer schema than this hub reads: refused, nothing written
    async def newer(store: Store) -> int:
        future = {"version": SCHEMA + 1, "oldestReader": SCHEMA + 1, "hub": "99.0.0"}
        return await store.put(SCHEMA_KEY, orjson.dumps(future))

    revision = _sqlite(db)(newer)
    out = subprocess.run(
        program_command("hub", "serve", "--data-dir", tmp_path / "hub", "--listen",
                        f"127.0.0.1:{free_port_pair()}"),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"has schema {SCHEMA + 1} (written by hub 99.0.0)" in out.stderr, out.stderr
    assert "nothing was changed" in out.stderr

    async def current_revision(store: Store) -> int:
        return (await store.range("/")).revision

    assert _sqlite(db)(current_revision) == revision


def test_replicas_on_etcd_are_upgraded_one_at_a_time_while_the_fleet_is_served(
    tmp_path: Path, edged_factory: Callable[..., Edged], previous: Release
) -> None:
    require_etcd()
    with running_etcd(tmp_path / "etcd") as etcd:
        p0 = free_port_pair()
        p1 = free_port_pair()
        while p1 in (p0 - 1, p0, p0 + 1):
            p1 = free_port_pair()
        r0 = _hub(tmp_path / "r0", tmp_path / "r0-old.log", previous, port=p0)
        r0.init("--store", f"etcd://{etcd.endpoint}{NAMESPACE}", "--replica-address",
                f"127.0.0.1:{p1}")  # fmt: skip
        config = r0.data / "hub.toml"
        config.write_text(config.read_text().replace('leaderLease = "10s"', 'leaderLease = "3s"'))
        shutil.copytree(r0.data, tmp_path / "r1")
        config = tmp_path / "r1" / "hub.toml"
        config.write_text(re.sub(r'metricsListen = "[^"]*"', 'metricsListen = ""',
                                 config.read_text()))  # fmt: skip
        r1 = _hub(tmp_path / "r1", tmp_path / "r1-old.log", previous, port=p1)
        running: list[HubProcess] = []

        def etcd_schema() -> dict[str, Any] | None:
            def read(fn: Callable[[Store], Any]) -> Any:
                async def main() -> Any:
                    store = await EtcdStore.open([etcd.endpoint], namespace=NAMESPACE)
                    try:
                        return await fn(store)
                    finally:
                        await store.close()

                return asyncio.run(main())

            return _schema(read)

        def served(*hubs: HubProcess) -> None:
            """The device serves, and every replica running answers edgectl."""
            assert e.infer("det", X)[0] == 200
            for h in hubs:
                names = [d["metadata"]["name"] for d in _get(h, "devices")["items"]]
                assert names == ["dev-a"], (h.address, names)

        try:
            running.append(r0.start())
            wait_for(lambda: leader_port(etcd) == p0, 60, "r0 to lead")
            running.append(r1.start())
            e = _device(r0, tmp_path, edged_factory, previous)
            push(r0, tmp_path, "det", "1.0.0")
            apply(r0, tmp_path, name="det", model="det", version="1.0.0", site="a")
            wait_for(lambda: serving(e, "det", "1.0.0"), 90, "the device to serve det 1.0.0")
            assert etcd_schema() is None

            # r1 first: the follower, upgraded while r0 (previous release) leads and serves
            r1.stop()
            running.remove(r1)
            served(r0)
            new1 = _hub(r1.data, tmp_path / "r1-new.log", CURRENT, port=p1)
            running.append(new1.start())
            schema = etcd_schema()
            assert schema is not None and schema["version"] == SCHEMA, schema
            assert schema["oldestReader"] == 0  # the previous replica may go on serving it
            served(r0, new1)
            wait_for(lambda: _ready(r0) and _ready(new1), 60, "both replicas to see det ready")

            # then r0: the upgraded r1 takes the lead and the device moves to it
            r0.stop()
            running.remove(r0)
            wait_for(lambda: leader_port(etcd) == p1, 60, "the upgraded r1 to lead")
            served(new1)
            new0 = _hub(r0.data, tmp_path / "r0-new.log", CURRENT, port=p0)
            running.append(new0.start())
            served(new0, new1)
            push(new0, tmp_path, "det", "2.0.0", seed=2)
            apply(new0, tmp_path, name="det", model="det", version="2.0.0", site="a")
            wait_for(lambda: serving(e, "det", "2.0.0"), 90, "the device to serve det 2.0.0")
            device = _get(new0, "devices", "dev-a")
            assert device["status"]["agentVersion"] == previous.version
            assert e.terminate() == 0

            # a later release's `hub migrate` run too early: running replicas that cannot read
            # the store any more stop, saying why, instead of serving it
            async def outgrow() -> None:
                store = await EtcdStore.open([etcd.endpoint], namespace=NAMESPACE)
                try:
                    future = {"version": SCHEMA + 1, "oldestReader": SCHEMA + 1, "hub": "9.0.0"}
                    await store.put(SCHEMA_KEY, orjson.dumps(future))
                finally:
                    await store.close()

            asyncio.run(outgrow())
            for h in (new0, new1):
                assert h.proc is not None
                assert h.proc.wait(60) == 1, h.log.read_text()[-2000:]
                running.remove(h)
                assert "store schema no longer readable" in h.log.read_text()
        finally:
            for h in running:
                h.stop()
