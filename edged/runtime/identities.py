"""Worker identities: a separate unprivileged uid (and gid of the same number) per worker
replica when edged runs as root, as systemd's ``DynamicUser=`` gives one per service.

* :func:`uid_candidates` and :func:`choose_uid` are pure: a replica slot (workload and slot
  number) always prefers the same uid of the range (a hash of the slot), then the next ones
  in turn, so a slot gets the same uid again across restarts while it is free.
* :class:`WorkerUids` holds the uids of the live replicas of this edged. A uid is taken only
  when nothing else has it: no user or group of that number in the user database (NSS), no
  running process of that uid (``/proc/*/status``), and a lock in
  ``/run/systemd/dynamic-uid/<uid>``: the BSD lock systemd itself takes on a dynamic uid
  (src/core/dynamic-user.c), so systemd never hands a uid a worker holds to a
  ``DynamicUser=`` service, nor edged one a service holds, and two edgeds on one machine
  never share one. The lock is held (its descriptor open) until the replica's process has
  exited; then the file is removed and the uid is free again.
"""

from __future__ import annotations

import fcntl
import grp
import hashlib
import os
import pwd
import stat
from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from edged.config import WorkersConfig
from edgefleet.logs import get_logger

log = get_logger(__name__)

DEFAULT_UID_BASE = 61184
DEFAULT_UID_COUNT = 4336  # 61184-65519: systemd's dynamic service users (UIDS-GIDS.md)
LOCK_DIR = Path("/run/systemd/dynamic-uid")
SPECIAL_UIDS = frozenset({65534, 65535})  # nobody, and (uid_t) -1 of 16-bit programs
MAX_TRIES = 256  # candidates tried per allocation before giving up


@dataclass(frozen=True, slots=True)
class UidRange:
    base: int = DEFAULT_UID_BASE
    count: int = DEFAULT_UID_COUNT

    @property
    def last(self) -> int:
        return self.base + self.count - 1

    def __str__(self) -> str:
        return f"{self.base}-{self.last}"


def uid_candidates(key: str, uids: UidRange) -> Iterator[int]:
    """Pure: the uids of ``uids`` in the order slot ``key`` tries them: the one its hash
    names, then each next one, wrapping around, each once."""
    start = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % uids.count
    for i in range(uids.count):
        uid = uids.base + (start + i) % uids.count
        if uid not in SPECIAL_UIDS:
            yield uid


def free_candidates(key: str, uids: UidRange, unavailable: Container[int]) -> Iterator[int]:
    """Pure: the uids slot ``key`` tries (:func:`uid_candidates`) that are not
    ``unavailable``, in that order."""
    return (u for u in uid_candidates(key, uids) if u not in unavailable)


def choose_uid(key: str, uids: UidRange, unavailable: Container[int]) -> int | None:
    """Pure: the uid slot ``key`` gets when ``unavailable`` are taken; None when none is
    left."""
    return next(free_candidates(key, uids, unavailable), None)


def slot_key(workload: str, slot: int) -> str:
    return f"{workload}/{slot}"


class NoUidFree(Exception):
    """No uid of the range can be taken."""


def _in_user_database(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        pass
    try:
        grp.getgrgid(uid)
        return True
    except KeyError:
        return False


def running_uids(proc: Path = Path("/proc")) -> set[int]:
    """Every real, effective, saved and filesystem uid and gid of the running processes."""
    found: set[int] = set()
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            text = (proc / name / "status").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith(("Uid:", "Gid:")):
                found.update(int(x) for x in line.split()[1:])
    return found


class WorkerUids:
    """The uids this edged's live replicas hold (see the module doc)."""

    def __init__(
        self, uids: UidRange = UidRange(), *, lock_dir: Path = LOCK_DIR, blocker: str = ""
    ) -> None:
        """``blocker``: why no worker could run as another uid here (the runtime it imports is
        not readable to other users: :func:`unreadable_to_others`); every acquire says it."""
        self.range = uids
        self.blocker = blocker
        self._lock_dir = lock_dir
        self._held: dict[str, tuple[int, int]] = {}  # replica id -> (uid, lock fd)

    def held(self) -> dict[str, int]:
        return {rid: uid for rid, (uid, _) in self._held.items()}

    def acquire(self, replica_id: str, key: str) -> int:
        """A uid for ``replica_id`` (the one it holds already, if any); ``key``: its slot
        (:func:`slot_key`). :class:`NoUidFree` when none can be taken."""
        have = self._held.get(replica_id)
        if have is not None:
            return have[0]
        if self.blocker:
            raise NoUidFree(self.blocker)
        mine = {uid for uid, _ in self._held.values()}
        busy = running_uids()
        try:
            self._lock_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        except OSError as exc:
            raise NoUidFree(f"cannot make {self._lock_dir}: {exc.strerror}") from None
        for tried, uid in enumerate(free_candidates(key, self.range, mine | busy)):
            if tried >= MAX_TRIES:
                break
            if _in_user_database(uid):
                continue
            try:
                fd = self._lock(uid)
            except OSError as exc:
                raise NoUidFree(
                    f"cannot lock {self._lock_dir / str(uid)}: {exc.strerror}"
                ) from None
            if fd is None:
                continue
            self._held[replica_id] = (uid, fd)
            return uid
        raise NoUidFree(
            f"no uid of {self.range} is free (each is held by a replica, a process, a user or "
            "group of that number, or a systemd dynamic user)"
        )

    def lock_fd(self, replica_id: str) -> int | None:
        """The descriptor of ``replica_id``'s uid lock (None: it holds none, or not by one):
        a kept worker inherits it, and so holds its uid's lock for as long as it lives."""
        item = self._held.get(replica_id)
        return item[1] if item is not None and item[1] >= 0 else None

    def adopt(self, replica_id: str, uid: int) -> None:
        """An adopted worker runs as ``uid``, whose lock it holds itself (:meth:`lock_fd`):
        held here too, so that it is released (its lock file removed) once it exits."""
        self._held[replica_id] = (uid, -1)

    def release(self, replica_id: str) -> None:
        """``replica_id``'s process has exited: its uid is free again."""
        item = self._held.pop(replica_id, None)
        if item is None:
            return
        uid, fd = item
        try:
            (self._lock_dir / str(uid)).unlink(missing_ok=True)
        except OSError as exc:
            log.warning("worker uid lock not removed", uid=uid, error=str(exc))
        if fd >= 0:
            os.close(fd)  # the lock goes with it (an adopted worker's went with it)

    def release_all(self) -> None:
        for rid in list(self._held):
            self.release(rid)

    def _lock(self, uid: int) -> int | None:
        path = self._lock_dir / str(uid)
        while True:
            fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None  # systemd, or another edged, holds it
            if os.fstat(fd).st_nlink > 0:
                break
            os.close(fd)  # removed between our open and our lock: again
        name = f"edged-worker-{uid}\n".encode()  # what systemd keeps there: a user name
        os.ftruncate(fd, 0)
        os.pwrite(fd, name, 0)
        return fd


def accelerator_groups(paths: Iterable[str]) -> tuple[int, ...]:
    """The groups a worker of its own uid needs to open the accelerator nodes ``paths`` (a
    directory: the nodes in it), and no more: the group of each character device that its
    group may read and write but others may not, never root's group (0)."""
    groups: set[int] = set()
    for path in paths:
        try:
            entries = [path]
            if os.path.isdir(path):
                entries = [os.path.join(path, n) for n in os.listdir(path)]
            for entry in entries:
                st = os.stat(entry, follow_symlinks=False)
                if not stat.S_ISCHR(st.st_mode) or st.st_gid == 0:
                    continue
                if st.st_mode & 0o006 == 0o006 or st.st_mode & 0o060 != 0o060:
                    continue  # open to all already, or not through its group
                groups.add(st.st_gid)
        except OSError:
            continue
    return tuple(sorted(groups))


def unreadable_to_others(path: str) -> str:
    """Why another uid could not read ``path`` (a directory it imports from: a directory on
    the way it may not pass, or the directory itself it may not list), or ``""``."""
    target = os.path.realpath(path)
    parts = target.split(os.sep)
    for i in range(1, len(parts) + 1):
        here = os.sep + os.path.join(*parts[1:i]) if i > 1 else os.sep
        try:
            mode = os.stat(here).st_mode
        except OSError as exc:
            return f"{here}: {exc.strerror}"
        need = 0o005 if here == target else 0o001
        if mode & need != need:
            what = "read" if here == target else "pass"
            return f"{here} is {stat.filemode(mode)}: other users cannot {what} it"
    return ""


def configured_uids(workers: WorkersConfig, *, edged_root: bool, edged_python: Path) -> WorkerUids:
    """The uids edged.toml's ``[workers]`` gives replicas; where edged (root) runs its workers
    with its own Python, that Python's onnxruntime must be readable to those uids
    (:func:`runtime_blocker`)."""
    return WorkerUids(
        UidRange(workers.uid_base, workers.uid_count),
        blocker=runtime_blocker()
        if edged_root and workers.python_executable == edged_python
        else "",
    )


def runtime_blocker() -> str:
    """Why workers of their own uids could not import onnxruntime here (its package is not
    readable to other users), or ``""``. Looked up without importing it."""
    import importlib.util

    try:
        found = importlib.util.find_spec("onnxruntime")
    except (ImportError, ValueError):
        return ""
    if found is None or not found.submodule_search_locations:
        return ""
    package = next(iter(found.submodule_search_locations))
    why = unreadable_to_others(package)
    return f"onnxruntime ({package}) cannot be read by a worker's own uid: {why}" if why else ""
