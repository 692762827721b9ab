"""Leader election and fencing among hub replicas on a real etcd: in this process (several
store clients, as several replicas would have) and as real processes killed with kill -9 or
paused with SIGSTOP (leaderproc.py). Assertions are on the store."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from asynctesting import async_test, eventually
from etcdtesting import EtcdServer

from edgefleet.supervising import supervise
from hub.state.store.electing import Elector, FencedStore, LeaderOnly, NotLeader
from hub.state.store.etcd import EtcdStore
from hub.state.store.identity import LEADER_KEY

LEADERPROC = Path(__file__).with_name("leaderproc.py")


class _Running:
    """Electors running in this loop, each on its own etcd client."""

    def __init__(self) -> None:
        self.stops: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.electors: dict[str, Elector] = {}
        self.stores: list[EtcdStore] = []

    async def start(self, endpoint: str, namespace: str, name: str, ttl: float) -> Elector:
        store = await EtcdStore.open([endpoint], namespace=namespace)
        self.stores.append(store)
        elector = Elector(store, identity=name, ttl=ttl)
        self.electors[name] = elector
        self.stops[name] = asyncio.Event()
        self.tasks[name] = asyncio.create_task(elector.run(self.stops[name]))
        return elector

    async def close(self) -> None:
        for stop in self.stops.values():
            stop.set()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        for store in self.stores:
            await store.close()


@async_test
async def test_one_replica_leads_and_only_its_controller_writes(
    etcd_server: EtcdServer, etcd_namespace: str
) -> None:
    running = _Running()
    try:
        for name in ("a", "b", "c"):
            await running.start(etcd_server.endpoint, etcd_namespace, name, ttl=30)
        await eventually(lambda: sum(e.leading for e in running.electors.values()) == 1, 10)
        (leader,) = [e for e in running.electors.values() if e.leading]
        kv = await leader.store.get(LEADER_KEY)
        assert kv is not None and kv.value == leader.identity.encode()
        assert kv.mod_revision == leader.term
        follower = next(e for e in running.electors.values() if not e.leading)
        await FencedStore(leader.store, leader).put("/desired/d", b"from the leader")
        with pytest.raises(NotLeader, match="does not lead"):
            await FencedStore(follower.store, follower).put("/desired/d", b"from a follower")
        got = await leader.store.get("/desired/d")
        assert got is not None and got.value == b"from the leader"

        # the leader stops: it gives the key up, and another leads without waiting for the TTL
        running.stops[leader.identity].set()
        await running.tasks[leader.identity]
        await eventually(lambda: sum(e.leading for e in running.electors.values()) == 1, 10)
        assert not leader.leading
    finally:
        await running.close()


@async_test
async def test_a_deposed_leader_that_has_not_noticed_cannot_write(
    etcd_server: EtcdServer, etcd_namespace: str
) -> None:
    running = _Running()
    try:
        a = await running.start(etcd_server.endpoint, etcd_namespace, "a", ttl=30)
        await eventually(lambda: a.leading, 10)
        b = await running.start(etcd_server.endpoint, etcd_namespace, "b", ttl=30)
        old_term = a.term
        fenced = FencedStore(a.store, a)
        await fenced.put("/rollouts/x", b"1")
        # a's lease ends (as if a had been paused past it); a does not know yet
        held = await b.store.get(LEADER_KEY)
        assert held is not None
        await b.store.revoke(held.lease)
        await eventually(lambda: b.leading, 40)  # b's campaign: watch saw the key go
        assert a.term == old_term  # a still believes it leads
        before = await b.store.range("")
        with pytest.raises(NotLeader, match="no longer leads"):
            await fenced.put("/rollouts/x", b"2")
        assert not a.leading  # the refusal made it step down: later writes are refused at once
        with pytest.raises(NotLeader, match="does not lead"):
            await fenced.delete("/rollouts/x")
        after = await b.store.range("")
        assert after.kvs == before.kvs  # nothing written
        kv = await b.store.get("/rollouts/x")
        assert kv is not None and kv.value == b"1"
    finally:
        await running.close()


@async_test
async def test_a_controller_runs_only_during_its_replicas_term(
    etcd_server: EtcdServer, etcd_namespace: str
) -> None:
    store = await EtcdStore.open([etcd_server.endpoint], namespace=etcd_namespace)
    elector = Elector(store, identity="solo", ttl=30)
    runs: list[str] = []

    class Controller:
        name = "controller"

        async def run(self, stop: asyncio.Event) -> None:
            runs.append("started")
            await stop.wait()
            runs.append("stopped")

    stop = asyncio.Event()
    task = asyncio.create_task(supervise([elector, LeaderOnly(Controller(), elector)], stop))
    try:
        await eventually(lambda: runs == ["started"], 10)
        await elector.lost(elector.term)  # as a fenced write would find
        await eventually(lambda: runs[:2] == ["started", "stopped"], 10)
    finally:
        stop.set()
        await task
        await store.close()


# -- real processes ------------------------------------------------------------------------

TTL = 3.0


class _Replicas:
    def __init__(self, endpoint: str, namespace: str, tmp: Path) -> None:
        self.endpoint = endpoint
        self.namespace = namespace
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[str]] = {}

    def start(self, name: str) -> None:
        log = (self.tmp / f"{name}.out").open("w")
        self.procs[name] = subprocess.Popen(
            [sys.executable, str(LEADERPROC), self.endpoint, self.namespace, name, str(TTL)],
            stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        log.close()

    def output(self, name: str) -> str:
        return (self.tmp / f"{name}.out").read_text()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            proc.wait(30)


@pytest.fixture
def replicas(etcd_server: EtcdServer, etcd_namespace: str, tmp_path: Path) -> Iterator[_Replicas]:
    r = _Replicas(etcd_server.endpoint, etcd_namespace, tmp_path)
    try:
        yield r
    finally:
        r.stop()


async def _holder(store: EtcdStore) -> str | None:
    kv = await store.get(LEADER_KEY)
    return None if kv is None else kv.value.decode()


async def _wait_holder(store: EtcdStore, *, other_than: str | None, within: float) -> str:
    async def other() -> str | None:
        holder = await _holder(store)
        return holder if holder is not None and holder != other_than else None

    return str(await eventually(other, within, f"a leader other than {other_than}", interval=0.02))


@pytest.mark.scenario
@async_test
async def test_leader_killed_another_leads_within_the_lease_ttl_plus_2s(
    replicas: _Replicas,
) -> None:
    store = await EtcdStore.open([replicas.endpoint], namespace=replicas.namespace)
    try:
        for name in ("r1", "r2", "r3"):
            replicas.start(name)
        first = await _wait_holder(store, other_than=None, within=20)
        replicas.procs[first].kill()  # kill -9: no resignation, the lease must expire
        killed = time.monotonic()
        second = await _wait_holder(store, other_than=first, within=TTL + 10)
        took = time.monotonic() - killed
        assert took <= TTL + 2, f"{second} led {took:.1f} s after {first} was killed"
        ticks = f"/ticks/{second}"
        await eventually(lambda: (replicas.output(second)).count("leading") >= 1, 10)
        first_tick = await store.get(ticks)
        await asyncio.sleep(0.5)
        later = await store.get(ticks)
        assert later is not None and (first_tick is None or later.version > first_tick.version)
    finally:
        await store.close()


@pytest.mark.scenario
@async_test
async def test_a_leader_paused_past_its_lease_resumes_and_writes_nothing(
    replicas: _Replicas,
) -> None:
    store = await EtcdStore.open([replicas.endpoint], namespace=replicas.namespace)
    try:
        replicas.start("p1")
        assert await _wait_holder(store, other_than=None, within=20) == "p1"
        await eventually(lambda: "leading" in replicas.output("p1"), 10)
        replicas.start("p2")
        await asyncio.sleep(0.3)  # p1 is ticking
        os.kill(replicas.procs["p1"].pid, signal.SIGSTOP)
        await asyncio.sleep(0.3)  # a write p1 had sent lands (or not) before we look
        paused = await store.get("/ticks/p1")
        assert paused is not None
        assert await _wait_holder(store, other_than="p1", within=TTL + 10) == "p2"
        os.kill(replicas.procs["p1"].pid, signal.SIGCONT)
        # p1 resumes believing it leads until its keepalive or a fenced write says otherwise
        await eventually(lambda: "stepped down" in replicas.output("p1")
                         or "refused" in replicas.output("p1"), 15)  # fmt: skip
        await asyncio.sleep(1.0)  # time for any write p1 would still make
        after = await store.get("/ticks/p1")
        assert after == paused, "the paused leader wrote after its lease ended"
        assert await _holder(store) == "p2"
        assert (await store.get("/ticks/p2")) is not None
    finally:
        await store.close()
