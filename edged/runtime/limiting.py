"""Resource limits for worker processes: cgroup v2 where edged may use one, else rlimits.

The control process decides (:func:`choose_limits`, using what :func:`detect_cgroup_root`
found); the worker applies them to itself first thing (:func:`apply_limits`), before it loads
any model, so a model never runs unlimited.

cgroup v2 needs a delegated subtree (systemd ``Delegate=yes``): edged creates one child cgroup
per replica under ``<root>/workers/`` and writes ``cpu.max`` (quota = cpu request) and
``memory.max`` (memory request). Without one, memory is bounded with ``RLIMIT_DATA`` (heap and
private mappings: an approximation that counts reservations, not resident pages) and CPU with
the affinity mask (whole cores: ``ceil(cpu)``), spreading replicas over the cores.
"""

from __future__ import annotations

import math
import os
import resource
from pathlib import Path

from edged.runtime.launching import LimitsSpec


def detect_cgroup_root(setting: str) -> Path | None:
    """The cgroup v2 directory edged may manage, or None.

    ``setting`` is the config value: ``off``, ``auto`` (edged's own cgroup when it is on the
    unified hierarchy, delegated, and has the cpu and memory controllers), or a path.
    """
    if setting == "off":
        return None
    if setting != "auto":
        path = Path(setting)
        return path if _usable(path) else None
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            path = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
            return path if _usable(path) else None
    return None


def _usable(path: Path) -> bool:
    try:
        controllers = (path / "cgroup.controllers").read_text().split()
    except OSError:
        return False
    return {"cpu", "memory"} <= set(controllers) and os.access(path, os.W_OK)


def choose_limits(
    *,
    replica_id: str,
    slot: int,
    cpu_millis: int | None,
    memory_bytes: int | None,
    cgroup_root: Path | None,
    cpu_count: int,
) -> LimitsSpec:
    """Pure: how to enforce a replica's requests given what this device allows."""
    if cpu_millis is None and memory_bytes is None:
        return LimitsSpec(mode="none")
    if cgroup_root is not None:
        return LimitsSpec(
            mode="cgroup",
            cgroup_path=str(cgroup_root / "workers" / replica_id),
            memory_bytes=memory_bytes,
            cpu_millis=cpu_millis,
        )
    cpus: tuple[int, ...] = ()
    if cpu_millis is not None and cpu_count > 0:
        n = min(cpu_count, max(1, math.ceil(cpu_millis / 1000)))
        start = (slot * n) % cpu_count
        cpus = tuple(sorted({(start + i) % cpu_count for i in range(n)}))
    return LimitsSpec(mode="rlimit", cpus=cpus, memory_bytes=memory_bytes, cpu_millis=cpu_millis)


def prepare_cgroup(limits: LimitsSpec) -> None:
    """Create the replica's cgroup and write its limits (control process, before launch)."""
    if limits.mode != "cgroup":
        return
    path = Path(limits.cgroup_path)
    parent = path.parent
    parent.mkdir(exist_ok=True)
    # Controllers must be enabled in every ancestor's subtree_control below the root.
    for anc in (parent.parent, parent):
        try:
            (anc / "cgroup.subtree_control").write_text("+cpu +memory")
        except OSError:
            pass
    path.mkdir(exist_ok=True)
    if limits.cpu_millis is not None:
        period = 100_000
        quota = max(1000, limits.cpu_millis * period // 1000)  # the kernel refuses < 1 ms
        (path / "cpu.max").write_text(f"{quota} {period}")
    if limits.memory_bytes is not None:
        (path / "memory.max").write_text(str(limits.memory_bytes))


def remove_cgroup(limits: LimitsSpec) -> None:
    if limits.mode == "cgroup":
        try:
            Path(limits.cgroup_path).rmdir()
        except OSError:
            pass


def apply_limits(limits: LimitsSpec) -> None:
    """Apply limits to the calling process (the worker, at start)."""
    if limits.mode == "cgroup":
        (Path(limits.cgroup_path) / "cgroup.procs").write_text(str(os.getpid()))
    elif limits.mode == "rlimit":
        if limits.memory_bytes is not None:
            resource.setrlimit(resource.RLIMIT_DATA, (limits.memory_bytes, limits.memory_bytes))
        if limits.cpus:
            os.sched_setaffinity(0, set(limits.cpus))


def raise_open_files_limit() -> int:
    """Raise edged's own soft RLIMIT_NOFILE to its hard limit (systemd's default soft limit is
    1024, whatever ``LimitNOFILE`` allows); the soft limit in force afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20) if soft != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= hard:
        return hard if soft == resource.RLIM_INFINITY else soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError):
        return soft
    return hard
