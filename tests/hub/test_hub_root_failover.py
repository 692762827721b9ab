"""A regional hub failing over between its root's replicas (docs/federation.md, "Hub replicas
at the root"): the addresses (:mod:`edgefleet.failover`, shared with edged's hub link) and
``D/parent.json`` as tables (pure, files in tmp_path); the link's order of dials with its
sessions faked (no network: each dial fails at once), a list changed by ``hub parent
set-addresses`` under a running link; then two root replicas on the session's real etcd
(copies of one data directory, real gRPC with real certificates on loopback) and a region
listing a dead address and both: it enrolls past the dead one, streams to a replica, that
replica stops, and the region streams to the other within a bound and keeps receiving what
is applied at the root. Also: a wave state written or followed wakes the regions' streams."""

from __future__ import annotations

import asyncio
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from asynctesting import async_test
from etcdtesting import EtcdServer
from wavetesting import (
    DEADLINE,
    Fleet,
    Hub,
    deployment,
    devices,
    push,
    rolled_out,
    slow_test,
    until,
)

from edgefleet.backoff import Backoff, Jitter
from edgefleet.failover import MAX_ADDRESSES, Rotation, round_delay, split_addresses
from edgefleet.launching import free_port_pair
from hub.controllers.parentlink import regionenrollment
from hub.controllers.parentlink.regionenrollment import (
    FederationError,
    ParentFiles,
    enroll_with_parent,
    parent_addresses,
    set_parent_addresses,
)
from hub.controllers.wave import WaveController
from hub.decide.wave import WaveState
from hub.initializing import HubPaths, init_hub
from hub.server import build_context, parent_link
from hub.state import storekeys, tokens
from hub.state.regions import Regions
from hub.state.store import EventType, KeyValue, MemoryStore
from hub.state.store.protocol import Event
from hub.trustsetup import quickstart_trust

FAILOVER_BOUND_S = 15.0  # a replica gone -> the region streams to another (loaded machine)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("root:7443", ["root:7443"]),
        ("a:1,b:2", ["a:1", "b:2"]),
        (" a:1 , b:2 ", ["a:1", "b:2"]),
        ("a:1,b:2,a:1", ["a:1", "b:2"]),  # each once, in order
        ("[::1]:7443,10.0.0.1:7443", ["[::1]:7443", "10.0.0.1:7443"]),
    ],
)
def test_root_addresses_are_host_ports_in_order_each_once(text: str, expected: list[str]) -> None:
    assert split_addresses(text, what="parent") == expected
    assert parent_addresses(text) == expected


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "must be HOST:PORT"),
        ("a:1,", "must be HOST:PORT"),
        ("a:1,,b:2", "must be HOST:PORT"),
        ("root", "must be HOST:PORT, got 'root'"),
        ("a:1,b:0", "got 'b:0'"),
        ("a:70000", "got 'a:70000'"),
        (",".join(f"h{i}:1" for i in range(MAX_ADDRESSES + 1)), "at most 16 parent addresses"),
    ],
)
def test_a_bad_root_address_list_is_refused_naming_it(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        split_addresses(text, what="parent")
    with pytest.raises(FederationError, match="--parent: "):
        parent_addresses(text)


def test_the_rotation_sticks_moves_on_and_keeps_its_place_in_a_new_list() -> None:
    rotation = Rotation(("a:1", "b:1", "c:1"))
    assert rotation.current == "a:1"
    assert [rotation.advance() for _ in range(4)] == ["b:1", "c:1", "a:1", "b:1"]
    rotation.replace(("x:1", "b:1"))  # still listed: dialled on
    assert rotation.current == "b:1"
    rotation.replace(("y:1", "z:1"))  # gone: the new list's first
    assert rotation.current == "y:1"
    with pytest.raises(ValueError):
        Rotation(())


@pytest.mark.parametrize(
    ("failures", "addresses", "ceiling"),
    [
        (0, 1, 0.5),
        (1, 1, 1.0),
        (2, 3, 0.5),  # one round of three: still the base
        (3, 3, 1.0),  # the second round: doubled
        (12, 3, 8.0),
        (200, 3, 30.0),  # capped
    ],
)
def test_the_backoff_grows_once_per_round_of_every_address(
    failures: int, addresses: int, ceiling: float
) -> None:
    backoff = Backoff(0.5, 30.0, Jitter.FULL)
    rng = random.Random(7)
    draws = [round_delay(backoff, failures, addresses, rng) for _ in range(200)]
    assert all(0 <= d <= ceiling for d in draws)
    assert max(draws) > ceiling * 0.9  # full jitter: up to the ceiling
    assert round_delay(Backoff(0.5, 30.0), failures, addresses) == ceiling


def _parent_dir(tmp_path: Path, doc: object) -> Path:
    d = tmp_path / "region"
    d.mkdir(exist_ok=True)
    for name in (regionenrollment.PARENT_CA_FILE, regionenrollment.FEDERATION_CERT_FILE):
        (d / name).write_bytes(b"pem")
    (d / regionenrollment.FEDERATION_KEY_FILE).write_bytes(b"key")
    (d / regionenrollment.PARENT_FILE).write_bytes(orjson.dumps(doc))
    return d


def test_parent_json_of_one_address_or_several_and_set_addresses(tmp_path: Path) -> None:
    old = {"parent": "root:7443", "region": "eu", "rootRegion": "root"}  # before lists
    d = _parent_dir(tmp_path, old)
    files = ParentFiles.load(d)
    assert files is not None and files.addresses == ("root:7443",) and files.parents == ()

    assert set_parent_addresses(d, "r1:7443, r2:7443") == ["r1:7443", "r2:7443"]
    doc = orjson.loads((d / regionenrollment.PARENT_FILE).read_bytes())
    assert doc == {
        "parent": "r1:7443",
        "parents": ["r1:7443", "r2:7443"],
        "region": "eu",
        "rootRegion": "root",
    }
    files = ParentFiles.load(d)
    assert files is not None and files.addresses == ("r1:7443", "r2:7443")
    assert (d / regionenrollment.PARENT_FILE).stat().st_mode & 0o777 == 0o600

    before = (d / regionenrollment.PARENT_FILE).read_bytes()
    for bad in ("", "r1", "r1:7443,nope"):
        with pytest.raises(FederationError, match="--parent: must be HOST:PORT"):
            set_parent_addresses(d, bad)
    assert (d / regionenrollment.PARENT_FILE).read_bytes() == before  # nothing written

    (d / regionenrollment.PARENT_FILE).write_bytes(orjson.dumps({**doc, "parents": ["r1:7443", 5]}))
    with pytest.raises(FederationError, match="not a parent link: a parent address must be"):
        ParentFiles.load(d)
    with pytest.raises(FederationError, match="is not a regional hub"):
        set_parent_addresses(tmp_path, "r1:7443")


def test_hub_parent_set_addresses_command(tmp_path: Path) -> None:
    asyncio.run(
        init_hub(tmp_path / "eu", region="eu", hub_address="127.0.0.1:7443",
                 trust_setup=quickstart_trust)
    )  # fmt: skip
    d = str(tmp_path / "eu")
    got = _hub("parent", "set-addresses", "--data-dir", d, "a:1,b:2")
    assert got.returncode == 1 and "is not a regional hub" in got.stderr, got
    (tmp_path / "eu" / regionenrollment.PARENT_FILE).write_bytes(
        orjson.dumps({"parent": "root:7443", "region": "eu", "rootRegion": "root"})
    )
    got = _hub("parent", "set-addresses", "--data-dir", d, "a:1,b:2")
    assert got.returncode == 0 and "root hub addresses: a:1,b:2" in got.stdout, got
    got = _hub("parent", "set-addresses", "--data-dir", d, "a:1,b")
    assert got.returncode == 2 and "must be HOST:PORT, got 'b'" in got.stderr, got
    files = ParentFiles.read_addresses(tmp_path / "eu")
    assert files[3] == ("a:1", "b:2")  # the refused list changed nothing


def _hub(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", "import sys; from hub.cli import main; sys.exit(main())"]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=60, check=False
    )


@async_test
async def test_the_link_dials_each_address_in_turn_and_takes_a_new_list(tmp_path: Path) -> None:
    """Every session fails at once: the link dials a, b, c, a (the backoff a round's base at
    first); ``set-addresses`` to (d, b) while it dials: it goes on at b (still listed), then d."""
    result = await init_hub(
        tmp_path / "eu", region="eu", hub_address="127.0.0.1:7443", trust_setup=quickstart_trust
    )
    d = result.paths.data_dir
    doc = {"parent": "a:1", "parents": ["a:1", "b:1", "c:1"], "region": "eu", "rootRegion": "r"}
    for name in (regionenrollment.PARENT_CA_FILE, regionenrollment.FEDERATION_CERT_FILE):
        (d / name).write_bytes(b"pem")
    (d / regionenrollment.FEDERATION_KEY_FILE).write_bytes(b"key")
    (d / regionenrollment.PARENT_FILE).write_bytes(orjson.dumps(doc))
    ctx = await build_context(d)
    try:
        files = ParentFiles.load(d)
        assert files is not None
        link = parent_link(ctx, files)
        dials: list[str] = []
        stop = asyncio.Event()

        async def session(_: asyncio.Event) -> None:
            dials.append(link.parent)
            if len(dials) == 4:
                set_parent_addresses(d, ["d:1", "b:1"])
            if len(dials) == 6:
                stop.set()
            raise OSError("connection refused")

        link._session = session  # type: ignore[method-assign]
        began = time.monotonic()
        await asyncio.wait_for(link._run(stop), 30)
        assert dials == ["a:1", "b:1", "c:1", "a:1", "b:1", "d:1"]
        assert time.monotonic() - began < 0.5 * 3 + 1.0 * 3 + 2.0  # rounds, not per dial
        assert link.files.addresses == ("d:1", "b:1")
    finally:
        await ctx.store.close()


@async_test
async def test_a_wave_state_written_or_followed_wakes_the_regions_streams() -> None:
    """The leader's wave controller writing a state (a wave released), and a follower
    replica taking the leader's state from the watch, each wake every stream (a wave
    released reaches its regions without waiting for the streams' poll)."""
    regions = Regions()
    waker = asyncio.Event()
    regions.wakers.add(waker)
    store = MemoryStore()
    leader = WaveController(store, None, regions, None)  # type: ignore[arg-type]
    state = WaveState("det", 2, 1, {}, released=frozenset({"eu"}))
    assert await leader._write("det", state, ())
    assert waker.is_set() and leader.states["det"].released == frozenset({"eu"})

    waker.clear()
    follower = WaveController(None, None, regions, None)  # type: ignore[arg-type]
    kv = KeyValue(storekeys.wave_key("det"), storekeys.dumps(state.to_json()), 1, 5, 1)
    assert follower.follow(Event(EventType.PUT, kv, None))
    assert waker.is_set() and follower.states["det"].released == frozenset({"eu"})


@pytest.mark.scenario
@slow_test
async def test_a_region_fails_over_to_another_root_replica_and_keeps_its_slices(
    tmp_path: Path, etcd_server: EtcdServer, etcd_namespace: str
) -> None:
    """Root replicas r0 (leading, at the fleet's address) and r1 on one real etcd, whose
    ``replicaAddresses`` name both; eu is enrolled with ``--parent DEAD,R1``: DEAD does not
    answer, so it enrolls at r1, and its parent.json lists r1, DEAD, then r0 (from the root's
    answer). It streams to r1 and runs 1.0.0; r1 stops: eu dials DEAD, then r0, within the
    bound, and 2.0.0 applied at r0 after that reaches eu."""
    fleet = Fleet(tmp_path)
    await fleet.make(store=f"etcd://{etcd_server.endpoint}{etcd_namespace}")
    shutil.copytree(fleet.root_paths.data_dir, tmp_path / "r1")
    r1_address = f"127.0.0.1:{free_port_pair()}"
    dead = f"127.0.0.1:{free_port_pair()}"
    for data_dir in (fleet.root_paths.data_dir, tmp_path / "r1"):
        # hub.toml replicaAddresses, as hub init --replica-address
        toml = HubPaths.of(data_dir).config
        addresses = f'replicaAddresses = ["{fleet.address}", "{r1_address}"]'
        text = re.sub(r"(?m)^replicaAddresses = .*$", addresses, toml.read_text())
        assert addresses in text
        toml.write_text(text)
    async with fleet.root() as r0:
        assert r0.ctx.elector is not None and r0.ctx.regions is not None
        await until(lambda: r0.ctx.elector and r0.ctx.elector.leading, "r0 leads")
        r1 = await Hub(HubPaths.of(tmp_path / "r1"), listen=r1_address).__aenter__()
        r1_open = True
        try:
            for replica in (r0, r1):
                assert replica.ctx.config.replica_addresses == (fleet.address, r1_address)
            token, _ = await tokens.create_token(
                r0.ctx.store, now=r0.ctx.clock(), ttl=600, for_region="eu"
            )

            async def setup(paths: HubPaths, ca: object) -> None:
                await enroll_with_parent(
                    paths,
                    parent=f"{dead},{r1_address}",
                    token=token,
                    ca_hash=fleet.pin,
                    region="eu",
                )

            eu_paths = (
                await init_hub(
                    tmp_path / "eu", region="eu", hub_address="127.0.0.1:7443", trust_setup=setup
                )
            ).paths
            files = ParentFiles.load(eu_paths.data_dir)
            assert files is not None
            assert files.addresses == (r1_address, dead, fleet.address)  # enrolled at r1; r0
            await push(r0, "1.0.0")
            await push(r0, "2.0.0")
            await r0.apply(deployment("1.0.0"))
            async with Hub(eu_paths) as eu, devices(eu):
                await until(lambda: rolled_out(eu, "1.0.0"), "eu on 1.0.0")
                assert r1.ctx.regions is not None
                await until(lambda: r1.ctx.regions.regions["eu"].connected, "eu streams to r1")
                assert not r0.ctx.regions.regions["eu"].connected

                stopped = time.monotonic()
                await r1.__aexit__(None, None, None)
                r1_open = False
                await until(
                    lambda: r0.ctx.regions.regions["eu"].connected,
                    "eu streams to r0",
                    timeout=DEADLINE,
                )
                took = time.monotonic() - stopped
                print(f"failover: eu streams to r0 {took:.2f} s after r1 stopped")
                assert took < FAILOVER_BOUND_S, took

                await r0.apply(deployment("2.0.0"))
                await until(lambda: rolled_out(eu, "2.0.0"), "eu on 2.0.0, applied after failover")
        finally:
            if r1_open:
                await r1.__aexit__(None, None, None)
