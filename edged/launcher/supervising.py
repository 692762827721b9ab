"""The launcher's loop (:class:`Launcher`, :mod:`edged.launcher`): runs edged from the right
slot until it exits for good: a request taken, a trial counted before each start and ended
(committed, or rolled back with why), sd_notify relayed both ways with the descriptors it
stores, the watchdog on edged, and signals passed on. Stdlib only."""

from __future__ import annotations

import errno
import os
import secrets
import selectors
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from edged.launcher.state import (
    DEFAULT_COMMIT_DEADLINE_S,
    DEFAULT_MAX_TRIES,
    PACKAGE,
    SLOTS,
    _log,
    _read_small_json,
    _warn,
    fsync_dir,
    read_state,
    slot_dir,
    slot_version,
    write_json_atomic,
)

MAX_FDS = 64
TRIAL_RESTART_DELAY_S = 1.0
STOP_TIMEOUT_S = 40.0  # under the unit's TimeoutStopSec=45s: the launcher kills edged itself
FORWARDED = ("READY=", "STATUS=", "STOPPING=", "RELOADING=", "ERRNO=", "EXTEND_TIMEOUT_USEC=")
COMMIT_LINE = "EDGED_COMMIT=1"


def _positive(doc: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ValueError(f"{key} must be a number in [{low}, {high}]")
    return float(value)


# -- the launcher ------------------------------------------------------------------------------
class Launcher:
    """One launcher process: runs edged from the right slot until it exits for good."""

    def __init__(
        self,
        edged_args: list[str],
        *,
        data_dir: Path,
        package_path: str = "",
        python: str = sys.executable,
        stop_timeout_s: float = STOP_TIMEOUT_S,
        restart_delay_s: float = TRIAL_RESTART_DELAY_S,
        environ: dict[str, str] | None = None,
    ) -> None:
        self.args = edged_args
        self.data_dir = data_dir
        self.agent_dir = data_dir / "agent"
        self.state_path = self.agent_dir / "launcher.json"
        self.request_path = self.agent_dir / "request.json"
        self.package_path = package_path
        self.python = python
        self.stop_timeout_s = stop_timeout_s
        self.restart_delay_s = restart_delay_s
        self.env = dict(os.environ if environ is None else environ)
        self.systemd_notify = _notify_address(self.env.pop("NOTIFY_SOCKET", ""))
        self.watchdog_s = _watchdog_seconds(self.env)
        self.fds: dict[str, int] = {}  # FDNAME -> descriptor, in the order they came
        self._take_listen_fds()
        self.state, problem = read_state(self.state_path)
        if problem:
            _warn(problem)
            self.state["last"] = {"outcome": "StateUnreadable", "reason": "StateUnreadable",
                                  "message": problem, "at": time.time()}  # fmt: skip
        # a power cut at the Nth step, for the tests (tests/agent/test_launcher_powercuts.py)
        self._fail_at = int(self.env.pop("EDGED_LAUNCHER_FAILPOINT", "0") or 0)
        self._steps = 0
        self.stopping: int | None = None  # the signal asked to stop with
        self.committed_now = False  # the run in progress committed its trial
        self.child: int | None = None  # the edged running now
        self._pinged_at = 0.0
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        name = f"edged-launcher/{os.getpid()}/{secrets.token_hex(8)}"
        self._notify.bind("\0" + name)
        self._notify.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._notify.setblocking(False)
        self.notify_env = "@" + name

    # -- state changes (each one atomic write) -------------------------------------------
    def _save(self) -> bool:
        """Write the state; False (said loudly) when it cannot be written (a full or
        read-only disk): the caller then does the safe thing, never an uncounted try."""
        self.step("save")
        try:
            write_json_atomic(self.state_path, self.state, between=lambda: self.step("renaming"))
        except OSError as exc:
            _warn(f"cannot write {self.state_path}: {exc}")
            return False
        self.step("saved")
        return True

    def step(self, name: str) -> None:
        """A step a power cut may fall on: the tests kill -9 the launcher at the Nth one
        ($EDGED_LAUNCHER_FAILPOINT=N) to check that every one of them leaves a bootable device."""
        self._steps += 1
        if self._steps == self._fail_at:
            _warn(f"failpoint {self._steps} ({name}): kill -9")
            os.kill(os.getpid(), signal.SIGKILL)

    def _finish_trial(self, outcome: str, reason: str, message: str) -> None:
        trying = self.state["trying"] or {}
        if outcome == "Committed":
            self.state["committed"] = trying["slot"]
            self.state["committedVersion"] = trying.get("version", "")
        self.state["last"] = {
            "outcome": outcome,
            "slot": trying.get("slot", ""),
            "version": trying.get("version", ""),
            "reason": reason,
            "message": message,
            "tries": trying.get("tries", 0),
            "upgrade": trying.get("upgrade", ""),
            "upgradeRevision": trying.get("upgradeRevision", 0),
            "at": time.time(),
        }
        self.state["trying"] = None
        self._save()
        (_log if outcome == "Committed" else _warn)(
            f"{outcome} {trying.get('slot')} ({trying.get('version')}): {reason}: {message}"
        )

    def consume_request(self) -> None:
        """Take ``request.json`` if there is one: a trial of an installed slot, or the abort
        of the trial. A request already taken (a power cut before its removal) is dropped;
        an invalid one is refused (reported as the last outcome) and removed."""
        try:
            doc = _read_small_json(self.request_path)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            doc = {"action": "invalid", "error": str(exc)}
        request_id = str(doc.get("id", ""))
        if request_id and request_id == self.state.get("lastRequest"):
            self._remove_request()
            return
        try:
            self._apply_request(doc)
        except ValueError as exc:
            _warn(f"request refused: {exc}")
            self.state["last"] = {"outcome": "RequestRefused", "reason": "InvalidRequest",
                                  "message": str(exc), "at": time.time()}  # fmt: skip
        self.state["lastRequest"] = request_id
        if self._save():
            self._remove_request()  # else taken again at the next start

    def _apply_request(self, doc: dict[str, Any]) -> None:
        action = doc.get("action")
        if action == "abort":
            if self.state["trying"] is not None:
                reason = str(doc.get("reason", "Aborted"))[:64] or "Aborted"
                self.state["lastRequest"] = str(doc.get("id", ""))
                self._finish_trial("RolledBack", reason, str(doc.get("message", ""))[:1024])
            return
        if action != "try":
            raise ValueError(doc.get("error") or f"unknown action {action!r}")
        slot = doc.get("slot")
        if slot not in (PACKAGE, *SLOTS):
            raise ValueError(f"slot {slot!r} is not one of a, b, package")
        if slot == self.state["committed"]:
            raise ValueError(f"slot {slot} is the committed one")
        version = slot_version(self.data_dir, slot, str(doc.get("version", "")))
        if version is None or version != doc.get("version"):
            raise ValueError(f"slot {slot} does not hold a complete release {doc.get('version')}")
        trial = {
            "slot": slot,
            "version": version,
            "tries": 0,
            "maxTries": int(_positive(doc, "maxTries", DEFAULT_MAX_TRIES, 1, 100)),
            "commitDeadlineSeconds": _positive(
                doc, "commitDeadlineSeconds", DEFAULT_COMMIT_DEADLINE_S, 1, 86400
            ),
            "upgrade": str(doc.get("upgrade", ""))[:256],
            "upgradeRevision": int(_positive(doc, "upgradeRevision", 0, 0, 2**63)),
            "fromSlot": self.state["committed"],
            "fromVersion": self.state["committedVersion"],
            # edged's own context (what served before the switch), returned to it as is
            "context": doc.get("context") if isinstance(doc.get("context"), dict) else {},
            "requestedAt": time.time(),
        }
        if self.state["trying"] is not None:  # never dropped silently: it ends, with why
            self._finish_trial("RolledBack", "Superseded", f"a trial of {version} was asked for")
        self.state["trying"] = trial
        _log(f"trial of slot {slot} ({version}) requested")

    def _remove_request(self) -> None:
        self.step("remove-request")
        try:
            self.request_path.unlink()
            fsync_dir(self.agent_dir)
        except FileNotFoundError:
            pass

    def next_slot(self) -> tuple[str, bool]:
        """The slot to start now and whether it is on trial; ends a trial that used its tries
        or lost its slot, and falls back to the package when the committed slot is gone."""
        trying = self.state["trying"]
        if trying is not None:
            if slot_version(self.data_dir, trying["slot"], trying.get("version", "")) is None:
                self._finish_trial("RolledBack", "SlotNotInstalled", "the slot is incomplete")
            elif trying["tries"] >= trying["maxTries"]:
                self._finish_trial(
                    "RolledBack",
                    "CrashLoop",
                    f"edged exited {trying['tries']} times without committing",
                )
            else:
                trying["tries"] += 1
                if self._save():  # counted before the exec: a power cut mid-start counts too
                    return trying["slot"], True
                _warn("the try could not be counted: the committed slot runs instead")
                self.state["trying"] = None  # in memory: never a try that was not counted
        committed = self.state["committed"]
        if committed != PACKAGE and slot_version(self.data_dir, committed) is None:
            _warn(f"committed slot {committed} is not installed: running the package")
            return PACKAGE, False
        return committed, False

    # -- running edged --------------------------------------------------------------------
    def child_env(self, slot: str, trial: bool) -> dict[str, str]:
        env = dict(self.env)
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        first = self.package_path if slot == PACKAGE else str(slot_dir(self.data_dir, slot) / "lib")
        env["PYTHONPATH"] = os.pathsep.join(([first] if first else []) + paths)
        env["NOTIFY_SOCKET"] = self.notify_env
        env["EDGED_SLOT"] = slot
        env["EDGED_TRIAL"] = "1" if trial else "0"
        env["EDGED_LAUNCHER_STATE"] = str(self.state_path)
        env.pop("WATCHDOG_PID", None)
        for key in ("LISTEN_FDS", "LISTEN_FDNAMES", "LISTEN_PID"):
            env.pop(key, None)
        if self.watchdog_s is not None:
            env["WATCHDOG_USEC"] = str(int(self.watchdog_s * 1_000_000))
        return env

    def spawn(self, slot: str, trial: bool) -> int:
        """Fork and exec edged with the stored descriptors at 3.. (``LISTEN_FDS``)."""
        env = self.child_env(slot, trial)
        argv = [self.python, "-P", "-m", "edged", *self.args]
        fds = list(self.fds.items())
        self.step("spawn")
        libc, parent = _libc(), os.getpid()
        pid = os.fork()
        if pid == 0:  # the child: only async-signal-safe-ish work, then exec
            try:
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
                    signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, [])
                if libc is not None:
                    libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
                if os.getppid() != parent:
                    os._exit(127)  # the launcher died before the prctl
                if fds:
                    high = [os.dup(fd) for _, fd in fds]  # out of the way of 3..3+n
                    for i, fd in enumerate(high):
                        os.dup2(fd, 3 + i, inheritable=True)
                    env["LISTEN_FDS"] = str(len(fds))
                    env["LISTEN_FDNAMES"] = ":".join(name for name, _ in fds)
                    env["LISTEN_PID"] = str(os.getpid())
                os.execve(self.python, argv, env)
            except BaseException:  # the child must never return into the launcher
                os._exit(127)
        return pid

    def run_once(self, slot: str, trial: bool) -> tuple[int, str]:
        """Start edged from ``slot``, serve its notifications until it exits; its exit status
        (shell-style: 128+signal) and what ended it ("exit", "deadline", "watchdog")."""
        pid = self.child = self.spawn(slot, trial)
        _log(f"started edged from slot {slot}{' on trial' if trial else ''} (pid {pid})")
        try:
            pidfd: int | None = os.pidfd_open(pid)
        except OSError:  # a kernel before 5.3: SIGCHLD wakes the loop instead
            pidfd = None
        sel = selectors.DefaultSelector()
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ, "exit")
        sel.register(self._notify, selectors.EVENT_READ, "notify")
        sel.register(self._wake_r, selectors.EVENT_READ, "signal")
        started = time.monotonic()
        last_ping = started
        ended = "exit"
        kill_at: float | None = None
        if self.stopping is not None:
            os.kill(pid, self.stopping)
            kill_at = started + self.stop_timeout_s
        try:
            while True:
                now = time.monotonic()
                trying = self.state["trying"]
                deadline = (
                    started + trying["commitDeadlineSeconds"]
                    if trial and trying is not None and ended == "exit"
                    else None
                )
                timeout = min(
                    t
                    for t in (
                        deadline,
                        kill_at,
                        last_ping + self.watchdog_s if self.watchdog_s else None,
                        now + (self.watchdog_s / 2 if self.watchdog_s else 60.0),
                        now + 1.0 if pidfd is None else None,
                    )
                    if t is not None
                )
                events = sel.select(max(0.0, timeout - now))
                for key, _ in events:
                    if key.data == "exit":
                        _, status = os.waitpid(pid, 0)
                        self.child = None
                        return _exit_code(status), ended
                    if key.data == "notify" and self._on_datagrams(pid, trial):
                        last_ping = time.monotonic()
                    if key.data == "signal":
                        sig = self._drain_signals()
                        if sig is not None and kill_at is None:
                            self.stopping = sig
                            _log(f"signal {signal.Signals(sig).name}: passed on to edged")
                            os.kill(pid, sig)
                            kill_at = time.monotonic() + self.stop_timeout_s
                if pidfd is None:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        self.child = None
                        return _exit_code(status), ended
                now = time.monotonic()
                trying = self.state["trying"]
                if deadline is not None and now >= deadline and kill_at is None:
                    _warn(f"edged did not commit within {trying['commitDeadlineSeconds']}s")
                    ended = "deadline"
                    os.kill(pid, signal.SIGTERM)
                    kill_at = now + self.stop_timeout_s
                if self.watchdog_s and now - last_ping > self.watchdog_s and kill_at is None:
                    _warn(f"edged sent no WATCHDOG=1 for {self.watchdog_s}s: killing it")
                    ended = "watchdog"
                    os.kill(pid, signal.SIGABRT)
                    kill_at = now + 5.0
                if kill_at is not None and now >= kill_at:
                    os.kill(pid, signal.SIGKILL)
                    kill_at = now + 3600
                if self.watchdog_s and ended == "exit" and now - last_ping < self.watchdog_s:
                    self._ping_systemd(now)
        finally:
            sel.close()
            if pidfd is not None:
                os.close(pidfd)

    def _on_datagrams(self, pid: int, trial: bool) -> bool:
        """Handle what edged sent; True when it pinged the watchdog."""
        pinged = False
        while True:
            try:
                data, ancdata, _, _ = self._notify.recvmsg(
                    4096, socket.CMSG_SPACE(MAX_FDS * 4) + socket.CMSG_SPACE(12)
                )
            except BlockingIOError:
                return pinged
            fds: list[int] = []
            sender = None
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.extend(
                        int.from_bytes(payload[i : i + 4], sys.byteorder)
                        for i in range(0, len(payload) - len(payload) % 4, 4)
                    )
                elif level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    sender = int.from_bytes(payload[:4], sys.byteorder, signed=True)
            for fd in fds:
                os.set_inheritable(fd, False)
            if sender != pid:  # NotifyAccess=main: edged alone, never its workers
                for fd in fds:
                    os.close(fd)
                continue
            lines = data.decode(errors="replace").split("\n")
            if "WATCHDOG=1" in lines:
                pinged = True
            if COMMIT_LINE in lines and trial and self.state["trying"] is not None:
                self._finish_trial("Committed", "Committed", "edged committed the release")
                self.committed_now = True
            self._on_fds(lines, fds)
            forward = [line for line in lines if line.startswith(FORWARDED)]
            if forward:
                self._to_systemd(*forward)

    def _on_fds(self, lines: list[str], fds: list[int]) -> None:
        names = [line[7:] for line in lines if line.startswith("FDNAME=")]
        name = names[0] if names else "stored"
        if "FDSTOREREMOVE=1" in lines:
            old = self.fds.pop(name, None)
            if old is not None:
                os.close(old)
            self._to_systemd("FDSTOREREMOVE=1", f"FDNAME={name}")
        if "FDSTORE=1" not in lines:
            for fd in fds:
                os.close(fd)
            return
        for fd in fds:
            if name in self.fds or len(self.fds) < MAX_FDS:
                old = self.fds.pop(name, None)
                if old is not None:
                    os.close(old)
                self.fds[name] = fd
                self._to_systemd("FDSTORE=1", f"FDNAME={name}", fds=[fd])
            else:
                _warn(f"FDSTORE: more than {MAX_FDS} descriptors: {name} dropped")
                os.close(fd)

    def _to_systemd(self, *lines: str, fds: list[int] | None = None) -> None:
        if self.systemd_notify is None:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                payload = "\n".join(lines).encode()
                if fds:  # socket.send_fds ignores its address before Python 3.12
                    rights = b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds)
                    s.sendmsg(
                        [payload],
                        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)],
                        0,
                        self.systemd_notify,
                    )
                else:
                    s.sendto(payload, self.systemd_notify)
        except OSError as exc:
            if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                _warn(f"cannot notify systemd: {exc}")

    def stop_child(self) -> None:
        """Stop the edged still running (before the launcher gives up on itself)."""
        pid, self.child = self.child, None
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGTERM)
            end = time.monotonic() + self.stop_timeout_s
            while time.monotonic() < end:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    return
                time.sleep(0.1)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass

    def _ping_systemd(self, now: float) -> None:
        """WATCHDOG=1 to systemd, at most every quarter of the watchdog interval."""
        if self.watchdog_s and now - self._pinged_at >= self.watchdog_s / 4:
            self._pinged_at = now
            self._to_systemd("WATCHDOG=1")

    def _take_listen_fds(self) -> None:
        """Descriptors systemd handed the launcher (its fd store, after a launcher restart)."""
        if self.env.pop("LISTEN_PID", "") != str(os.getpid()):
            self.env.pop("LISTEN_FDS", None)
            self.env.pop("LISTEN_FDNAMES", None)
            return
        try:
            count = min(int(self.env.pop("LISTEN_FDS", "0")), MAX_FDS)
        except ValueError:
            count = 0
        names = self.env.pop("LISTEN_FDNAMES", "").split(":")
        for i in range(count):
            fd = 3 + i
            os.set_inheritable(fd, False)
            name = names[i] if i < len(names) and names[i] else f"stored{i}"
            self.fds[name] = fd

    # -- signals --------------------------------------------------------------------------
    def install_signals(self) -> None:
        def handler(sig: int, _frame: object) -> None:
            try:
                os.write(self._wake_w, bytes([sig]))
            except OSError:
                pass

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, handler)

    def _drain_signals(self) -> int | None:
        got = None
        try:
            while data := os.read(self._wake_r, 64):
                for sig in data:
                    if sig != signal.SIGCHLD and (got is None or sig != signal.SIGHUP):
                        got = sig
        except BlockingIOError:
            pass
        return got

    def _wait(self, seconds: float) -> None:
        """Sleep, woken by a stop signal (pinging systemd meanwhile: the launcher is alive)."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0 and self.stopping is None:
            sel = selectors.DefaultSelector()
            sel.register(self._wake_r, selectors.EVENT_READ)
            if sel.select(min(left, self.watchdog_s / 2 if self.watchdog_s else left)):
                self.stopping = self._drain_signals() or self.stopping
            sel.close()
            self._ping_systemd(time.monotonic())

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> int:
        self.install_signals()
        self.agent_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.consume_request()
        while True:
            slot, trial = self.next_slot()
            self._wait_for_data_dir_lock()
            if self.stopping is not None:
                return 0
            self.committed_now = False
            code, ended = self.run_once(slot, trial)
            _log(f"edged from slot {slot} exited ({code}, {ended})")
            trying = self.state["trying"]
            if trial and trying is not None and ended == "deadline":
                self._finish_trial(
                    "RolledBack",
                    "CommitDeadlineExceeded",
                    f"edged did not commit within {trying['commitDeadlineSeconds']:g}s",
                )
            self.consume_request()
            if self.stopping is not None:
                return 0 if code in (0, 128 + self.stopping) else code
            if self.state["trying"] is not None:
                if trial:  # the trial goes on: its next start (counted by next_slot)
                    self._wait(self.restart_delay_s)
                continue  # a new trial starts at once
            if trial and not self.committed_now:
                continue  # the trial was rolled back: the committed slot starts now
            return code  # edged exited for good: systemd restarts the launcher

    def _wait_for_data_dir_lock(self, timeout_s: float = 30.0) -> None:
        """A previous edged (from before a launcher crash) may still hold the data directory
        while it drains: give it some time rather than start one that fails at once."""
        import fcntl

        try:
            fd = os.open(self.data_dir / "edged.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            return
        try:
            end = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    return
                except BlockingIOError:
                    if time.monotonic() > end:
                        return
                    self._wait(0.2)
                    if self.stopping is not None:
                        return
        finally:
            os.close(fd)


_LIBC: list[Any] = []


def _libc() -> Any:
    """The C library, for prctl(PR_SET_PDEATHSIG, SIGTERM) in the child: an edged whose
    launcher was killed stops too (the unit's KillMode=process signals the launcher only).
    Loaded in the parent, once, so that the child between fork and exec does no import."""
    if not _LIBC:
        try:
            import ctypes

            _LIBC.append(ctypes.CDLL(None, use_errno=True))
        except (ImportError, OSError):
            _LIBC.append(None)
    return _LIBC[0]


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _notify_address(value: str) -> str | None:
    if value.startswith("@"):
        return "\0" + value[1:]
    return value if value.startswith("/") else None


def _watchdog_seconds(env: dict[str, str]) -> float | None:
    usec, pid = env.pop("WATCHDOG_USEC", ""), env.pop("WATCHDOG_PID", "")
    if pid and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 1_000_000 if value > 0 else None
