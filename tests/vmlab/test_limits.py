"""Limits and logs as the kernel and journald have them, on the lab's device (after
test_device): a worker's cgroup v2 ``memory.max`` and ``cpu.max`` equal to its manifest's
``spec.resources``, CPU throttling in ``cpu.stat``, a model that allocates past its memory
limit OOM-killed by the kernel and reported as ``OOMKilled`` at the hub while the other
workload keeps serving, and ``journalctl -u edged -p warning`` holding warnings and errors only.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest
from lab import LabHub, Vm, deploy, enrolled, infer_request, push, wait_for
from onnx import TensorProto, helper

from edgefleet.demo import TINY_MLP, build_mlp

pytestmark = [pytest.mark.vmlab, pytest.mark.timeout(1200)]

# 250m of a TCG guest's CPU: loading ONNX Runtime takes minutes, hence the startup probe
LIMITED = "    startup: {timeoutSeconds: 400}\n  resources: {cpu: 250m, memory: 400Mi}\n"
HOG_LIMIT = "  resources: {memory: 256Mi}\n"
TIMEOUT = 420


def build_hog(path: Path) -> None:
    """input [N, 64] -> Tile x 2,000,000 -> [N, 128,000,000] floats (512 MB a row) -> ReduceSum
    -> [N, 1]: one request allocates past a 256 MiB limit."""
    repeats = helper.make_tensor("repeats", TensorProto.INT64, [2], [1, 2_000_000])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    graph = helper.make_graph(
        [
            helper.make_node("Tile", ["input", "repeats"], ["big"]),
            helper.make_node("ReduceSum", ["big", "axes"], ["logits"], keepdims=1),
        ],
        "hog",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 1])],
        initializer=[repeats, axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def cgroup_of(vm: Vm, workload: str) -> str:
    """The cgroup leaf (under edged's ``workloads/``) of ``workload``'s running worker: the
    leaf's name or its worker's command line (the spec, as JSON) names the workload."""
    out = vm.run(
        "for d in /sys/fs/cgroup/system.slice/edged.service/workloads/*/; do "
        '  p=$(head -1 $d/cgroup.procs 2>/dev/null); [ -n "$p" ] || continue; '
        "  echo \"$d $(tr '\\0' ' ' </proc/$p/cmdline 2>/dev/null)\"; "
        "done",
        check=False,
    )
    leaves = [
        line.split(" ", 1)[0].rstrip("/")
        for line in out.splitlines()
        if workload in line.split(" ", 1)[0] or f'"{workload}"' in line
    ]
    return leaves[0] if len(leaves) == 1 else ""


def ok(vm: Vm, model: str, x: np.ndarray) -> bool:
    try:
        return vm.infer(model, infer_request(x), timeout=60)[0] == 200
    except OSError:
        return False


def test_worker_limits_are_the_manifests_and_the_kernel_enforces_them(
    seeded: tuple[Vm, str], hub: LabHub, tmp_path: Path
) -> None:
    vm, _ = seeded
    wait_for(lambda: enrolled(hub), TIMEOUT, "the device at the hub", period=3)
    build_mlp(tmp_path / "big.onnx", TINY_MLP, seed=3)
    push(hub, tmp_path / "big.onnx", "big", "1.0.0")
    deploy(hub, tmp_path, "big", "1.0.0", LIMITED)
    x = np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)
    wait_for(lambda: ok(vm, "big", x), TIMEOUT, "big to answer", period=3)
    leaf = wait_for(lambda: cgroup_of(vm, "big"), 60, "big's worker cgroup leaf")
    assert vm.run(f"cat {leaf}/memory.max").strip() == str(400 * 1024 * 1024)
    quota, period = vm.run(f"cat {leaf}/cpu.max").split()
    assert int(quota) / int(period) == pytest.approx(0.25)
    # the worker is alone in its leaf, below edged's delegated cgroup
    assert "/edged.service/workloads/" in leaf

    def throttled() -> dict[str, int]:
        lines = vm.run(f"cat {leaf}/cpu.stat").splitlines()
        return {k: int(v) for k, v in (line.split() for line in lines)}

    before = throttled()
    with ThreadPoolExecutor(4) as pool:  # keep the worker busy past its 250m for a while
        answers = list(pool.map(lambda _: ok(vm, "big", x), range(32)))
    after = throttled()
    print(f"big's cpu.stat: before the load {before}, after {after}")
    assert all(answers)
    # loading ONNX Runtime and serving at 250m: the kernel held the worker back
    assert after["nr_throttled"] > 0 and after["throttled_usec"] > 0, after
    hub.edgectl("delete", "deployment", "big")  # the modules after this one serve det alone


def test_a_model_past_its_memory_limit_is_oom_killed_and_reported_while_others_serve(
    seeded: tuple[Vm, str], hub: LabHub, tmp_path: Path
) -> None:
    vm, _ = seeded
    name = wait_for(lambda: enrolled(hub), TIMEOUT, "the device at the hub", period=3)[0]
    name = name["metadata"]["name"]
    build_hog(tmp_path / "hog.onnx")
    push(hub, tmp_path / "hog.onnx", "hog", "1.0.0")
    deploy(hub, tmp_path, "hog", "1.0.0", HOG_LIMIT)
    x = np.ones((1, 64), dtype=np.float32)
    det = np.ones((1, 64), dtype=np.float32)
    wait_for(lambda: cgroup_of(vm, "hog"), TIMEOUT, "hog's worker", period=3)
    leaf = cgroup_of(vm, "hog")
    assert vm.run(f"cat {leaf}/memory.max").strip() == str(256 * 1024 * 1024)
    try:
        vm.infer("hog", infer_request(x), timeout=120)
    except OSError:
        pass  # the worker died under the request: what the test wants; the kill is checked below

    def reported() -> bool:
        return "OOMKilled" in hub.edgectl("get", "devices", name, "-o", "json").stdout

    wait_for(reported, TIMEOUT, "OOMKilled in the device's status at the hub", period=3)
    events = vm.run(f"cat {leaf}/memory.events 2>/dev/null || true")
    print(f"hog's memory.events after the kill: {events!r}")
    assert ok(vm, "det", det), "det stopped serving while hog was OOM-killed"
    # restarted (with backoff): a new worker in a new leaf
    wait_for(lambda: cgroup_of(vm, "hog"), TIMEOUT, "hog's worker started again", period=3)
    # gone before the power cuts and upgrades: else the device (and the fleet test's two more,
    # site=lab too) loads ONNX Runtime, allocates 512 MB and is OOM-killed again and again
    # under everything that follows
    hub.edgectl("delete", "deployment", "hog")
    wait_for(lambda: not cgroup_of(vm, "hog"), TIMEOUT, "hog's worker gone", period=3)


def test_journalctl_warning_shows_warnings_and_errors_only(seeded: tuple[Vm, str]) -> None:
    vm, _ = seeded
    records = [
        json.loads(line)
        for line in vm.run("journalctl -u edged -o json --no-pager", timeout=120).splitlines()
        if line.startswith("{")
    ]

    def level(record: dict[str, object]) -> str:
        message = str(record.get("MESSAGE", ""))
        try:
            return str(json.loads(message).get("level", "")) if message.startswith("{") else ""
        except ValueError:
            return ""

    infos = [r for r in records if level(r) == "info"]
    assert infos, "edged logged no info record"
    assert all(r["PRIORITY"] == "6" for r in infos), [r["MESSAGE"] for r in infos][:5]
    for r in records:
        if level(r) in ("warning", "error", "critical"):
            assert int(r["PRIORITY"]) <= 4, r["MESSAGE"]
    shown = vm.run("journalctl -u edged -p warning -o json --no-pager", timeout=120)
    for line in shown.splitlines():
        if line.startswith("{"):
            assert level(json.loads(line)) not in ("info", "debug"), line
