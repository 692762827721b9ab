"""Workers that outlive edged: the record each kept worker leaves, and the checks the next edged
makes before it adopts one (docs/agent-updates.md, "Workers outlive edged").

As containerd's shims outlive containerd, a worker launched with an ``attach_name``
(``LaunchSpec``) does not die with edged: when its channel to edged closes it listens on that
abstract Unix socket for the next edged, up to ``orphan_timeout_s``, then exits by itself.

edged writes a :class:`WorkerRecord` per such process as soon as it has started (atomically, in
``<dataDir>/state/workers/``) and removes it once the process has exited under its eyes, so a
record survives a ``kill -9`` of edged. At start the next edged reads every record and, for
each one:

* :func:`identify` reads what the kernel says of the pid (``/proc/PID``) through a pidfd
  opened first, so that the pid cannot be reused between the reading and the adoption;
* :func:`check_identity` (pure) says whether that process is the worker the record describes:
  the same boot, the same start time (``/proc/PID/stat`` field 22), the same executable and
  argv, the same uid and cgroup. A process that is not is never touched (its pid was reused,
  or the record lies): the record is dropped;
* :func:`check_desired` (pure) says whether edged still wants what it runs: its workload is in
  the desired state and its model digest is one the workload names. A worker that is not
  wanted is killed (through its pidfd) and the reconciler starts what is wanted;
* the pool then connects to its socket (the peer's ``SO_PEERCRED`` pid must be the record's),
  waits for its READY (which names its pid again) and a PONG to a PING (the readiness probe):
  only then is it adopted and served, and supervised through its pidfd (it is no longer
  edged's child: edged cannot reap it, its exit status is not known).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from edged.runtime.launching import LaunchSpec
from edgefleet.logs import get_logger
from edgefleet.persisting import write_atomic

log = get_logger(__name__)

RECORD_FORMAT = 1
MAX_RECORD_BYTES = 1 << 20  # a record holds one worker's argv (its spec): far less
MAX_RECORDS = 1024  # more files than that in the directory: the rest are dropped unread
WORKER_MODULE = "edged.runtime.worker"
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
ATTACH_HELLO = b"edged-attach/1"
"""What edged sends first on a kept worker's socket, with its end of a stderr pipe (SCM_RIGHTS)."""


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """What a kept worker is: enough for the next edged to prove it and serve through it."""

    replica_id: str
    workload: str
    revision: str
    slot: int
    pid: int
    start_time: int  # /proc/PID/stat field 22: clock ticks after boot
    boot_id: str  # /proc/sys/kernel/random/boot_id: a pid of another boot is no pid of ours
    exe: str  # /proc/PID/exe
    argv: tuple[str, ...]  # /proc/PID/cmdline, the worker's spec (JSON) as its last word
    uid: int  # its real uid (/proc/PID/status)
    cgroup: str  # the cgroup v2 path it runs in ("" : none mounted)
    restarts: int = 0
    crash_streak: int = 0

    @property
    def spec(self) -> LaunchSpec:
        """The worker's spec, as its own argv says it (never a second copy that could differ)."""
        return LaunchSpec.from_json(orjson.loads(self.argv[-1]))

    @property
    def socket_name(self) -> str:
        return self.spec.attach_name

    def to_json(self) -> dict[str, Any]:
        return {"format": RECORD_FORMAT, **asdict(self), "argv": list(self.argv)}

    @classmethod
    def from_json(cls, doc: object) -> WorkerRecord:
        """A record from its JSON, or ValueError naming what is wrong."""
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        if doc.get("format") != RECORD_FORMAT:
            raise ValueError(f"format {doc.get('format')!r} is not {RECORD_FORMAT}")
        ints = ("slot", "pid", "start_time", "uid", "restarts", "crash_streak")
        strs = ("replica_id", "workload", "revision", "boot_id", "exe", "cgroup")
        for key in ints:
            if not isinstance(doc.get(key), int) or isinstance(doc.get(key), bool):
                raise ValueError(f"{key} must be an integer")
        for key in strs:
            if not isinstance(doc.get(key), str):
                raise ValueError(f"{key} must be a string")
        argv = doc.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("argv must be a non-empty list of strings")
        if not _NAME.match(doc["replica_id"]):
            raise ValueError(f"replica_id {doc['replica_id']!r} is not a replica id")
        if doc["pid"] <= 1:
            raise ValueError(f"pid {doc['pid']} is not a worker's")
        record = cls(
            **{k: doc[k] for k in ints + strs},
            argv=tuple(argv),
        )
        try:
            spec = record.spec
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise ValueError(f"argv does not end with a worker spec: {exc}") from None
        if spec.replica_id != record.replica_id or not spec.attach_name:
            raise ValueError("argv's spec is not this replica's, or not a kept worker's")
        return record


@dataclass(frozen=True, slots=True)
class ProcIdentity:
    """What the kernel says of a process (:func:`identify`)."""

    start_time: int
    exe: str
    argv: tuple[str, ...]
    uid: int
    cgroup: str


def parse_start_time(stat: str) -> int:
    """Pure: field 22 of ``/proc/PID/stat`` (after the command, which may hold spaces and
    parentheses: the last ``)`` ends it)."""
    rest = stat[stat.rindex(")") + 2 :].split()
    return int(rest[19])  # fields 3.. : field 22 is the 20th


def parse_real_uid(status: str) -> int:
    for line in status.splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise ValueError("no Uid: line")


def parse_cgroup(proc_cgroup: str, mount: str) -> str:
    """Pure: the absolute cgroup v2 directory of a ``/proc/PID/cgroup`` text ("" without
    one)."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::") and mount:
            return os.path.normpath(mount + "/" + line[3:].lstrip("/"))
    return ""


def cgroup2_mount() -> str:
    from edged.runtime.delegating import detect_hierarchy

    try:
        _, mount = detect_hierarchy(Path("/proc/self/mountinfo").read_text())
    except OSError:
        return ""
    return str(mount) if mount is not None else ""


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def identify(pid: int, *, mount: str | None = None) -> ProcIdentity:
    """What ``/proc/PID`` says; OSError when the process is gone or cannot be read."""
    base = Path(f"/proc/{pid}")
    stat = (base / "stat").read_text()
    cmdline = (base / "cmdline").read_bytes()
    try:
        exe = os.readlink(base / "exe")
    except PermissionError:
        # a worker on a uid of its own: /proc/PID/exe needs CAP_SYS_PTRACE, which the shipped
        # unit does not give edged (found by the VM lab); "" then, and the rest of the
        # identity (start time, boot, argv, uid, cgroup, the handshake) proves it
        exe = ""
    return ProcIdentity(
        start_time=parse_start_time(stat),
        exe=exe,
        argv=tuple(a.decode(errors="replace") for a in cmdline.split(b"\0")[:-1]),
        uid=parse_real_uid((base / "status").read_text()),
        cgroup=parse_cgroup(
            (base / "cgroup").read_text(), cgroup2_mount() if mount is None else mount
        ),
    )


def check_identity(record: WorkerRecord, seen: ProcIdentity | None, *, boot: str) -> str:
    """Pure: why the process behind ``record.pid`` is not the worker ``record`` describes
    (``seen``: what the kernel says of it, None when it is gone); "" when it is."""
    if seen is None:
        return f"pid {record.pid} is gone"
    if record.boot_id != boot:
        return "the record is of another boot"
    if seen.start_time != record.start_time:
        return (
            f"pid {record.pid} started at tick {seen.start_time}, the worker at "
            f"{record.start_time}: another process has its pid"
        )
    # an interpreter replaced on disk since (a package upgrade) still runs the worker; a
    # worker on a uid of its own has an exe edged cannot read (identify): the rest proves it
    if seen.exe and seen.exe not in (record.exe, f"{record.exe} (deleted)"):
        return f"pid {record.pid} runs {seen.exe}, the worker ran {record.exe}"
    if seen.argv != record.argv:
        return f"pid {record.pid}'s argv is not the worker's"
    if len(record.argv) < 3 or WORKER_MODULE not in record.argv:
        return "the recorded argv is not an inference worker's"
    if seen.uid != record.uid:
        return f"pid {record.pid} runs as uid {seen.uid}, the worker as {record.uid}"
    if seen.cgroup != record.cgroup:
        return f"pid {record.pid} is in the cgroup {seen.cgroup!r}, the worker in {record.cgroup!r}"
    return ""


def check_desired(record: WorkerRecord, digests: Mapping[str, frozenset[str]]) -> str:
    """Pure: why edged does not want what the worker runs (``digests``: per desired workload,
    the model digests it may run: its artifact and its variants); "" when it does."""
    wanted = digests.get(record.workload)
    if wanted is None:
        return f"workload {record.workload} is no longer desired"
    sha = record.spec.artifact_sha256
    if sha not in wanted:
        return (
            f"it runs the model sha256:{sha[:12]}, which workload {record.workload} no longer names"
        )
    return ""


class WorkerRecords:
    """The records of kept workers in one directory, one file per replica (atomic writes).

    ``write`` and ``remove`` only queue the change: one thread of its own makes them, in the
    order asked, so that edged's event loop never waits on the disk (a slow or stuck disk held
    every inference request and health check while a worker's record was written: the soak
    harness's slow I/O, tests/soak/test_slow_state_dir.py). ``flush`` waits for what is queued;
    ``load`` and edged's stop flush first."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._writer: ThreadPoolExecutor | None = None

    def path(self, replica_id: str) -> Path:
        if not _NAME.match(replica_id):
            raise ValueError(f"{replica_id!r} is not a replica id")
        return self.directory / f"{replica_id}.json"

    def write(self, record: WorkerRecord) -> None:
        path = self.path(record.replica_id)
        self._queue(self._write, path, orjson.dumps(record.to_json()))

    def remove(self, replica_id: str) -> None:
        self._queue(self._remove, self.path(replica_id))

    def flush(self) -> None:
        """Every queued write and removal made (blocks: call it in a thread from a loop)."""
        if self._writer is not None:
            self._writer.submit(lambda: None).result()

    def _queue(
        self, fn: Callable[[Path, bytes], None] | Callable[[Path], None], *args: Any
    ) -> None:
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="worker-records")
        self._writer.submit(fn, *args)

    def _write(self, path: Path, data: bytes) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_atomic(path, data)
        except OSError as exc:
            log.error("worker record not written", record=path.name, error=str(exc))

    @staticmethod
    def _remove(path: Path) -> None:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("worker record not removed", record=path.name, error=str(exc))

    def load(self) -> Iterator[WorkerRecord]:
        """Every readable record; one that is not is logged and removed."""
        self.flush()
        try:
            names = sorted(p.name for p in self.directory.iterdir() if p.suffix == ".json")
        except FileNotFoundError:
            return
        for i, name in enumerate(names):
            path = self.directory / name
            if i >= MAX_RECORDS:
                log.warning("too many worker records: dropped unread", record=name)
                path.unlink(missing_ok=True)
                continue
            try:
                with path.open("rb") as f:
                    data = f.read(MAX_RECORD_BYTES + 1)
                if len(data) > MAX_RECORD_BYTES:
                    raise ValueError(f"larger than {MAX_RECORD_BYTES} bytes")
                record = WorkerRecord.from_json(orjson.loads(data))
                if f"{record.replica_id}.json" != name:
                    raise ValueError(f"it names replica {record.replica_id}")
            except (OSError, ValueError) as exc:  # orjson.JSONDecodeError is a ValueError
                log.warning("worker record unreadable: dropped", record=name, error=str(exc))
                path.unlink(missing_ok=True)
                continue
            yield record


def record_for(
    spec: LaunchSpec,
    *,
    workload: str,
    revision: str,
    slot: int,
    pid: int,
    restarts: int,
    crash_streak: int,
) -> WorkerRecord:
    """The record of a worker just started with ``spec`` (read from /proc: what the kernel
    says, not what edged asked). Its cgroup is where the worker goes first thing: its own
    egress or limits cgroup, else where it was born (edged's)."""
    mount = cgroup2_mount()
    seen = identify(pid, mount=mount)
    if not seen.argv:  # read between exec's point of no return and its arguments' setup
        raise ValueError(f"pid {pid} shows no argv yet")
    cgroup = spec.sandbox.egress_cgroup or (
        spec.limits.cgroup_path if spec.limits.mode == "cgroup" else ""
    )
    return WorkerRecord(
        replica_id=spec.replica_id,
        workload=workload,
        revision=revision,
        slot=slot,
        pid=pid,
        start_time=seen.start_time,
        boot_id=boot_id(),
        exe=seen.exe,
        argv=seen.argv,
        uid=spec.uid if spec.uid >= 0 else seen.uid,
        cgroup=os.path.normpath(cgroup) if cgroup else seen.cgroup,
        restarts=restarts,
        crash_streak=crash_streak,
    )
