"""The device image in QEMU: seconds from QEMU's start to the model answering, and edged's RSS
in the guest while enrolled and serving.

    .venv/bin/python bench/vmboot.py [--image DIR] [--json PATH]      # as root, ~6 min

1. A hub on the host (``hub init --san 10.0.2.100``, ``hub serve``), a model pushed and a
   ModelDeployment applied for ``site=lab`` before the device exists.
2. First boot: QEMU starts (TCG) with a fresh overlay of the image and a seed from ``hub token
   create``; the clock runs until an inference request from the host (through hostfwd) gets
   200. Also timed: the guest's agent answering, the device listed at the hub.
3. edged's RSS in the guest (its main process; and its workers apart), sampled 5 times.
4. A clean power-off, then a later boot of the same disk: QEMU start to the model answering.

The image is the lab's (``packaging/image/build --test-agent``, cached; or ``--image``): the
agent is how the numbers are read from inside the guest. Uses the VM lab's parts
(tests/vmlab/lab.py). Guests run under TCG, several times slower than the host: the figures
are for this machine's emulation, a lower bound on what a real device does.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "vmlab"))

from lab import LabHub, Vm, build_image, make_seed  # noqa: E402

from edgefleet.demo import TINY_MLP, build_mlp  # noqa: E402

DEPLOYMENT = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {name: det}
spec:
  model: {name: det, version: "1.0.0"}
  runtime: {executionProviders: [CPUExecutionProvider]}
  replicas: {perDevice: 1}
  placement: {nodeSelector: {site: lab}}
  probes:
    readiness: {periodSeconds: 2, timeoutSeconds: 5}
"""
REQUEST = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]}
LIMIT_S = 900


def answers(vm: Vm) -> bool:
    try:
        return vm.infer("det", REQUEST, timeout=20)[0] == 200
    except OSError:
        return False


def boot_to_answer(vm: Vm, hub: LabHub | None) -> dict[str, float]:
    vm.start()
    t0 = vm.started_at
    marks: dict[str, float] = {}
    deadline = t0 + LIMIT_S
    while time.monotonic() < deadline:
        vm.alive()
        now = time.monotonic() - t0
        if "agent_s" not in marks and vm.try_run("true", 5) is not None:
            marks["agent_s"] = now
        if hub is not None and "at_hub_s" not in marks and hub.devices():
            marks["at_hub_s"] = time.monotonic() - t0
        if answers(vm):
            marks["answering_s"] = time.monotonic() - t0
            return marks
        time.sleep(1)
    raise SystemExit(f"no answer within {LIMIT_S}s; console:\n{vm.console_tail()}")


def rss_kib(vm: Vm) -> dict[str, float]:
    # no procps in the image: /proc directly; the workers are edged's children
    script = (
        "pid=$(systemctl show -p MainPID --value edged); "
        "echo main $(awk '/^VmRSS/ {print $2}' /proc/$pid/status); "
        "for c in $(cat /proc/$pid/task/*/children); do "
        "echo worker $(awk '/^VmRSS/ {print $2}' /proc/$c/status); done"
    )
    mains: list[int] = []
    workers: list[int] = []
    for _ in range(5):
        for line in vm.run(script).splitlines():
            kind, _, value = line.partition(" ")
            if value.strip():
                (mains if kind == "main" else workers).append(int(value))
        time.sleep(2)
    return {
        "edged_rss_mib": max(mains) / 1024,
        "workers_rss_mib": (max(workers) / 1024) if workers else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", type=Path, help="a --test-agent image (default: build it)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vmboot-") as tmp:
        d = Path(tmp)
        image = args.image or build_image(d / "image", d)
        hub = LabHub(d / "hub", d / "hub.log").init().start()
        try:
            build_mlp(d / "det.onnx", TINY_MLP, seed=1)
            hub.edgectl(
                "models", "push", str(d / "det.onnx"), "--name", "det", "--version", "1.0.0"
            )
            (d / "det.yaml").write_text(DEPLOYMENT)
            hub.edgectl("apply", "-f", str(d / "det.yaml"))
            make_seed(d / "seed.img", hub, labels={"site": "lab"})
            vm = Vm(image, d / "vm", hub, d / "seed.img")
            try:
                first = boot_to_answer(vm, hub)
                memory = rss_kib(vm)
                vm.stop()
                later = boot_to_answer(vm, None)
            finally:
                vm.kill()
        finally:
            hub.stop()
    figures: dict[str, Any] = {
        "first_boot": first,
        "later_boot": later,
        **memory,
    }
    print(
        f"first boot (enrollment):  agent {first.get('agent_s', 0):6.1f} s   at the hub "
        f"{first.get('at_hub_s', 0):6.1f} s   model answering {first['answering_s']:6.1f} s"
    )
    print(
        f"later boot:               agent {later.get('agent_s', 0):6.1f} s   "
        f"model answering {later['answering_s']:6.1f} s"
    )
    print(f"edged RSS in the guest (enrolled, serving): {memory['edged_rss_mib']:.1f} MiB; "
          f"its worker: {memory['workers_rss_mib']:.1f} MiB")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
