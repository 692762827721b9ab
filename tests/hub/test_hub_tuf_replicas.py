"""One TUF repository for hub replicas (``hub.tufsharing``, docs/etcd.md) on a real etcd: two
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
from trusttesting import Key, make_root

from edged.trust.tufclient import TufClient
from edgefleet.errors import TrustError
from edgefleet.trust import tufmeta
from edgefleet.trust.documents import ArtifactMetadata, FileInfo, Root, parse_root
from edgefleet.trust.envelopes import ROOT_TYPE, decode_payload
from hub.store.electing import Elector, FencedStore, NotLeader
from hub.store.etcd import EtcdStore
from hub.tufrepo import TufRepository, create_repository
from hub.tufsharing import TIMESTAMP_KEY, SharedTuf

DAY = 86400.0
keys = trusttesting.keys  # the fixture: real Ed25519 keys


def artifact(version: str, data: bytes) -> ArtifactMetadata:
    import hashlib

    now = time.time()
    return ArtifactMetadata(
        name="vision-det", version=version, precision=None, metadata_version=1, created=now,
        expires=now + 30 * DAY,
        files={"model.onnx": FileInfo(hashlib.sha256(data).hexdigest(), len(data), "model")},
    )  # fmt: skip


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


def fleet_root(keys: dict[str, Key]) -> Root:
    return parse_root(
        decode_payload(
            make_root(keys, expires=time.time() + 365 * DAY), expected_type=ROOT_TYPE, what="r"
        )
    )


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
