"""Resource limits: the pure choice as a table; cgroup writes against a directory in tmp (a
fake cgroupfs: what the kernel enforces needs the VM lab, tests/vmlab)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edged.runtime.launching import LimitsSpec
from edged.runtime.limiting import (
    LimitsError,
    apply_limits,
    choose_limits,
    parse_oom_kills,
    prepare_cgroup,
    read_oom_kills,
    remove_cgroup,
)

CGROUP = Path("/sys/fs/cgroup/system.slice/edged.service/workloads")
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
            cgroup_path=str(CGROUP / "r-1"),
            memory_bytes=256 * MIB,
            cpu_millis=500,
        ),
    ),
    "cgroup: memory only": (
        {"cpu_millis": None, "memory_bytes": MIB, "cgroup_root": CGROUP},
        LimitsSpec(mode="cgroup", cgroup_path=str(CGROUP / "r-1"), memory_bytes=MIB),
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


def fake_workloads(root: Path, enabled: str = "cpu memory") -> Path:
    """A workloads subtree as delegating.py leaves it: controllers on in its subtree_control
    (the kernel reads it back without the plus signs)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.subtree_control").write_text(enabled + "\n")
    return root


def test_prepare_cgroup_writes_limits(tmp_path: Path) -> None:
    root = fake_workloads(tmp_path / "edged.service" / "workloads")
    limits = choose_limits(
        replica_id="mnist-abc-0",
        slot=0,
        cpu_millis=1500,
        memory_bytes=256 * MIB,
        cgroup_root=root,
        cpu_count=4,
    )
    prepare_cgroup(limits)
    group = root / "mnist-abc-0"
    assert (group / "cpu.max").read_text() == "150000 100000"
    assert (group / "memory.max").read_text() == str(256 * MIB)
    # the leaf's controllers come from the workloads subtree: nothing above it is written
    assert (root / "cgroup.subtree_control").read_text() == "cpu memory\n"
    assert not (root.parent / "cgroup.subtree_control").exists()

    apply_limits(limits)
    assert (group / "cgroup.procs").read_text() == str(os.getpid())

    prepare_cgroup(limits)  # a restart of the same replica reuses its cgroup
    for name in ("cpu.max", "memory.max", "cgroup.procs"):
        (group / name).unlink()  # a real cgroup directory has no files of its own to remove
    remove_cgroup(limits)
    assert not group.exists()


def test_prepare_cgroup_cpu_quota_is_at_least_the_kernel_minimum(tmp_path: Path) -> None:
    """cgroup v2 refuses a cpu.max quota under 1 ms per period (EINVAL)."""
    root = fake_workloads(tmp_path / "workloads")
    limits = choose_limits(
        replica_id="r", slot=0, cpu_millis=1, memory_bytes=None, cgroup_root=root, cpu_count=4
    )
    prepare_cgroup(limits)
    assert (root / "r" / "cpu.max").read_text() == "1000 100000"


def test_prepare_cgroup_writes_only_what_is_requested(tmp_path: Path) -> None:
    root = fake_workloads(tmp_path / "workloads")
    limits = choose_limits(
        replica_id="r", slot=0, cpu_millis=None, memory_bytes=MIB, cgroup_root=root, cpu_count=4
    )
    prepare_cgroup(limits)
    assert (root / "r" / "memory.max").read_text() == str(MIB)
    assert not (root / "r" / "cpu.max").exists()


FAILURES = {
    "controllers not enabled in the workloads subtree": (
        "cpu",
        None,
        "the memory controllers are not enabled in {root}",
    ),
    "no workloads subtree at all": (None, None, "cannot read {root}/cgroup.subtree_control"),
    "memory.max cannot be written": (
        "cpu memory",
        "memory.max",
        "cannot write 1048576 to {root}/r/memory.max",
    ),
}


@pytest.mark.parametrize(("enabled", "blocked", "message"), FAILURES.values(), ids=FAILURES)
def test_prepare_cgroup_says_what_it_could_not_write(
    tmp_path: Path, enabled: str | None, blocked: str | None, message: str
) -> None:
    """Never swallowed: the replica's start fails with the write that did not happen."""
    root = tmp_path / "workloads"
    if enabled is not None:
        fake_workloads(root, enabled)
    if blocked is not None:
        (root / "r" / blocked).mkdir(parents=True)  # a directory: the write fails (EISDIR)
    limits = choose_limits(
        replica_id="r", slot=0, cpu_millis=500, memory_bytes=MIB, cgroup_root=root, cpu_count=4
    )
    with pytest.raises(LimitsError) as caught:
        prepare_cgroup(limits)
    assert message.format(root=root) in str(caught.value)


MEMORY_EVENTS = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"


def test_oom_kills_are_read_from_memory_events(tmp_path: Path) -> None:
    assert parse_oom_kills(MEMORY_EVENTS) == 2
    assert parse_oom_kills("low 0\n") is None
    leaf = tmp_path / "r"
    leaf.mkdir()
    limits = LimitsSpec(mode="cgroup", cgroup_path=str(leaf), memory_bytes=MIB)
    assert read_oom_kills(limits) is None  # no memory.events (no memory controller)
    (leaf / "memory.events").write_text(MEMORY_EVENTS)
    assert read_oom_kills(limits) == 2
    assert read_oom_kills(LimitsSpec(mode="rlimit", memory_bytes=MIB)) is None


@pytest.mark.parametrize("mode", ["none", "rlimit"])
def test_prepare_cgroup_does_nothing_without_a_cgroup(tmp_path: Path, mode: str) -> None:
    prepare_cgroup(LimitsSpec(mode=mode, cgroup_path=str(tmp_path / "x"), memory_bytes=MIB))
    remove_cgroup(LimitsSpec(mode=mode, cgroup_path=str(tmp_path)))
    assert list(tmp_path.iterdir()) == []
    apply_limits(LimitsSpec(mode="none"))  # a no-op for the test process


def test_an_adopted_workers_limits_are_written_again(tmp_path: Path) -> None:
    """After the unit's ExecStopPost= disabled the controllers (edged-launcher cleanup, for
    systemd 252 to start the unit again), a leaf's cpu.max and memory.max read "max" once
    edged enables them again: adoption writes the record's limits back, or says why not."""
    from types import SimpleNamespace
    from typing import cast

    from edged.runtime.launching import LaunchSpec
    from edged.runtime.workerpool import _limits_again

    root = fake_workloads(tmp_path / "edged.service" / "workloads")
    limits = choose_limits(
        replica_id="mnist-abc-0",
        slot=0,
        cpu_millis=500,
        memory_bytes=64 * MIB,
        cgroup_root=root,
        cpu_count=4,
    )
    group = root / "mnist-abc-0"
    group.mkdir()
    (group / "memory.max").write_text("max")
    spec = cast(LaunchSpec, SimpleNamespace(limits=limits))  # what the record says
    assert _limits_again(spec) == ""
    assert (group / "memory.max").read_text() == str(64 * MIB)
    assert (group / "cpu.max").read_text() == "50000 100000"
    (root / "cgroup.subtree_control").write_text("-cpu -memory")  # not enabled again
    assert "limits cannot be written again" in _limits_again(spec)
