"""``edgectl quickstart``: the whole main job on one machine, with no setup.

1. ``hub init`` + ``hub serve`` (SQLite store, a CA, a trust root and a quickstart publisher
   key in the hub's directory) on free loopback ports;
2. three devices enrolled with bootstrap tokens (``edged enroll``, CA pinned by hash), with
   different labels (two ``site=retail``, one ``site=factory``), each an ``edged run``;
3. a small model built, signed with the publisher key and pushed (``edgectl models push``);
4. a ModelDeployment for ``site=retail`` applied (``edgectl apply``), convergence shown live;
5. an inference request through one retail device's socket, checked against ONNX Runtime
   called directly; ``edgectl get devices`` and ``get deployments``;
6. everything stopped with SIGTERM (or left running with ``--keep-running``).

Every step is the real command a user would type; their output is in ``DIR/*.log``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from importlib.resources import as_file
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from edgefleet.devicestatus import fetch_status
from edgefleet.inference import infer
from edgefleet.launching import (
    Launched,
    LaunchError,
    free_port_pair,
    program_command,
    start_edged,
    start_hub,
)

MARKER = ".edgefleet-quickstart"
DEVICES = (("retail-1", "retail"), ("retail-2", "retail"), ("factory-1", "factory"))
EDGED_CONFIG = """\
# Written by edgectl quickstart. The trust root came with enrollment, pinned by --root-hash.
[trust]
rootFile = "{root}"
"""


class Demo:
    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.procs: list[tuple[str, Launched]] = []
        self.port = free_port_pair()
        self.hub_dir = workdir / "hub"
        self.admin = self.hub_dir / "admin.toml"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            program_command(*cmd), check=False, capture_output=True, text=True, timeout=120
        )
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:3])} failed:\n{out.stdout}{out.stderr}")
        return out

    def log(self, name: str) -> Path:
        return self.dir / f"{name}.log"

    def track(self, name: str, launched: Launched) -> Launched:
        self.procs.append((name, launched))
        return launched

    def edgectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run("edgectl", "--config", str(self.admin), *args)

    def stop_all(self) -> None:
        for _, launched in reversed(self.procs):
            launched.terminate()
        for name, launched in reversed(self.procs):
            code = launched.stop(40)
            print(f"   stopped {name} (exit code {code})")


def _wait(cond: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = cond()
        except (OSError, ValueError, KeyError, RuntimeError):
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


def run_fleet_quickstart(workdir: Path, example: Traversable, *, keep_running: bool = False) -> int:
    import numpy as np

    from edgefleet.demo import TINY_MLP, build_mlp

    started = time.monotonic()
    workdir = workdir.resolve()
    marker = workdir / MARKER
    if workdir.exists() and any(workdir.iterdir()):
        if not marker.exists():
            print(
                f"edgectl quickstart: {workdir} is not empty and not from a quickstart; "
                "pass --dir NEW",
                file=sys.stderr,
            )
            return 2
        shutil.rmtree(workdir)  # a previous quickstart's state: start over
    workdir.mkdir(parents=True, exist_ok=True)
    marker.write_text("made by edgectl quickstart; removed by the next one\n")
    demo = Demo(workdir)
    ok = False
    try:
        demo.run(
            "hub", "init", "--data-dir", str(demo.hub_dir), "--hub-address", demo.address, "--tuf"
        )
        print(
            "1. hub init --tuf: CA, admin credentials, trust root, publisher key and TUF "
            f"repository in {demo.hub_dir}"
        )
        hub = start_hub(demo.hub_dir, listen=demo.address, log=demo.log("hub"))
        demo.track("hub", hub)
        hub.wait_listening(30)
        print(f"2. hub serve: mTLS on {demo.address}, enrollment on port {demo.port + 1}")
        for name, site in DEVICES:
            token = demo.run(
                "hub", "token", "create", "--data-dir", str(demo.hub_dir), "--ttl", "10m"
            )
            pin = token.stderr.split("CA hash ")[1].strip()
            root_pin = token.stderr.split("root hash ")[1].split(";")[0]
            data = workdir / name
            demo.run("edged", "enroll", "--hub", demo.address, "--token", token.stdout.strip(),
                     "--ca-hash", pin, "--root-hash", root_pin, "--data-dir", str(data),
                     "--name", name,
                     "--label", f"site={site}")  # fmt: skip
            config = workdir / f"{name}.toml"
            config.write_text(EDGED_CONFIG.format(root=workdir / "no-image-root.json"))
            demo.track(name, start_edged(data, config=config, log=demo.log(name)))
            print(f"3. enrolled {name} (site={site}) with a bootstrap token; edged running")
        _wait(
            lambda: (
                sum(
                    d["status"]["phase"] == "Ready"
                    for d in json.loads(demo.edgectl("get", "devices", "-o", "json").stdout)[
                        "items"
                    ]
                )
                == len(DEVICES)
            ),
            60,
            "every device to connect",
        )
        print("4. " + demo.edgectl("get", "devices").stdout.rstrip().replace("\n", "\n   "))
        model = build_mlp(workdir / "model.onnx", TINY_MLP, seed=7)
        pushed = demo.edgectl(
            "models", "push", str(model), "--name", "demo-classifier", "--version", "1.0.0"
        )
        print(
            "5. signed (metadata and the publisher's TUF targets) with the publisher key and "
            f"pushed: {pushed.stdout.strip()}"
        )
        with as_file(example) as manifest:  # package data: a file, unless zipped
            applied = demo.edgectl("apply", "-f", str(manifest))
        print(f"6. edgectl apply -f {example.name}: {applied.stdout.strip()}")
        last = ""

        def converged() -> bool:
            nonlocal last
            dep = json.loads(
                demo.edgectl("get", "deployments", "demo-classifier", "-o", "json").stdout
            )
            st = dep.get("status", {})
            line = (
                f"   devices desired {st.get('desiredDevices', 0)}, updated "
                f"{st.get('updatedDevices', 0)}, ready {st.get('readyDevices', 0)}, "
                f"available {st.get('availableDevices', 0)}"
            )
            if line != last:
                print(line, flush=True)
                last = line
            return bool(st.get("desiredDevices")) and st.get("availableDevices") == st.get(
                "desiredDevices"
            )

        _wait(converged, 60, "the deployment to converge")
        print("7. " + demo.edgectl("get", "deployments").stdout.rstrip().replace("\n", "\n   "))
        x = np.random.default_rng(0).standard_normal((1, TINY_MLP[0])).astype(np.float32)
        sock = str(workdir / "retail-1" / "infer.sock")
        code, reply = infer(sock, "demo-classifier", {"input": x})
        if code != 200:
            print(f"inference failed ({code}): {reply}", file=sys.stderr)
            return 1
        got = np.asarray(reply["outputs"][0]["data"], dtype=np.float32)
        import onnxruntime as ort

        want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(
            None, {"input": x}
        )[0]
        ok = bool(np.allclose(got, want.ravel(), rtol=1e-5, atol=1e-5))
        print(f"8. POST /v2/models/demo-classifier/infer on retail-1 ({sock}) -> {code}")
        print(f"   logits {np.round(got, 3)}; class {int(got.argmax())}")
        print(f"   matches ONNX Runtime called directly: {ok}")
        factory = fetch_status(str(workdir / "factory-1" / "edged.sock"))
        print(f"   factory-1 runs {len(factory['workloads'])} workloads (nodeSelector site=retail)")
        print(f"done in {time.monotonic() - started:.1f} s; logs and state in {workdir}")
        if keep_running:
            print(
                f"left running: hub on {demo.address} (edgectl --config {demo.admin} get devices)"
                "; stop with: kill " + " ".join(str(p.pid) for _, p in demo.procs)
            )
        return 0 if ok else 1
    except (RuntimeError, LaunchError) as exc:
        print(f"edgectl quickstart: {exc}; see the logs in {workdir}", file=sys.stderr)
        return 1
    finally:
        if not keep_running or not ok:
            print("9. stopping (SIGTERM):")
            demo.stop_all()
