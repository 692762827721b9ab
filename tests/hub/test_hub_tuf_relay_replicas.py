"""A regional hub's replicas share the root's TUF set (``hub.state.sharedtuf.SharedRelay``,
docs/federation.md) on a real etcd: two region replicas, each with its own data directory
(``D/tuf-relay/``), etcd client and elector, in this process. The one holding the root link
(the leader) adopts the root's set and writes it to the store; the other serves it only after
checking it itself, so a device (python-tuf's real client) on either replica verifies the
root's artifacts, and a set written into the store that does not check out (forged, or older
than one the replica saw) is not served.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import trusttesting
from asynctesting import async_test, eventually
from etcdtesting import EtcdServer
from trusttesting import Key
from tufreplicatesting import artifact, fleet_root

from edged.trust.tufclient import TufClient
from edgefleet.errors import TrustError
from edgefleet.trust import tufmeta
from edgefleet.trust.documents import ArtifactMetadata, Root
from hub.state.sharedtuf import (
    RELAY_CURRENT_KEY,
    RELAY_FILES_PREFIX,
    RELAY_PREFIX,
    SharedRelay,
    read_relayed,
)
from hub.state.store import Put
from hub.state.store.electing import Elector, FencedStore, NotLeader
from hub.state.store.etcd import EtcdStore
from hub.state.store.protocol import KeyValue
from hub.state.tufrelay import RelayedTuf, adopt
from hub.state.tufrepo import TufRepository, create_repository

DAY = 86400.0
keys = trusttesting.keys  # the fixture: real Ed25519 keys


class RegionReplica:
    def __init__(self, name: str, data: Path, fleet: Root) -> None:
        self.name = name
        self.data = data
        self.fleet = fleet
        data.mkdir(parents=True, exist_ok=True)
        self.tuf: RelayedTuf | None = RelayedTuf.load(data)
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self, endpoint: str, namespace: str) -> RegionReplica:
        self.store = await EtcdStore.open([endpoint], namespace=namespace)
        self.elector = Elector(self.store, identity=self.name, ttl=30)
        self.relay = SharedRelay(
            self.data, self.store, FencedStore(self.store, self.elector),
            held=lambda: self.tuf, fleet_root=lambda: self.fleet, adopted=self._adopted,
        )  # fmt: skip
        self.tasks.append(asyncio.create_task(self.elector.run(self.stop)))
        return self

    def _adopted(self, relayed: RelayedTuf) -> None:
        self.tuf = relayed

    def run_relay(self) -> None:
        self.tasks.append(asyncio.create_task(self.relay.run(self.stop)))

    async def from_root(self, root: TufRepository) -> None:
        """What the root link does with a set (hub.controllers.parentlink.tufadoption
        TufAdoption.adopt)."""
        files, digest = root.files()
        self.tuf = await asyncio.to_thread(adopt, self.data, files, digest, self.fleet)
        await self.relay.publish(files, digest)

    def device(self, tmp: Path, meta: ArtifactMetadata) -> None:
        served = self.tuf
        assert served is not None
        client = TufClient(tmp / "dev")  # one device, moving between replicas
        TufClient.check(client.refresh(lambda n, m: served.read(n), self.fleet), meta)

    async def close(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.store.close()


def root_repository(tmp: Path, keys: dict[str, Key]) -> TufRepository:
    create_repository(
        tmp,
        root_keys=[keys["root1"].key_file],
        targets_key=keys["newroot1"].key_file,
        delegations=[tufmeta.Delegation("vision", (keys["pub1"].raw,), 1, ("vision-*",))],
        now=time.time(),
        root_lifetime_s=365 * DAY,
        targets_lifetime_s=365 * DAY,
    )
    return TufRepository(tmp / "tuf")


def push(root: TufRepository, keys: dict[str, Key], meta: ArtifactMetadata) -> None:
    data = tufmeta.add_artifact(
        root.read("vision.json"), meta, [tufmeta.tuf_signer(keys["pub1"].key_file)],
        expires=time.time() + 30 * DAY,
    )  # fmt: skip
    root.store_delegated(
        "vision", data, root.check_delegated("vision", data, meta, now=time.time())
    )


async def write_set(replica: RegionReplica, files: dict[str, bytes], digest: str) -> None:
    """Someone able to write etcd puts a set there, past the fence (a store's set is never
    trusted for being there)."""
    import hashlib

    names = {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}
    ops = [
        Put(RELAY_FILES_PREFIX + sha, files[n])
        for sha, n in {v: k for k, v in names.items()}.items()
    ]
    current = json.dumps({"digest": digest, "files": names}).encode()
    await replica.store.txn([], [*ops, Put(RELAY_CURRENT_KEY, current)])


@async_test
async def test_region_replicas_share_the_roots_tuf_set_and_each_verifies_it(
    etcd_server: EtcdServer,
    etcd_namespace: str,
    tmp_path: Path,
    keys: dict[str, Key],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from hub.state.tufrelay import digest_files

    def refusals() -> list[str]:
        return [
            getattr(r, "fields", {}).get("reason", "")
            for r in caplog.records
            if r.getMessage().startswith("shared relayed tuf metadata refused")
        ]

    root = root_repository(tmp_path / "root", keys)
    fleet = fleet_root(keys)
    meta = artifact("1.0.0", b"v1")
    push(root, keys, meta)
    a = await RegionReplica("a", tmp_path / "a", fleet).start(etcd_server.endpoint, etcd_namespace)
    await eventually(lambda: a.elector.leading, 10)
    b = await RegionReplica("b", tmp_path / "b", fleet).start(etcd_server.endpoint, etcd_namespace)
    try:
        # b has no root link and nothing relayed: it serves nothing until the store has a set
        assert b.tuf is None and await b.relay.follow() > 0 and b.tuf is None
        b.run_relay()
        await a.from_root(root)
        files, digest = root.files()
        assert not await a.relay.publish(files, digest)  # the same set again: no write
        await eventually(lambda: b.tuf is not None and b.tuf.digest == digest, 10)
        assert b.tuf is not None and dict(b.tuf.files_by_name) == files  # byte for byte
        assert RelayedTuf.load(b.data) == b.tuf  # in b's own D/tuf-relay/, as checked there
        a.device(tmp_path, meta)
        b.device(tmp_path, meta)  # the device fails over to b: the same set verifies

        # a push at the root: only the leader takes the set from the link; b follows
        meta2 = artifact("2.0.0", b"v2")
        push(root, keys, meta2)
        files2, digest2 = root.files()
        with pytest.raises(NotLeader):  # a follower cannot write the store's set
            await b.relay.publish(files2, digest2)
        await a.from_root(root)
        await eventually(lambda: b.tuf is not None and b.tuf.digest == digest2, 10)
        b.device(tmp_path, meta2)
        stored = (await b.store.range(RELAY_PREFIX)).kvs
        assert read_relayed(stored) == (files2, digest2)
        blobs = [kv for kv in stored if kv.key.startswith(RELAY_FILES_PREFIX)]
        # one key per distinct file (root.json is 1.root.json); the old set's others deleted
        assert len(blobs) == len(set(files2.values()))

        # a forged targets in the store (the digest made to match): b refuses, keeps serving
        forged = dict(files2)
        from tuf.api.metadata import Targets

        signed, _ = tufmeta.parse(files2["vision.json"], Targets, what="x")
        forged["vision.json"] = tufmeta.sign(signed, [tufmeta.tuf_signer(keys["root1"].key_file)])
        await write_set(b, forged, digest_files(forged))
        await eventually(lambda: refusals() != [], 10)
        assert refusals() == ["SignatureThresholdNotMet"]  # not by the delegated keys
        assert b.tuf is not None and b.tuf.digest == digest2
        assert RelayedTuf.load(b.data) == b.tuf

        # the older set written back (a rollback): b refuses it too
        await write_set(b, files, digest)
        await eventually(lambda: len(refusals()) > 1, 10)
        assert refusals()[1:] == ["TufRollback"]
        assert b.tuf is not None and b.tuf.digest == digest2
        b.device(tmp_path, meta2)

        # a file the store's set names but does not hold, or not of its digest: refused
        current = json.dumps({"digest": digest2, "files": {"root.json": "0" * 64}}).encode()
        with pytest.raises(TrustError, match="no such file"):
            read_relayed((KeyValue(RELAY_CURRENT_KEY, current, 1, 1, 1),))
        fake = {"root.json": b"other bytes"}
        stored_fake = (
            KeyValue(RELAY_CURRENT_KEY, current, 1, 1, 1),
            KeyValue(RELAY_FILES_PREFIX + "0" * 64, fake["root.json"], 1, 1, 1),
        )
        with pytest.raises(TrustError, match="not the sha256"):
            read_relayed(stored_fake)

        # the leader writes the root's next set over whatever was put there: b takes it
        push(root, keys, artifact("3.0.0", b"v3"))
        await a.from_root(root)
        _, digest3 = root.files()
        await eventually(lambda: b.tuf is not None and b.tuf.digest == digest3, 10)

        # a restarted replica serves its last checked set at once, then the store's
        b2 = RegionReplica("b2", tmp_path / "b", fleet)
        assert b2.tuf is not None and b2.tuf.digest == digest3
    finally:
        await a.close()
        await b.close()


@async_test
async def test_a_file_too_large_for_the_store_is_refused_before_any_write(
    etcd_server: EtcdServer, etcd_namespace: str, tmp_path: Path, keys: dict[str, Key]
) -> None:
    from hub.state.sharedtuf import MAX_SHARED_TARGETS_BYTES

    a = await RegionReplica("a", tmp_path / "a", fleet_root(keys)).start(
        etcd_server.endpoint, etcd_namespace
    )
    try:
        await eventually(lambda: a.elector.leading, 10)
        big = {"vision.json": b"x" * (MAX_SHARED_TARGETS_BYTES + 1)}
        with pytest.raises(TrustError) as info:
            await a.relay.publish(big, "d")
        assert info.value.reason == "MetadataTooLarge"
        assert (await a.store.range(RELAY_PREFIX)).kvs == ()
    finally:
        await a.close()
