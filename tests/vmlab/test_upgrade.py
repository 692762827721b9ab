"""edged updates itself on the lab's device (after test_powercut), issue 32's power cuts: a
release of this checkout with a higher version, built by ``packaging/agent/build-release`` for
the guest's platform (its arch and CPython ABI, as its edged reports them), pushed with
``edgectl agent push`` and rolled out by an AgentUpgrade (canary steps; the lab's one device is
the canary and then all) with a power cut (QEMU killed) while the device installs it; then a
second release with a power cut while the device switches to it. Each time the device boots a
working edged, the upgrade completes and det answers. Canary first then all across three VMs,
and the broken releases: test_upgrade_fleet.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lab import REPO, LabHub, Vm, deploy, enrolled, infer_request, push, wait_for

from edgefleet.demo import TINY_MLP, build_mlp

pytestmark = [pytest.mark.vmlab, pytest.mark.timeout(2400)]

TIMEOUT = 600  # a switch on TCG: smoke test, edged restarted on trial, the commit
X = np.ones((1, 64), dtype=np.float32)
UPGRADE = """\
apiVersion: edgefleet.io/v1
kind: AgentUpgrade
metadata: {{name: edged-lab}}
spec:
  version: "{version}"
  selector: {{matchLabels: {{site: lab}}}}
  rollout: {{maxUnavailable: 1, progressDeadlineSeconds: 1200, canary: {{steps: [50%, 100%]}}}}
  commit: {{deadlineSeconds: 400, maxTries: 3}}
"""


def agent(vm: Vm) -> dict[str, Any]:
    return dict(vm.status().get("agent") or {})


def serves(vm: Vm) -> bool:
    try:
        return vm.infer("det", infer_request(X), timeout=20)[0] == 200
    except OSError:
        return False


def upgrade_status(hub: LabHub) -> dict[str, Any]:
    out = hub.edgectl("get", "agentupgrade", "edged-lab", "-o", "json", check=False)
    return dict(json.loads(out.stdout).get("status", {})) if out.returncode == 0 else {}


def apply_upgrade(hub: LabHub, folder: Path, version: str) -> None:
    doc = folder / f"upgrade-{version}.yaml"
    doc.write_text(UPGRADE.format(version=version))
    hub.edgectl("apply", "-f", str(doc))


def build_and_push(hub: LabHub, folder: Path, version: str, platform: dict[str, Any]) -> None:
    out = folder / f"edged-{version}.tar.gz"
    made = subprocess.run(
        [sys.executable, str(REPO / "packaging" / "agent" / "build-release"), "--version",
         version, "--out", str(out), "--arch", platform["arch"],
         "--python-abi", platform["pythonAbi"]],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    pushed = hub.edgectl("agent", "push", str(out), "--version", version)
    # "unchanged": the same bytes were pushed before (the build is reproducible: the fleet test
    # after a test_upgrade that stopped early picks a version that one pushed)
    assert "pushed" in pushed.stdout or "unchanged" in pushed.stdout, pushed.stdout + pushed.stderr


def complete(hub: LabHub, vm: Vm, version: str) -> None:
    """The upgrade Complete at the hub, the device committed on ``version`` and det answering."""
    wait_for(
        lambda: (s := upgrade_status(hub)).get("phase") == "Complete" and s,
        TIMEOUT,
        f"the upgrade to {version} Complete",
        period=3,
    )
    got = wait_for(
        lambda: (a := agent(vm)).get("version") == version and a.get("committedVersion") == version
        and a,
        TIMEOUT,
        f"the device committed on {version}",
        period=1,
    )  # fmt: skip
    assert got["slot"] in ("a", "b"), got
    wait_for(
        lambda: version in hub.edgectl("get", "devices", "-o", "wide").stdout,
        TIMEOUT,
        f"the hub to show edged {version}",
        period=3,
    )
    wait_for(lambda: serves(vm), TIMEOUT, f"det to answer on edged {version}", period=1)


def installing(vm: Vm) -> str:
    phase = str(agent(vm).get("phase", ""))
    return phase if phase in ("Installing", "SmokeTesting") else ""


def switching(vm: Vm) -> str:
    """What says the device switches now: edged's request to the launcher, or a trial in
    launcher.json ("" when neither)."""
    out = vm.try_run(
        "cd /var/lib/edged/agent && ls request.json 2>/dev/null; cat launcher.json", 10
    )
    if out is None or out[0] != 0:
        return ""
    text = out[1]
    if text.startswith("request.json"):
        return "Switching"
    try:
        return "Trying" if json.loads(text).get("trying") else ""
    except ValueError:
        return ""


def cut_when(vm: Vm, probe: Callable[[Vm], str], what: str) -> str:
    """Kill QEMU (a power cut) as soon as ``probe`` says something."""
    phase = wait_for(lambda: probe(vm), TIMEOUT, what, period=0.3)
    vm.kill()
    vm.start()
    vm.wait_agent(TIMEOUT)
    return str(phase)


def test_an_agent_upgrade_commits_and_survives_power_cuts_while_it_installs_and_switches(
    seeded: tuple[Vm, str], hub: LabHub, tmp_path: Path
) -> None:
    vm, _ = seeded
    wait_for(lambda: enrolled(hub), TIMEOUT, "the device at the hub", period=3)
    if hub.edgectl("get", "deployment", "det", check=False).returncode != 0:  # run alone
        build_mlp(tmp_path / "det.onnx", TINY_MLP, seed=11)
        push(hub, tmp_path / "det.onnx", "det", "1.0.0")
        deploy(hub, tmp_path, "det", "1.0.0")
    wait_for(lambda: serves(vm), TIMEOUT, "det to answer", period=1)
    now = wait_for(lambda: agent(vm), TIMEOUT, "the device's agent status", period=1)
    major, minor, patch = (int(x) for x in now["version"].split(".")[:3])
    first, second = f"{major}.{minor}.{patch + 1}", f"{major}.{minor}.{patch + 2}"
    platform = {"arch": now["arch"], "pythonAbi": now["pythonAbi"]}
    print(f"guest: edged {now['version']}, {platform}")
    for version in (first, second):
        build_and_push(hub, tmp_path, version, platform)

    # 1. a power cut while it installs the first release
    apply_upgrade(hub, tmp_path, first)
    phase = cut_when(vm, installing, "the install")
    print(f"power cut while {phase} {first}")
    complete(hub, vm, first)

    # 2. the next release, a power cut as it switches (its edged asked the launcher for the
    # trial, or runs on trial)
    apply_upgrade(hub, tmp_path, second)
    phase = cut_when(vm, switching, "the switch")
    print(f"power cut while {phase} {second}")
    complete(hub, vm, second)
