"""A fleet that updates its edged, all real processes (issue 32, tests/e2e/test_agent_upgrade.py):
``hub init`` and ``hub serve``; releases built by ``packaging/agent/build-release`` (from this
checkout, or from a copy of it with one file broken) and pushed with ``edgectl agent push``;
devices enrolled with ``edged enroll``, each run by the real ``edged-launcher`` and serving a
signed model with a real ONNX Runtime worker; a client per device that keeps sending requests
(one retry each, as a client of an edged that restarts would) and counts what failed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from agentreleasetesting import build_release
from brokenreleases import build_broken
from fleet import SIGNED_DEVICE_CONFIG, HubProcess, enroll
from harness import wait_for

from edgefleet.devicestatus import fetch_status, send_request
from edgefleet.inference import infer_path, infer_request_body
from edgefleet.versioning import installed_version

REPO = Path(__file__).resolve().parents[2]
OLD = installed_version()
_MAJOR, _MINOR, _PATCH = (int(x) for x in OLD.split(".")[:3])


def patch_version(n: int) -> str:
    """This release's version ``n`` patches later (inside the hub's window)."""
    return f"{_MAJOR}.{_MINOR}.{_PATCH + n}"


DEVICE_CONFIG = SIGNED_DEVICE_CONFIG + '[workers]\nkeepOnExit = true\norphanTimeout = "5m"\n'
X = np.ones((1, 64), dtype=np.float32)
BODY = infer_request_body({"input": X})

UPGRADE = """\
apiVersion: edgefleet.io/v1
kind: AgentUpgrade
metadata: {{name: {name}}}
spec:
  version: "{version}"
  selector: {{matchLabels: {{site: retail}}}}
  rollout:
    maxUnavailable: {unavailable}
    progressDeadlineSeconds: {progress}
    canary: {{steps: [{steps}]}}
  commit: {{deadlineSeconds: {deadline}, maxTries: {tries}}}
"""


def upgrade_yaml(
    version: str,
    *,
    name: str = "edged-next",
    steps: str = "33%, 100%",
    deadline: int = 60,
    tries: int = 2,
    progress: int = 300,
    unavailable: int = 1,
) -> str:
    """An AgentUpgrade of the ``site=retail`` devices; ``steps`` 33% of three: one canary."""
    return UPGRADE.format(
        name=name, version=version, steps=steps, deadline=deadline, tries=tries,
        progress=progress, unavailable=unavailable,
    )  # fmt: skip


# -- releases ---------------------------------------------------------------------------------
def build(tmp: Path, version: str, broken: str | None = None) -> Path:
    """``build-release`` of this checkout as ``version`` (``broken``: a key of BROKEN)."""
    out = tmp / f"edged-{version}{'-' + broken if broken else ''}.tar.gz"
    if broken is None:
        return build_release(out, version)
    return build_broken(tmp, out, version, broken)


def push(hub: HubProcess, release: Path, version: str) -> None:
    out = hub.edgectl("agent", "push", str(release), "--version", version, check=False)
    assert out.returncode == 0 and "pushed" in out.stdout, out.stdout + out.stderr


# -- a device under the launcher ----------------------------------------------------------------
class LaunchedDevice:
    """``edged-launcher run`` for an enrolled data directory, and a client of its sockets."""

    def __init__(self, name: str, data: Path, config: Path, log: Path) -> None:
        self.name, self.data, self.config, self.log = name, data, config, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LaunchedDevice:
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        env["PYTHONPATH"] = str(REPO)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "edged.launcher", "--launcher-restart-delay=0.2", "run",
                 "--data-dir", str(self.data), "--config", str(self.config)],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.data.parent,
                start_new_session=True,
            )  # fmt: skip
        return self

    # what it says
    def status(self) -> dict[str, Any]:
        return fetch_status(self.data / "edged.sock")

    def agent(self) -> dict[str, Any]:
        try:
            return dict(self.status().get("agent") or {})
        except (OSError, ValueError):
            return {}

    def launcher(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.data / "agent" / "launcher.json").read_text()))
        except (OSError, ValueError):
            return {}

    def committed(self) -> str:
        return str(self.launcher().get("committedVersion", ""))

    def worker_pids(self, workload: str = "det") -> list[int]:
        for w in self.status().get("workloads", []):
            if w["name"] == workload:
                return sorted(r["pid"] for r in w["replicas"] if r.get("pid"))
        return []

    def serving(self, workload: str = "det") -> bool:
        try:
            for w in self.status().get("workloads", []):
                if w["name"] == workload:
                    return bool(w.get("readyReplicas", 0) >= 1)
        except (OSError, ValueError):
            pass
        return False

    def infer(self, timeout: float = 10.0) -> int:
        status, _, _ = send_request(
            self.data / "infer.sock", "POST", infer_path("det"), BODY, timeout=timeout
        )
        return status

    def edged_pids(self) -> list[int]:
        """The launcher's children that run edged (not the workers: their own sessions)."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        try:
            return [c.pid for c in psutil.Process(self.proc.pid).children()]
        except psutil.NoSuchProcess:
            return []

    def logs(self) -> str:
        try:
            return f"--- {self.name} ---\n" + self.log.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    # how it ends
    def kill9(self) -> None:
        """The launcher and its edged killed at once (what a power cut does to them; the
        workers, in sessions of their own, stay: a real power cut takes them too)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_workers(data: Path) -> None:
    """Every process whose command line names ``data`` and is no launcher or edged left: the
    kept workers of a device, at the end of a test."""
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(str(data) in a for a in (p.info["cmdline"] or [])) or _worker_of(p, data):
                p.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue


def _worker_of(p: psutil.Process, data: Path) -> bool:
    try:
        return str(data) in (p.cwd() or "")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


# -- clients that keep asking --------------------------------------------------------------------
class Load:
    """A request to each device every ``period`` seconds, one retry each (after 0.2 s):
    requests sent, failed (both tries), and the longest time a device went without an answer."""

    def __init__(self, devices: list[LaunchedDevice], period: float = 0.1) -> None:
        self.devices, self.period = devices, period
        self.sent = dict.fromkeys((d.name for d in devices), 0)
        self.failed = dict.fromkeys((d.name for d in devices), 0)
        self.errors: list[str] = []
        self.gap = dict.fromkeys((d.name for d in devices), 0.0)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(d,), daemon=True)
                         for d in devices]  # fmt: skip

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def _one(self, d: LaunchedDevice) -> str:
        try:
            status = d.infer()
        except (OSError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return "" if status == 200 else f"HTTP {status}"

    def _run(self, d: LaunchedDevice) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.period):
            self.sent[d.name] += 1
            problem = self._one(d)
            if problem:
                time.sleep(0.2)
                problem = self._one(d)
            now = time.monotonic()
            if problem:
                self.failed[d.name] += 1
                if len(self.errors) < 20:
                    self.errors.append(f"{d.name}: {problem}")
            else:
                self.gap[d.name] = max(self.gap[d.name], now - last)
                last = now

    def summary(self) -> str:
        return ", ".join(
            f"{n}: {self.failed[n]}/{self.sent[n]} failed, longest gap {self.gap[n]:.1f} s"
            for n in self.sent
        )


# -- the fleet --------------------------------------------------------------------------------
class Fleet:
    """A real hub with ``det`` 1.0.0 pushed and deployed to ``site=retail``, and devices
    ``r0``, ``r1``... enrolled with it, each under its own launcher."""

    def __init__(self, tmp: Path, size: int = 3) -> None:
        self.tmp = tmp
        self.hub = HubProcess(tmp / "hub", tmp / "hub.log").init().start()
        self.devices: list[LaunchedDevice] = []
        self.size = size

    def start(self) -> Fleet:
        from hubfleettesting import apply as apply_deployment
        from hubfleettesting import push as push_model

        push_model(self.hub, self.tmp, "det", "1.0.0")
        apply_deployment(
            self.hub, self.tmp, name="det", model="det", version="1.0.0", site="retail"
        )
        config = self.tmp / "edged.toml"
        config.write_text(DEVICE_CONFIG.format(absent=self.tmp / "no-root"))
        for i in range(self.size):
            name = f"r{i}"
            out = enroll(self.hub, self.tmp / name, name, {"site": "retail"})
            assert out.returncode == 0, out.stdout + out.stderr
            device = LaunchedDevice(name, self.tmp / name, config, self.tmp / f"{name}.log")
            self.devices.append(device.start())
        for d in self.devices:
            wait_for(d.serving, 180, f"{d.name} serving det", interval=0.5, detail=self.logs)
        return self

    def device(self, name: str) -> LaunchedDevice:
        return next(d for d in self.devices if d.name == name)

    def logs(self) -> str:
        return "\n".join(d.logs() for d in self.devices) + "\n--- hub ---\n" + self.hub_log()

    def hub_log(self) -> str:
        try:
            return self.hub.log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    # the hub's side
    def apply(self, text: str) -> None:
        doc = self.tmp / "upgrade.yaml"
        doc.write_text(text)
        out = self.hub.edgectl("apply", "-f", str(doc), check=False)
        assert out.returncode == 0, out.stdout + out.stderr

    def upgrade(self, name: str = "edged-next") -> dict[str, Any]:
        out = self.hub.edgectl("get", "agentupgrade", name, "-o", "json", check=False)
        return dict(json.loads(out.stdout).get("status", {})) if out.returncode == 0 else {}

    def wait_phase(self, phase: str, timeout: float, name: str = "edged-next") -> dict[str, Any]:
        found: dict[str, Any] = wait_for(
            lambda: (s := self.upgrade(name)).get("phase") == phase and s,
            timeout,
            f"the upgrade {phase}",
            interval=0.5,
            detail=lambda: f"{self.upgrade(name)}\n{self.logs()}",
        )
        return found

    def agent_column(self) -> dict[str, str]:
        """``get devices -o wide``: each device's AGENT column."""
        lines = self.hub.edgectl("get", "devices", "-o", "wide").stdout.splitlines()
        header = lines[0].split()
        at = header.index("AGENT")
        return {cols[0]: cols[at] for line in lines[1:] if len(cols := line.split()) > at}

    def events(self, kind: str = "AgentUpgrade") -> list[dict[str, Any]]:
        doc = json.loads(self.hub.edgectl("get", "events", "-o", "json").stdout)
        items = doc["items"] if isinstance(doc, dict) else doc
        return [e for e in items if e.get("object", {}).get("kind") == kind]

    def stop(self) -> None:
        for d in self.devices:
            d.stop()
        for d in self.devices:
            kill_workers(d.data)
        self.hub.stop()


def timed_commits(
    fleet: Fleet,
    version: str,
    timeout: float,
    *,
    since: float | None = None,
    each: Callable[[dict[str, float]], None] | None = None,
) -> dict[str, float]:
    """Seconds from ``since`` (a monotonic time; now by default) to each device's
    launcher.json committing ``version``; ``each(done so far)`` is called at every look (to
    check what must hold meanwhile)."""
    start, done = time.monotonic() if since is None else since, {}

    def all_done() -> bool:
        for d in fleet.devices:
            if d.name not in done and d.committed() == version:
                done[d.name] = time.monotonic() - start
        if each is not None:
            each(done)
        return len(done) == len(fleet.devices)

    wait_for(all_done, timeout, f"every device committed {version}", interval=0.2,
             detail=fleet.logs)  # fmt: skip
    return done


def poll(cond: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """``cond()`` until it is truthy (its value) or ``timeout`` (None): for racing a step."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            value = cond()
        except (OSError, ValueError):
            value = None
        if value:
            return value
        time.sleep(interval)
    return None
