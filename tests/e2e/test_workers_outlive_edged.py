"""Workers outlive edged (docs/agent-updates.md, "Workers outlive edged"): a restart of edged,
clean or kill -9, leaves the inference workers running and the next edged adopts them, after it
has proven each one is what its record says; a process that is not, or a record that lies, is
never adopted; a kept worker no edged comes back for exits by itself."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import psutil
import pytest
from fdstoretesting import FdStore
from harness import UNSIGNED_CONFIG, Edged, wait_for, write_manifest
from metricstesting import series_value

from edgefleet.devicestatus import send_request
from edgefleet.inference import infer_path, infer_request_body

X = np.zeros((1, 64), dtype=np.float32)


def _config(tmp_path: Path, *, keep: bool = True, orphan: str = "2m") -> str:
    absent = tmp_path / "no-trust-root.json"
    keep_text = "true" if keep else "false"
    return UNSIGNED_CONFIG.format(absent=absent) + (
        f'[workers]\nkeepOnExit = {keep_text}\norphanTimeout = "{orphan}"\n'
    )


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _fds(pid: int) -> list[str]:
    return [fd for fd in os.listdir(f"/proc/{pid}/fd") if os.path.exists(f"/proc/{pid}/fd/{fd}")]


def _records(e: Edged) -> dict[str, dict]:
    d = e.data / "state" / "workers"
    return {p.stem: orjson.loads(p.read_bytes()) for p in d.glob("*.json")} if d.is_dir() else {}


def _stop_for_good(e: Edged, tmp_path: Path) -> None:
    """Stop edged (it keeps its workers), start it once more without keepOnExit and stop it:
    the workers it adopted stop with it."""
    if e.launched is not None and e.launched.running():
        assert e.terminate() == 0
    e.config_text = _config(tmp_path, keep=False)
    e.start().wait_ready()
    assert e.terminate() == 0


def test_restart_keeps_workers_serving(model_dir: Path, tmp_path: Path, edged_factory) -> None:
    write_manifest(model_dir, replicas=2)
    e: Edged = edged_factory(model_dir, config=_config(tmp_path)).start()
    e.wait_ready()
    wait_for(lambda: len(e.worker_pids("mlp")) == 2, 30, "two workers")
    before = sorted(e.worker_pids("mlp"))
    assert set(_records(e)) == {r["id"] for r in e.workload("mlp")["replicas"]}
    # this machine's workers share edged's cgroup (no cgroup v2 limits): nothing blocks it
    assert e.status()["device"]["keepWorkers"] == {"inForce": True, "problem": ""}
    assert e.terminate() == 0
    assert all(_alive(pid) for pid in before), "the workers stopped with edged"

    e.start().wait_ready()
    wait_for(lambda: e.workload("mlp")["readyReplicas"] == 2, 30, "both replicas ready again")
    assert sorted(e.worker_pids("mlp")) == before
    for rep in e.workload("mlp")["replicas"]:
        assert rep["restarts"] == 0 and rep.get("lastExit") is None
        assert rep["kept"] and rep["adopted"]
    assert e.log_records("replica adopted")
    assert e.infer("mlp", X)[0] == 200
    # each adopted worker's stderr is a pipe the new edged reads (handed over on attach)
    assert e.launched is not None
    edged_pipes = {os.stat(f"/proc/{e.launched.pid}/fd/{fd}").st_ino for fd in _fds(e.launched.pid)}
    for pid in before:
        assert os.stat(f"/proc/{pid}/fd/2").st_ino in edged_pipes
    # an adopted worker is supervised: killed, it is seen through its pidfd and replaced
    os.kill(before[0], signal.SIGKILL)

    def replaced() -> bool:
        pids = e.worker_pids("mlp")
        return before[0] not in pids and len(pids) == 2 and e.workload("mlp")["readyReplicas"] == 2

    wait_for(replaced, 30, "the killed adopted worker replaced")
    assert e.infer("mlp", X)[0] == 200
    _stop_for_good(e, tmp_path)
    assert not any(_alive(pid) for pid in before[1:])
    assert _records(e) == {}


def test_an_adopted_worker_counts_only_the_batches_it_runs_for_the_new_edged(
    model_dir: Path, tmp_path: Path, edged_factory
) -> None:
    """A worker's PONG carries its running totals since it started; the batches it ran for
    the edged before are not the new edged's to count (edged_inference_batches_total and
    friends start from the totals at adoption, as the overlap counts do)."""
    write_manifest(model_dir, replicas=1, period=1)
    e: Edged = edged_factory(model_dir, config=_config(tmp_path)).start()
    e.wait_ready()
    wait_for(lambda: e.workload("mlp")["readyReplicas"] == 1, 30, "the replica ready")

    def batched() -> float:
        text = e.request("GET", "/metrics", sock=e.status_sock)[1].decode()
        return series_value(text, 'edged_inference_batched_requests_total{workload="mlp"}')

    for _ in range(5):
        assert e.infer("mlp", X)[0] == 200
    wait_for(lambda: batched() == 5, 30, "5 requests counted by the first edged")
    assert e.terminate() == 0
    e.start().wait_ready()
    wait_for(lambda: e.workload("mlp")["readyReplicas"] == 1, 30, "the replica adopted")
    assert e.workload("mlp")["replicas"][0]["adopted"]
    assert batched() == 0
    # the counter moves only with a PONG's totals, and the worker's totals count the first
    # edged's 5 too: 2 here is a PONG saying 7 counted as the 2 of this edged (the counter
    # never goes down: had the 5 been counted by any PONG since the adoption, it would never
    # read 2), then 3 the same after more PONGs
    for want in (2, 3):
        for _ in range(want - int(batched())):
            assert e.infer("mlp", X)[0] == 200
        wait_for(lambda w=want: batched() >= w, 30, f"the {want} requests made to this edged")
        assert batched() == want, "the first edged's batches were counted again"
    _stop_for_good(e, tmp_path)


def test_kill9_of_edged_then_adopted(model_dir: Path, tmp_path: Path, edged_factory) -> None:
    write_manifest(model_dir)
    e: Edged = edged_factory(model_dir, config=_config(tmp_path)).start()
    e.wait_ready()
    (pid,) = e.worker_pids("mlp")
    e.kill9()
    time.sleep(0.5)
    assert _alive(pid)
    e.start().wait_ready()
    wait_for(lambda: e.workload("mlp")["readyReplicas"] == 1, 30, "the replica ready again")
    assert e.worker_pids("mlp") == [pid]
    assert e.infer("mlp", X)[0] == 200
    _stop_for_good(e, tmp_path)


def test_impostor_with_the_recorded_pid_is_not_adopted(
    model_dir: Path, tmp_path: Path, edged_factory
) -> None:
    """The worker is gone and another process runs the very argv it ran (what a reused pid
    looks like, and more): its start time differs, so it is neither adopted nor signalled."""
    write_manifest(model_dir)
    e: Edged = edged_factory(model_dir, config=_config(tmp_path)).start()
    e.wait_ready()
    (pid,) = e.worker_pids("mlp")
    assert e.terminate() == 0
    (name, record) = next(iter(_records(e).items()))
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not _alive(pid), 10, "the worker gone")
    # an impostor: a process that holds nothing of the worker's but looks like it by argv
    impostor = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", *record["argv"][1:]],
        stdin=subprocess.DEVNULL,
    )
    try:
        record["pid"] = impostor.pid  # the record now lies: it names the impostor
        (e.data / "state" / "workers" / f"{name}.json").write_bytes(orjson.dumps(record))
        e.start().wait_ready()
        wait_for(lambda: e.workload("mlp")["readyReplicas"] == 1, 60, "a new worker")
        assert e.worker_pids("mlp") != [impostor.pid]
        assert impostor.poll() is None, "edged signalled a process that is not its worker"
        assert any(
            "not the worker" in str(r) or "started at tick" in str(r) or "argv" in str(r)
            for r in e.log_records("kept worker not adopted")
        )
    finally:
        impostor.kill()
        impostor.wait()
    _stop_for_good(e, tmp_path)


def test_tampered_record_is_not_adopted_and_the_worker_is_replaced(
    model_dir: Path, tmp_path: Path, edged_factory
) -> None:
    """A record that says the worker runs as another uid (or any field it does not) is not
    the worker's: it is not adopted, nor signalled (it exits at its orphan bound: ended here)."""
    write_manifest(model_dir)
    e: Edged = edged_factory(model_dir, config=_config(tmp_path)).start()
    e.wait_ready()
    (pid,) = e.worker_pids("mlp")
    assert e.terminate() == 0
    (name, record) = next(iter(_records(e).items()))
    record["uid"] = record["uid"] + 1
    (e.data / "state" / "workers" / f"{name}.json").write_bytes(orjson.dumps(record))
    e.start().wait_ready()
    wait_for(lambda: e.workload("mlp")["readyReplicas"] == 1, 60, "a new worker")
    assert e.worker_pids("mlp") != [pid]
    assert any("uid" in str(r.get("reason")) for r in e.log_records("kept worker not adopted"))
    assert _alive(pid)  # not signalled: edged could not prove it is its worker
    os.kill(pid, signal.SIGKILL)
    _stop_for_good(e, tmp_path)


def test_a_new_model_while_edged_was_away_replaces_the_adopted_worker(
    model_dir: Path, tmp_path: Path, edged_factory
) -> None:
    """The manifest names other bytes when edged comes back: the worker of the accepted
    revision is adopted (it serves meanwhile), then replaced the way any new revision is."""
    from edgefleet.demo import TINY_MLP, build_mlp

    write_manifest(model_dir)
    e: Edged = edged_factory(model_dir, config=_config(tmp_path)).start()
    e.wait_ready()
    (pid,) = e.worker_pids("mlp")
    assert e.terminate() == 0
    build_mlp(model_dir / "mlp.onnx", TINY_MLP, seed=7)
    e.start().wait_ready()
    wait_for(lambda: not _alive(pid), 30, "the worker of the old model stopped")
    assert [r["replica"] for r in e.log_records("replica adopted")]
    wait_for(lambda: e.workload("mlp")["readyReplicas"] == 1, 60, "a worker of the new model")
    assert e.worker_pids("mlp") != [pid]
    _stop_for_good(e, tmp_path)


def test_orphaned_worker_exits_by_itself(model_dir: Path, tmp_path: Path, edged_factory) -> None:
    write_manifest(model_dir)
    e: Edged = edged_factory(model_dir, config=_config(tmp_path, orphan="2s")).start()
    e.wait_ready()
    (pid,) = e.worker_pids("mlp")
    assert e.terminate() == 0
    assert _alive(pid)
    wait_for(lambda: not _alive(pid), 15, "the orphaned worker to exit")
    # the next edged drops its record and starts a new one
    e.start().wait_ready()
    wait_for(lambda: e.workload("mlp")["readyReplicas"] == 1, 60, "a new worker")
    assert e.worker_pids("mlp") != [pid]
    _stop_for_good(e, tmp_path)


def test_keep_on_exit_off_stops_workers_with_edged(
    model_dir: Path, tmp_path: Path, edged_factory
) -> None:
    write_manifest(model_dir)
    e: Edged = edged_factory(model_dir, config=_config(tmp_path, keep=False)).start()
    e.wait_ready()
    (pid,) = e.worker_pids("mlp")
    assert _records(e) == {}
    assert e.status()["device"]["keepWorkers"] == {"inForce": False, "problem": ""}
    assert e.terminate() == 0
    wait_for(lambda: not _alive(pid), 10, "the worker stopped with edged")


class SteadyLoad:
    """One client sending inference requests back to back, each on a new connection, retrying
    a failed one once (what a client of a restarting service does): counts what failed even
    so, and the longest time without an answer."""

    def __init__(self, sock: str, tcp_port: int | None = None) -> None:
        self.sock = sock
        self.tcp_port = tcp_port
        self.body = infer_request_body({"input": X})
        self.answered = 0
        self.failed: list[str] = []
        self.longest_gap = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _one(self) -> str:
        try:
            if self.tcp_port is None:
                status, _, _ = send_request(
                    self.sock, "POST", infer_path("mlp"), self.body, timeout=30.0
                )
            else:
                conn = http.client.HTTPConnection("127.0.0.1", self.tcp_port, timeout=30.0)
                try:
                    conn.request("POST", infer_path("mlp"), self.body)
                    status = conn.getresponse().status
                finally:
                    conn.close()
        except (OSError, http.client.HTTPException) as exc:
            return f"{type(exc).__name__}: {exc}"
        return "" if status == 200 else f"HTTP {status}"

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            why = self._one()
            if why:
                why = self._one()  # the one retry
            now = time.monotonic()
            if why:
                self.failed.append(why)
            else:
                self.answered += 1
                self.longest_gap = max(self.longest_gap, now - last)
                last = now

    def __enter__(self) -> SteadyLoad:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(40)


def test_restart_under_load_fails_no_request(
    model_dir: Path, tmp_path: Path, edged_factory
) -> None:
    """edged under a descriptor store (as systemd or the launcher runs it): its inference
    socket is stored and taken back, its workers adopted; a client that retries once sees no
    failure across restarts, clean and kill -9."""
    store = FdStore(tmp_path / "fdstore")
    write_manifest(model_dir, replicas=2)
    e: Edged = edged_factory(model_dir, config=_config(tmp_path))
    e.python, e.env = store.python, store.env
    try:
        e.start().wait_ready()
        wait_for(lambda: e.workload("mlp")["readyReplicas"] == 2, 30, "two replicas")
        wait_for(lambda: "inference" in store.names(), 10, "infer.sock in the store")
        before = sorted(e.worker_pids("mlp"))
        with SteadyLoad(e.infer_sock) as load:
            wait_for(lambda: load.answered > 20, 30, "requests answered")
            for crash in (False, True, False):
                if crash:
                    e.kill9()
                else:
                    assert e.terminate() == 0
                e.start()
                answered = load.answered
                wait_for(lambda n=answered: load.answered > n + 20, 60, "answers after the restart")
        assert load.failed == [], load.failed[:5]
        assert sorted(e.worker_pids("mlp")) == before
        assert len(e.log_records("socket taken from the descriptor store")) >= 2
    finally:
        _stop_for_good(e, tmp_path)
        store.close()


def test_restart_under_the_launcher_and_a_store_above_it(
    model_dir: Path, tmp_path: Path, edged_factory
) -> None:
    """The whole chain as on a device: edged under the real edged-launcher, the launcher under
    a descriptor store as systemd keeps one. edged stores infer.sock with the launcher, which
    passes it on to the store; a restart of the service (the launcher and edged) gets it back
    through both, and the workers are adopted: no request fails."""
    from edgefleet.launching import launch

    store = FdStore(tmp_path / "fdstore")
    write_manifest(model_dir)
    e: Edged = edged_factory(model_dir, config=_config(tmp_path))  # its helpers, its data dir
    config = tmp_path / "launcher-edged.toml"
    config.write_text(_config(tmp_path))
    args = ["run", "--data-dir", e.data, "--manifests", model_dir, "--config", config]

    def start() -> subprocess.Popen[bytes]:
        env = {**store.env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        return launch(
            "edged.launcher", *args, log=tmp_path / "launcher.log", env=env, python=store.python
        ).process

    launcher = start()
    try:
        wait_for(lambda: e.workload("mlp")["readyReplicas"] == 1, 60, "a ready replica")
        wait_for(lambda: "inference" in store.names(), 10, "infer.sock in the store")
        before = e.worker_pids("mlp")
        with SteadyLoad(e.infer_sock) as load:
            wait_for(lambda: load.answered > 20, 30, "requests answered")
            for _ in range(2):
                launcher.send_signal(signal.SIGTERM)
                assert launcher.wait(60) == 0
                launcher = start()
                answered = load.answered
                wait_for(lambda n=answered: load.answered > n + 20, 60, "answers after the restart")
        assert load.failed == [], load.failed[:5]
        assert e.worker_pids("mlp") == before
        log = (tmp_path / "launcher.log").read_text()
        assert log.count("socket taken from the descriptor store") >= 2
    finally:
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGTERM)
            launcher.wait(60)
        store.close()  # the sockets it held go: the next edged binds its paths anew
        _stop_for_good(e, tmp_path)


def test_a_worker_that_does_not_answer_is_killed_and_restarted(
    model_dir: Path, tmp_path: Path, edged_factory
) -> None:
    """A kept worker that is what its record says but does not answer on its socket (here:
    stopped with SIGSTOP) is not adopted: killed through its pidfd, restarted, and its slot's
    last exit says why."""
    write_manifest(model_dir)
    e: Edged = edged_factory(model_dir, config=_config(tmp_path)).start()
    e.wait_ready()
    (pid,) = e.worker_pids("mlp")
    assert e.terminate() == 0
    os.kill(pid, signal.SIGSTOP)
    e.start().wait_ready(60)
    wait_for(lambda: not _alive(pid), 30, "the silent worker killed")
    wait_for(lambda: e.workload("mlp")["readyReplicas"] == 1, 60, "a new worker")
    (rep,) = e.workload("mlp")["replicas"]
    assert rep["pid"] != pid and not rep["adopted"] and rep["restarts"] == 1
    assert rep["lastExit"]["reason"] == "NotAdopted"
    assert "READY" in rep["lastExit"]["message"]
    (event,) = e.log_records("kept worker not adopted: killed")
    assert event["pid"] == pid
    _stop_for_good(e, tmp_path)


def test_the_loopback_tcp_port_is_kept_too(model_dir: Path, tmp_path: Path, edged_factory) -> None:
    """``[inference] listenTcp``: its listener is stored as well (FDNAME=inference-tcp) and
    taken back, so a TCP client is not refused during a restart either."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = FdStore(tmp_path / "fdstore")
    write_manifest(model_dir)
    config = _config(tmp_path) + f'[inference]\nlistenTcp = "127.0.0.1:{port}"\n'
    e: Edged = edged_factory(model_dir, config=config)
    e.python, e.env = store.python, store.env
    try:
        e.start().wait_ready()
        wait_for(lambda: "inference-tcp" in store.names(), 10, "the TCP listener in the store")
        with SteadyLoad(e.infer_sock, tcp_port=port) as load:
            wait_for(lambda: load.answered > 20, 30, "requests answered over TCP")
            for _ in range(2):
                assert e.terminate() == 0
                e.start()
                answered = load.answered
                wait_for(lambda n=answered: load.answered > n + 20, 60, "answers after the restart")
        assert load.failed == [], load.failed[:5]
        taken = [r for r in e.log_records("socket taken from the descriptor store")]
        assert sum(r.get("name") == "inference-tcp" for r in taken) >= 2
    finally:
        _stop_for_good(e, tmp_path)
        store.close()


NO_TCP_BASELINE = """\
apiVersion: edgefleet.io/v1
kind: SecurityBaseline
metadata: {name: fleet}
spec:
  network:
    ingress: {tcpPorts: []}
"""


def test_a_tcp_port_no_longer_allowed_leaves_the_store(
    model_dir: Path, tmp_path: Path, edged_factory
) -> None:
    """A baseline that stops the TCP port drops its listener from the descriptor store too:
    the store must not keep a port listening that nothing may serve."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = FdStore(tmp_path / "fdstore")
    write_manifest(model_dir)
    config = _config(tmp_path) + f'[inference]\nlistenTcp = "127.0.0.1:{port}"\n'
    e: Edged = edged_factory(model_dir, config=config)
    e.python, e.env = store.python, store.env
    try:
        e.start().wait_ready()
        wait_for(lambda: "inference-tcp" in store.names(), 10, "the TCP listener in the store")
        (model_dir / "baseline.yaml").write_text(NO_TCP_BASELINE)
        wait_for(lambda: "inference-tcp" not in store.names(), 60, "the listener dropped")
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
    finally:
        _stop_for_good(e, tmp_path)
        store.close()


def test_an_update_through_the_launcher_keeps_the_workers(
    model_dir: Path, tmp_path: Path, edged_factory
) -> None:
    """What an update does on a device, without the hub: a release built by
    ``packaging/agent/build-release`` installed into slot b, edged asks the launcher for the
    trial (``request.json``) and stops; the launcher starts slot b's edged, which adopts the
    workers of the edged before it and takes infer.sock from the launcher's store. Under load,
    no request fails and the workers keep their pids."""
    import hashlib
    import json

    from agentreleasetesting import build_release

    from edged.agent.installing import Platform, install_release
    from edged.hublink.agentreleases import VerifiedRelease
    from edgefleet.launching import launch
    from edgefleet.versioning import installed_version

    major, minor, patch = (int(x) for x in installed_version().split(".")[:3])
    new = f"{major}.{minor}.{patch + 1}"
    archive = build_release(tmp_path / "next.tar.gz", new)
    data = archive.read_bytes()
    here = Platform.of_this_device()
    release = VerifiedRelease(archive, new, here.arch, here.python_abi,
                              hashlib.sha256(data).hexdigest(), len(data))  # fmt: skip
    write_manifest(model_dir)
    e: Edged = edged_factory(model_dir, config=_config(tmp_path))
    install_release(release, e.data, "b")
    config = tmp_path / "launcher-edged.toml"
    config.write_text(_config(tmp_path))
    args = ["run", "--data-dir", e.data, "--manifests", model_dir, "--config", config]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("NOTIFY_SOCKET", None)  # the launcher is the top: no systemd above it here
    launcher = launch("edged.launcher", *args, log=tmp_path / "launcher.log", env=env).process
    try:
        wait_for(lambda: e.workload("mlp")["readyReplicas"] == 1, 60, "a ready replica")
        assert e.status()["device"]["edgedVersion"] == installed_version()
        before = e.worker_pids("mlp")
        old_edged = e.status()["device"]["pid"]
        with SteadyLoad(e.infer_sock) as load:
            wait_for(lambda: load.answered > 20, 30, "requests answered")
            request = {"action": "try", "slot": "b", "version": new, "id": "adopt-test",
                       "commitDeadlineSeconds": 600}  # fmt: skip
            (e.data / "agent" / "request.json").write_text(json.dumps(request))
            os.kill(old_edged, signal.SIGTERM)  # edged stops for the switch; the launcher stays

            def switched() -> bool:
                return bool(e.status()["device"]["edgedVersion"] == new)

            wait_for(switched, 60, "slot b's edged")
            answered = load.answered
            wait_for(lambda: load.answered > answered + 20, 60, "answers from slot b's edged")
        assert load.failed == [], load.failed[:5]
        assert launcher.poll() is None
        assert e.worker_pids("mlp") == before
        (rep,) = e.workload("mlp")["replicas"]
        assert rep["adopted"] and rep["restarts"] == 0
    finally:
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGTERM)
            launcher.wait(60)
        _stop_for_good(e, tmp_path)


def test_the_units_cleanup_spares_the_recorded_workers_of_a_real_edged(
    model_dir: Path, tmp_path: Path, edged_factory
) -> None:
    """edged.service's ExecStopPost= (edged-launcher cleanup, systemd 252) after a launcher
    was killed, over a cgroup tree of files laid out as edged does (this host has no cgroup
    v2 limits): the edged still running is killed, the worker it recorded is not, the
    controllers are disabled below the unit, and the next edged adopts the worker."""
    write_manifest(model_dir)
    e: Edged = edged_factory(model_dir, config=_config(tmp_path)).start()
    e.wait_ready()
    (pid,) = e.worker_pids("mlp")
    assert e.launched is not None
    edged_pid = e.launched.pid
    unit = tmp_path / "cgroup" / "edged.service"
    for d, procs, enabled in (
        (unit, [], "cpu memory"),
        (unit / "supervisor", [edged_pid], ""),
        (unit / "workloads", [], "cpu memory"),
        (unit / "workloads" / "mlp-0", [pid], ""),
    ):
        d.mkdir(parents=True)
        (d / "cgroup.procs").write_text("".join(f"{p}\n" for p in procs))
        (d / "cgroup.subtree_control").write_text(enabled)
    run = [sys.executable, "-m", "edged.launcher", "cleanup", "--data-dir", str(e.data), str(unit)]
    done = subprocess.run(run, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"1 process(es) ended ([{edged_pid}])" in done.stderr, done.stderr
    assert "1 kept worker(s) left" in done.stderr, done.stderr
    assert e.launched.kill() == -signal.SIGKILL
    assert _alive(pid)
    for d in (unit, unit / "workloads"):
        assert (d / "cgroup.subtree_control").read_text() == "-cpu -memory"
    e.start().wait_ready()
    wait_for(lambda: e.workload("mlp")["readyReplicas"] == 1, 30, "the replica ready again")
    assert e.worker_pids("mlp") == [pid]
    assert e.infer("mlp", X)[0] == 200
    _stop_for_good(e, tmp_path)
