"""A regional hub with two replicas on a real etcd under a root hub with a TUF repository
(docs/federation.md, hub.state.sharedtuf ``SharedRelay``): all real processes on loopback.

Only the replica leading the region runs the root link, yet both serve the root's TUF files:
the leader writes the set it checked into etcd and the other replica takes it from there
after checking it itself (its own ``D/tuf-relay/``). A model pushed at the root reaches the
follower's files the same way; the leader killed, the follower leads, opens the root link and
serves the root's next set.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from etcdtesting import EtcdServer, running_etcd
from federationtesting import SLACK, served_files
from fleet import HubProcess
from harness import wait_for
from hubreplicatesting import leader_port

from edgefleet.demo import TINY_MLP, build_mlp
from edgefleet.launching import free_port_pair

NAMESPACE = "/fleet"  # test_hub_replicas_fleet.leader_port reads the leader there


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    with running_etcd(tmp_path / "etcd") as server:
        yield server


def push(root: HubProcess, tmp_path: Path, version: str, seed: int) -> None:
    model = tmp_path / f"det-{version}.onnx"
    build_mlp(model, TINY_MLP, seed=seed)
    out = root.edgectl("models", "push", str(model), "--name", "det", "--version", version)
    assert "pushed" in out.stdout, out.stdout + out.stderr


def test_region_replicas_both_serve_the_roots_tuf_metadata(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    root = HubProcess(tmp_path / "root", tmp_path / "root.log").init("--region", "root").start()
    started = [root]
    try:
        p0 = free_port_pair()
        p1 = free_port_pair()
        while p1 in (p0 - 1, p0, p0 + 1, root.port, root.port + 1):
            p1 = free_port_pair()
        token, pin = root.token("--for-region", "eu")
        r0 = HubProcess(tmp_path / "r0", tmp_path / "r0.log", port=p0)
        r0.init("--region", "eu", "--parent", root.address, "--token", token,
                "--parent-ca-hash", pin, "--store", f"etcd://{etcd.endpoint}{NAMESPACE}",
                "--replica-address", f"127.0.0.1:{p1}")  # fmt: skip
        config = r0.data / "hub.toml"
        config.write_text(config.read_text().replace('leaderLease = "10s"', 'leaderLease = "3s"'))
        shutil.copytree(r0.data, tmp_path / "r1")  # another replica: a copy of the data dir
        r1 = HubProcess(tmp_path / "r1", tmp_path / "r1.log", port=p1)
        config = r1.data / "hub.toml"
        text = re.sub(r'metricsListen = "[^"]*"', 'metricsListen = ""', config.read_text())
        config.write_text(text)
        r0.start()
        started.append(r0)
        wait_for(lambda: leader_port(etcd) == p0, 60, "r0 to lead the region")
        r1.start()
        started.append(r1)

        wait_for(lambda: served_files(r0), SLACK, "the leader to serve the root's TUF files")
        wait_for(
            lambda: served_files(r1) == served_files(r0), SLACK, "the follower to serve them too"
        )
        assert "timestamp.json" in served_files(r1)

        # a push at the root: a new delegated targets, snapshot and timestamp on both
        first = served_files(r1)
        push(root, tmp_path, "1.0.0", seed=1)
        wait_for(
            lambda: served_files(r0).get("snapshot.json") != first["snapshot.json"],
            SLACK,
            "the leader to take the root's new set",
        )
        wait_for(
            lambda: served_files(r1) == served_files(r0),
            SLACK,
            "the follower to serve the root's new set",
        )

        # the leader killed: r1 leads, runs the root link itself and takes the next set
        r0.kill9()
        wait_for(lambda: leader_port(etcd) == p1, 60, "r1 to lead the region")
        before = served_files(r1)
        push(root, tmp_path, "2.0.0", seed=2)
        wait_for(
            lambda: served_files(r1).get("snapshot.json") != before.get("snapshot.json"),
            SLACK,
            "the new leader to serve the root's next set",
        )
    finally:
        for hub in reversed(started):
            hub.stop()
