"""The A/B launcher systemd starts (docs/agent-updates.md, "On the device"): stdlib only.

``edged-launcher [--launcher-OPTION ...] ARGS...`` runs ``python -P -m edged ARGS...`` from one
of three places: the base install (``package``) or an installed release in ``D/agent/slots/a``
or ``D/agent/slots/b`` (``PYTHONPATH=<slot>/lib``). ``D`` is edged's ``--data-dir`` (else
``$STATE_DIRECTORY``, else /var/lib/edged).

* ``D/agent/launcher.json`` (:data:`STATE_FORMAT`) is this launcher's state and it alone
  writes it (temp file, fsync, rename, fsync of the directory): the committed slot, the slot on
  trial with its try counter, and the last outcome (Committed or RolledBack, with a reason).
* ``D/agent/request.json`` is edged's request (``{"action": "try", "slot": "b", ...}`` or
  ``{"action": "abort", "reason": ...}``), consumed when edged exits or the launcher starts.
* Boot counting, as systemd-boot does it: each start of the slot on trial increments its tries
  (persisted) before the exec; the trial fails when edged has been started ``maxTries`` times
  without a commit (CrashLoop) or one start does not commit within ``commitDeadlineSeconds``
  (CommitDeadlineExceeded). Then the committed slot runs again. Commit: edged sends
  ``EDGED_COMMIT=1`` on the launcher's notify socket.
* sd_notify both ways: edged's ``NOTIFY_SOCKET`` is the launcher's; ``READY=1``, ``STATUS=``,
  ``STOPPING=1`` go on to systemd; ``WATCHDOG=1`` feeds the launcher's own watchdog on edged
  (a stuck edged is killed here, since the unit's ``KillMode=process`` lets systemd signal the
  launcher only) and the launcher pings systemd while edged is healthy; ``FDSTORE=1``
  descriptors are kept (and passed on to systemd's store) and handed to the next edged as
  ``LISTEN_FDS``/``LISTEN_FDNAMES``.
* SIGTERM, SIGINT and SIGHUP go to edged; the launcher exits when edged exits for good (not a
  switch, not a trial restart) with edged's status, and systemd restarts it.

A power cut at any instant leaves a bootable device: each step is one atomic write; an
unreadable state falls back to the package; a slot without its ``installed.json`` (written
last by edged.agent.installing, inside the temporary tree renamed into place) is never run.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import selectors
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

STATE_FORMAT = 1
SLOTS = ("a", "b")
PACKAGE = "package"
DEFAULT_DATA_DIR = "/var/lib/edged"
DEFAULT_MAX_TRIES = 3
DEFAULT_COMMIT_DEADLINE_S = 300.0
MAX_REQUEST_BYTES = 64 << 10
MAX_FDS = 64
TRIAL_RESTART_DELAY_S = 1.0
STOP_TIMEOUT_S = 40.0  # under the unit's TimeoutStopSec=45s: the launcher kills edged itself
FORWARDED = ("READY=", "STATUS=", "STOPPING=", "RELOADING=", "ERRNO=", "EXTEND_TIMEOUT_USEC=")
COMMIT_LINE = "EDGED_COMMIT=1"


def _log(text: str) -> None:
    """One line on stderr (the journal); ``<4>``/``<6>`` is its syslog priority."""
    sys.stderr.write(f"<6>edged-launcher: {text}\n")
    sys.stderr.flush()


def _warn(text: str) -> None:
    sys.stderr.write(f"<4>edged-launcher: {text}\n")
    sys.stderr.flush()


# -- files -------------------------------------------------------------------------------------
def write_json_atomic(path: Path, doc: dict[str, Any], between: Any = None) -> None:
    """``doc`` at ``path``, whole or not at all (temp file, fsync, rename, fsync the dir);
    ``between()`` runs before the rename (a test's power cut there)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = json.dumps(doc, indent=2, sort_keys=True).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    if between is not None:
        between()
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_small_json(path: Path, limit: int = MAX_REQUEST_BYTES) -> dict[str, Any]:
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes")
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc


def slot_dir(data_dir: Path, slot: str) -> Path:
    return data_dir / "agent" / "slots" / slot


def slot_version(data_dir: Path, slot: str, package_version: str = "") -> str | None:
    """The release a slot holds, or None when it is not completely installed: its
    ``installed.json`` (the installer's last file) must name the version ``release.json`` has.
    The package is always there."""
    if slot == PACKAGE:
        return package_version
    if slot not in SLOTS:
        return None
    root = slot_dir(data_dir, slot)
    try:
        release = _read_small_json(root / "release.json")
        installed = _read_small_json(root / "installed.json")
    except (OSError, ValueError):
        return None
    version = release.get("version")
    if not isinstance(version, str) or not version or installed.get("version") != version:
        return None
    return version if (root / "lib" / "edged").is_dir() else None


# -- state -------------------------------------------------------------------------------------
def empty_state() -> dict[str, Any]:
    return {
        "format": STATE_FORMAT,
        "committed": PACKAGE,
        "committedVersion": "",
        "trying": None,
        "last": None,
        "lastRequest": "",
    }


def read_state(path: Path) -> tuple[dict[str, Any], str]:
    """The state, and a problem ("" when none). An absent file is a device that never updated;
    an unreadable or invalid one falls back to the package (always installed), said loudly."""
    try:
        doc = _read_small_json(path)
    except FileNotFoundError:
        return empty_state(), ""
    except (OSError, ValueError) as exc:
        return empty_state(), f"{path} unreadable ({exc}): running the package"
    state = empty_state()
    committed = doc.get("committed")
    if doc.get("format") != STATE_FORMAT or committed not in (PACKAGE, *SLOTS):
        return state, f"{path} has an unknown format or committed slot: running the package"
    state["committed"] = committed
    state["committedVersion"] = str(doc.get("committedVersion", ""))
    state["lastRequest"] = str(doc.get("lastRequest", ""))
    if isinstance(doc.get("last"), dict):
        state["last"] = doc["last"]
    trying = doc.get("trying")
    if isinstance(trying, dict) and trying.get("slot") in (PACKAGE, *SLOTS):
        try:
            trying["tries"] = int(trying.get("tries", 0))
            trying["maxTries"] = max(1, int(trying.get("maxTries", DEFAULT_MAX_TRIES)))
            trying["commitDeadlineSeconds"] = float(
                trying.get("commitDeadlineSeconds", DEFAULT_COMMIT_DEADLINE_S)
            )
        except (TypeError, ValueError):
            return state, f"{path}: the trial is unreadable: it is dropped"
        state["trying"] = trying
    return state, ""


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


def data_dir_of(args: list[str], env: dict[str, str]) -> Path:
    """edged's ``--data-dir`` (as ``edged run`` resolves it: the flag, else
    ``$STATE_DIRECTORY``, else /var/lib/edged)."""
    for i, arg in enumerate(args):
        if arg == "--data-dir" and i + 1 < len(args):
            return Path(args[i + 1])
        if arg.startswith("--data-dir="):
            return Path(arg.split("=", 1)[1])
    state = env.get("STATE_DIRECTORY", "").split(":")[0]
    return Path(state) if state.startswith("/") else Path(DEFAULT_DATA_DIR)


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
            pass
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


USAGE = """usage: edged-launcher [--launcher-package-path DIR] [--launcher-python PYTHON]
                      [--launcher-stop-timeout SECONDS] EDGED-ARGS...
       edged-launcher cleanup [CGROUP-DIR]
Runs `python -m edged EDGED-ARGS` from the committed or trial slot (docs/agent-updates.md);
cleanup readies a stopped unit's cgroup for its next start, keeping workers (ExecStopPost=)."""


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == [CLEANUP]:
        return cleanup_main(args[1:])
    options: dict[str, str] = {}
    while args and args[0].startswith("--launcher-"):
        key, sep, value = args.pop(0).partition("=")
        if not sep:
            if not args:
                sys.stderr.write(f"edged-launcher: {key} needs a value\n{USAGE}\n")
                return 2
            value = args.pop(0)
        options[key] = value
    unknown = set(options) - {
        "--launcher-package-path",
        "--launcher-python",
        "--launcher-stop-timeout",
        "--launcher-restart-delay",
    }
    if unknown or not args or args[0] in ("-h", "--help"):
        sys.stderr.write(
            (f"edged-launcher: unknown {sorted(unknown)}\n" if unknown else "") + USAGE + "\n"
        )
        return 2
    try:
        stop_timeout = float(options.get("--launcher-stop-timeout", STOP_TIMEOUT_S))
        restart_delay = float(options.get("--launcher-restart-delay", TRIAL_RESTART_DELAY_S))
    except ValueError as exc:
        sys.stderr.write(f"edged-launcher: {exc}\n")
        return 2
    python = options.get("--launcher-python", sys.executable)
    package_path = options.get("--launcher-package-path", "")
    launcher = None
    try:
        launcher = Launcher(
            args,
            data_dir=data_dir_of(args, dict(os.environ)),
            package_path=package_path,
            python=python,
            stop_timeout_s=stop_timeout,
            restart_delay_s=restart_delay,
        )
        return launcher.run()
    except Exception as exc:  # a fault of the launcher must not keep edged from running
        _warn(f"launcher failed ({exc!r}): running the package's edged without it")
        if launcher is not None:
            launcher.stop_child()
        env = {k: v for k, v in os.environ.items() if not k.startswith("LISTEN_")}
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(([package_path] if package_path else []) + paths)
        os.execve(python, [python, "-P", "-m", "edged", *args], env)


if __name__ == "__main__":
    raise SystemExit(main())
