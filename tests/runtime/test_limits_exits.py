"""How a worker's limits show when they bite or cannot be set: a real worker process and
WorkerPool, its cgroup a fake cgroupfs leaf in tmp (the worker writes its pid there as it would
into the kernel's). The kernel's side (memory.max enforced, the OOM killer) is stood in for:
the test writes memory.events' oom_kill and sends the SIGKILL; the VM lab shows the real one."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from asynctesting import async_test
from workerprocess import launch_spec

from edged.reconcile.model import Phase
from edged.runtime.adopting import WorkerRecords
from edged.runtime.launching import LaunchSpec, SandboxSpec
from edged.runtime.limiting import LimitsError, choose_limits
from edged.runtime.workerpool import WorkerPool
from edged.workloads import WorkloadName
from edgefleet.api import Probes
from edgefleet.demo import TINY_MLP, build_mlp

MIB = 1 << 20


async def _until(cond: Callable[[], object], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def _spec(tmp_path: Path, workloads: Path) -> LaunchSpec:
    model = build_mlp(tmp_path / "m.onnx", TINY_MLP, seed=1)
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    limits = choose_limits(
        replica_id="w-0",
        slot=0,
        cpu_millis=None,
        memory_bytes=512 * MIB,
        cgroup_root=workloads,
        cpu_count=os.cpu_count() or 1,
    )
    assert limits.mode == "cgroup"
    return replace(launch_spec(model, sha, SandboxSpec(mode="off")), limits=limits)


def _pool() -> WorkerPool:
    return WorkerPool(
        notify=lambda _w: None, on_serving_change=lambda _r, _ready: None, on_result=lambda *_: None
    )


@async_test
async def test_an_oom_kill_in_the_workers_cgroup_is_its_exit_reason(tmp_path: Path) -> None:
    workloads = tmp_path / "workloads"
    workloads.mkdir()
    (workloads / "cgroup.subtree_control").write_text("cpu memory\n")
    spec = _spec(tmp_path, workloads)
    leaf = Path(spec.limits.cgroup_path)
    pool = _pool()
    await pool.start(spec, WorkloadName("w"), "r1", 0, Probes())
    (rep,) = pool.replicas()
    await _until(lambda: rep.phase is Phase.READY, "the worker ready")
    assert (leaf / "memory.max").read_text() == str(512 * MIB)
    assert (leaf / "cgroup.procs").read_text() == str(rep.pid)  # the worker joined its leaf
    # the kernel's part: the OOM killer counts in memory.events and kills with SIGKILL
    (leaf / "memory.events").write_text("low 0\nhigh 0\nmax 40\noom 1\noom_kill 1\n")
    assert rep.pid is not None
    os.kill(rep.pid, signal.SIGKILL)
    await _until(lambda: rep.phase is Phase.EXITED, "the exit seen")
    assert rep.exit_reason == "OOMKilled"
    assert f"memory.max {512 * MIB} bytes" in rep.exit_message
    assert rep.crash_streak == 1  # restarted with the crash-loop backoff like any crash

    # the same leaf again (its rmdir failed: files in tmp): only new OOM kills count
    await pool.start(spec, WorkloadName("w"), "r1", 0, Probes())
    await _until(lambda: rep.phase is Phase.READY, "the restarted worker ready")
    assert rep.pid is not None
    os.kill(rep.pid, signal.SIGKILL)
    await _until(lambda: rep.phase is Phase.EXITED, "the second exit seen")
    assert rep.exit_reason == "Killed"  # oom_kill still 1: this SIGKILL came from elsewhere
    await pool.shutdown(timeout=10)


@async_test
async def test_limits_that_cannot_be_set_fail_the_start(tmp_path: Path) -> None:
    """Not swallowed: no worker runs unlimited while status says it is limited."""
    workloads = tmp_path / "workloads"
    workloads.mkdir()
    (workloads / "cgroup.subtree_control").write_text("cpu\n")  # memory not enabled
    spec = _spec(tmp_path, workloads)
    pool = _pool()
    with pytest.raises(LimitsError):
        await pool.start(spec, WorkloadName("w"), "r1", 0, Probes())
    (rep,) = pool.replicas()
    assert rep.phase is Phase.EXITED and rep.pid is None
    assert rep.exit_reason == "LimitsFailed"
    assert f"the memory controllers are not enabled in {workloads}" in rep.exit_message
    await pool.shutdown(timeout=10)


@async_test
async def test_without_pidfds_a_thread_waits_for_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel before 5.3 has no pidfd_open: workers still start, their exits are seen (by
    a thread that waits for each child) and stopping them works; they are not kept."""
    import errno

    def no_pidfds(_pid: int, _flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfds)
    model = build_mlp(tmp_path / "m.onnx", TINY_MLP, seed=1)
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    spec = launch_spec(model, sha, SandboxSpec(mode="off"))
    pool = WorkerPool(
        notify=lambda _w: None,
        on_serving_change=lambda _r, _ready: None,
        on_result=lambda *_: None,
        records=WorkerRecords(tmp_path / "records"),
        keep=True,
    )
    assert not pool.keep
    await pool.start(spec, WorkloadName("w"), "r1", 0, Probes())
    (rep,) = pool.replicas()
    await _until(lambda: rep.phase is Phase.READY, "the worker ready")
    assert rep.pidfd is None and not rep.spec.attach_name
    assert rep.pid is not None
    os.kill(rep.pid, signal.SIGKILL)
    await _until(lambda: rep.phase is Phase.EXITED, "the exit seen")
    assert rep.exit_reason == "Killed" and rep.exit_code == -signal.SIGKILL
    await pool.start(spec, WorkloadName("w"), "r1", 0, Probes())
    await _until(lambda: rep.phase is Phase.READY, "the restarted worker ready")
    await pool.shutdown(timeout=10)
    assert not rep.running
