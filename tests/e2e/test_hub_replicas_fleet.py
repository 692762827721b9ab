"""Hub replicas with real devices: two ``hub serve`` on one real etcd, a real enrolled
``edged run``, real edgectl.

The device enrolls at one replica and learns both addresses from the enrollment answer; the
replica it is connected to (the leader) is killed with kill -9: the device moves to the other
replica and keeps syncing, and downloads from it an artifact pushed through the dead one (its
bytes come out of etcd); edgectl, whose admin.toml lists the dead replica first, still works.
With ``--tuf`` the same, the device verifying with python-tuf: the other replica serves the
delegated targets, snapshot and timestamp the dead one signed into etcd (no rollback). And
``hub tuf install`` run once, on one replica, reaches the other through etcd.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from etcdtesting import EtcdServer, running_etcd
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import Edged, wait_for
from hubfleettesting import apply, push, serving
from hubreplicatesting import NAMESPACE, leader_port, stored

from edgefleet.launching import free_port_pair, program_command


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    with running_etcd(tmp_path / "etcd") as server:
        yield server


@pytest.fixture(params=["envelopes", "tuf"])
def replicas(
    request: pytest.FixtureRequest, tmp_path: Path, etcd: EtcdServer
) -> Iterator[list[HubProcess]]:
    """Two replicas; with ``tuf``, made with ``hub init --tuf``: one TUF repository whose
    snapshot and timestamp versions the replicas share in etcd (hub.state.sharedtuf)."""
    p0 = free_port_pair()
    p1 = free_port_pair()
    while p1 in (p0 - 1, p0, p0 + 1):
        p1 = free_port_pair()
    r0 = HubProcess(tmp_path / "r0", tmp_path / "r0.log", port=p0)
    tuf = ["--tuf"] if request.param == "tuf" else []
    r0.init("--store", f"etcd://{etcd.endpoint}{NAMESPACE}", "--replica-address",
            f"127.0.0.1:{p1}", *tuf)  # fmt: skip
    config = r0.data / "hub.toml"
    config.write_text(config.read_text().replace('leaderLease = "10s"', 'leaderLease = "3s"'))
    shutil.copytree(r0.data, tmp_path / "r1")  # another replica: a copy of the data directory
    r1 = HubProcess(tmp_path / "r1", tmp_path / "r1.log", port=p1)
    config = r1.data / "hub.toml"
    config.write_text(re.sub(r'metricsListen = "[^"]*"', 'metricsListen = ""', config.read_text()))
    started = [r0]
    try:
        r0.start()  # r0 leads first: pushes and applies go to it while it lives
        wait_for(lambda: leader_port(etcd) == p0, 60, "r0 to lead")
        r1.start()
        started.append(r1)
        yield [r0, r1]
    finally:
        for r in started:
            r.stop()


def test_a_device_fails_over_to_another_replica_and_downloads_what_the_dead_one_took(
    replicas: list[HubProcess],
    etcd: EtcdServer,
    tmp_path: Path,
    edged_factory: Callable[..., Edged],
) -> None:
    r0, r1 = replicas
    admin = (r0.data / "admin.toml").read_text()
    assert f'hub = ["{r0.address}", "{r1.address}"]' in admin, admin

    data = tmp_path / "dev-a"
    out = enroll(r0, data, "dev-a", {"site": "a"})
    assert out.returncode == 0, out.stdout + out.stderr
    link = json.loads((data / "hub" / "link.json").read_text())
    assert link["hubs"] == [r0.address, r1.address]  # from the enrollment answer
    a = edged_factory(
        None, data=data, config=SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "no-root")
    ).start()
    try:
        _fail_over(r0, r1, a, tmp_path, etcd)
    finally:
        a.terminate()


def _fail_over(r0: HubProcess, r1: HubProcess, a: Edged, tmp_path: Path, etcd: EtcdServer) -> None:
    wait_for(lambda: a.status()["hub"]["connected"], 60, "dev-a to connect")
    assert a.status()["hub"]["hub"] == r0.address

    push(r0, tmp_path, "det", "1.0.0")
    push(r0, tmp_path, "det", "2.0.0", seed=2)  # through r0 only: r1 has not its bytes
    apply(r0, tmp_path, name="det", model="det", version="1.0.0", site="a")
    wait_for(lambda: serving(a, "det", "1.0.0"), 90, "dev-a to serve det 1.0.0")
    assert not any((r1.data / "blobs" / "sha256").iterdir())
    # its acknowledgement of the desired state went into r0's heartbeat record (within a
    # second) rather than a write of its device record (docs/soak.md, run C; the record
    # carries it when a status change writes it); r1 shows it from there
    desired = json.loads(stored(etcd, "/desired/dev-a")["/desired/dev-a"][1])
    wait_for(lambda: _acked_in_heartbeats(etcd, "dev-a") >= desired["generation"], 30,
             "dev-a's acknowledgement in a heartbeat record")  # fmt: skip
    wait_for(lambda: _acked_at(r1, "dev-a") >= desired["generation"], 30, "r1 to show it")

    r0.kill9()
    wait_for(
        lambda: a.status()["hub"]["connected"] and a.status()["hub"]["hub"] == r1.address,
        90,
        "dev-a to connect to the other replica",
    )
    # edgectl: the first address in admin.toml is dead; reads go to the next one
    devices = json.loads(r0.edgectl("get", "devices", "-o", "json").stdout)
    assert [d["metadata"]["name"] for d in devices["items"]] == ["dev-a"]

    # r1 leads once r0's lease is gone; writes refused meanwhile say so and are made again
    deadline = time.monotonic() + 90
    while True:
        out = r0.edgectl("apply", "-f", str(_deployment(tmp_path, "2.0.0")), check=False)
        if out.returncode == 0:
            break
        assert time.monotonic() < deadline, out.stdout + out.stderr
        time.sleep(1)
    # the device, on r1, downloads 2.0.0, which only r0 took: r1 copies it out of etcd
    wait_for(lambda: serving(a, "det", "2.0.0"), 120, "dev-a to serve det 2.0.0 through r1")
    assert any((r1.data / "blobs" / "sha256").iterdir())
    assert a.status()["hub"]["hub"] == r1.address
    if (r0.data / "tuf").exists():  # one TUF repository: r1 serves the versions r0 signed, on
        status = a.status()["hub"]  # (the device would refuse lower ones as a rollback)
        assert status["tufRequired"] is True and status["tufProblem"] is None, status
        assert (r1.data / "tuf" / "delegated" / "lab.json").exists()  # from the store
    devices = json.loads(r0.edgectl("get", "devices", "-o", "json").stdout)
    assert devices["items"][0]["status"]["phase"] == "Ready", devices

    # a device enrolling with both addresses while the first replica is dead enrolls at the
    # other one
    token, pin = r0.token()  # offline, on the store
    data = tmp_path / "dev-b"
    out = subprocess.run(
        program_command("edged", "enroll", "--hub", f"{r0.address},{r1.address}",
                        "--ca-hash", pin, "--root-hash", r0.root_pin, "--data-dir", data,
                        "--name", "dev-b"),
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "EDGED_TOKEN": token},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    link = json.loads((data / "hub" / "link.json").read_text())
    assert link["hubs"] == [r1.address, r0.address]


def _acked_in_heartbeats(etcd: EtcdServer, device: str) -> int:
    records = stored(etcd, "/heartbeats/").values()
    return max((json.loads(v).get("acked", {}).get(device, 0) for _, v in records), default=0)


def _acked_at(hub: HubProcess, device: str) -> int:
    """``device``'s acknowledged generation as ``hub`` itself shows it (its cache)."""
    config = hub.data / "admin-this-replica.toml"
    text = (hub.data / "admin.toml").read_text()
    config.write_text(re.sub(r"(?m)^hub = .*$", f'hub = ["{hub.address}"]', text))
    out = subprocess.run(
        program_command("edgectl", "--config", config, "get", "devices", "-o", "json"),
        check=False, capture_output=True, text=True, timeout=60, env=hub.env, cwd=hub.cwd,
    )  # fmt: skip
    if out.returncode != 0:
        return 0
    items = json.loads(out.stdout)["items"]
    return max((d["status"].get("generationAcked", 0) for d in items
                if d["metadata"]["name"] == device), default=0)  # fmt: skip


def _deployment(tmp_path: Path, version: str) -> Path:
    from hubfleettesting import DEPLOYMENT

    doc = tmp_path / f"det-{version}.yaml"
    doc.write_text(DEPLOYMENT.format(name="det", model="det", version=version, site="a"))
    return doc


@pytest.mark.parametrize("replicas", ["tuf"], indirect=True)
def test_hub_tuf_install_on_one_replica_reaches_the_other(
    replicas: list[HubProcess], etcd: EtcdServer, tmp_path: Path
) -> None:
    """``hub tuf install`` run once, on the follower's data directory, while both serve: the
    leader installs the new targets from etcd and signs a snapshot listing them, which the
    follower serves too (hub.state.sharedtuf ``share_installed``)."""
    from tuf.api.metadata import Snapshot

    from edgefleet.trust import tufmeta

    r0, r1 = replicas
    targets2 = tmp_path / "targets2.json"
    out = subprocess.run(
        program_command("edgectl", "trust", "tuf", "targets", "--key",
                        str(r1.data / "targets.key"), "--delegate",
                        f"lab={r1.data / 'publisher.pub'}:*", "--delegate",
                        f"audio={r1.data / 'publisher.pub'}:audio-*", "--version", "2",
                        "--out", str(targets2)),
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    out = subprocess.run(
        program_command("hub", "tuf", "install", "--data-dir", str(r1.data), "--root",
                        str(r1.data / "tuf" / "root.json"), "--targets", str(targets2)),
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "shared with every replica" in out.stdout

    def snapshot_lists_targets_2(hub: HubProcess) -> bool:
        path = hub.data / "tuf" / "snapshot.json"
        snap, _ = tufmeta.parse(path.read_bytes(), Snapshot, what="snapshot")
        return bool(snap.meta["targets.json"].version == 2)

    wait_for(
        lambda: (r0.data / "tuf" / "targets.json").read_bytes() == targets2.read_bytes(),
        30,
        "the leader to install the targets from etcd",
    )
    wait_for(lambda: snapshot_lists_targets_2(r0), 30, "the leader to sign a snapshot for them")
    wait_for(lambda: snapshot_lists_targets_2(r1), 30, "the follower to serve that snapshot")
