"""Slots for the launcher's tests: small fake edged packages (``lib/edged/__main__.py``) whose
behaviour a test picks, a real launcher process (``python -m edged.launcher``) over them.

A fake edged records each start in ``D/runs.jsonl`` (slot, trial, pid, the descriptors it was
handed) and then does what its slot's ``behaviour`` says: ``serve`` (READY=1, WATCHDOG=1, runs
until SIGTERM), ``commit`` (the same, and EDGED_COMMIT=1), ``crash`` (exits 3 at once),
``store-fd`` (stores a pipe with FDSTORE=1 and serves), ``request`` (writes request.json
from ``D/next-request.json`` and exits: what edged does to ask for a trial).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from polltesting import wait_for

ROOT = Path(__file__).resolve().parents[2]

FAKE_EDGED = r"""
import json, os, signal, socket, sys, time

args = sys.argv[1:]
data = args[args.index("--data-dir") + 1]
here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
behaviour = open(os.path.join(here, "behaviour")).read().strip()


def notify(*lines, fds=()):
    addr = os.environ.get("NOTIFY_SOCKET", "")
    addr = "\0" + addr[1:] if addr.startswith("@") else addr
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        payload = "\n".join(lines).encode()
        if fds:
            rights = b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds)
            s.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)], 0, addr)
        else:
            s.sendto(payload, addr)


names = os.environ.get("LISTEN_FDNAMES", "")
mine = os.environ.get("LISTEN_PID") == str(os.getpid())
listen = int(os.environ.get("LISTEN_FDS", "0")) if mine else 0
received = []
for i in range(listen):
    try:
        received.append(os.read(3 + i, 100).decode())
    except OSError as exc:
        received.append(f"error {exc}")
with open(os.path.join(data, "runs.jsonl"), "a") as f:
    f.write(json.dumps({
        "slot": os.environ.get("EDGED_SLOT"), "trial": os.environ.get("EDGED_TRIAL"),
        "pid": os.getpid(), "behaviour": behaviour, "fdnames": names, "fdcontent": received,
        "watchdog": os.environ.get("WATCHDOG_USEC", ""),
    }) + "\n")
if behaviour == "crash":
    sys.exit(3)
if behaviour == "request":
    req = open(os.path.join(data, "next-request.json")).read()
    tmp = os.path.join(data, "agent", ".request.tmp")
    with open(tmp, "w") as f:
        f.write(req)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(data, "agent", "request.json"))
    os.remove(os.path.join(data, "next-request.json"))
    sys.exit(0)
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
if behaviour == "store-fd":
    r, w = os.pipe()
    os.write(w, b"kept across edged")
    notify("FDSTORE=1", "FDNAME=inference", fds=[r])
notify("READY=1", "STATUS=fake edged serving")
if behaviour == "commit":
    notify("EDGED_COMMIT=1")
if behaviour == "hang":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(1)
while not stop:
    if behaviour != "silent":
        notify("WATCHDOG=1")
    time.sleep(0.05)
sys.exit(0)
"""


# the launcher on a kernel without pidfd_open (before 5.3: Jetson's 4.9, say)
NO_PIDFD = (
    "import os, runpy, sys\n"
    "def no(pid): raise OSError(38, 'Function not implemented')\n"
    "os.pidfd_open = no\n"
    "sys.argv[0] = 'edged-launcher'\n"
    "runpy.run_module('edged.launcher', run_name='__main__', alter_sys=True)\n"
)


def install_fake(root: Path, version: str, behaviour: str, *, complete: bool = True) -> Path:
    """A fake edged tree at ``root`` (a slot, or the package's lib's parent)."""
    pkg = root / "lib" / "edged"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(FAKE_EDGED)
    (root / "behaviour").write_text(behaviour)
    (root / "release.json").write_text(json.dumps({"format": 1, "version": version}))
    if complete:
        (root / "installed.json").write_text(json.dumps({"version": version}))
    return root


def install_slot(data: Path, slot: str, version: str, behaviour: str, **kw: Any) -> Path:
    return install_fake(data / "agent" / "slots" / slot, version, behaviour, **kw)


def set_behaviour(root: Path, behaviour: str) -> None:
    (root / "behaviour").write_text(behaviour)


def state(data: Path) -> dict[str, Any]:
    return json.loads((data / "agent" / "launcher.json").read_text())


def runs(data: Path) -> list[dict[str, Any]]:
    path = data / "runs.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_request(data: Path, doc: dict[str, Any]) -> None:
    (data / "agent").mkdir(parents=True, exist_ok=True)
    (data / "agent" / "request.json").write_text(json.dumps(doc))


def try_request(slot: str, version: str, **kw: Any) -> dict[str, Any]:
    return {
        "action": "try",
        "id": f"{slot}-{version}-{time.monotonic_ns()}",
        "slot": slot,
        "version": version,
        "maxTries": 3,
        "commitDeadlineSeconds": 30,
        **kw,
    }


class LauncherProcess:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill_everything(self) -> None:
        """A power cut: kill -9 of the launcher and every process it started."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)


@contextmanager
def launcher(
    data: Path,
    package: Path,
    *,
    env: dict[str, str] | None = None,
    extra: list[str] | None = None,
    no_pidfd: bool = False,
) -> Iterator[LauncherProcess]:
    """A real ``edged-launcher`` process in a process group of its own (a power cut kills it
    all), over the fake slots under ``data`` and the fake package at ``package``."""
    data.mkdir(parents=True, exist_ok=True)
    log = data / f"launcher-{time.monotonic_ns()}.log"
    full_env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        **(env or {}),
    }
    full_env.pop("NOTIFY_SOCKET", None) if env is None or "NOTIFY_SOCKET" not in env else None
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                *(["-c", NO_PIDFD] if no_pidfd else ["-m", "edged.launcher"]),
                f"--launcher-package-path={package / 'lib'}",
                "--launcher-restart-delay=0.1",
                "--launcher-stop-timeout=5",
                *(extra or []),
                "run",
                "--data-dir",
                str(data),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,
        )
    lp = LauncherProcess(proc, log)
    try:
        yield lp
    finally:
        if proc.poll() is None:
            lp.kill_everything()


def wait_runs(data: Path, count: int, timeout: float = 20.0) -> list[dict[str, Any]]:
    return wait_for(
        lambda: len(runs(data)) >= count and runs(data),
        timeout,
        f"{count} edged starts",
        detail=lambda: json.dumps(runs(data)),
    )
