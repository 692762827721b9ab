"""One TUF repository for hub replicas (``hub.state.sharedtuf``, docs/etcd.md) on a real etcd: two
replicas, each with its own copy of the data directory's ``D/tuf/`` and its own etcd client
and elector, in this process. Only the leader signs, through the fenced store; the follower
serves what the store holds; after a failover the new leader signs the next versions, so a
device (python-tuf's real client) moving between replicas never sees a rollback.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import trusttesting
from asynctesting import async_test, eventually
from etcdtesting import EtcdServer
from trusttesting import Key
from tufreplicatesting import DAY, artifact, fleet_root

from edged.trust.tufclient import TufClient
from edgefleet.errors import TrustError
from edgefleet.trust import tufmeta
from edgefleet.trust.documents import ArtifactMetadata
from hub.state.sharedtuf import TIMESTAMP_KEY, SharedTuf
from hub.state.store.electing import Elector, FencedStore, NotLeader
from hub.state.store.etcd import EtcdStore
from hub.state.tufrepo import TufRepository, create_repository

keys = trusttesting.keys  # the fixture: real Ed25519 keys


class Replica:
    def __init__(self, name: str, data: Path, clock: Any) -> None:
        self.name = name
        self.repo = TufRepository(data / "tuf", clock=clock, signing=False)
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self, endpoint: str, namespace: str) -> Replica:
        self.store = await EtcdStore.open([endpoint], namespace=namespace)
        self.elector = Elector(self.store, identity=self.name, ttl=30)
        self.shared = SharedTuf(
            lambda: self.repo, self.store, FencedStore(self.store, self.elector), self.elector,
            period_s=0.1,
        )  # fmt: skip
        self.tasks.append(asyncio.create_task(self.elector.run(self.stop)))
        return self

    def run_shared(self) -> None:
        self.tasks.append(asyncio.create_task(self.shared.run(self.stop)))

    async def close(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.store.close()

    def version(self, name: str) -> int:
        from tuf.api.metadata import Snapshot, Timestamp

        kind = Timestamp if name == "timestamp" else Snapshot
        signed, _ = tufmeta.parse(self.repo.read(f"{name}.json") or b"", kind, what=name)
        return int(signed.version)


def publish(
    replica: Replica, keys: dict[str, Key], meta: ArtifactMetadata
) -> tuple[str, bytes, int]:
    data = tufmeta.add_artifact(
        replica.repo.read("vision.json"), meta, [tufmeta.tuf_signer(keys["pub1"].key_file)],
        expires=time.time() + 30 * DAY,
    )  # fmt: skip
    version = replica.repo.check_delegated("vision", data, meta, now=time.time())
    return "vision", data, version


@async_test
async def test_replicas_share_one_repository_and_a_device_failing_over_sees_no_rollback(
    etcd_server: EtcdServer, etcd_namespace: str, tmp_path: Path, keys: dict[str, Key]
) -> None:
    create_repository(
        tmp_path / "a",
        root_keys=[keys["root1"].key_file],
        targets_key=keys["newroot1"].key_file,
        delegations=[tufmeta.Delegation("vision", (keys["pub1"].raw,), 1, ("vision-*",))],
        now=time.time(),
        root_lifetime_s=365 * DAY,
        targets_lifetime_s=365 * DAY,
    )
    TufRepository(tmp_path / "a" / "tuf")  # a single hub signs its first snapshot and timestamp
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # a replica is a copy of the data directory
    now = [time.time()]
    a = await Replica("a", tmp_path / "a", lambda: now[0]).start(
        etcd_server.endpoint, etcd_namespace
    )
    await eventually(lambda: a.elector.leading, 10)
    b = await Replica("b", tmp_path / "b", lambda: now[0]).start(
        etcd_server.endpoint, etcd_namespace
    )
    fleet = fleet_root(keys)
    try:
        assert await a.shared.sign()  # the first leader puts its copy in the store
        assert not await a.shared.sign()  # nothing due
        # a push on the leader: delegated targets, snapshot and timestamp in one write
        meta = artifact("1.0.0", b"v1")
        await a.shared.publish_delegated(*publish(a, keys, meta))
        assert (a.version("snapshot"), a.version("timestamp")) == (2, 2)
        await b.shared.follow()
        for name in ("timestamp.json", "snapshot.json", "vision.json"):
            assert b.repo.read(name) == a.repo.read(name), name
        # a follower does not sign, and could not write if it tried
        assert b.repo.read("timestamp.json") == a.repo.read("timestamp.json")
        with pytest.raises(NotLeader):
            await b.shared.sign(force=True)

        # a device on a, then on b: the same versions
        device = TufClient(tmp_path / "dev")
        TufClient.check(device.refresh(lambda n, m: a.repo.read(n), fleet), meta)

        # the timestamp half way to its expiry: the leader signs the next one; b follows
        a.run_shared()
        b.run_shared()
        now[0] += 1800.0 + 1.0
        await eventually(lambda: b.version("timestamp") == 3, 10)
        assert a.version("timestamp") == 3
        TufClient.check(device.refresh(lambda n, m: b.repo.read(n), fleet), meta)

        # failover: a stops (gives the lead up), b leads and signs the next versions from the
        # store's, not from an older copy of its own
        await a.close()
        await eventually(lambda: b.elector.leading, 10)
        meta2 = artifact("2.0.0", b"v2")
        await b.shared.publish_delegated(*publish(b, keys, meta2))
        assert (b.version("snapshot"), b.version("timestamp")) == (3, 4)
        TufClient.check(device.refresh(lambda n, m: b.repo.read(n), fleet), meta2)
        kv = await b.store.get(TIMESTAMP_KEY)
        assert kv is not None and kv.value == b.repo.read("timestamp.json")

        # a replica whose copy went back (an old timestamp) does not serve it over the store's
        old = TufRepository(tmp_path / "a" / "tuf", signing=False)
        with pytest.raises(TrustError):
            old.adopt_shared(b"not dsse", kv.value, {})
        assert old.adopt_shared(
            b.repo.read("snapshot.json") or b"", kv.value,
            {"vision": b.repo.read("vision.json") or b""},
        )  # fmt: skip
        assert old.read("timestamp.json") == kv.value
    finally:
        await a.close()
        await b.close()


def offline_roles(tmp: Path, keys: dict[str, Key], data: Path, version: int) -> tuple[Path, Path]:
    """An operator's next TUF root (the same keys, ``version``) and top-level targets (one
    more publisher), signed offline: the files ``hub tuf install`` takes."""
    from edgefleet.trust import signing

    root = tufmeta.build_root(
        root_keys=[keys["root1"].raw], root_threshold=1,
        targets_keys=[keys["newroot1"].raw], targets_threshold=1,
        online_keys=[signing.load_public_key_raw(data / "tuf" / "online.key")],
        version=version, expires=time.time() + 365 * DAY,
    )  # fmt: skip
    targets = tufmeta.build_targets(
        [tufmeta.Delegation("vision", (keys["pub1"].raw,), 1, ("vision-*",)),
         tufmeta.Delegation("audio", (keys["pub1"].raw,), 1, ("audio-*",))],
        version=version, expires=time.time() + 365 * DAY,
    )  # fmt: skip
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "root.json").write_bytes(
        tufmeta.sign(root, [tufmeta.tuf_signer(keys["root1"].key_file)])
    )
    (tmp / "targets.json").write_bytes(
        tufmeta.sign(targets, [tufmeta.tuf_signer(keys["newroot1"].key_file)])
    )
    return tmp / "root.json", tmp / "targets.json"


@async_test
async def test_hub_tuf_install_on_one_replica_reaches_every_replica_through_the_store(
    etcd_server: EtcdServer, etcd_namespace: str, tmp_path: Path, keys: dict[str, Key]
) -> None:
    from edgefleet.errors import HubDirError
    from hub.state.sharedtuf import ROOTS_PREFIX, TARGETS_KEY, share_installed
    from hub.state.tufrepo import install_repository

    create_repository(
        tmp_path / "a",
        root_keys=[keys["root1"].key_file],
        targets_key=keys["newroot1"].key_file,
        delegations=[tufmeta.Delegation("vision", (keys["pub1"].raw,), 1, ("vision-*",))],
        now=time.time(),
        root_lifetime_s=365 * DAY,
        targets_lifetime_s=365 * DAY,
    )
    TufRepository(tmp_path / "a" / "tuf")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.copytree(tmp_path / "a", tmp_path / "old")  # a replica's copy left behind
    a = await Replica("a", tmp_path / "a", time.time).start(etcd_server.endpoint, etcd_namespace)
    await eventually(lambda: a.elector.leading, 10)
    b = await Replica("b", tmp_path / "b", time.time).start(etcd_server.endpoint, etcd_namespace)
    fleet = fleet_root(keys)
    try:
        assert await a.shared.sign()
        await b.shared.follow()
        device = TufClient(tmp_path / "dev")
        meta = artifact("1.0.0", b"v1")
        await a.shared.publish_delegated(*publish(a, keys, meta))

        # hub tuf install on b (a follower), with replicas: no signing there, then the store
        root2, targets2 = offline_roles(tmp_path / "offline", keys, tmp_path / "b", 2)
        install_repository(tmp_path / "b", root2, targets2, signing=False)
        assert await share_installed(b.store, tmp_path / "b" / "tuf")
        assert not await share_installed(b.store, tmp_path / "b" / "tuf")  # once
        stored = {kv.key for kv in (await a.store.range("/tuf/")).kvs}
        assert {f"{ROOTS_PREFIX}1", f"{ROOTS_PREFIX}2", TARGETS_KEY} <= stored
        # a (the leader) installs it from the store into its own D/tuf; its watcher adopts it
        await a.shared.follow()
        assert (tmp_path / "a" / "tuf" / "targets.json").read_bytes() == targets2.read_bytes()
        assert (tmp_path / "a" / "tuf" / "2.root.json").read_bytes() == root2.read_bytes()
        a.repo = TufRepository(tmp_path / "a" / "tuf", signing=False)  # as tuf-repository does
        b.repo = TufRepository(tmp_path / "b" / "tuf", signing=False)
        assert (a.repo.root.version, a.repo.targets.version) == (2, 2)
        # the leader signs a snapshot for the new targets; a device on b follows the rotation
        assert await a.shared.sign()
        await b.shared.follow()
        updater = device.refresh(lambda n, m: b.repo.read(n), fleet)
        assert updater._trusted_set.root.version == 2
        TufClient.check(updater, meta)

        # the copy left behind cannot share lower targets over the replicas' newer ones
        with pytest.raises(HubDirError, match="not lower than this one's 1"):
            await share_installed(a.store, tmp_path / "old" / "tuf")
        # a targets written into the store that its targets keys did not sign: refused
        forged = tufmeta.build_targets([], version=3, expires=time.time() + DAY)
        await a.store.put(
            TARGETS_KEY, tufmeta.sign(forged, [tufmeta.tuf_signer(keys["pub1"].key_file)])
        )
        await b.shared.follow()
        assert (tmp_path / "b" / "tuf" / "targets.json").read_bytes() == targets2.read_bytes()
    finally:
        await a.close()
        await b.close()


@async_test
async def test_hub_tuf_install_with_an_etcd_store_shares_the_roles_and_signs_nothing_itself(
    etcd_server: EtcdServer, etcd_namespace: str, tmp_path: Path
) -> None:
    from edgectl.cli import main as edgectl
    from hub.cli import main as hub
    from hub.state.sharedtuf import ROOTS_PREFIX, TARGETS_KEY

    d = tmp_path / "hub"
    store = f"etcd://{etcd_server.endpoint}{etcd_namespace}"
    assert (
        await asyncio.to_thread(hub, ["init", "--data-dir", str(d), "--no-tuf", "--store", store])
        == 0
    )
    assert await asyncio.to_thread(hub, ["tuf", "online-key", "--data-dir", str(d)]) == 0
    off = tmp_path / "offline"
    for name in ("targets", "vision"):
        assert edgectl(["keys", "generate", "--out", str(off / name)]) == 0
    root1, targets1 = off / "root.json", off / "targets.json"
    assert (
        edgectl(
            [
                "trust",
                "tuf",
                "root",
                "--root-key",
                str(d / "root.key"),
                "--targets-key",
                str(off / "targets.pub"),
                "--online-key",
                str(d / "tuf" / "online.pub"),
                "--out",
                str(root1),
            ]
        )
        == 0
    )
    assert edgectl(["trust", "tuf", "targets", "--key", str(off / "targets.key"),
                    "--delegate", f"vision={off / 'vision.pub'}:vision-*", "--version", "1",
                    "--out", str(targets1)]) == 0  # fmt: skip
    assert await asyncio.to_thread(hub, ["tuf", "install", "--data-dir", str(d), "--root",
                                         str(root1), "--targets", str(targets1)]) == 0  # fmt: skip
    assert not (d / "tuf" / "timestamp.json").exists()  # the replicas' leader signs it
    s = await EtcdStore.open([etcd_server.endpoint], namespace=etcd_namespace)
    try:
        stored = {kv.key: kv.value for kv in (await s.range("/tuf/")).kvs}
    finally:
        await s.close()
    assert stored[f"{ROOTS_PREFIX}1"] == root1.read_bytes()
    assert stored[TARGETS_KEY] == targets1.read_bytes()
    # the first leader signs the first snapshot and timestamp, for every replica
    a = await Replica("a", d, time.time).start(etcd_server.endpoint, etcd_namespace)
    try:
        await eventually(lambda: a.elector.leading, 10)
        assert a.repo.read("timestamp.json") == b""
        assert await a.shared.sign()
        kv = await a.store.get(TIMESTAMP_KEY)
        assert kv is not None and kv.value == a.repo.read("timestamp.json") != b""
        assert a.version("timestamp") == 1
    finally:
        await a.close()
