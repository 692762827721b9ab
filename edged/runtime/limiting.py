"""Resource limits for worker processes: cgroup v2 where edged may use one, else rlimits.

The control process decides (:func:`choose_limits`, using the workloads subtree
``delegating.delegate`` laid out); the worker applies them to itself first thing
(:func:`apply_limits`), before it loads any model, so a model never runs unlimited.

cgroup v2 needs a delegated subtree (systemd ``Delegate=yes``), laid out at edged's start by
``delegating.py``: edged in ``<delegated>/supervisor``, and one leaf per replica under
``<delegated>/workloads/`` with ``cpu.max`` (quota = cpu request) and ``memory.max`` (memory
request). A write that fails fails the replica's start (:class:`LimitsError`, reason
``LimitsFailed``): a worker never runs unlimited while status says it is limited. The leaf's
``memory.events`` counts the kernel's OOM kills (:func:`read_oom_kills`).

Without one, memory is bounded with ``RLIMIT_DATA`` (heap and private mappings: an
approximation that counts reservations, not resident pages) and CPU with the affinity mask
(whole cores: ``ceil(cpu)``), spreading replicas over the cores.
"""

from __future__ import annotations

import math
import os
import resource
from pathlib import Path

from edged.runtime.delegating import CONTROLLERS
from edged.runtime.launching import LimitsSpec


def choose_limits(
    *,
    replica_id: str,
    slot: int,
    cpu_millis: int | None,
    memory_bytes: int | None,
    cgroup_root: Path | None,
    cpu_count: int,
) -> LimitsSpec:
    """Pure: how to enforce a replica's requests given what this device allows.
    ``cgroup_root``: the workloads subtree (``CgroupLayout.workloads``), or None for rlimits."""
    if cpu_millis is None and memory_bytes is None:
        return LimitsSpec(mode="none")
    if cgroup_root is not None:
        return LimitsSpec(
            mode="cgroup",
            cgroup_path=str(cgroup_root / replica_id),
            memory_bytes=memory_bytes,
            cpu_millis=cpu_millis,
        )
    cpus: tuple[int, ...] = ()
    if cpu_millis is not None and cpu_count > 0:
        n = min(cpu_count, max(1, math.ceil(cpu_millis / 1000)))
        start = (slot * n) % cpu_count
        cpus = tuple(sorted({(start + i) % cpu_count for i in range(n)}))
    return LimitsSpec(mode="rlimit", cpus=cpus, memory_bytes=memory_bytes, cpu_millis=cpu_millis)


class LimitsError(OSError):
    """The replica's cgroup or its limits could not be written (the message says which)."""


def prepare_cgroup(limits: LimitsSpec) -> None:
    """Create the replica's leaf below the workloads subtree and write its limits (control
    process, before launch). :class:`LimitsError` names what failed."""
    if limits.mode != "cgroup":
        return
    path = Path(limits.cgroup_path)
    try:
        enabled = (path.parent / "cgroup.subtree_control").read_text().split()
    except OSError as exc:
        raise LimitsError(
            exc.errno, f"cannot read {path.parent}/cgroup.subtree_control: {exc.strerror}"
        ) from None
    missing = [c for c in CONTROLLERS if c not in {w.lstrip("+") for w in enabled}]
    if missing:
        raise LimitsError(
            0, f"the {' and '.join(missing)} controllers are not enabled in {path.parent}"
        )
    writes: list[tuple[str, str]] = []
    if limits.cpu_millis is not None:
        period = 100_000
        quota = max(1000, limits.cpu_millis * period // 1000)  # the kernel refuses < 1 ms
        writes.append(("cpu.max", f"{quota} {period}"))
    if limits.memory_bytes is not None:
        writes.append(("memory.max", str(limits.memory_bytes)))
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        raise LimitsError(exc.errno, f"cannot make the cgroup {path}: {exc.strerror}") from None
    for name, value in writes:
        try:
            (path / name).write_text(value)
        except OSError as exc:
            raise LimitsError(
                exc.errno, f"cannot write {value} to {path / name}: {exc.strerror}"
            ) from None


def read_oom_kills(limits: LimitsSpec) -> int | None:
    """How many times the kernel's OOM killer acted in the replica's cgroup (``oom_kill`` of
    its ``memory.events``); None without a cgroup or when it cannot be read."""
    if limits.mode != "cgroup":
        return None
    try:
        text = (Path(limits.cgroup_path) / "memory.events").read_text()
    except OSError:
        return None
    return parse_oom_kills(text)


def parse_oom_kills(memory_events: str) -> int | None:
    """Pure: ``oom_kill`` of a ``memory.events`` file's text."""
    for line in memory_events.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def remove_cgroup(limits: LimitsSpec) -> None:
    if limits.mode == "cgroup":
        try:
            Path(limits.cgroup_path).rmdir()
        except OSError:
            pass  # gone already, or a process of it lingers: the next start reuses it


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
