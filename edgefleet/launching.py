"""Starting edgefleet programs on this machine: the one way the quickstart, the tests and the
benchmarks start ``edged run`` and ``hub serve``, wait for them and stop them.

* :func:`program_command`: the command line of an edgefleet program (``python -m edged ...``)
  with the running interpreter, so it works from a checkout and from an installed package.
* :func:`start_edged` -> :class:`LaunchedEdged`: ``edged run``; :meth:`~LaunchedEdged.wait_ready`
  polls its status socket (``GET /readyz``) with a deadline.
* :func:`start_hub` -> :class:`LaunchedHub`: ``hub serve``; :meth:`~LaunchedHub.wait_listening`
  polls its port with a deadline.
* :class:`Launched`, what both are: :meth:`~Launched.stop` sends SIGTERM (edged drains, the hub
  closes its streams) and SIGKILL when the process is still there after a grace period;
  :meth:`~Launched.wait_until` fails at once when the process exits, and says so with the tail
  of its log (:class:`LaunchError`).
* :func:`free_port_pair`: loopback ports for a hub.

Nothing here imports edged or the hub: they run as processes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from edgefleet.configfiles import parse_host_port
from edgefleet.devicestatus import send_request
from edgefleet.errors import EdgefleetError

DEFAULT_STOP_TIMEOUT_S = 30.0
"""How long :meth:`Launched.stop` waits after SIGTERM before SIGKILL."""
_REAP_TIMEOUT_S = 10.0
_POLL_S = 0.05
_LOG_TAIL_CHARS = 4000

StrPath = str | os.PathLike[str]


class LaunchError(EdgefleetError):
    """A started program exited, or was not ready before its deadline; the message ends with
    the tail of its log."""


def program_command(program: str, *args: StrPath, python: StrPath | None = None) -> list[str]:
    """``[python, "-m", program, *args]``: an edgefleet program (``edged``, ``hub``,
    ``edgectl``) run by ``python`` (default: the running interpreter)."""
    return [os.fspath(python or sys.executable), "-m", program, *(os.fspath(a) for a in args)]


class Launched:
    """One started process of an edgefleet program, its output appended to ``log_path``."""

    def __init__(
        self, program: str, process: subprocess.Popen[bytes], log_path: Path | None
    ) -> None:
        self.program = program
        self.process = process
        self.log_path = log_path
        self._terminated = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, chars: int = _LOG_TAIL_CHARS) -> str:
        if self.log_path is None:
            return ""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def wait_until(self, check: Callable[[], object], *, timeout: float, what: str) -> float:
        """Poll ``check`` until it returns something true (an OSError from it counts as "not
        yet": a socket not there yet); the seconds waited. :class:`LaunchError` as soon as the
        process exits, or when ``timeout`` seconds pass; ``what`` names what was awaited."""
        start = time.monotonic()
        deadline = start + timeout
        while True:
            code = self.process.poll()
            if code is not None:
                raise LaunchError(self._failure(f"exited with code {code}", what))
            try:
                if check():
                    return time.monotonic() - start
            except OSError:
                pass
            if time.monotonic() >= deadline:
                raise LaunchError(self._failure(f"timed out after {timeout:g} s", what))
            time.sleep(_POLL_S)

    def terminate(self) -> None:
        """SIGTERM, without waiting: to stop several at once, terminate each, then stop each."""
        if self.process.poll() is None and not self._terminated:
            self.process.send_signal(signal.SIGTERM)
            self._terminated = True

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT_S) -> int:
        """SIGTERM (unless :meth:`terminate` sent it), then SIGKILL if the process is still
        running ``timeout`` seconds later; its exit code (negative: the signal that ended it).
        Stopping a stopped process is a no-op."""
        if self.process.poll() is None:
            self.terminate()
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait(_REAP_TIMEOUT_S)

    def kill(self) -> int:
        """SIGKILL now (a crash or a power cut, as far as the program can tell), and reap it."""
        if self.process.poll() is None:
            self.process.kill()
        return self.process.wait(_REAP_TIMEOUT_S)

    def _failure(self, outcome: str, what: str) -> str:
        text = f"{self.program} (pid {self.pid}) {outcome} while waiting for {what}"
        tail = self.log_tail()
        if tail:
            text += f"\n--- the end of {self.log_path} ---\n{tail}"
        return text


def launch(
    program: str,
    *args: StrPath,
    log: Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: StrPath | None = None,
    python: StrPath | None = None,
) -> Launched:
    """Start ``python -m PROGRAM ARGS`` with stdout and stderr appended to ``log`` (discarded
    when ``None``); returns at once."""
    command = program_command(program, *args, python=python)
    if log is None:
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=cwd
        )
    else:
        with open(log, "ab") as out:  # the child keeps its own copy of the descriptor
            process = subprocess.Popen(command, stdout=out, stderr=out, env=env, cwd=cwd)
    return Launched(program, process, log)


# -- edged ---------------------------------------------------------------------------------------
STATUS_SOCKET_NAME = "edged.sock"
INFERENCE_SOCKET_NAME = "infer.sock"


class LaunchedEdged(Launched):
    """An ``edged run`` process and where its sockets are."""

    def __init__(
        self,
        launched: Launched,
        data_dir: Path,
        *,
        status_socket: Path | None = None,
        inference_socket: Path | None = None,
    ) -> None:
        super().__init__(launched.program, launched.process, launched.log_path)
        self.data_dir = data_dir
        self.status_socket = status_socket or data_dir / STATUS_SOCKET_NAME
        self.inference_socket = inference_socket or data_dir / INFERENCE_SOCKET_NAME

    def is_ready(self) -> bool:
        """``GET /readyz`` on the status socket says ready: its state loaded, its source read,
        every workload with a ready replica. OSError when the socket is not there (yet)."""
        return send_request(self.status_socket, "GET", "/readyz", timeout=5.0)[0] == 200

    def model_ready(self, model: str) -> bool:
        """``GET /v2/models/MODEL/ready`` on the inference socket answers 200."""
        path = f"/v2/models/{model}/ready"
        return send_request(self.inference_socket, "GET", path, timeout=5.0)[0] == 200

    def wait_ready(self, timeout: float = 60.0, *, models: Iterable[str] = ()) -> float:
        """Wait until edged is ready and each of ``models`` answers ready; the seconds waited.
        :class:`LaunchError` when edged exits first or ``timeout`` passes."""
        names = list(models)

        def ready() -> bool:
            return self.is_ready() and all(self.model_ready(m) for m in names)

        return self.wait_until(ready, timeout=timeout, what="edged to be ready")


def start_edged(
    data_dir: Path,
    *,
    manifests: Path | None = None,
    config: Path | None = None,
    log: Path | None = None,
    args: Sequence[StrPath] = (),
    env: Mapping[str, str] | None = None,
    cwd: StrPath | None = None,
    python: StrPath | None = None,
    status_socket: Path | None = None,
    inference_socket: Path | None = None,
) -> LaunchedEdged:
    """Start ``edged run --data-dir DATA_DIR [--manifests M] [--config C] ARGS``; returns at
    once (call :meth:`LaunchedEdged.wait_ready`; a test of a refusal waits for the exit).
    ``status_socket`` and ``inference_socket``: where the config puts them, when not in
    ``data_dir``."""
    command: list[StrPath] = ["run", "--data-dir", data_dir]
    if manifests is not None:
        command += ["--manifests", manifests]
    if config is not None:
        command += ["--config", config]
    launched = launch("edged", *command, *args, log=log, env=env, cwd=cwd, python=python)
    return LaunchedEdged(
        launched, data_dir, status_socket=status_socket, inference_socket=inference_socket
    )


# -- the hub -------------------------------------------------------------------------------------
class LaunchedHub(Launched):
    """A ``hub serve`` process and the address it listens on (mutual TLS; enrollment on the
    port after it unless told otherwise)."""

    def __init__(self, launched: Launched, data_dir: Path, listen: str) -> None:
        super().__init__(launched.program, launched.process, launched.log_path)
        self.data_dir = data_dir
        self.listen = listen
        self.host, self.port = parse_host_port(listen)

    def is_listening(self) -> bool:
        """A TCP connection to its port succeeds. OSError when it does not (yet)."""
        with socket.create_connection((self.host, self.port), timeout=1.0):
            return True

    def wait_listening(self, timeout: float = 30.0) -> float:
        """Wait until the hub accepts connections; the seconds waited. :class:`LaunchError`
        when it exits first or ``timeout`` passes."""
        return self.wait_until(self.is_listening, timeout=timeout, what="the hub to listen")


def start_hub(
    data_dir: Path,
    *,
    listen: str,
    log: Path | None = None,
    args: Sequence[StrPath] = (),
    env: Mapping[str, str] | None = None,
    cwd: StrPath | None = None,
    python: StrPath | None = None,
) -> LaunchedHub:
    """Start ``hub serve --data-dir DATA_DIR --listen LISTEN ARGS``; returns at once (call
    :meth:`LaunchedHub.wait_listening`)."""
    launched = launch(
        "hub", "serve", "--data-dir", data_dir, "--listen", listen, *args,
        log=log, env=env, cwd=cwd, python=python,
    )  # fmt: skip
    return LaunchedHub(launched, data_dir, listen)


def free_port_pair(host: str = "127.0.0.1") -> int:
    """A free port P on ``host`` with P + 1 free too: a hub's mTLS port and its enrollment port
    (the quickstart, benchmarks and tests run hubs on loopback). A later bind may still lose a
    race for them; callers start the hub right away."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port >= 65535:
            continue
        try:
            with socket.socket() as s:
                s.bind((host, port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no two free consecutive ports on {host}")
