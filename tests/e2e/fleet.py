"""A real hub process, enrolled edged devices and a loopback TCP proxy that can be cut.

Used by the hub scenarios: ``hub init`` and ``hub serve`` run as real processes on free
loopback ports with real certificates; ``edgectl`` runs as a real process against them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from edgefleet.launching import LaunchedHub, LaunchError, free_port_pair, program_command, start_hub

SIGNED_DEVICE_CONFIG = """\
[trust]
rootFile = "{absent}"

[discovery]
healthPeriod = "2s"
"""

MEASURED_DEVICE_CONFIG = SIGNED_DEVICE_CONFIG + '\n[inference]\nmetricsPeriod = "1s"\n'
"""A device that reports its figures every second (what a canary's analysis reads)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HubProcess:
    """``env``, ``cwd``: what its programs (hub, edgectl) run with; a previous release's come
    from tests/releasetesting.py."""

    def __init__(
        self,
        data: Path,
        log: Path,
        *,
        port: int | None = None,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.data = data
        self.log = log
        self.port = port or free_port_pair()
        self.env = env
        self.cwd = cwd
        self.launched: LaunchedHub | None = None  # the latest ``hub serve``
        self.root_pin = ""  # the hub's trust root pin, printed with each token

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def admin_config(self) -> Path:
        return self.data / "admin.toml"

    def init(self, *extra: str) -> HubProcess:
        out = subprocess.run(
            program_command(
                "hub", "init", "--data-dir", self.data, "--hub-address", self.address, *extra
            ),
            capture_output=True, text=True, check=True, timeout=60, env=self.env, cwd=self.cwd,
        )  # fmt: skip
        assert "bootstrap token" in out.stdout, out.stdout + out.stderr
        return self

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.launched.process if self.launched is not None else None

    def start(self) -> HubProcess:
        self.launched = start_hub(
            self.data, listen=self.address, log=self.log, env=self.env, cwd=self.cwd
        )
        try:
            self.launched.wait_listening(30)
        except LaunchError as exc:
            raise AssertionError(str(exc)) from None
        return self

    def kill9(self) -> None:
        assert self.launched is not None
        self.launched.kill()

    def stop(self) -> None:
        if self.launched is not None:
            self.launched.stop(15)

    def token(self, *extra: str) -> tuple[str, str]:
        """A new bootstrap token and the CA pin."""
        out = subprocess.run(
            program_command("hub", "token", "create", "--data-dir", self.data, *extra),
            capture_output=True, text=True, check=True, timeout=60, env=self.env, cwd=self.cwd,
        )  # fmt: skip
        pin = out.stderr.split("CA hash ")[1].strip()
        self.root_pin = out.stderr.split("root hash ")[1].split(";")[0]
        return out.stdout.strip(), pin

    def edgectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            program_command("edgectl", "--config", self.admin_config, *args),
            check=False, capture_output=True, text=True, timeout=120, env=self.env, cwd=self.cwd,
        )  # fmt: skip
        if check and out.returncode != 0:
            raise AssertionError(f"edgectl {' '.join(args)}: {out.stdout}{out.stderr}")
        return out


def enroll(
    hub: HubProcess,
    data: Path,
    name: str,
    labels: dict[str, str],
    *,
    via: str | None = None,
    config: Path | None = None,
    token_labels: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``edged enroll``; ``labels``: the device asks for them (``--label``); ``token_labels``:
    its bootstrap token sets them (the only labels a Secret follows); ``config``: an
    edged.toml to read (``[trust] tpm`` selects a TPM); ``env``, ``cwd``: what edged runs
    with (a previous release's)."""
    token, pin = hub.token(*(f"--label={k}={v}" for k, v in (token_labels or {}).items()))
    cmd = program_command("edged", "enroll", "--hub", via or hub.address, "--ca-hash", pin,
                          "--root-hash", hub.root_pin, "--data-dir", data, "--name", name,
                          "--enroll-address", f"127.0.0.1:{hub.port + 1}")  # fmt: skip
    if config is not None:
        cmd += ["--config", str(config)]
    for k, v in labels.items():
        cmd += ["--label", f"{k}={v}"]
    env = {**(env or os.environ), "EDGED_TOKEN": token}  # as edged-enroll.service passes it
    return subprocess.run(
        cmd, check=False, capture_output=True, text=True, timeout=60, env=env, cwd=cwd
    )


@contextmanager
def enrolled_devices(
    hub: HubProcess,
    tmp_path: Path,
    edged_factory: Callable[..., Any],
    count: int,
    config: str = SIGNED_DEVICE_CONFIG,
) -> Iterator[list[Any]]:
    """``count`` devices ``dev-0``... enrolled with ``site=a`` and started (harness.Edged);
    the ones still running are terminated at the end."""
    started = []
    for i in range(count):
        data = tmp_path / f"dev-{i}"
        out = enroll(hub, data, f"dev-{i}", {"site": "a"})
        assert out.returncode == 0, out.stdout + out.stderr
        device_config = config.format(absent=tmp_path / "no-root")
        started.append(edged_factory(None, data=data, config=device_config).start())
    try:
        yield started
    finally:
        for e in started:
            if e.proc is not None and e.proc.poll() is None:
                e.terminate()


class TcpProxy:
    """Forwards 127.0.0.1:port to a target; ``cut()`` drops every connection and refuses new
    ones (a network partition), ``heal()`` accepts again on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._open()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _open(self) -> None:
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", self.port))
        ls.listen(64)
        self._listener = ls
        threading.Thread(target=self._accept, args=(ls,), daemon=True).start()

    def _accept(self, ls: socket.socket) -> None:
        while True:
            try:
                client, _ = ls.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            threading.Thread(target=self._carry, args=(client, upstream), daemon=True).start()

    def _carry(self, client: socket.socket, upstream: socket.socket) -> None:
        """Both ways; once both directions stop, both sockets are closed and forgotten (kept
        until the next cut, a long-lived proxy held two descriptors per connection it ever
        carried, docs/soak.md, defects)."""
        back = threading.Thread(target=self._pump, args=(upstream, client), daemon=True)
        back.start()
        self._pump(client, upstream)
        back.join()
        with self._lock:
            self._conns = [s for s in self._conns if s is not client and s is not upstream]
        client.close()
        upstream.close()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        if self._listener is not None:
            try:  # wakes the thread blocked in accept(), which then lets go of the port
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def heal(self) -> None:
        if self._listener is None:
            self._open()

    def close(self) -> None:
        self.cut()


def pids_of_workers(edged_pid: int) -> set[int]:
    import psutil

    try:
        return {c.pid for c in psutil.Process(edged_pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def set_device_timers(hub: HubProcess, **values: str) -> None:
    """Set ``[devices]`` timers in the hub's hub.toml (``heartbeatGrace="3s"``...)."""
    toml = hub.data / "hub.toml"
    lines = toml.read_text().splitlines()
    for key, value in values.items():
        lines = [f'{key} = "{value}"' if line.startswith(f"{key} =") else line for line in lines]
    toml.write_text("\n".join(lines) + "\n")


RESCHEDULE_AFTER = 4.0
"""``devices.rescheduleAfter`` with :func:`quick_rescheduling`, in seconds."""


def quick_rescheduling(hub: HubProcess) -> None:
    """Heartbeats every 1 s, a device late after 3 s, and a silent device's replicas moved
    after :data:`RESCHEDULE_AFTER` (set in hub.toml before the hub starts)."""
    set_device_timers(
        hub,
        heartbeatInterval="1s",
        heartbeatGrace="3s",
        rescheduleAfter=f"{RESCHEDULE_AFTER:g}s",
    )
