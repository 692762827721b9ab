"""One device booted from the image, in order: first-boot enrollment from the seed, a model
deployed at the hub and answering from the host, ``systemctl restart edged`` and a clean
reboot (serving again, not enrolled again), and the systemd watchdog.

The tests share the module's VM and run in file order (``-n 0``); each waits for the state it
needs rather than assuming the one before passed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from lab import LabHub, Vm, deploy, enrolled, infer_request, main_pid, push, wait_active, wait_for

from edgefleet.demo import TINY_MLP, build_mlp

pytestmark = [pytest.mark.vmlab, pytest.mark.timeout(1200)]

X = np.random.default_rng(7).standard_normal((2, 64)).astype(np.float32)
BOOT_TIMEOUT = 420  # TCG on two shared cores: a first boot with enrollment takes minutes


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "det.onnx"
    build_mlp(path, TINY_MLP, seed=11)
    return path


def answer(vm: Vm) -> np.ndarray | None:
    try:
        code, doc = vm.infer("det", infer_request(X), timeout=20)
    except OSError:
        return None  # not forwarded yet (edged or the agent starting)
    if code != 200:
        return None
    out = doc["outputs"][0]
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def answered(vm: Vm) -> list[np.ndarray]:
    """[det's answer], or [] (false, for wait_for) while it does not answer."""
    got = answer(vm)
    return [] if got is None else [got]


def expected(model: Path) -> np.ndarray:
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    out: np.ndarray = sess.run(None, {"input": X})[0]
    return out


def idle_memory(vm: Vm) -> str:
    """The memory of the enrolled, idle edged in the guest (issue 34's figure), from /proc:
    the launcher (the unit's main process) and the control process it runs, each as RSS and
    its private part (smaps_rollup's Private_Clean + Private_Dirty), in MiB."""

    def of(pid: int, what: str) -> str:
        status = dict(line.split(":", 1) for line in vm.run(f"cat /proc/{pid}/status").splitlines())
        rollup = vm.run(f"cat /proc/{pid}/smaps_rollup").splitlines()
        private = sum(
            int(line.split()[1])
            for line in rollup
            if line.startswith(("Private_Clean", "Private_Dirty"))
        )
        rss = int(status["VmRSS"].split()[0])
        return f"{what} RSS {rss / 1024:.1f} MiB (private {private / 1024:.1f})"

    launcher = main_pid(vm)
    children = [int(p) for p in vm.run(f"cat /proc/{launcher}/task/*/children").split()]
    shown = [of(launcher, "launcher")]
    shown += [of(pid, f"child {pid}" if len(children) > 1 else "edged") for pid in children]
    return "; ".join(shown)


def test_first_boot_enrolls_from_the_seed_and_keeps_the_token_out_of_logs(
    seeded: tuple[Vm, str], hub: LabHub
) -> None:
    vm, token = seeded
    vm.wait_agent(BOOT_TIMEOUT)
    devices = wait_for(lambda: enrolled(hub), BOOT_TIMEOUT, "the device at the hub", period=3)
    assert len(devices) == 1
    assert devices[0]["metadata"]["labels"]["device.lab/role"] == "first"
    # the seed was applied once and the token spent
    assert vm.run("cat /var/lib/edgefleet-seed/applied").strip() == "applied"
    wait_for(  # edged-enroll.service's ExecStartPost, once edged enroll has returned
        lambda: vm.run("test -e /etc/edged/enroll.token; echo $?").strip() == "1",
        60,
        "the spent token removed",
    )
    wait_active(vm, "edged", BOOT_TIMEOUT)
    settled = time.monotonic() + 20  # enrolled and connected: what an idle edged settles at
    # the token reached neither the journal nor the console (read while edged settles)
    journal = vm.run("journalctl -b --no-pager -o verbose", timeout=120)
    assert "edgefleet-seed: provisioned" in journal
    assert token not in journal
    assert token not in vm.console.read_text(errors="replace")
    time.sleep(max(0.0, settled - time.monotonic()))
    print(f"enrolled, idle edged in the VM: {idle_memory(vm)}")


def test_a_model_deployed_at_the_hub_answers_from_the_host_as_onnxruntime_does(
    seeded: tuple[Vm, str], hub: LabHub, model: Path, tmp_path: Path
) -> None:
    vm, _ = seeded
    wait_for(lambda: enrolled(hub), BOOT_TIMEOUT, "the device at the hub", period=3)
    push(hub, model, "det", "1.0.0")
    deploy(hub, tmp_path, "det", "1.0.0")
    got = wait_for(lambda: answered(vm), BOOT_TIMEOUT, "det to answer", period=1)[0]
    np.testing.assert_allclose(got, expected(model), rtol=1e-5, atol=1e-5)


EGRESS = """\
  network:
    egress:
      - port: 9
        cidr: 127.0.0.1
"""


def replica_of(vm: Vm, workload: str) -> dict[str, Any]:
    """``workload``'s first replica as ``edged status`` reports it; {} before it has one."""
    for w in vm.status().get("workloads", []):
        if w.get("name") == workload and w.get("replicas"):
            return dict(w["replicas"][0])
    return {}


def kernel_has_landlock_tcp(vm: Vm) -> bool:
    """Landlock's TCP rules (ABI 4) came with Linux 6.7; edged enforces an egress rule's port
    with them, and its address with a cgroup BPF program."""
    major, minor = (int(x) for x in vm.run("uname -r").strip().split(".")[:2])
    return (major, minor) >= (6, 7)


def test_the_shipped_unit_runs_workers_on_their_own_uids_sandboxed_and_egress_as_the_kernel_can(
    seeded: tuple[Vm, str], hub: LabHub, model: Path, tmp_path: Path
) -> None:
    """The unit as the package ships it (root, a bounded capability set, no drop-in), as
    ``edged status`` reports it: each worker on a uid of its own with no-new-privs, seccomp
    and Landlock in force; an egress rule naming an address enforced where the kernel has
    Landlock's TCP rules, and refused with the reason where it has not (Debian 12's 6.1):
    never silently weaker."""
    vm, _ = seeded
    wait_for(lambda: enrolled(hub), BOOT_TIMEOUT, "the device at the hub", period=3)
    assert vm.run("systemctl show -p User --value edged").strip() in ("", "root")
    push(hub, model, "det", "1.0.0")
    deploy(hub, tmp_path, "det", "1.0.0")
    wait_for(lambda: answer(vm) is not None, BOOT_TIMEOUT, "det to answer", period=1)
    sb = wait_for(
        lambda: (
            (replica_of(vm, "det").get("sandbox") or {}).get("inForce")
            and replica_of(vm, "det")["sandbox"]
        ),
        120,
        "det's sandbox in force",
        period=1,
    )
    assert sb["separateUid"] is True and sb["uid"] != 0, sb
    assert sb["noNewPrivs"] is True and sb["seccomp"] is True, sb
    text = vm.run("edged status --socket /run/edged/edged.sock", timeout=60)
    assert "+uid" in text, text

    push(hub, model, "egr", "1.0.0")  # a model name of its own: one deployment per name
    deploy(hub, tmp_path, "egr", "1.0.0", extra=EGRESS)
    if kernel_has_landlock_tcp(vm):
        sb = wait_for(
            lambda: (
                (replica_of(vm, "egr").get("sandbox") or {}).get("connectTo")
                and replica_of(vm, "egr")["sandbox"]
            ),
            BOOT_TIMEOUT,
            "egr's egress filter in force",
            period=1,
        )
        assert "127.0.0.1" in " ".join(sb["connectTo"]) and sb["separateUid"] is True, sb
    else:
        ended = wait_for(
            lambda: replica_of(vm, "egr").get("lastExit"),
            BOOT_TIMEOUT,
            "egr refused: its egress rule cannot be enforced on this kernel",
            period=1,
        )
        assert ended["reason"] == "NetworkPolicyUnenforceable", ended
        assert "Landlock ABI" in ended["message"] and "6.7" in ended["message"], ended
    hub.edgectl("delete", "deployment", "egr")


def test_restart_and_clean_reboot_serve_again_without_enrolling_again(
    seeded: tuple[Vm, str], hub: LabHub, model: Path
) -> None:
    vm, _ = seeded
    wait_for(lambda: answer(vm) is not None, BOOT_TIMEOUT, "det to answer", period=1)
    name = enrolled(hub)[0]["metadata"]["name"]
    before = main_pid(vm)
    worker = wait_for(lambda: replica_of(vm, "det").get("pid"), 120, "det's worker pid")
    # twice: the second restart finds the cgroup the first one's edged laid out again, with
    # the worker it adopted in it (edged-cgroup.service readies it: else 219/CGROUP)
    for _ in range(2):
        vm.run("systemctl restart edged", timeout=180)
        assert main_pid(vm) not in (0, before)
        before = main_pid(vm)
        got = wait_for(lambda: answered(vm), 300, "det to answer after the restart", period=1)[0]
        np.testing.assert_allclose(got, expected(model), rtol=1e-5, atol=1e-5)
        # the worker outlived edged and the next edged adopted it (proven on its own uid)
        rep = wait_for(lambda: replica_of(vm, "det").get("adopted") and replica_of(vm, "det"),
                       120, "det's worker adopted", period=1)  # fmt: skip
        assert rep["pid"] == worker, rep
        # neither the launcher (edged's parent) nor the adopted worker is a stray to drift
        compliance = json.dumps(vm.status().get("compliance"))
        assert "StrayProcess" not in compliance, compliance

    vm.reboot(BOOT_TIMEOUT)
    got = wait_for(lambda: answered(vm), BOOT_TIMEOUT, "det after the reboot", period=1)[0]
    np.testing.assert_allclose(got, expected(model), rtol=1e-5, atol=1e-5)
    # neither the seed nor the enrollment ran in this boot, and the hub knows one device
    for unit in ("edgefleet-seed", "edged-enroll"):
        assert vm.run(f"systemctl show -p ConditionResult --value {unit}").strip() == "no", unit
    assert [d["metadata"]["name"] for d in enrolled(hub)] == [name]


def test_watchdog_kills_and_restarts_a_stopped_edged(seeded: tuple[Vm, str]) -> None:
    vm, _ = seeded
    wait_for(lambda: answer(vm) is not None, BOOT_TIMEOUT, "det to answer", period=1)
    watchdog_s = int(vm.run("systemctl show -p WatchdogUSec --value edged").strip().rstrip("s"))
    pid = main_pid(vm)
    vm.run(f"kill -STOP {pid}")
    stopped = time.monotonic()
    wait_for(
        lambda: main_pid(vm) not in (0, pid),
        watchdog_s + 60,  # WatchdogSec, then the abort and RestartSec, slowed by TCG
        "systemd to restart the stopped edged",
        period=2,
    )
    took = time.monotonic() - stopped
    journal = vm.run("journalctl -b -u edged --no-pager -o cat", timeout=120)
    assert "Watchdog timeout" in journal, journal[-2000:]
    print(f"watchdog: stopped edged replaced after {took:.0f}s (WatchdogSec={watchdog_s}s)")
    wait_for(lambda: answer(vm) is not None, 300, "det to answer after the watchdog", period=1)
