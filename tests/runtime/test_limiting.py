"""Resource limits: the pure choice as a table; cgroup writes against a directory in tmp."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edged.runtime.launching import LimitsSpec
from edged.runtime.limiting import (
    apply_limits,
    choose_limits,
    detect_cgroup_root,
    prepare_cgroup,
    remove_cgroup,
)

CGROUP = Path("/sys/fs/cgroup/edged.service")
MIB = 1 << 20

CASES: dict[str, tuple[dict[str, object], LimitsSpec]] = {
    "no requests: no limits": (
        {"cpu_millis": None, "memory_bytes": None, "cgroup_root": CGROUP},
        LimitsSpec(mode="none"),
    ),
    "cgroup: cpu and memory": (
        {"cpu_millis": 500, "memory_bytes": 256 * MIB, "cgroup_root": CGROUP},
        LimitsSpec(
            mode="cgroup",
            cgroup_path=str(CGROUP / "workers" / "r-1"),
            memory_bytes=256 * MIB,
            cpu_millis=500,
        ),
    ),
    "cgroup: memory only": (
        {"cpu_millis": None, "memory_bytes": MIB, "cgroup_root": CGROUP},
        LimitsSpec(mode="cgroup", cgroup_path=str(CGROUP / "workers" / "r-1"), memory_bytes=MIB),
    ),
    "rlimit: half a core is one core": (
        {"cpu_millis": 500, "memory_bytes": None},
        LimitsSpec(mode="rlimit", cpus=(0,), cpu_millis=500),
    ),
    "rlimit: 1.5 cores round up to 2": (
        {"cpu_millis": 1500, "memory_bytes": 64 * MIB},
        LimitsSpec(mode="rlimit", cpus=(0, 1), memory_bytes=64 * MIB, cpu_millis=1500),
    ),
    "rlimit: slots spread over the cores": (
        {"cpu_millis": 2000, "memory_bytes": None, "slot": 1},
        LimitsSpec(mode="rlimit", cpus=(2, 3), cpu_millis=2000),
    ),
    "rlimit: spreading wraps around": (
        {"cpu_millis": 2500, "memory_bytes": None, "slot": 1},
        LimitsSpec(mode="rlimit", cpus=(0, 1, 3), cpu_millis=2500),
    ),
    "rlimit: never more cores than the device has": (
        {"cpu_millis": 16000, "memory_bytes": None, "slot": 2},
        LimitsSpec(mode="rlimit", cpus=(0, 1, 2, 3), cpu_millis=16000),
    ),
    "rlimit: memory only keeps every core": (
        {"cpu_millis": None, "memory_bytes": MIB},
        LimitsSpec(mode="rlimit", memory_bytes=MIB),
    ),
    "rlimit: unknown core count": (
        {"cpu_millis": 1000, "memory_bytes": None, "cpu_count": 0},
        LimitsSpec(mode="rlimit", cpu_millis=1000),
    ),
}


@pytest.mark.parametrize(("given", "expected"), CASES.values(), ids=CASES.keys())
def test_choose_limits(given: dict[str, object], expected: LimitsSpec) -> None:
    args: dict[str, object] = {"replica_id": "r-1", "slot": 0, "cgroup_root": None, "cpu_count": 4}
    args.update(given)
    assert choose_limits(**args) == expected  # type: ignore[arg-type]


def fake_cgroup(root: Path, controllers: str = "cpuset cpu io memory pids") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    return root


def test_detect_cgroup_root(tmp_path: Path) -> None:
    usable = fake_cgroup(tmp_path / "usable")
    no_memory = fake_cgroup(tmp_path / "no-memory", "cpu io pids")
    assert detect_cgroup_root(str(usable)) == usable
    assert detect_cgroup_root(str(no_memory)) is None
    assert detect_cgroup_root(str(tmp_path / "absent")) is None
    assert detect_cgroup_root("off") is None


def test_prepare_cgroup_writes_limits(tmp_path: Path) -> None:
    root = fake_cgroup(tmp_path / "edged.service")
    limits = choose_limits(
        replica_id="mnist-abc-0",
        slot=0,
        cpu_millis=1500,
        memory_bytes=256 * MIB,
        cgroup_root=root,
        cpu_count=4,
    )
    prepare_cgroup(limits)
    group = root / "workers" / "mnist-abc-0"
    assert (group / "cpu.max").read_text() == "150000 100000"
    assert (group / "memory.max").read_text() == str(256 * MIB)
    for parent in (root, root / "workers"):
        assert (parent / "cgroup.subtree_control").read_text() == "+cpu +memory"

    apply_limits(limits)
    assert (group / "cgroup.procs").read_text() == str(os.getpid())

    prepare_cgroup(limits)  # a restart of the same replica reuses its cgroup
    for name in ("cpu.max", "memory.max", "cgroup.procs"):
        (group / name).unlink()  # a real cgroup directory has no files of its own to remove
    remove_cgroup(limits)
    assert not group.exists()


def test_prepare_cgroup_cpu_quota_is_at_least_the_kernel_minimum(tmp_path: Path) -> None:
    """cgroup v2 refuses a cpu.max quota under 1 ms per period (EINVAL)."""
    root = fake_cgroup(tmp_path / "edged.service")
    limits = choose_limits(
        replica_id="r", slot=0, cpu_millis=1, memory_bytes=None, cgroup_root=root, cpu_count=4
    )
    prepare_cgroup(limits)
    assert (root / "workers" / "r" / "cpu.max").read_text() == "1000 100000"


def test_prepare_cgroup_writes_only_what_is_requested(tmp_path: Path) -> None:
    root = fake_cgroup(tmp_path / "edged.service")
    limits = choose_limits(
        replica_id="r", slot=0, cpu_millis=None, memory_bytes=MIB, cgroup_root=root, cpu_count=4
    )
    prepare_cgroup(limits)
    assert (root / "workers" / "r" / "memory.max").read_text() == str(MIB)
    assert not (root / "workers" / "r" / "cpu.max").exists()


@pytest.mark.parametrize("mode", ["none", "rlimit"])
def test_prepare_cgroup_does_nothing_without_a_cgroup(tmp_path: Path, mode: str) -> None:
    prepare_cgroup(LimitsSpec(mode=mode, cgroup_path=str(tmp_path / "x"), memory_bytes=MIB))
    remove_cgroup(LimitsSpec(mode=mode, cgroup_path=str(tmp_path)))
    assert list(tmp_path.iterdir()) == []
    apply_limits(LimitsSpec(mode="none"))  # a no-op for the test process
