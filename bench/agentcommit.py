"""Seconds from a device receiving an edged release to its commit (issue 32). Not a test.

Method (/work/shared/BENCHMARKS.md: a baseline measured in the same run): a real
``edged-launcher`` runs a real edged with one tiny ONNX model from static manifests (no hub:
its fetch is bench/agentrelease.py's). Releases are built by ``packaging/agent/build-release``
from this checkout beforehand, so "received" is the verified tarball on disk, as the fetch
leaves it. Each repetition:

* **update**: install into the inactive slot (edged.agent.installing), smoke test (the new
  slot's ``edged check``), the switch as the agent controller asks it (request.json, edged
  exits), the new edged's start, its workload serving again, its commit in launcher.json;
  each part timed;
* **baseline, restart**: the same edged stopped and started again by the launcher (a request
  for the slot already committed is refused, so: the launcher killed and started again, as
  systemd restarts it), until the workload serves again.

The ratio is update / restart: what an update costs over the restart it cannot avoid.

Workers are kept across edged and adopted by the next one (the default under the launcher);
``--stop-workers``: they stop with each edged and start again.

    .venv/bin/python bench/agentcommit.py [--reps 3] [--stop-workers] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from common import median  # noqa: E402

from edged.agent.installing import install_release  # noqa: E402
from edged.agent.smoketesting import smoke_test  # noqa: E402
from edged.hublink.agentreleases import VerifiedRelease  # noqa: E402
from edgefleet.demo import TINY_MLP, build_mlp  # noqa: E402
from edgefleet.devicestatus import fetch_status  # noqa: E402
from edgefleet.trust.agentreleases import this_platform  # noqa: E402

MANIFEST = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {name: mlp}
spec:
  model: {name: mlp, version: "1.0.0", path: mlp.onnx}
  runtime: {executionProviders: [CPUExecutionProvider]}
  resources: {cpu: 500m, memory: 1Gi}
  probes:
    startup: {timeoutSeconds: 60}
    readiness: {periodSeconds: 0.2, timeoutSeconds: 1}
"""


def build(version: str, out: Path) -> VerifiedRelease:
    subprocess.run(
        [sys.executable, str(REPO / "packaging" / "agent" / "build-release"),
         "--version", version, "--out", str(out)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    data = out.read_bytes()
    plat = this_platform()
    return VerifiedRelease(out, version, plat.arch, plat.python_abi,
                           hashlib.sha256(data).hexdigest(), len(data))  # fmt: skip


def wait(cond: Any, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if cond():
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting for {what}")


class Device:
    def __init__(self, tmp: Path, *, keep_workers: bool) -> None:
        self.tmp, self.data = tmp, tmp / "d"
        self.manifests = tmp / "manifests"
        self.manifests.mkdir()
        build_mlp(self.manifests / "mlp.onnx", TINY_MLP, seed=1)
        (self.manifests / "mlp.yaml").write_text(MANIFEST)
        self.config = tmp / "edged.toml"
        self.config.write_text(
            f'[trust]\nallowUnsigned = true\nrootFile = "{tmp / "absent.json"}"\n'
            f"[workers]\nkeepOnExit = {'true' if keep_workers else 'false'}\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        env["PYTHONPATH"] = str(REPO)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edged.launcher", "run", "--data-dir", str(self.data),
             "--manifests", str(self.manifests), "--config", str(self.config)],
            stdout=subprocess.DEVNULL, stderr=open(self.tmp / "launcher.log", "ab"),  # noqa: SIM115
            env=env, cwd=self.tmp, start_new_session=True,
        )  # fmt: skip

    def kill(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def serving(self) -> bool:
        doc = fetch_status(str(self.data / "edged.sock"))
        return any(
            w["name"] == "mlp" and any(r.get("ready") for r in w.get("replicas", []))
            for w in doc.get("workloads", [])
        ) and not doc.get("draining", False)

    def edged_pid(self) -> int:
        import psutil

        assert self.proc is not None
        return next(c.pid for c in psutil.Process(self.proc.pid).children())

    def state(self) -> dict[str, Any]:
        return json.loads((self.data / "agent" / "launcher.json").read_text())


def update(dev: Device, release: VerifiedRelease, slot: str) -> dict[str, float]:
    t0 = time.monotonic()
    installed = install_release(release, dev.data, slot)
    t1 = time.monotonic()
    asyncio.run(smoke_test(installed.root, release.version, data_dir=dev.data,
                           config_path=dev.config))  # fmt: skip
    t2 = time.monotonic()
    request = {"action": "try", "id": f"{release.version}-{time.time_ns()}", "slot": slot,
               "version": release.version, "maxTries": 3, "commitDeadlineSeconds": 120,
               "context": {"servedBefore": ["mlp"]}}  # fmt: skip
    path = dev.data / "agent" / "request.json"
    path.with_suffix(".tmp").write_text(json.dumps(request))
    path.with_suffix(".tmp").replace(path)
    os.kill(dev.edged_pid(), signal.SIGTERM)
    wait(lambda: dev.state()["committedVersion"] == release.version, 120, "the commit")
    t3 = time.monotonic()
    return {"install": t1 - t0, "smoke": t2 - t1, "switch_to_commit": t3 - t2, "total": t3 - t0}


def restart(dev: Device) -> float:
    t0 = time.monotonic()
    dev.kill()
    dev.start()
    wait(dev.serving, 120, "serving after the restart")
    return time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--stop-workers",
        action="store_true",
        help="workers stop with each edged (keepOnExit = false) instead of being adopted",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agentcommit-") as tmp_text:
        tmp = Path(tmp_text)
        releases = [build(f"9.0.{i + 1}", tmp / f"r{i}.tar.gz") for i in range(args.reps)]
        print(f"release: {releases[0].length / 1e6:.2f} MB (.tar.gz)")
        dev = Device(tmp, keep_workers=not args.stop_workers)
        updates: list[dict[str, float]] = []
        restarts: list[float] = []
        try:
            dev.start()
            wait(dev.serving, 120, "the first edged serving")
            for i, release in enumerate(releases):
                restarts.append(restart(dev))
                slot = "a" if i % 2 == 0 else "b"
                updates.append(update(dev, release, slot))
                wait(dev.serving, 120, "serving after the commit")
                u = updates[-1]
                print(f"rep {i + 1}: update {u['total']:.2f} s (install {u['install']:.2f}, "
                      f"smoke test {u['smoke']:.2f}, switch to commit "
                      f"{u['switch_to_commit']:.2f}); restart {restarts[-1]:.2f} s")  # fmt: skip
        finally:
            dev.kill()
            import psutil

            for proc in psutil.process_iter(["cmdline"]):  # kept workers: their own sessions
                if str(dev.data) in " ".join(proc.info["cmdline"] or ()):
                    proc.kill()
    medians = {k: median(u[k] for u in updates) for k in updates[0]}
    base = median(restarts)
    print(f"median: received -> committed {medians['total']:.2f} s; restart (baseline) "
          f"{base:.2f} s; ratio {medians['total'] / base:.2f}x")  # fmt: skip
    if args.json is not None:
        doc = {"updates": updates, "restarts": restarts, "medians": medians, "restart": base}
        args.json.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
