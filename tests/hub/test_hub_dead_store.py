"""A real ``hub serve`` whose disk refuses every write exits non-zero, and starts again after.

The store dies the way a full disk kills it: the test lowers the running hub's file size limit
(``RLIMIT_FSIZE``, which binds root too) to one byte, so every SQLite write fails with a disk
I/O error while reads still work. The writer retries for ``hub.state.batchloop.GIVE_UP_AFTER``
seconds, then the supervisor's quick restarts fail too and it gives up: about 50 s in all.
"""

from __future__ import annotations

import asyncio
import resource
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import polltesting
import pytest
from hubserving import client_credentials

from edgefleet.launching import free_port_pair
from edgefleet.v1 import admin_pb2, admin_pb2_grpc
from hub import pki
from hub.decide.devices import Device
from hub.initializing import HubPaths
from hub.state import storekeys
from hub.state.store import SqliteStore

pytestmark = [
    pytest.mark.scenario,
    pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="needs prlimit (Linux)"),
]

HUB = [sys.executable, "-m", "hub"]


class Hub:
    """``hub serve`` with its output (stdout and stderr) read by a thread: no file to write,
    since the file size limit would refuse the log lines too."""

    def __init__(self, data: Path, port: int) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [*HUB, "serve", "--data-dir", str(data), "--listen", f"127.0.0.1:{port}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        wait_for(lambda: any("hub serving" in line for line in self.lines), 30, "the hub")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def output(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
        self._reader.join(5)
        return code


def wait_for(predicate: Callable[[], bool], within: float, what: str) -> None:
    polltesting.wait_for(predicate, within, what, tolerate=())


def stored(db: Path, key: str) -> bytes | None:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        row = conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
    return bytes(row[0]) if row else None


async def seed_device(db: Path, device: Device) -> None:
    store = await SqliteStore.open(db)
    try:
        await store.put(storekeys.device_key(device.name), storekeys.dumps(device.to_json()))
    finally:
        await store.close()


def cordon(paths: HubPaths, port: int, name: str) -> grpc.StatusCode:
    admin = pki.load_certified_key(paths.admin_certificate, paths.admin_key)
    with grpc.secure_channel(f"127.0.0.1:{port}", client_credentials(paths, admin)) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        try:
            stub.Cordon(admin_pb2.CordonRequest(device_name=name), timeout=30)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def test_a_hub_whose_disk_refuses_writes_exits_non_zero_then_starts_again(
    tmp_path: Path,
) -> None:
    data = tmp_path / "hub"
    port = free_port_pair()
    init = subprocess.run(
        [*HUB, "init", "--data-dir", str(data), "--hub-address", f"127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert init.returncode == 0, init.stderr
    paths = HubPaths.of(data)
    db = paths.data_dir / "hub.db"
    asyncio.run(seed_device(db, Device("cam-1")))

    hub = Hub(data, port)
    try:
        wait_for(lambda: stored(db, storekeys.desired_key("cam-1")) is not None, 10, "projection")
        _, hard = resource.prlimit(hub.proc.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(hub.proc.pid, resource.RLIMIT_FSIZE, (1, hard))  # the disk is "full"

        assert cordon(paths, port, "cam-1") is grpc.StatusCode.UNAVAILABLE  # refused, honestly
        started = time.monotonic()
        code = hub.wait(120)
    finally:
        if hub.proc.poll() is None:
            hub.proc.kill()
            hub.proc.wait(5)
    output = hub.output()
    assert code == 1, output[-3000:]
    assert "component 'device-writer' failed" in output and "giving up" in output, output[-3000:]
    assert "disk I/O error" in output
    assert time.monotonic() - started < 90

    # systemd starts it again, with a clean slate; the store is whole (the cordon never landed)
    again = Hub(data, port)
    try:
        value = stored(db, storekeys.device_key("cam-1"))
        assert value is not None and Device.from_json(storekeys.loads(value)) == Device("cam-1")
    finally:
        again.proc.terminate()
    assert again.wait(30) == 0, again.output()[-3000:]
