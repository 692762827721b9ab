"""The drift watch (component ``drift``): every period, look at what the baseline covers
(``checking.py`` decides), report it (status ``device.compliance``, a ``Compliant``
condition, the log) and hand the remediation the baseline asks for to ``act``.

Idle cost: one ``scandir`` of the store, one read of the config file, one read of a few
``cgroup.procs`` and ``/proc/PID/stat`` per period; a blob is hashed (in a thread) only when
its stat fingerprint changed since it was last trusted. Open files and listeners: one
``readlink`` per descriptor of every process edged may look at (at most
:data:`MAX_PROCESSES` processes of :data:`MAX_FDS` descriptors each: a check that stops
there says so in status), and one read of ``/proc/net/{tcp,tcp6,unix}``; ``/proc/PID/stat``
only of the processes found holding a model file or a listener.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edged.compliance.checking import (
    DriftAction,
    Finding,
    Listener,
    Remediation,
    StoreEntry,
    check_config,
    check_listeners,
    check_openers,
    check_processes,
    check_store,
    hash_findings,
    plan_remediation,
)
from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop

log = get_logger(__name__)

DEFAULT_PERIOD_S = 30.0
MAX_PROCESSES = 4096
MAX_FDS = 4096
PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class IngressRules:
    """What may listen (``check_listeners``): the baselines' loopback TCP ports (None: any
    loopback port) and the unix socket paths edged serves."""

    tcp_ports: tuple[int, ...] | None
    unix_paths: tuple[str, ...]


@dataclass(slots=True)
class FdScan:
    """What the descriptors of the processes showed."""

    open_blobs: dict[int, list[str]] = field(default_factory=dict)  # pid -> blob names
    sockets: dict[int, int] = field(default_factory=dict)  # socket inode -> pid
    complete: bool = True  # False: stopped at MAX_PROCESSES or MAX_FDS


def scan_fds(blobs: Path, proc: Path = PROC) -> FdScan:
    """Every process's descriptors (those edged may read): which point into ``blobs``, and
    which socket inode each process holds. Bounded (see the module doc)."""
    out = FdScan()
    prefix = str(blobs.resolve()) + "/"
    try:
        pids = [int(n) for n in os.listdir(proc) if n.isdigit()]
    except OSError:
        return FdScan(complete=False)
    if len(pids) > MAX_PROCESSES:
        out.complete = False
        pids = pids[:MAX_PROCESSES]
    for pid in pids:
        fd_dir = f"{proc}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue  # gone, a kernel thread, or not ours to read
        if len(fds) > MAX_FDS:
            out.complete = False
            fds = fds[:MAX_FDS]
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = target[8:-1]
                if inode.isdigit():
                    out.sockets[int(inode)] = pid
            elif target.startswith(prefix):
                out.open_blobs.setdefault(pid, []).append(target[len(prefix) :])
    return out


TCP_LISTEN = "0A"
UNIX_ACCEPTCON = 0x10000


def _tcp_address(hex_addr: str) -> tuple[str, int]:
    """``0100007F:1F90`` (or the 32-digit IPv6 form) as ("127.0.0.1", 8080)."""
    addr, _, port = hex_addr.partition(":")
    raw = bytes.fromhex(addr)
    # /proc/net/tcp{,6} print each 32-bit word in host order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if sys.byteorder == "big":
        words = raw
    return str(ipaddress.ip_address(words)), int(port, 16)


def unix_sockets(proc: Path = PROC) -> tuple[dict[int, str], set[int]]:
    """The unix sockets of edged's network namespace: those listening (inode -> path,
    ``@name`` when abstract) and the inodes of all (socket pairs too)."""
    listening: dict[int, str] = {}
    every: set[int] = set()
    try:
        lines = (proc / "net" / "unix").read_text().splitlines()[1:]
    except OSError:
        return listening, every
    for line in lines:
        f = line.split()
        # Num RefCount Protocol Flags Type St Inode [Path]
        if len(f) < 7 or not f[6].isdigit():
            continue
        inode = int(f[6])
        every.add(inode)
        if int(f[3], 16) & UNIX_ACCEPTCON:
            listening[inode] = f[7] if len(f) > 7 else "(unnamed)"
    return listening, every


def tcp_listeners(proc: Path = PROC) -> dict[int, tuple[str, str, int]]:
    """Listening TCP sockets of edged's network namespace: inode -> (family, address, port).
    Dearer than the unix table (the kernel walks every TCP socket to print it): read only
    when a process in scope holds a socket that is not a unix one."""
    out: dict[int, tuple[str, str, int]] = {}
    for family in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / family).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == TCP_LISTEN and f[9].isdigit():
                try:
                    address, port = _tcp_address(f[1])
                except ValueError:
                    continue
                out[int(f[9])] = (family, address, port)
    return out


def descendants(pid: int, proc: Path = PROC) -> set[int] | None:
    """Every process below ``pid`` (its workers), from ``/proc/PID/task/*/children``; None
    when the kernel does not offer that file."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        cur = todo.pop()
        try:
            tasks = os.listdir(f"{proc}/{cur}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                text = Path(f"{proc}/{cur}/task/{task}/children").read_text()
            except FileNotFoundError:
                if cur == pid:
                    return None
                continue
            except OSError:
                continue
            for child in map(int, text.split()):
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return found


def process_uid(pid: int, proc: Path = PROC) -> int | None:
    try:
        return os.stat(f"{proc}/{pid}").st_uid
    except OSError:
        return None


def scan_store(blobs: Path) -> list[StoreEntry]:
    out = []
    try:
        with os.scandir(blobs) as it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                out.append(
                    StoreEntry(
                        e.name,
                        e.is_file(follow_symlinks=False),
                        st.st_mode,
                        st.st_size,
                        st.st_mtime_ns,
                        st.st_ino,
                    )
                )
    except FileNotFoundError:
        pass
    return out


def file_digest(path: Path) -> str | None:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def own_cgroup() -> Path | None:
    """edged's cgroup v2 directory, or None when it has none of its own (the root cgroup,
    or no cgroup v2 mounted): then strays cannot be told from the rest of the machine."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    rel = next((line[3:] for line in lines if line.startswith("0::")), None)
    mount = next((m.split()[4] for m in mounts if " - cgroup2 " in m), None)
    if rel is None or mount is None or rel in ("", "/"):
        return None
    return Path(mount) / rel.lstrip("/")


def cgroup_pids(root: Path) -> list[int]:
    pids: list[int] = []
    for dirpath, _, files in os.walk(root):
        if "cgroup.procs" in files:
            try:
                text = (Path(dirpath) / "cgroup.procs").read_text()
            except OSError:
                continue
            pids += [int(x) for x in text.split()]
    return pids


def process_table(pids: list[int]) -> tuple[dict[int, int], dict[int, str]]:
    """Parent pid and name of each of ``pids`` and of their ancestors."""
    parent: dict[int, int] = {}
    names: dict[int, str] = {}
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid in parent or pid <= 1:
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name, _, rest = stat.partition("(")[2].rpartition(")")
        ppid = int(rest.split()[1])
        parent[pid], names[pid] = ppid, name
        todo.append(ppid)
    return parent, names


def _descends_from(pid: int, own: int, parent: dict[int, int]) -> bool:
    seen = set()
    while pid not in (own, 0, 1) and pid not in seen and pid in parent:
        seen.add(pid)
        pid = parent[pid]
    return pid == own


class DriftWatch:
    """Component ``drift``. ``action()``: the baselines' drift action now; ``period()``:
    seconds between checks; ``act(remediation)``: performs what the action asks."""

    name = "drift"

    def __init__(
        self,
        *,
        blobs: Path,
        config_path: Path | None,
        action: Callable[[], DriftAction],
        period: Callable[[], float],
        act: Callable[[Remediation], None],
        on_change: Callable[[], None],
        ingress: Callable[[], IngressRules] | None = None,
    ) -> None:
        self._blobs = blobs
        self._config_path = config_path
        self._config_digest = file_digest(config_path) if config_path else None
        self._action = action
        self._period = period
        self._act = act
        self._on_change = on_change
        self._trusted: dict[str, tuple[int, int, int]] = {}
        self._bad: dict[str, tuple[tuple[int, int, int], str | None]] = {}
        self._first = True
        self._cgroup: Path | None = None
        self._ingress = ingress
        self._fds_complete: bool | None = None
        self.findings: tuple[Finding, ...] = ()
        self.checked_at: float | None = None

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.check()
            if await wait_for_stop(stop, self._period()):
                return

    async def check(self) -> tuple[Finding, ...]:
        entries = scan_store(self._blobs)
        findings, to_hash = check_store(entries, self._trusted)
        by_name = {e.name: e for e in entries}
        if self._first:  # what is there at start is trusted as it is; workers re-hash it
            for name in to_hash:
                self._trusted[name] = by_name[name].fingerprint
            to_hash = []
            self._first = False
        hashed: dict[str, str | None] = {}
        for name in to_hash:
            fp = by_name[name].fingerprint
            bad = self._bad.get(name)
            if bad is not None and bad[0] == fp:
                hashed[name] = bad[1]
                continue
            found = await asyncio.to_thread(file_digest, self._blobs / name)
            if found == name:
                self._trusted[name] = fp
                self._bad.pop(name, None)
            else:
                self._bad[name] = (fp, found)
                hashed[name] = found
        findings += hash_findings(hashed)
        if self._config_path is not None:
            now = await asyncio.to_thread(file_digest, self._config_path)
            findings += check_config(str(self._config_path), self._config_digest, now)
        self._cgroup = own_cgroup()  # read each time: edged may be moved (systemd, a test)
        pids = []
        if self._cgroup is not None:
            pids = cgroup_pids(self._cgroup)
            parent, names = process_table(pids)
            findings += check_processes(pids, parent, os.getpid(), names)
        findings += await asyncio.to_thread(self._check_descriptors, set(pids))
        new = [f for f in findings if f not in self.findings]
        for f in new:
            log.warning("drift detected", kind=f.kind.value, subject=f.subject, message=f.message)
        changed = tuple(findings) != self.findings
        self.findings = tuple(findings)
        self.checked_at = time.time()
        if changed:
            self._on_change()
        remediation = plan_remediation(findings, self._action())
        if remediation != Remediation():
            self._act(remediation)
        return self.findings

    def _check_descriptors(self, cgroup_pids: set[int]) -> list[Finding]:
        """Model files held open by others, and listeners the ingress policy does not allow
        (``checking.check_openers``, ``check_listeners``)."""
        own = os.getpid()
        scan = scan_fds(self._blobs)
        self._fds_complete = scan.complete
        below = descendants(own)
        openers = {
            pid: blobs
            for pid, blobs in scan.open_blobs.items()
            if pid != own and (below is None or pid not in below)
        }
        held: dict[int, int] = {}  # socket inode -> pid, of the processes in scope
        if self._ingress is not None:
            uid = os.getuid()
            scope: dict[int, bool] = {own: False}  # pid -> in scope, asked once per process

            def in_scope(pid: int) -> bool:
                if pid not in scope:
                    scope[pid] = (
                        pid in cgroup_pids
                        or (below is not None and pid in below)
                        or (below is None and _descends_from(pid, own, process_table([pid])[0]))
                        or (uid != 0 and process_uid(pid) == uid)
                    )
                return scope[pid]

            held = {inode: pid for inode, pid in scan.sockets.items() if in_scope(pid)}
        listeners: list[Listener] = []
        if held:
            unix, every_unix = unix_sockets()
            listeners += [Listener(held[i], "unix", path) for i, path in unix.items() if i in held]
            if any(i not in every_unix for i in held):
                listeners += [
                    Listener(held[i], family, address, port)
                    for i, (family, address, port) in tcp_listeners().items()
                    if i in held
                ]
        if not openers and not listeners:
            return []
        parent, names = process_table(sorted(set(openers) | {li.pid for li in listeners}))
        findings = check_openers(openers, parent, own, names)
        if self._ingress is not None:
            rules = self._ingress()
            findings += check_listeners(
                listeners, tcp_ports=rules.tcp_ports, unix_paths=rules.unix_paths, names=names
            )
        return findings

    def status(self, *, quarantined: str | None) -> dict[str, Any]:
        """``device.compliance`` of ``/v1/status``."""
        compliant = not self.findings and quarantined is None
        return {
            "compliant": compliant if self.checked_at is not None else None,
            "checkedAt": self.checked_at,
            "action": self._action().value,
            "findings": [f.to_json() for f in self.findings],
            "processesChecked": self._cgroup is not None,
            "descriptorsChecked": self._fds_complete,
            "quarantined": quarantined,
            "condition": {
                "type": "Compliant",
                "status": "Unknown"
                if self.checked_at is None
                else ("True" if compliant else "False"),
                "reason": "Quarantined"
                if quarantined
                else (self.findings[0].kind.value if self.findings else "NoDrift"),
                "message": quarantined
                or "; ".join(f.message for f in self.findings[:4])
                or "nothing differs from what edged made",
            },
        }
