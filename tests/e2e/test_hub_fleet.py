"""The fleet, end to end: a real hub, real enrolled edged daemons, real certificates, loopback.

Each test starts ``hub serve`` and one or two ``edged run`` processes, pushes a signed model
with ``edgectl models push`` and applies a ModelDeployment with ``edgectl apply``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, TcpProxy, enroll
from harness import Edged, wait_for
from hubfleettesting import apply, push, serving

from edged.runtime.worker import TEST_PROBE_ENV
from edgefleet.demo import MEDIUM_MLP, build_mlp
from edgefleet.launching import program_command


def get_json(hub: HubProcess, *args: str) -> Any:
    return json.loads(hub.edgectl("get", *args, "-o", "json").stdout)


X = np.ones((1, 64), dtype=np.float32)


def test_enroll_apply_serve_and_apply_again_changes_nothing(
    hub: HubProcess, device: Callable[..., Edged], tmp_path: Path
) -> None:
    a = device("dev-a", {"site": "a"})
    b = device("dev-b", {"site": "b"})
    push(hub, tmp_path, "det", "1.0.0")
    first = apply(hub, tmp_path, name="det", model="det", version="1.0.0", site="a")
    assert "created" in first
    wait_for(lambda: serving(a, "det", "1.0.0"), 60, "dev-a to serve det 1.0.0")
    code, out = a.infer("det", X)
    assert code == 200, out
    assert b.status()["workloads"] == []  # site b is not selected
    assert b.status()["device"]["name"] == "dev-b"  # the hub's name for it, not the hostname
    again = apply(hub, tmp_path, name="det", model="det", version="1.0.0", site="a")
    assert "unchanged" in again
    pids = a.worker_pids("det")
    dep = wait_for(
        lambda: (d := get_json(hub, "deployments", "det"))["status"]["readyDevices"] == 1 and d,
        30,
        "the hub to see dev-a ready",
    )
    assert dep["status"]["desiredDevices"] == 1
    devices = get_json(hub, "devices")
    assert {d["metadata"]["name"] for d in devices["items"]} == {"dev-a", "dev-b"}
    assert a.worker_pids("det") == pids  # nothing restarted
    import subprocess
    import sys

    shown = subprocess.run(
        [sys.executable, "-m", "edged", "status", "--data-dir", str(a.data)],
        check=True, capture_output=True, text=True, timeout=30,
    ).stdout  # fmt: skip
    assert f"hub {hub.address} as dev-a: connected, generation" in shown, shown


def test_a_device_certificate_reads_only_its_own_state(
    hub: HubProcess, device: Callable[..., Edged], tmp_path: Path
) -> None:
    from edgefleet.v1 import admin_pb2, admin_pb2_grpc, device_pb2, device_pb2_grpc
    from edgefleet.versioning import installed_version

    a = device("dev-a", {"site": "a"})
    device("dev-b", {"site": "b"})
    wait_for(lambda: a.status()["hub"]["connected"], 30, "dev-a connected")
    creds = grpc.ssl_channel_credentials(
        (a.data / "hub" / "ca.crt").read_bytes(),
        (a.data / "identity" / "key.pem").read_bytes(),
        (a.data / "hub" / "device.crt").read_bytes(),
    )
    with grpc.secure_channel(hub.address, creds) as ch:
        stub = device_pb2_grpc.DeviceServiceStub(ch)
        hello = device_pb2.DeviceMessage(
            hello=device_pb2.Hello(edged_version=installed_version(), device_name="dev-b")
        )
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Sync(iter([hello]), timeout=10))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "dev-b" in (err.value.details() or "")
        admin = admin_pb2_grpc.AdminServiceStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            admin.List(admin_pb2.ListRequest(kind="Device"), timeout=10)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_expired_and_reused_tokens_are_refused(hub: HubProcess, tmp_path: Path) -> None:
    token, pin = hub.token("--single-use")

    def run(data: str, tok: str, ca_hash: str = pin) -> Any:
        import subprocess
        import sys

        return subprocess.run(
            [sys.executable, "-m", "edged", "enroll", "--hub", hub.address, "--ca-hash", ca_hash,
             "--root-hash", hub.root_pin,
             "--token", tok, "--data-dir", str(tmp_path / data), "--name", data],
            check=False, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    assert run("one", token).returncode == 0
    # every refused token gets the same answer (it tells no one which ids exist)...
    reused = run("two", token)
    assert reused.returncode == 1 and "UNAUTHENTICATED" in reused.stderr, reused.stderr
    assert "the bootstrap token is not valid" in reused.stderr
    short, _ = hub.token("--ttl", "1s")
    time.sleep(1.2)
    expired = run("three", short)
    assert expired.returncode == 1 and "UNAUTHENTICATED" in expired.stderr, expired.stderr
    assert "the bootstrap token is not valid" in expired.stderr
    # ...while the hub's log says exactly why
    log = hub.log.read_text()
    assert '"reason":"AlreadyUsed"' in log and '"reason":"Expired"' in log
    wrong_pin = run("four", hub.token()[0], "sha256:" + "0" * 64)
    assert wrong_pin.returncode == 1 and "--ca-hash" in wrong_pin.stderr, wrong_pin.stderr
    assert not (tmp_path / "four" / "hub").exists()  # nothing written
    bad = run("five", "abcdef.0123456789abcdef")
    assert bad.returncode == 1 and "UNAUTHENTICATED" in bad.stderr


def test_a_revoked_device_is_refused_and_keeps_serving(
    hub: HubProcess, device: Callable[..., Edged], tmp_path: Path
) -> None:
    a = device("dev-a", {"site": "a"})
    push(hub, tmp_path, "det", "1.0.0")
    apply(hub, tmp_path, name="det", model="det", version="1.0.0", site="a")
    wait_for(lambda: serving(a, "det", "1.0.0"), 60, "dev-a to serve")
    out = hub.edgectl("devices", "revoke", "dev-a")
    assert "revoked" in out.stdout
    wait_for(
        lambda: "revoked" in (a.status()["hub"]["lastError"] or ""),
        30,
        "dev-a to be refused",
    )
    assert a.infer("det", X)[0] == 200  # the last verified state still serves
    # a few refusals with backoff, then a final state instead of a warning every second
    hub_status = wait_for(
        lambda: (h := a.status()["hub"])["refused"] and h, 60, "dev-a to stop dialling"
    )
    assert hub_status["lastError"].startswith("refused by the hub (UNAUTHENTICATED")
    logs = a.log_path.read_text()
    assert logs.count("hub refused this device, link stopped") == 1
    # the stream closed, then refusals with backoff until the link stops. On a loaded machine
    # a reconnect right after the revocation may end with INTERNAL ("Internal error from
    # Core", gRPC's, before the hub's refusal) instead, which starts the refusal count again:
    # a handful of lines, never one a second for the minute this test waits
    broken = [line for line in logs.splitlines() if '"hub link broken"' in line]
    assert len(broken) <= 10, "\n".join(broken)
    assert a.infer("det", X)[0] == 200


def test_hub_kill9_devices_keep_serving_then_reconverge_without_restarts(
    hub: HubProcess, device: Callable[..., Edged], tmp_path: Path
) -> None:
    a = device("dev-a", {"site": "a"})
    push(hub, tmp_path, "det", "1.0.0")
    apply(hub, tmp_path, name="det", model="det", version="1.0.0", site="a")
    wait_for(lambda: serving(a, "det", "1.0.0"), 60, "dev-a to serve")
    pids = a.worker_pids("det")
    hub.kill9()
    wait_for(lambda: not a.status()["hub"]["connected"], 30, "dev-a to notice")
    assert a.infer("det", X)[0] == 200
    a.terminate()  # and across a restart of edged itself, offline
    a.start()
    a.wait_ready(60)
    assert a.infer("det", X)[0] == 200
    pids = a.worker_pids("det")
    hub.start()
    wait_for(lambda: a.status()["hub"]["connected"], 90, "dev-a to reconnect")
    push(hub, tmp_path, "det", "1.0.0")  # unchanged: versions are immutable
    time.sleep(1.5)
    assert a.worker_pids("det") == pids  # already right: nothing restarted
    apply(hub, tmp_path, name="det", model="det", version="1.0.0", site="a")
    assert serving(a, "det", "1.0.0")


def test_a_partitioned_device_converges_to_the_newest_state(
    hub: HubProcess, device: Callable[..., Edged], tmp_path: Path
) -> None:
    host, port = hub.address.split(":")
    proxy = TcpProxy((host, int(port)))
    try:
        a = device("dev-a", {"site": "a"}, via=proxy.address)
        push(hub, tmp_path, "det", "1.0.0")
        apply(hub, tmp_path, name="det", model="det", version="1.0.0", site="a")
        wait_for(lambda: serving(a, "det", "1.0.0"), 60, "dev-a to serve 1.0.0")
        proxy.cut()
        wait_for(lambda: not a.status()["hub"]["connected"], 90, "dev-a to lose the hub")
        push(hub, tmp_path, "det", "1.1.0", seed=2)
        apply(hub, tmp_path, name="det", model="det", version="1.1.0", site="a")
        push(hub, tmp_path, "det", "1.2.0", seed=3)
        apply(hub, tmp_path, name="det", model="det", version="1.2.0", site="a")
        assert serving(a, "det", "1.0.0")  # cut off: keeps what it had
        assert a.infer("det", X)[0] == 200
        proxy.heal()
        wait_for(lambda: serving(a, "det", "1.2.0"), 120, "dev-a to converge to 1.2.0")
    finally:
        proxy.close()


def test_kill9_edged_during_a_download_resumes_and_the_old_version_serves(
    hub: HubProcess, device: Callable[..., Edged], tmp_path: Path
) -> None:
    a = device("dev-a", {"site": "a"})
    push(hub, tmp_path, "det", "1.0.0")
    apply(hub, tmp_path, name="det", model="det", version="1.0.0", site="a")
    wait_for(lambda: serving(a, "det", "1.0.0"), 60, "dev-a to serve 1.0.0")
    downloads = a.data / "downloads"

    def partial() -> bool:
        return any(p.stat().st_size > 0 for p in downloads.glob("*.part"))

    # a download under way, frozen at once, then killed: kill9() reads the status socket
    # first, and in those milliseconds a fast download finished (a CI rehearsal); on a loaded
    # machine the download may even finish before this process sees its partial file (a
    # rehearsal with the VM lab alongside): then another version, up to three times
    for attempt, version in enumerate(("2.0.0", "2.1.0", "2.2.0")):
        big = tmp_path / f"det-{version}.onnx"
        build_mlp(big, MEDIUM_MLP, seed=5 + attempt)  # about 25 MB: a download of a moment
        hub.edgectl("models", "push", str(big), "--name", "det", "--version", version)
        apply(hub, tmp_path, name="det", model="det", version=version, site="a")
        wait_for(partial, 60, "the download to start", interval=0.01)
        assert a.launched is not None
        a.launched.process.send_signal(signal.SIGSTOP)
        part_size = max((p.stat().st_size for p in downloads.glob("*.part")), default=0)
        if 0 < part_size < big.stat().st_size or attempt == 2:
            break
        a.launched.process.send_signal(signal.SIGCONT)  # finished already: the next version
        wait_for(lambda v=version: serving(a, "det", v), 120, f"dev-a to serve {version}")
    a.launched.kill()
    assert 0 < part_size < big.stat().st_size, (part_size, big.stat().st_size)
    a.start()
    a.wait_ready(60)
    assert a.infer("det", X)[0] == 200  # the old version serves while the new one downloads
    wait_for(lambda: serving(a, "det", version), 120, f"dev-a to serve {version}")
    assert part_size > 0
    assert not list(downloads.glob("*.part"))
    assert "artifact download resuming" in a.logs()


def test_certificate_renewal_and_device_lifecycle(
    tmp_path: Path, edged_factory: Callable[..., Edged]
) -> None:
    """Short-lived certificates are renewed at 70-90 % of their life over the mTLS channel; a
    device that stops talking becomes NotReady after the grace period, and Ready again."""
    hub = HubProcess(tmp_path / "hub", tmp_path / "hub.log").init()
    toml = hub.data / "hub.toml"
    text = toml.read_text()
    for key, value in (
        # long enough for edged to start and connect on a loaded machine before the first
        # certificate expires (an expired one cannot connect: that device must re-enroll)
        ("deviceLifetime", "30s"),
        ("heartbeatInterval", "1s"),
        ("heartbeatGrace", "3s"),
    ):
        text = "\n".join(
            f'{key} = "{value}"' if line.startswith(f"{key} =") else line
            for line in text.splitlines()
        )
    toml.write_text(text + "\n")
    hub.start()
    try:
        data = tmp_path / "dev-a"
        assert enroll(hub, data, "dev-a", {"site": "a"}).returncode == 0
        first = (data / "hub" / "device.crt").read_bytes()
        a = edged_factory(
            None, data=data, config=SIGNED_DEVICE_CONFIG.format(absent=tmp_path / "no-root")
        ).start()

        def phase() -> str:
            return str(get_json(hub, "devices", "dev-a")["status"]["phase"])

        wait_for(lambda: phase() == "Ready", 30, "dev-a Ready")
        wait_for(
            lambda: (data / "hub" / "device.crt").read_bytes() != first,
            40,
            "the certificate to be renewed",
        )
        # logged after the rename and the directory's fsync: poll, do not race it
        wait_for(lambda: "certificate renewed" in a.logs(), 10, "the renewal to be logged")
        a.kill9()
        wait_for(lambda: phase() == "NotReady", 20, "dev-a NotReady")
        a.start()  # connects with the renewed certificate
        wait_for(lambda: phase() == "Ready", 30, "dev-a Ready again")
        events = hub.edgectl("get", "events", "--for", "device/dev-a").stdout
        assert "NotReady" in events and "Ready" in events
        a.terminate()
    finally:
        hub.stop()


def test_logs_are_asked_of_the_device_through_the_hub(
    hub: HubProcess, device: Callable[..., Edged], tmp_path: Path
) -> None:
    """edgectl logs: the hub asks the connected edged over its Sync stream and relays the
    newest lines of its log about the workload; nothing of them is stored at the hub."""
    a = device("dev-a", {"site": "a"})
    push(hub, tmp_path, "det", "1.0.0")
    apply(hub, tmp_path, name="det", model="det", version="1.0.0", site="a")
    wait_for(lambda: serving(a, "det", "1.0.0"), 60, "dev-a to serve det 1.0.0")
    out = hub.edgectl("logs", "device/dev-a", "det", "--tail", "20", "-o", "json")
    events = [json.loads(line) for line in out.stdout.splitlines()]
    assert 0 < len(events) <= 20
    assert "replica ready" in [e["event"] for e in events], events
    assert all(e.get("replica", "det-").startswith("det-") for e in events)
    every = hub.edgectl("logs", "device/dev-a").stdout.splitlines()
    assert len(every) >= len(events)
    # for a person by default: TIME LEVEL EVENT key=value...
    shown = hub.edgectl("logs", "device/dev-a", "det", "--tail", "20").stdout.splitlines()
    assert any(re.match(r"\S+Z info +replica ready replica=det-", line) for line in shown), shown
    # a deployment's devices, each line with its device; -l; --since
    by_deployment = hub.edgectl("logs", "deployment/det", "--tail", "20").stdout.splitlines()
    assert by_deployment and all("[dev-a] " in line for line in by_deployment), by_deployment
    records = hub.edgectl("logs", "deployment/det", "-o", "json").stdout.splitlines()
    assert {json.loads(line)["device"] for line in records} == {"dev-a"}
    selected = hub.edgectl("logs", "-l", "site=a", "det", "-o", "json").stdout.splitlines()
    assert selected and all(json.loads(line)["workload"] == "det" for line in selected if
                            "workload" in json.loads(line))  # fmt: skip
    assert hub.edgectl("logs", "deployment/det", "--since", "1ms").stdout.strip() == ""


def test_logs_carry_what_the_workers_write_to_stderr(
    hub: HubProcess,
    device: Callable[..., Edged],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each worker's stderr is a pipe edged reads into a ring per replica: edgectl logs shows
    its lines with the replica named (``--tail``, ``-f``), kept across the worker's restart,
    and edged still forwards them to its own log. The worker here is a real one, writing
    with the test probe hook (one line on stderr when its model is loaded)."""
    monkeypatch.setenv(TEST_PROBE_ENV, json.dumps([{"open": "/nonexistent-edgefleet-probe"}]))
    a = device("dev-a", {"site": "a"})
    push(hub, tmp_path, "det", "1.0.0")
    apply(hub, tmp_path, name="det", model="det", version="1.0.0", site="a")
    wait_for(lambda: serving(a, "det", "1.0.0"), 60, "dev-a to serve det 1.0.0")

    def worker_lines(*args: str) -> list[dict[str, Any]]:
        """The probe's lines (onnxruntime may write a warning of its own too)."""
        out = hub.edgectl("logs", "device/dev-a", *args, "-o", "json").stdout.splitlines()
        events = [json.loads(line) for line in out]
        return [
            e
            for e in events
            if e["event"] == "worker output" and e["line"].startswith("worker test probe: ")
        ]

    lines = wait_for(lambda: worker_lines("det", "--tail", "100"), 30, "the worker's line")
    assert len(lines) == 1, lines
    first = lines[0]
    assert "nonexistent-edgefleet-probe" in first["line"]
    assert first["replica"].startswith("det-") and first["workload"] == "det"
    assert first["stream"] == "stderr" and first["ts"].endswith("Z")
    assert worker_lines("other-workload") == []
    assert len(hub.edgectl("logs", "device/dev-a", "det", "--tail", "1").stdout.splitlines()) == 1
    # forwarded to edged's own log (journald under systemd), replica named
    forwarded = [
        json.loads(line)
        for line in a.log_path.read_text().splitlines()
        if '"worker output"' in line and "worker test probe" in line
    ]
    assert forwarded and forwarded[0]["replica"] == first["replica"]
    assert forwarded[0]["line"] == first["line"]

    # -f: the next process of the slot writes its line; the follower prints it
    follower = subprocess.Popen(
        program_command("edgectl", "--config", hub.admin_config, "logs", "device/dev-a", "det",
                        "--tail", "5", "-f"),
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    followed: list[str] = []
    reader = threading.Thread(
        target=lambda: followed.extend(iter(follower.stdout.readline, "")),  # type: ignore[union-attr]
        daemon=True,
    )
    reader.start()
    try:
        wait_for(lambda: any("worker test probe" in line for line in followed), 30, "-f to start")
        (pid,) = a.worker_pids("det")
        os.kill(pid, signal.SIGKILL)
        wait_for(
            lambda: a.worker_pids("det") not in ([], [pid]) and serving(a, "det", "1.0.0"),
            90,
            "the replica to restart",
        )
        wait_for(
            lambda: sum("worker test probe" in line for line in followed) >= 2,
            30,
            "-f to print the new process's line",
        )
    finally:
        follower.terminate()
        follower.wait(30)
    # the slot's ring kept the first process's line across the restart
    again = worker_lines("det")
    assert len(again) == 2 and again[0] == first
    assert again[1]["replica"] == first["replica"]
