"""``edged-launcher cleanup [CGROUP-DIR]`` (edged.service's ExecStopPost=, :mod:`edged.launcher`):
after the unit's main process is gone, ready its cgroup for the next start, keeping the
workers the last edged kept for the next one to adopt. Stdlib only."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from edged.launcher.state import _log, _read_small_json, data_dir_of

CLEANUP = "cleanup"  # edged-launcher cleanup [CGROUP-DIR] (edged.service's ExecStopPost=)
WORKER_MODULE = "edged.runtime.worker"  # in a kept worker's argv (edged.runtime.processes)
CONTROL = ".control"  # where systemd runs a delegated unit's ExecStopPost= (systemd 240..)
CLEANUP_TIMEOUT_S = 10.0


def _cgroup_procs(cgroup: Path) -> list[int]:
    """The live processes in ``cgroup`` (zombies and pids gone since are not)."""
    try:
        words = (cgroup / "cgroup.procs").read_text().split()
    except OSError:
        return []
    alive = []
    for word in words:
        try:
            stat = Path(f"/proc/{int(word)}/stat").read_text()
        except (OSError, ValueError):
            continue
        if stat.rpartition(")")[2].split()[:1] != ["Z"]:
            alive.append(int(word))
    return alive


MAX_WORKER_RECORDS = 1024  # as edged.runtime.adopting reads them
MAX_WORKER_RECORD_BYTES = 1 << 20


def recorded_workers(data_dir: Path) -> frozenset[tuple[int, int]]:
    """(pid, start time) of each kept worker's record, ``D/state/workers/*.json``
    (edged.runtime.adopting: format 1), bounded; unreadable records name no worker."""
    found: set[tuple[int, int]] = set()
    try:
        paths = sorted((data_dir / "state" / "workers").glob("*.json"))[:MAX_WORKER_RECORDS]
    except OSError:
        return frozenset()
    for path in paths:
        try:
            doc = _read_small_json(path, MAX_WORKER_RECORD_BYTES)
        except (OSError, ValueError):
            continue
        pid, start = doc.get("pid"), doc.get("start_time")
        if doc.get("format") == 1 and type(pid) is int and type(start) is int and pid > 1:
            found.add((pid, start))
    return frozenset(found)


def _start_time(pid: int) -> int | None:
    """/proc/PID/stat field 22 (clock ticks after boot), as a worker's record has it."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _is_kept_worker(pid: int, records: frozenset[tuple[int, int]]) -> bool:
    """A worker some edged recorded as kept (its record's pid and start time) and whose argv
    says it is one: only such a process can be adopted by the next edged."""
    if (pid, _start_time(pid)) not in records:
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return WORKER_MODULE.encode() in argv


def cleanup_cgroup(
    unit: Path,
    own: Path | None = None,
    *,
    records: frozenset[tuple[int, int]] = frozenset(),
    release: bool = True,
    timeout_s: float = CLEANUP_TIMEOUT_S,
    rmdir: Any = os.rmdir,
) -> str:
    """After the unit's main process is gone (ExecStopPost=), make ``unit`` (the unit's
    cgroup) one systemd can start edged.service in again, keeping the kept workers for the
    next edged; what was done, for the journal. Never raises.

    edged moves itself into ``<unit>/supervisor``, enables the cpu and memory controllers in
    ``<unit>``'s and ``<unit>/workloads``'s ``cgroup.subtree_control`` and starts each worker
    in a leaf below. Without ``DelegateSubgroup=`` (systemd before 254) systemd starts the
    next launcher in ``<unit>`` itself, which cgroup v2 refuses while controllers are enabled
    there (no internal processes: 219/CGROUP at every restart, each one counted against the
    start limit). So:

    1. every process below ``unit`` that is not a kept worker (``records``: its record's
       pid and start time, from :func:`recorded_workers`; its argv names the worker module)
       is killed (with
       ``KillMode=process``, an edged still draining after its launcher was killed, or
       anything they started), except in ``own`` (``<unit>/.control``, this command's);
    2. with kept workers left and ``release`` (no ``DelegateSubgroup=``), the controllers are
       disabled below ``unit``, deepest first: the workers run on, without cpu.max and
       memory.max until the next edged adopts them and writes their limits again
       (edged.runtime.workerpool); where that fails, the workers are killed too;
    3. with nothing left, the leaves are removed, deepest first, and the controllers disabled
       in ``unit`` (systemd removes the cgroup then, or starts the next one in it)."""
    if not (unit / "cgroup.procs").exists():
        return f"{unit} is not a cgroup (nothing to do)"
    try:
        dirs = sorted((Path(d) for d, _, _ in os.walk(unit)), key=lambda d: (-len(d.parts), str(d)))
    except OSError as exc:
        return f"cannot read {unit}: {exc}"
    below = [d for d in dirs if d != unit and (own is None or not d.is_relative_to(own))]
    killed, stuck = _kill_below(
        [*below, unit], lambda pid: not _is_kept_worker(pid, records), timeout_s
    )
    said = f"{len(killed)} process(es) ended" + (f" ({sorted(killed)})" if killed else "")
    if stuck:
        return f"{said}; processes {stuck} in {unit} outlived SIGKILL for {timeout_s:g} s"
    workers = [p for d in [*below, unit] for p in _cgroup_procs(d)]
    if workers and not release:
        return f"{said}; {len(workers)} kept worker(s) left for the next edged"
    if workers:
        problem = _disable_controllers([*below, unit])
        if not problem:
            return (
                f"{said}; {len(workers)} kept worker(s) left for the next edged, controllers "
                f"disabled below {unit} until it writes their limits again"
            )
        more, stuck = _kill_below([*below, unit], lambda _pid: True, timeout_s)
        killed |= more
        said = f"{problem}: {len(killed)} process(es) ended ({sorted(killed)})"
        if stuck:
            return f"{said}; processes {stuck} in {unit} outlived SIGKILL for {timeout_s:g} s"
    removed = 0
    for d in below:
        if own is not None and own.is_relative_to(d):
            continue
        try:
            rmdir(d)
            removed += 1
        except FileNotFoundError:
            pass  # removed meanwhile (by systemd, or with its parent): what was wanted
        except OSError as exc:
            return f"{said}; cannot remove the cgroup {d}: {exc}"
    problem = _disable_controllers([unit])
    return f"{said}; {removed} cgroup(s) removed; " + (problem or f"{unit} is ready")


def _kill_below(dirs: list[Path], which: Any, timeout_s: float) -> tuple[set[int], list[int]]:
    """SIGKILL every live process in ``dirs`` that ``which`` picks, until none is left or
    ``timeout_s`` passed: (those signalled, those still there)."""
    deadline = time.monotonic() + timeout_s
    killed: set[int] = set()
    while True:
        left = [p for d in dirs for p in _cgroup_procs(d) if which(p)]
        if not left or time.monotonic() >= deadline:
            return killed, sorted(left)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                pass  # gone, or not ours to signal (left: it says so at the deadline)
        time.sleep(0.05)


def _disable_controllers(dirs: list[Path]) -> str:
    """Disable every controller enabled in each of ``dirs``' ``cgroup.subtree_control``, in
    that order (deepest first: a parent's cannot go while a child's is on); "" or why not."""
    for d in dirs:
        try:
            enabled = (d / "cgroup.subtree_control").read_text().split()
            if enabled:
                (d / "cgroup.subtree_control").write_text(" ".join(f"-{c}" for c in enabled))
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"cannot disable the controllers of {d}: {exc}"
    return ""


def own_unit_cgroup(proc_cgroup: str, mountinfo: str) -> tuple[Path, Path] | str:
    """Pure: (the unit's cgroup, this process's) when this runs as a delegated unit's control
    process (``<unit>/.control``, as systemd runs ExecStopPost=), else why not."""
    own = next((ln[3:] for ln in proc_cgroup.splitlines() if ln.startswith("0::")), None)
    mount = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if sep and right.split()[:1] == ["cgroup2"] and len(left.split()) > 4:
            mount = Path(left.split()[4])
            break
    if own is None or mount is None:
        return "no cgroup v2 (nothing to do)"
    path = mount / own.lstrip("/")
    if path.name != CONTROL or not path.parent.name.endswith(".service"):
        return (
            f"not a unit's control process (cgroup {own}): run as edged.service's ExecStopPost=, "
            "or name the unit's cgroup"
        )
    return path.parent, path


def cleanup_main(args: list[str]) -> int:
    data_dir = data_dir_of(args, dict(os.environ))  # --data-dir, else $STATE_DIRECTORY
    rest = [
        a for i, a in enumerate(args) if a != "--data-dir" and args[i - 1 : i] != ["--data-dir"]
    ]
    rest = [a for a in rest if not a.startswith("--data-dir=")]
    if len(rest) > 1 or (rest and not rest[0].startswith("/")):
        sys.stderr.write(f"usage: edged-launcher {CLEANUP} [--data-dir DIR] [/sys/fs/cgroup/...]\n")
        return 2
    records = recorded_workers(data_dir)
    if rest:
        _log(f"cleanup: {cleanup_cgroup(Path(rest[0]), records=records)}")
        return 0
    try:
        found = own_unit_cgroup(
            Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text()
        )
    except OSError as exc:
        found = f"cannot read /proc: {exc}"
    if isinstance(found, str):
        _log(f"cleanup: {found}")
        return 0
    unit, own = found
    release = not _delegate_subgroup(unit.name)
    _log(f"cleanup: {cleanup_cgroup(unit, own, records=records, release=release)}")
    return 0


def _delegate_subgroup(unit: str) -> str:
    """The unit's ``DelegateSubgroup=`` (systemd 254; "" before, or when systemctl cannot
    say): with it systemd starts the unit again beside controllers enabled below it."""
    import subprocess

    try:
        done = subprocess.run(
            ["systemctl", "show", "--property=DelegateSubgroup", "--value", unit],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""
