"""edged updates itself across three VMs (issue 32's lab tests, after test_upgrade): the lab's
device and two more guests booted from the image with seeds of their own (site=lab), all
serving det.

* a release of this checkout with a higher version, pushed with ``edgectl agent push`` and
  rolled out by an AgentUpgrade canary first (33% of three: one device, the others sent
  nothing until it commits), then all: every device commits it, the hub shows it, det answers;
* three broken releases of this checkout (tests/brokenreleases.py: one crashes at start, one
  starts but never connects, one connects but cannot serve; each passes the device's smoke
  test, so the device switches to it): the canary's launcher goes back by itself, the device
  says why, the rollout stops at the canary (phase RolledBack, the other two sent nothing) and
  the hub names the device and the reason.

Prints the seconds from each device receiving the release to its commit, and for each broken
release how long until the canary was back and the rollout stopped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from brokenreleases import build_broken
from lab import LabHub, Vm, deploy, enrolled, make_seed, push, wait_for
from test_upgrade import TIMEOUT, agent, build_and_push, serves

from edgefleet.demo import TINY_MLP, build_mlp

pytestmark = [pytest.mark.vmlab, pytest.mark.timeout(2400)]

NAME = "edged-fleet"
UPGRADE = """\
apiVersion: edgefleet.io/v1
kind: AgentUpgrade
metadata: {{name: {name}}}
spec:
  version: "{version}"
  selector: {{matchLabels: {{site: lab}}}}
  rollout: {{maxUnavailable: 2, progressDeadlineSeconds: 1800, canary: {{steps: [33%, 100%]}}}}
  commit: {{deadlineSeconds: {deadline}, maxTries: {tries}}}
"""
# the broken releases and the launcher's reason for going back (a commit deadline that a
# healthy edged meets on TCG with room: it commits 15-30 s after its start there)
BROKEN_REASONS = {
    "crash": "CrashLoop",
    "silent": "CommitDeadlineExceeded",
    "noserve": "CommitDeadlineExceeded",
}
BROKEN_DEADLINE_S = 40


@pytest.fixture(scope="module")
def fleet(
    seeded: tuple[Vm, str], hub: LabHub, image: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Vm]]:
    """The lab's device and two more VMs, enrolled and serving det."""
    first, _ = seeded
    # test_upgrade's AgentUpgrade (Complete) would send its version to the devices that join
    # its selector: this module's upgrade is the only one
    hub.edgectl("delete", "agentupgrade", "edged-lab", check=False)
    more: list[Vm] = []
    try:
        for role in ("second", "third"):
            d = tmp_path_factory.mktemp(role)
            make_seed(d / "seed.img", hub, labels={"site": "lab", "device.lab/role": role})
            more.append(Vm(image, d / "vm", hub, d / "seed.img").start())
        for vm in more:
            vm.wait_agent(TIMEOUT)
        vms = [first, *more]
        wait_for(lambda: len(enrolled(hub)) == 3, TIMEOUT, "three devices at the hub", period=3)
        if hub.edgectl("get", "deployment", "det", check=False).returncode != 0:  # run alone
            folder = tmp_path_factory.mktemp("det")
            build_mlp(folder / "det.onnx", TINY_MLP, seed=11)
            push(hub, folder / "det.onnx", "det", "1.0.0")
            deploy(hub, folder, "det", "1.0.0")
        for vm in vms:
            wait_for(lambda vm=vm: serves(vm), TIMEOUT, f"det to answer on {vm.dir}", period=1)
        yield vms
    finally:
        for vm in more:  # a power cut: their disks are thrown away (a clean poweroff: ~50 s)
            vm.kill()


def apply(hub: LabHub, folder: Path, version: str, deadline: int, tries: int) -> None:
    doc = folder / f"{NAME}-{version}.yaml"
    doc.write_text(UPGRADE.format(name=NAME, version=version, deadline=deadline, tries=tries))
    hub.edgectl("apply", "-f", str(doc))


def status(hub: LabHub) -> dict[str, Any]:
    return upgrade_status_of(hub, NAME)


def upgrade_status_of(hub: LabHub, name: str) -> dict[str, Any]:
    out = hub.edgectl("get", "agentupgrade", name, "-o", "json", check=False)
    return dict(json.loads(out.stdout).get("status", {})) if out.returncode == 0 else {}


def device_name(vm: Vm) -> str:
    got = wait_for(lambda: (vm.status().get("hub") or {}).get("deviceName"), TIMEOUT,
                   f"the device name of {vm.dir}", period=1)  # fmt: skip
    return str(got)


def launcher_state(vm: Vm) -> dict[str, Any]:
    out = vm.try_run("cat /var/lib/edged/agent/launcher.json", 20)
    if out is None or out[0] != 0:
        return {}
    try:
        return dict(json.loads(out[1]))
    except ValueError:
        return {}


def next_versions(vms: list[Vm]) -> tuple[str, dict[str, str], int]:
    """The highest version the three run, their platform, and the next free patch number."""
    now = [wait_for(lambda vm=vm: agent(vm), TIMEOUT, "an agent status", period=1) for vm in vms]
    parsed = [tuple(int(x) for x in a["version"].split(".")[:3]) for a in now]
    major, minor, patch = max(parsed)
    platform = {"arch": now[0]["arch"], "pythonAbi": now[0]["pythonAbi"]}
    return f"{major}.{minor}", platform, patch + 1


def test_canary_then_all_then_three_broken_releases_stop_at_the_canary(
    fleet: list[Vm], hub: LabHub, tmp_path: Path
) -> None:
    names = {device_name(vm): vm for vm in fleet}
    assert len(names) == 3, names
    base, platform, patch = next_versions(fleet)
    good = f"{base}.{patch}"
    print(f"\nguests: {[agent(vm)['version'] for vm in fleet]}, {platform}; releasing {good}")
    build_and_push(hub, tmp_path, good, platform)

    # 1. canary first, then all
    apply(hub, tmp_path, good, deadline=400, tries=3)
    received: dict[str, float] = {}
    committed: dict[str, float] = {}
    canary_seen_alone = False
    started = time.monotonic()
    deadline = started + 2 * TIMEOUT
    while len(committed) < 3:
        assert time.monotonic() < deadline, f"not all committed {good}: {committed}"
        for name, vm in names.items():
            a = agent(vm)
            now = time.monotonic()
            if name not in received and (
                a.get("desiredVersion") == good or a.get("version") == good
            ):
                received[name] = now
                if len(received) > 1:
                    # nobody else before the canary committed (read again: it may have
                    # committed since it was read in this round)
                    canary = min(received, key=lambda n: received[n])
                    if canary not in committed:
                        c = agent(names[canary])
                        assert c.get("committedVersion") == good, (name, canary, c)
                        committed[canary] = now  # committed by then
            if name not in committed and a.get("committedVersion") == good == a.get("version"):
                committed[name] = now
        if len(received) == 1 and not committed:
            s = status(hub)
            canary_seen_alone |= s.get("updatingDevices") == 1 and s.get("stepDevices") == 1
        time.sleep(1)
    canary = min(received, key=lambda n: received[n])
    assert all(received[n] >= committed[canary] for n in names if n != canary), (
        received,
        committed,
    )
    assert canary_seen_alone, "the hub never showed the canary step with one device updating"
    done = wait_for(lambda: (s := status(hub)).get("phase") == "Complete" and s, TIMEOUT,
                    "the upgrade Complete", period=3)  # fmt: skip
    assert done["doneDevices"] == 3 and not done.get("failedDevices"), done
    print(f"agent upgrade of three VMs, canary {canary}: seconds from receiving {good} to the "
          "commit: " + ", ".join(f"{n} {committed[n] - received[n]:.0f}" for n in sorted(names))
          + f"; all committed after {max(committed.values()) - started:.0f} s")  # fmt: skip
    wide = hub.edgectl("get", "devices", "-o", "wide").stdout
    for name, vm in names.items():
        row = next(line for line in wide.splitlines() if name in line)
        assert good in row, wide
        wait_for(lambda vm=vm: serves(vm), TIMEOUT, f"det to answer on {name}", period=1)

    # 2. three broken releases: each stops at the canary, which goes back by itself
    for i, (broken, reason) in enumerate(sorted(BROKEN_REASONS.items())):
        version = f"{base}.{patch + 1 + i}"
        release = build_broken(
            tmp_path, tmp_path / f"edged-{version}-{broken}.tar.gz", version, broken,
            "--arch", platform["arch"], "--python-abi", platform["pythonAbi"],
        )  # fmt: skip
        pushed = hub.edgectl("agent", "push", str(release), "--version", version)
        assert "pushed" in pushed.stdout, pushed.stdout + pushed.stderr
        started = time.monotonic()
        apply(hub, tmp_path, version, deadline=BROKEN_DEADLINE_S, tries=2)
        sent: list[str] = []

        def untouched(sent: list[str] = sent, version: str = version) -> None:
            """Every device but the canary: not sent the broken release, on ``good``."""
            for name, vm in names.items():
                a = agent(vm)
                if a.get("desiredVersion") == version and name not in sent:
                    sent.append(name)
                assert len(sent) <= 1, f"{sent} sent {version} (a canary of one)"
                if name not in sent and a:
                    assert a.get("version") == good, (name, a)

        def back(sent: list[str] = sent, version: str = version) -> dict[str, Any] | None:
            untouched()
            if not sent:
                return None
            last = launcher_state(names[sent[0]]).get("last") or {}
            ok = last.get("outcome") == "RolledBack" and last.get("version") == version
            return last if ok else None

        last = wait_for(back, TIMEOUT, f"the canary's launcher going back from {broken}", 1)
        took_back = time.monotonic() - started
        canary = sent[0]
        assert last["reason"] == reason, last
        reported = wait_for(
            lambda c=canary: (a := agent(names[c])).get("phase") == "RolledBack" and a,
            TIMEOUT, f"{canary} reporting RolledBack", period=1,
        )  # fmt: skip
        assert reported["version"] == good == reported["committedVersion"], reported
        assert reported["reason"] == reason, reported
        stopped = wait_for(lambda: (s := status(hub)).get("phase") == "RolledBack" and s,
                           TIMEOUT, f"the rollout of {version} stopped", period=3)  # fmt: skip
        took = time.monotonic() - started
        untouched()
        print(f"broken release ({broken}): {canary} back on {good} after {took_back:.0f} s, "
              f"the rollout stopped after {took:.0f} s")  # fmt: skip
        assert stopped["reason"] == "FailureThresholdReached", stopped
        assert list(stopped["failedDevices"]) == [canary], stopped
        assert stopped["failedDevices"][canary].startswith(reason), stopped
        assert f"{canary} ({reason}" in stopped["message"], stopped
        watched = hub.edgectl("rollout", "status", f"agentupgrade/{NAME}", check=False)
        assert watched.returncode == 1, watched.stdout
        assert f"failed {canary}: {reason}" in watched.stdout, watched.stdout
        # reverted: the canary is sent nothing more and serves on its committed edged
        wait_for(lambda c=canary: agent(names[c]).get("desiredVersion") == "", TIMEOUT,
                 f"{canary} sent nothing", period=1)  # fmt: skip
        for name, vm in names.items():
            wait_for(lambda vm=vm: serves(vm), TIMEOUT, f"det to answer on {name}", period=1)
        untouched()
