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

Opens between two checks: where edged has ``CAP_SYS_ADMIN`` the kernel reports each open of
a file of the store (``fanotifying.py``); edged wakes only then, and an open by a process
that is neither edged nor one of its descendants is a ``ModelFileOpened`` finding at once,
remediated at once under the baselines' action. Bounded: at most
:data:`MAX_OPEN_EVENTS_PER_S` events read a second (the rest wait in the kernel's bounded
queue), at most :data:`MAX_OPEN_FINDINGS` such findings kept, each for one drift period
after its last open. Without the capability or kernel support the watch is not in force
(status says why) and the descriptor scan of each check stays the only way.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import os
import sys
import time
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edged.compliance.checking import (
    HEX_NAME,
    DriftAction,
    Finding,
    FindingKind,
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
from edged.compliance.fanotifying import OpenEvent, OpenWatch, open_watch
from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop

log = get_logger(__name__)

DEFAULT_PERIOD_S = 30.0
MAX_PROCESSES = 4096
MAX_FDS = 4096
PROC = Path("/proc")
MAX_OPEN_EVENTS_PER_S = 200
MAX_OPEN_FINDINGS = 32
GONE_GRACE_S = 1.0


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
        started: Callable[[], Container[int]] | None = None,
    ) -> None:
        """``started()``: the pids of the latest workers edged started (one that opened its
        model and is gone, reaped, before edged looks is told from a stranger by it)."""
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
        self._started = started
        self._fds_complete: bool | None = None
        self.findings: tuple[Finding, ...] = ()
        self.checked_at: float | None = None
        self._polled: tuple[Finding, ...] = ()  # of the last check
        self._watch: OpenWatch | None = None
        self.open_watch_reason: str | None = "not started yet"  # None: in force
        # (pid, blob) -> the finding, when last seen (time.monotonic())
        self._opened: dict[tuple[int, str], tuple[Finding, float]] = {}
        self._window = (0.0, 0)  # rate bound: (second it began, events read in it)
        self._timers: list[asyncio.TimerHandle] = []  # resume reading; judge the gone
        self._gone: list[tuple[int, str, float]] = []  # (pid, blob, when): judged soon
        self.open_counts = {"events": 0, "edged": 0, "paused": 0, "findingsDropped": 0}

    async def run(self, stop: asyncio.Event) -> None:
        self.start_open_watch()
        try:
            while not stop.is_set():
                await self.check()
                if await wait_for_stop(stop, self._period()):
                    return
        finally:
            self.stop_open_watch()

    # -- opens, as the kernel reports them (fanotify) ---------------------------------------
    def start_open_watch(self) -> None:
        """Watch opens of the store from now on (on the running loop), or say why not."""
        if self._watch is not None:
            return
        found = open_watch(self._blobs)
        if isinstance(found, str):
            if self.open_watch_reason != found:
                log.warning("open watch not in force", reason=found)
            self.open_watch_reason = found
            return
        self._watch = found
        self.open_watch_reason = None
        asyncio.get_running_loop().add_reader(found.fd, self._on_open_events)
        log.info("open watch in force", path=str(self._blobs))

    def stop_open_watch(self) -> None:
        if self._watch is None:
            return
        with contextlib.suppress(RuntimeError, ValueError):  # loop closed: nothing to remove
            asyncio.get_running_loop().remove_reader(self._watch.fd)
        for timer in self._timers:
            timer.cancel()
        self._timers = []
        self._watch.close()
        self._watch = None
        self.open_watch_reason = "stopped"

    def _on_open_events(self) -> None:
        self._guarded(self._read_open_events)

    def _guarded(self, step: Callable[[], None]) -> None:
        """Run a step of the watch called by the loop (a reader, a timer): nothing above it
        would hear of a failure, so the watch stops and says why, and the next check starts
        it again."""
        try:
            step()
        except Exception as exc:
            log.error("open watch failed", error=repr(exc))
            self.stop_open_watch()
            self.open_watch_reason = f"failed: {exc!r} (started again at the next check)"
            self._on_change()

    def _read_open_events(self) -> None:
        watch = self._watch
        if watch is None:
            return
        clock = asyncio.get_running_loop().time()
        self._timers = [t for t in self._timers if t.when() > clock]  # those still to fire
        now = time.monotonic()
        began, count = self._window
        if now - began >= 1.0:
            began, count = now, 0
        budget = MAX_OPEN_EVENTS_PER_S - count
        if budget <= 0:  # the rest waits in the kernel's queue until the next second
            loop = asyncio.get_running_loop()
            loop.remove_reader(watch.fd)
            self.open_counts["paused"] += 1
            self._timers.append(loop.call_later(began + 1.0 - now, self._resume_open_watch))
            return
        events = list(watch.read(budget))
        self._window = (began, count + len(events))
        self.open_counts["events"] += len(events)
        self._publish(self._judge_opens(events, time.monotonic()))

    def _publish(self, new: list[Finding]) -> None:
        """Report findings the open watch made, and remediate them at once."""
        if not new:
            return
        for f in new:
            log.warning("drift detected", kind=f.kind.value, subject=f.subject, message=f.message)
        self._compose()
        self._on_change()
        remediation = plan_remediation(new, self._action())
        if remediation != Remediation():
            self._act(remediation)

    def _resume_open_watch(self) -> None:
        if self._watch is not None:
            self._window = (time.monotonic(), 0)
            asyncio.get_running_loop().add_reader(self._watch.fd, self._on_open_events)

    def _judge_opens(self, events: list[OpenEvent], now: float) -> list[Finding]:
        """The new findings among ``events``: opens of a blob by a process that is neither
        edged nor one of its descendants. A process gone (reaped) before edged looked is
        judged again :data:`GONE_GRACE_S` later against the workers edged started (a worker
        may open its model and exit before edged has noted its pid); not one of them: a
        finding."""
        own = os.getpid()
        prefix = str(self._blobs.resolve()) + "/"
        new: list[Finding] = []
        for ev in events:
            blob = ev.path[len(prefix) :] if ev.path.startswith(prefix) else ""
            if ev.pid == own or not HEX_NAME.fullmatch(blob):
                continue  # edged itself; other names are ArtifactAdded findings already
            parent, names = process_table([ev.pid])
            if _descends_from(ev.pid, own, parent):
                self.open_counts["edged"] += 1
                continue
            if ev.pid not in parent and self._started is not None:
                if ev.pid in self._started():
                    self.open_counts["edged"] += 1
                elif len(self._gone) < MAX_OPEN_FINDINGS:
                    if not self._gone:
                        loop = asyncio.get_running_loop()
                        self._timers.append(
                            loop.call_later(GONE_GRACE_S, self._guarded, self._judge_gone)
                        )
                    self._gone.append((ev.pid, blob, now))
                else:  # too many to wait for: judged now
                    new += self._record(ev.pid, blob, "", now)
                continue
            try:
                who = os.readlink(f"{PROC}/{ev.pid}/exe")
            except OSError:
                who = names.get(ev.pid, "")
            new += self._record(ev.pid, blob, who, now)
        return new

    def _judge_gone(self) -> None:
        gone, self._gone = self._gone, []
        started = self._started() if self._started is not None else ()
        new: list[Finding] = []
        for pid, blob, at in gone:
            if pid in started:
                self.open_counts["edged"] += 1
            else:
                new += self._record(pid, blob, "", at)
        self._publish(new)

    def _record(self, pid: int, blob: str, who: str, now: float) -> list[Finding]:
        """A finding for ``pid`` opening ``blob`` (``who``: its executable), when new."""
        key = (pid, blob)
        if key in self._opened:
            self._opened[key] = (self._opened[key][0], now)
            return []
        finding = Finding(
            FindingKind.MODEL_FILE_OPENED,
            str(pid),
            f"process {pid} ({who or 'exited before edged looked'}) opened model file "
            f"{blob[:12]} (seen by fanotify); only edged's workers may",
        )
        if len(self._opened) >= MAX_OPEN_FINDINGS:
            oldest = min(self._opened, key=lambda k: self._opened[k][1])
            del self._opened[oldest]
            self.open_counts["findingsDropped"] += 1
        self._opened[key] = (finding, now)
        return [finding]

    def _compose(self) -> None:
        self.findings = self._polled + tuple(f for f, _ in self._opened.values())

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
            # edged's own launcher (edged-launcher, its parent) and the workers it adopted
            # (kept by the previous edged, their parent is init now) are edged's too
            known: set[int] = set()
            if self._started is not None:
                known.update(p for p in pids if p in self._started())
            if os.environ.get("EDGED_SLOT"):
                known.add(os.getppid())
            findings += check_processes(
                [p for p in pids if p not in known], parent, os.getpid(), names
            )
        findings += await asyncio.to_thread(self._check_descriptors, set(pids))
        new = [f for f in findings if f not in self.findings]
        for f in new:
            log.warning("drift detected", kind=f.kind.value, subject=f.subject, message=f.message)
        if self._watch is None and self.open_watch_reason not in ("not started yet", "stopped"):
            self.start_open_watch()  # the store may have appeared, or be a directory again
        at = time.time()
        # ages on the monotonic clock: a step of the wall clock (NTP, date -s) must neither
        # keep an open's finding for the length of the step nor drop it early
        seen_before = time.monotonic() - self._period()
        self._opened = {k: v for k, v in self._opened.items() if v[1] > seen_before}
        before = self.findings
        self._polled = tuple(findings)
        self._compose()
        changed = self.findings != before
        self.checked_at = at
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
            "opensWatched": self.open_watch_reason is None,
            "opensWatch": {
                "reason": self.open_watch_reason,
                "overflows": self._watch.overflows if self._watch is not None else 0,
                **self.open_counts,
            },
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
