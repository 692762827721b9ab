"""sd_notify: the protocol pieces, the watchdog pinger on a loop the test blocks, and a real
``edged run`` under a test notify socket (READY after state and status socket, WATCHDOG while
healthy, STOPPING at SIGTERM)."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from asynctesting import async_test, eventually
from polltesting import wait_for
from systemdtesting import NotifySocket

from edged.state.desired import FORMAT
from edgefleet.notifying import Notifier, WatchdogPinger, socket_address, watchdog_interval


def test_socket_address_abstract_and_path() -> None:
    assert socket_address("@sd-notify") == "\0sd-notify"
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert socket_address("") is None
    assert socket_address("relative/path") is None


def test_watchdog_interval_is_half_of_watchdog_usec_for_this_pid_only() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}, 42) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "42"}, 42) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "7"}, 42) is None
    assert watchdog_interval({}, 42) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}, 42) is None
    assert watchdog_interval({"WATCHDOG_USEC": "soon"}, 42) is None


def test_without_notify_socket_nothing_is_sent() -> None:
    n = Notifier.from_environ({"WATCHDOG_USEC": "1000000"})
    assert not n.enabled
    assert n.watchdog_interval_s is None
    assert n.ready("x") is False


def test_datagrams_reach_the_socket(notify_socket: NotifySocket) -> None:
    n = Notifier.from_environ({"NOTIFY_SOCKET": notify_socket.env_value})
    assert n.ready("generation 3\nsecond line")
    notify_socket.wait_for("READY=1", 5)
    assert any("STATUS=generation 3 second line" in text for _, text in notify_socket.received())
    assert n.stopping()
    notify_socket.wait_for("STOPPING=1", 5)


def test_a_socket_nobody_listens_on_is_not_an_error(tmp_path: Path) -> None:
    n = Notifier(str(tmp_path / "gone.sock"))
    assert n.status("x") is False
    assert n.status("y") is False  # logged once, never raised


@async_test
async def test_watchdog_pings_stop_while_the_loop_is_stuck(notify_socket: NotifySocket) -> None:
    notifier = Notifier.from_environ(
        {"NOTIFY_SOCKET": notify_socket.env_value, "WATCHDOG_USEC": "100000"}
    )
    assert notifier.watchdog_interval_s == 0.05
    stop = asyncio.Event()
    task = asyncio.ensure_future(WatchdogPinger(notifier).run(stop))
    await eventually(lambda: notify_socket.count("WATCHDOG=1") >= 4, within=3)
    assert notify_socket.count("WATCHDOG=1") >= 4  # healthy: pings keep coming
    await asyncio.sleep(0.1)  # let the reader thread catch up with pings already sent
    stuck_from = time.monotonic()
    time.sleep(0.6)  # noqa: ASYNC251 - the point: the event loop is stuck on a blocking call
    stuck_until = time.monotonic()
    await asyncio.sleep(0.2)  # unstuck: pings resume
    stop.set()
    await task
    times = [t for t, text in notify_socket.received() if text == "WATCHDOG=1"]
    during = [t for t in times if stuck_from + 0.05 < t < stuck_until]
    assert during == [], f"pings while the loop was stuck: {during}"
    assert any(t >= stuck_until for t in times), "pings did not resume"


def _status_answers(sock_path: Path) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(2)
        s.connect(str(sock_path))
        conn = http.client.HTTPConnection("localhost")
        conn.sock = s
        conn.request("GET", "/v1/status")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        s.close()


def test_edged_run_notifies_ready_watchdog_and_stopping(
    tmp_path: Path, notify_socket: NotifySocket
) -> None:
    data = tmp_path / "data"
    config = tmp_path / "edged.toml"
    config.write_text(
        f'[discovery]\nenabled = false\n[trust]\nrootFile = "{tmp_path / "none.json"}"\n'
    )
    # persisted desired state from an earlier life: READY must come after it is loaded
    state = data / "state"
    state.mkdir(parents=True)
    desired = {"format": FORMAT, "generation": 7, "workloads": []}
    (state / "desired.json").write_text(json.dumps(desired))
    env = {
        **os.environ,
        "NOTIFY_SOCKET": notify_socket.env_value,
        "WATCHDOG_USEC": "400000",
    }
    env.pop("WATCHDOG_PID", None)
    log = tmp_path / "edged.log"
    cmd = [sys.executable, "-m", "edged", "run", "--data-dir", str(data), "--config", str(config)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=out,
            env=env,
        )
    try:
        ready_at = notify_socket.wait_for("READY=1", 30)
        # the status socket was up (and answers) when READY came
        assert (data / "edged.sock").exists()
        assert _status_answers(data / "edged.sock")
        ready = next(text for t, text in notify_socket.received() if t == ready_at)
        assert "STATUS=generation 7, 0 workloads" in ready.split("\n"), ready
        # no watchdog ping before READY: they come from the loop that is serving
        first_ping = notify_socket.wait_for("WATCHDOG=1", 5)
        assert first_ping >= ready_at
        # every 0.2 s while healthy
        wait_for(lambda: notify_socket.count("WATCHDOG=1") >= 5, 10, "5 watchdog pings")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
        notify_socket.wait_for("STOPPING=1", 5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_hub_serve_notifies_ready_once_listening(
    tmp_path: Path, notify_socket: NotifySocket
) -> None:
    hub_dir = tmp_path / "hub"
    subprocess.run(
        [sys.executable, "-m", "hub", "init", "--data-dir", str(hub_dir)],
        check=True,
        capture_output=True,
    )
    env = {**os.environ, "NOTIFY_SOCKET": notify_socket.env_value, "WATCHDOG_USEC": "400000"}
    env.pop("WATCHDOG_PID", None)
    log = tmp_path / "hub.log"
    cmd = [sys.executable, "-m", "hub", "serve", "--data-dir", str(hub_dir)]
    cmd += ["--listen", "127.0.0.1:0", "--enroll-listen", "127.0.0.1:0"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, env=env)
    try:
        ready_at = notify_socket.wait_for("READY=1", 30)
        assert "hub serving region" in log.read_text()  # printed once the server listens
        assert notify_socket.wait_for("WATCHDOG=1", 5) >= ready_at
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
        notify_socket.wait_for("STOPPING=1", 5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_listen_fds_for_this_pid_only() -> None:
    from edgefleet.notifying import listen_fds

    env = {"LISTEN_PID": "42", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "inference:status"}
    assert listen_fds(env, 42) == [("inference", 3), ("status", 4)]
    assert listen_fds(env, 7) == []
    assert listen_fds({**env, "LISTEN_FDS": "many"}, 42) == []
    assert listen_fds({**env, "LISTEN_FDNAMES": ""}, 42) == [("unknown", 3), ("unknown", 4)]
    assert len(listen_fds({**env, "LISTEN_FDS": "100000"}, 42)) == 64  # bounded


def test_store_fd_sends_the_descriptor_with_its_name(tmp_path: Path) -> None:
    import array

    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(path))
        r, w = os.pipe()
        try:
            assert Notifier(str(path)).store_fd("inference", r)
            removed = server.recv(1024)
            msg, anc, _, _ = server.recvmsg(1024, socket.CMSG_SPACE(4))
        finally:
            os.close(r)
        assert removed == b"FDSTOREREMOVE=1\nFDNAME=inference"
        assert msg == b"FDSTORE=1\nFDNAME=inference"
        fds = array.array("i")
        fds.frombytes(anc[0][2])
        os.write(w, b"x")
        assert os.read(fds[0], 1) == b"x"  # the very pipe
        os.close(fds[0])
        os.close(w)
    assert not Notifier(None).store_fd("inference", 0)
