"""The worker sandbox, enforced by this machine's kernel: real worker processes (real ONNX
Runtime, a tiny MLP) confine themselves with Landlock, no_new_privs and seccomp, then try
what ``EDGEFLEET_TEST_WORKER_PROBE`` lists (open a file, connect, bind, a UDP socket) and
report each outcome in READY. Nothing is mocked: a denial here is the kernel's.

Skipped, with the reason, on a kernel without Landlock (the network cases: without ABI 4).
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from workerprocess import Worker, launch_spec

from edged.runtime import landlock
from edged.runtime.launching import SandboxSpec
from edged.runtime.worker import TEST_PROBE_ENV
from edgefleet.demo import build_mlp

ABI = landlock.abi_version()
needs_landlock = pytest.mark.skipif(ABI < 1, reason="this kernel has no Landlock")
needs_tcp_rules = pytest.mark.skipif(
    ABI < 4, reason=f"Landlock ABI {ABI} has no TCP rules (ABI 4, Linux 6.7)"
)
EACCES = "PermissionError: errno 13"
EPERM = "PermissionError: errno 1"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path]:
    """An artifact store of two blobs: the worker's model and another one it must not read."""
    d = tmp_path_factory.mktemp("store")
    model = build_mlp(d / "model.onnx")
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    other = d / "other-artifact"
    other.write_bytes(b"another workload's model")
    return model, sha, other


@pytest.fixture
def listener() -> Iterator[list[int]]:
    """Two TCP ports listening on loopback: [allowed, not allowed]."""
    socks = []
    for _ in range(2):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        socks.append(s)
    yield [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()


def run_worker(store: tuple[Path, str, Path], sandbox: SandboxSpec, probe: list[dict[str, str]]):
    model, sha, _ = store
    w = Worker(launch_spec(model, sha, sandbox), env={TEST_PROBE_ENV: orjson.dumps(probe).decode()})
    try:
        return w.first_frame()
    finally:
        w.close()


def outcomes(meta: dict) -> dict[str, str]:
    return {f"{r['step']} {r['target']}": r["outcome"] for r in meta["testProbe"]}


@needs_landlock
def test_a_sandboxed_worker_reads_its_artifact_and_nothing_else(store) -> None:
    model, _, other = store
    kind, meta = run_worker(
        store,
        SandboxSpec(mode="landlock"),
        [{"open": str(model)}, {"open": str(other)}, {"open": "/etc/hostname"}],
    )
    assert kind == "ready", meta
    got = outcomes(meta)
    assert got[f"open {model}"] == "ok"
    assert got[f"open {other}"] == EACCES  # the kernel says no: another artifact
    assert got["open /etc/hostname"] == EACCES
    sandbox = meta["sandbox"]
    assert sandbox["mode"] == "landlock" and sandbox["filesystem"] is True
    assert sandbox["landlockAbi"] == ABI and sandbox["noNewPrivs"] is True


@needs_tcp_rules
def test_egress_only_to_the_ports_the_policy_grants(store, listener) -> None:
    allowed, other = listener
    kind, meta = run_worker(
        store,
        SandboxSpec(mode="landlock", network=True, connect_ports=(allowed,), seccomp=True),
        [
            {"connect": f"127.0.0.1:{allowed}"},
            {"connect": f"127.0.0.1:{other}"},
            {"bind": "127.0.0.1:0"},
            {"udp": "any"},
        ],
    )
    assert kind == "ready", meta
    got = outcomes(meta)
    assert got[f"connect 127.0.0.1:{allowed}"] == "ok"
    assert got[f"connect 127.0.0.1:{other}"] == EACCES
    assert got["bind 127.0.0.1:0"] == EACCES
    assert got["udp any"] == EPERM  # seccomp: UDP is not TCP, Landlock would not see it
    assert meta["sandbox"]["network"] is True and meta["sandbox"]["connectPorts"] == [allowed]
    assert meta["sandbox"]["seccomp"] is True


@needs_tcp_rules
def test_no_network_by_default(store, listener) -> None:
    kind, meta = run_worker(
        store, SandboxSpec(mode="landlock"), [{"connect": f"127.0.0.1:{listener[0]}"}]
    )
    assert kind == "ready", meta
    assert outcomes(meta)[f"connect 127.0.0.1:{listener[0]}"] == EACCES


def test_without_the_sandbox_the_same_worker_may_do_all_of_it(store, listener) -> None:
    _, _, other = store
    kind, meta = run_worker(
        store,
        SandboxSpec(mode="off"),
        [{"open": str(other)}, {"connect": f"127.0.0.1:{listener[1]}"}],
    )
    assert kind == "ready", meta
    assert set(outcomes(meta).values()) == {"ok"}
    assert meta["sandbox"] == {**meta["sandbox"], "mode": "off", "filesystem": False}


def test_a_refused_policy_fails_the_start_with_its_reason(store) -> None:
    kind, doc = run_worker(
        store, SandboxSpec(mode="landlock", refused="port 22 is not allowed"), []
    )
    assert kind == "failed"
    assert doc == {"reason": "NetworkPolicyDenied", "message": "port 22 is not allowed"}


@needs_landlock
def test_a_worker_that_keeps_edgeds_uid_says_why(store) -> None:
    """As edged's pool starts it when edged is not root (securing.uid_separation)."""
    import os

    kind, meta = run_worker(store, SandboxSpec(mode="landlock", uid_note="edged is not root"), [])
    assert kind == "ready", meta
    sandbox = meta["sandbox"]
    assert sandbox["separateUid"] is False and sandbox["uidNote"] == "edged is not root"
    assert (sandbox["uid"], sandbox["gid"]) == (os.getuid(), os.getgid())
    assert sandbox["problems"] == []


def test_egress_rules_by_address_that_cannot_be_enforced_fail_the_start(store) -> None:
    """edged could not make the worker's BPF cgroup (not root, no cgroup v2): the worker does
    not start, saying why, whatever ``required`` says (never silently weaker)."""
    kind, doc = run_worker(
        store,
        SandboxSpec(
            mode="landlock",
            network=True,
            connect_ports=(8080,),
            egress_rules=((8080, "127.0.0.1/32"),),
            egress_problem="no cgroup v2 hierarchy is mounted",
        ),
        [],
    )
    assert kind == "failed"
    assert doc["reason"] == "NetworkPolicyUnenforceable"
    assert "no cgroup v2 hierarchy is mounted" in doc["message"]
    assert "edged as root" in doc["message"]
