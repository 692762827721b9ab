"""Sandboxed workers under a real ``edged run``: status shows per replica what confines it,
the deployment's egress port is the only one its worker reaches (the kernel's verdict, through
the worker's test probe), and a SecurityBaseline that does not allow a deployment's egress
keeps its worker from starting, saying why. Skipped without Landlock TCP rules (ABI 4)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from harness import Edged, wait_for

from edged.runtime import egressfilter, landlock
from edged.runtime.worker import TEST_PROBE_ENV

ABI = landlock.abi_version()
pytestmark = pytest.mark.skipif(
    ABI < 4, reason=f"Landlock ABI {ABI}: no TCP rules here (ABI 4, Linux 6.7, has them)"
)

DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: mlp}}
spec:
  model: {{name: mlp, version: "1.0.0", path: mlp.onnx}}
  runtime: {{executionProviders: [CPUExecutionProvider]}}
  network: {{egress: [{{port: {port}}}]}}
"""
BASELINE = """\
apiVersion: edgefleet.io/v1
kind: SecurityBaseline
metadata: {name: fleet}
spec:
  requireSandbox: true
  network: {egress: []}
"""


@pytest.fixture
def ports() -> Iterator[tuple[int, int]]:
    socks = []
    for _ in range(2):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        socks.append(s)
    yield socks[0].getsockname()[1], socks[1].getsockname()[1]
    for s in socks:
        s.close()


def test_status_shows_the_sandbox_and_egress_reaches_only_the_granted_port(
    model_dir: Path, edged_factory, ports, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowed, other = ports
    (model_dir / "mlp.yaml").write_text(DEPLOYMENT.format(port=allowed))
    probe = [{"connect": f"127.0.0.1:{allowed}"}, {"connect": f"127.0.0.1:{other}"}]
    monkeypatch.setenv(TEST_PROBE_ENV, orjson.dumps(probe).decode())
    e: Edged = edged_factory(model_dir).start()
    e.wait_ready()
    (replica,) = e.workload("mlp")["replicas"]
    sandbox = replica["sandbox"]
    assert sandbox["inForce"] is True and sandbox["mode"] == "landlock"
    assert sandbox["filesystem"] and sandbox["network"] and sandbox["noNewPrivs"]
    assert sandbox["seccomp"] and sandbox["connectPorts"] == [allowed]
    assert sandbox["landlockAbi"] == ABI and sandbox["problems"] == []
    status, doc = e.infer("mlp", [[0.5] * 64])
    assert status == 200, doc
    assert e.terminate() == 0
    # what the worker tried once confined (its stderr, forwarded into edged's log): the
    # kernel's verdicts
    tried = {r["target"]: r["outcome"] for r in e.probe_results()[0]}
    assert tried == {
        f"127.0.0.1:{allowed}": "ok",
        f"127.0.0.1:{other}": "PermissionError: errno 13",
    }


ADDRESS_DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {{name: mlp}}
spec:
  model: {{name: mlp, version: "1.0.0", path: mlp.onnx}}
  runtime: {{executionProviders: [CPUExecutionProvider]}}
  network: {{egress: [{{port: {port}, cidr: 127.0.0.1}}]}}
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroup BPF programs need edged as root")
def test_egress_reaches_only_the_granted_address(
    model_dir: Path, edged_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``{port, cidr}``: the port on that address only, the kernel's verdict through a cgroup
    BPF program (127.0.0.2 is loopback too and listening on the same port)."""
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    (model_dir / "mlp.yaml").write_text(ADDRESS_DEPLOYMENT.format(port=port))
    probe = [
        {"connect": f"127.0.0.1:{port}"},
        {"connect": f"127.0.0.2:{port}"},
        {"connect": f"[::ffff:127.0.0.2]:{port}"},
    ]
    monkeypatch.setenv(TEST_PROBE_ENV, orjson.dumps(probe).decode())
    e: Edged = edged_factory(model_dir).start()
    assert e.launched is not None
    pid = e.launched.pid
    try:
        e.wait_ready()
        (replica,) = e.workload("mlp")["replicas"]
        sandbox = replica["sandbox"]
        assert sandbox["inForce"] is True and sandbox["connectPorts"] == [port]
        assert sandbox["connectTo"] == [f"127.0.0.1/32:{port}"]
        status, doc = e.infer("mlp", [[0.5] * 64])
        assert status == 200, doc
        assert e.terminate() == 0
        tried = {r["target"]: r["outcome"] for r in e.probe_results()[0]}
        assert tried == {
            f"127.0.0.1:{port}": "ok",
            f"127.0.0.2:{port}": "PermissionError: errno 1",  # EPERM: the BPF program
            f"[::ffff:127.0.0.2]:{port}": "PermissionError: errno 1",
        }
        # the worker's cgroup went with it
        leftovers = list(egressfilter.egress_parent().glob(f"{pid}-*"))
        assert leftovers == []
    finally:
        listener.close()


def test_a_baseline_that_does_not_allow_the_egress_keeps_the_worker_from_starting(
    model_dir: Path, edged_factory, ports
) -> None:
    (model_dir / "mlp.yaml").write_text(DEPLOYMENT.format(port=ports[0]))
    (model_dir / "baseline.yaml").write_text(BASELINE)
    e: Edged = edged_factory(model_dir).start()

    def refused() -> dict | None:
        for r in e.workload("mlp")["replicas"]:
            if r["lastExit"] and r["lastExit"]["reason"] == "NetworkPolicyDenied":
                return r["lastExit"]
        return None

    last = wait_for(refused, 60, "the worker to be refused")
    assert f"port {ports[0]}" in last["message"] and "SecurityBaseline fleet" in last["message"]
    persisted = orjson.loads((e.data / "state" / "baselines.json").read_bytes())
    assert [b["metadata"]["name"] for b in persisted["baselines"]] == ["fleet"]
    assert e.terminate() == 0


INGRESS_BASELINE = """\
apiVersion: edgefleet.io/v1
kind: SecurityBaseline
metadata: {name: fleet}
spec:
  network:
    ingress: {socketGroup: daemon, socketMode: "0620", tcpPorts: []}
"""


def test_ingress_follows_the_baseline(model_dir: Path, edged_factory, tmp_path: Path) -> None:
    """infer.sock gets the baseline's group and mode (the kernel checks them at connect), and
    the configured loopback TCP port is not served when the baseline allows no port."""
    import grp
    import os
    import stat

    from harness import UNSIGNED_CONFIG

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = UNSIGNED_CONFIG.format(absent=tmp_path / "none.json")
    config += f'\n[inference]\nlistenTcp = "127.0.0.1:{port}"\n'
    (model_dir / "baseline.yaml").write_text(INGRESS_BASELINE)
    e: Edged = edged_factory(model_dir, config=config).start()

    def applied() -> dict | None:
        ingress = e.status()["device"]["ingress"]
        return ingress if ingress and ingress["socketGroup"] == "daemon" else None

    ingress = wait_for(applied, 60, "the baseline's ingress to be in force")
    st = os.stat(e.infer_sock)
    assert stat.S_IMODE(st.st_mode) == 0o620 and st.st_gid == grp.getgrnam("daemon").gr_gid
    assert ingress["tcp"] is None and ingress["socketMode"] == "0620"
    assert ingress["problems"] == [
        f"inference.listenTcp port {port} is not allowed by the SecurityBaseline fleet "
        "(tcpPorts: none): not served"
    ]
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
    (model_dir / "baseline.yaml").unlink()  # no baseline: the configured port is served
    wait_for(lambda: e.status()["device"]["ingress"]["tcp"], 60, "the TCP port to be served")
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    assert e.terminate() == 0


def test_a_new_baseline_reaches_workers_already_running(
    model_dir: Path, edged_factory, ports
) -> None:
    (model_dir / "mlp.yaml").write_text(DEPLOYMENT.format(port=ports[0]))
    e: Edged = edged_factory(model_dir).start()
    e.wait_ready()
    (before,) = e.worker_pids("mlp")
    (model_dir / "baseline.yaml").write_text(BASELINE)  # egress: [] from now on

    def refused() -> dict | None:
        for r in e.workload("mlp")["replicas"]:
            if r["lastExit"] and r["lastExit"]["reason"] == "NetworkPolicyDenied":
                return r
        return None

    replica = wait_for(refused, 60, "the running worker to be restarted and refused")
    assert replica["pid"] != before
    assert "SandboxChanged" in e.logs()
    assert e.terminate() == 0
