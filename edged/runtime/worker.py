"""The inference worker: one process per replica, one ONNX Runtime session.

Started by edged as ``python -m edged.runtime.worker FD [--handoff=FD2] SPEC_JSON``; FD is its
end of a Unix socket pair to edged (see ``framing.py``), FD2 its end of the hand-off socket on
which edged hands it client connections to serve itself (``direct.py``). It:

1. dies with edged (PR_SET_PDEATHSIG), unless it is a kept worker (``attach_name``: it
   outlives edged and waits for the next one on that socket, ``adopting.py``), and applies its
   resource limits before anything else;
   with a uid of its own (edged runs as root), it then imports numpy and the standard library
   it needs and opens its artifact, validation set and secrets' directories while still root,
   and its sandbox
   (``sandboxing.py``) switches it to that uid before it reads any of them;
2. reads the artifact from the content-addressed store, checks its sha256 *again* (so a file
   swapped on disk after verification is never loaded) and builds the session from those bytes;
3. picks execution providers: the requested ones that this onnxruntime build offers, falling
   back to CPU with a condition that edged shows in status;
4. runs a warm-up inference (the startup probe passes only after it) and sends READY;
5. serves INFER frames with adaptive dynamic batching (``workerprotocol.py``; the policy:
   ``batching.py``): requests that arrive while a batch runs are merged (up to
   ``max_batch_size`` rows) into the next one, and the queue is held briefly when the clients
   of the last batch are about to come back. Fast models run inline on the event loop (no
   thread hop); slower ones run in the runner thread (``overlapping.py``), so the loop reads
   and decodes the next requests and encodes the last batch's answers while ONNX Runtime
   runs, and a next batch that cannot grow any more is handed over before the running one
   ends. Binary requests and answers are not copied: tensors are views of the bytes read,
   answers views of the output arrays.

This module is the process: its start, the model's load, the sandbox, and waiting for the
next edged when it is kept.
"""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import os
import signal
import socket
import struct
import sys
import time
from typing import Any

import orjson

from edged.runtime.adopting import ATTACH_HELLO
from edged.runtime.configstage import attach
from edged.runtime.framing import FrameType, encode_frame
from edged.runtime.launching import LaunchSpec
from edged.runtime.limiting import apply_limits
from edged.runtime.sandboxing import Protections, SandboxUnavailable, apply_sandbox
from edged.runtime.workerprotocol import WorkerProtocol

EXIT_LOAD_FAILED = 3
WARMUP_RUNS = 5
BENCH_RUNS = 20  # the self-benchmark after the warm-up: at most this many timed runs...
BENCH_BUDGET_S = 2.0  # ...within this long (at least one run), before READY
TEST_PROBE_ENV = "EDGEFLEET_TEST_WORKER_PROBE"
"""Tests only: a JSON list of ``{"open": PATH}`` / ``{"connect": "HOST:PORT"}`` (``[V6]:PORT``) /
``{"bind": "HOST:PORT"}`` / ``{"udp": ""}`` / ``{"secret": "MOUNTPATH/KEY"}`` (a secret's file
through ``EDGEFLEET_SECRET_DIRS``, as a workload finds it) the worker tries once its sandbox
is in force and its model loaded, reporting each outcome in READY (``testProbe``). Read from
the environment edged was started with, never from edged.toml or a manifest; it only tries
and reports, it grants nothing."""
SECRET_DIRS_ENV = "EDGEFLEET_SECRET_DIRS"
CONFIG_ENV = "EDGEFLEET_MODEL_CONFIG"  # edged.state.modelconfigs.ENV_CONFIG
CONFIG_DIR_ENV = "EDGEFLEET_MODEL_CONFIG_DIR"  # edged.state.modelconfigs.ENV_CONFIG_DIR


class LoadError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _outlive_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, 0)  # PR_SET_PDEATHSIG: none
    except (OSError, AttributeError):
        pass


def _read_verified(path: str, sha256: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise LoadError("ArtifactUnreadable", f"cannot read {path}: {exc.strerror}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise LoadError(
            "ArtifactDigestMismatch",
            f"{path} has sha256 {digest}, expected {sha256}: refusing to load it",
        )
    return data


class Model:
    """An ONNX Runtime session plus what the protocol needs to know about it."""

    def __init__(
        self, spec: LaunchSpec, data: bytes, protections: Protections | None = None
    ) -> None:
        self.protections = protections
        try:
            import onnxruntime as ort
        except ImportError as exc:  # pragma: no cover - packaging error
            raise LoadError("RuntimeMissing", f"onnxruntime cannot be imported: {exc}") from None
        from edged.runtime.tensors import spec_from_ort

        available = ort.get_available_providers()
        providers = [p for p in spec.providers if p in available]
        self.conditions: list[dict[str, str]] = []
        missing = [p for p in spec.providers if p not in available]
        if missing:
            self.conditions.append(
                {
                    "type": "ProviderFallback",
                    "reason": "ProviderUnavailable",
                    "message": f"{', '.join(missing)} not available in this onnxruntime build "
                    f"(available: {', '.join(available)}); "
                    + ("using " + ", ".join(providers) if providers else "falling back to CPU"),
                }
            )
        if "CPUExecutionProvider" not in providers:
            providers.append("CPUExecutionProvider")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = spec.intra_op_threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        # No busy-waiting thread pools: edged is a guest on small devices.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        try:
            self.session = ort.InferenceSession(data, sess_options=opts, providers=providers)
        except MemoryError:
            raise LoadError(
                "MemoryLimitTooLow", "the model does not fit in the worker's memory limit"
            ) from None
        except Exception as exc:  # onnxruntime raises its own exception types
            raise LoadError(
                "ModelLoadFailed", f"onnxruntime cannot load the model: {exc}"
            ) from None
        self.providers = self.session.get_providers()
        self.inputs = {n.name: spec_from_ort(n) for n in self.session.get_inputs()}
        self.outputs = tuple(n.name for n in self.session.get_outputs())
        self.output_specs = [spec_from_ort(n) for n in self.session.get_outputs()]
        unsupported = [s.name for s in self.inputs.values() if s.datatype == "BYTES"]
        if unsupported:
            raise LoadError(
                "UnsupportedModel", f"string (BYTES) inputs are not supported: {unsupported}"
            )
        self.batchable = spec.max_batch_size > 1 and all(
            s.shape and s.shape[0] == -1 for s in self.inputs.values()
        )
        self.max_batch = spec.max_batch_size if self.batchable else 1
        self.run_s, self.benchmark = self._warm_up()
        self.validation: dict[str, Any] | None = None  # set by main() on slot 0
        self.stage: Any = None  # its config's processing (runtime/configstage.py), by main()

    def _warm_up(self) -> tuple[float, dict[str, Any]]:
        """The warm-up (its median run) and the self-benchmark that follows it: the p95 of
        up to :data:`BENCH_RUNS` timed runs within :data:`BENCH_BUDGET_S` (the hub keeps a
        deployment with ``placement.maxLatencyP95`` off devices over it)."""
        import numpy as np

        from edged.runtime.tensors import _OIP_TO_NUMPY

        feeds = {
            s.name: np.zeros([1 if d < 0 else d for d in s.shape], dtype=_OIP_TO_NUMPY[s.datatype])
            for s in self.inputs.values()
        }
        times: list[float] = []
        bench: list[float] = []
        started = time.perf_counter()
        for i in range(WARMUP_RUNS + BENCH_RUNS):
            if i >= WARMUP_RUNS and bench and time.perf_counter() - started > BENCH_BUDGET_S:
                break
            if i == WARMUP_RUNS:
                started = time.perf_counter()
            t0 = time.perf_counter()
            try:
                self.session.run(None, feeds)
            except Exception as exc:
                raise LoadError("WarmupFailed", f"warm-up inference failed: {exc}") from None
            (times if i < WARMUP_RUNS else bench).append(time.perf_counter() - t0)
        bench.sort()
        p95 = bench[max(0, -(-len(bench) * 95 // 100) - 1)]
        return sorted(times)[len(times) // 2], {"p95Seconds": p95, "runs": len(bench)}

    def metadata(self, spec: LaunchSpec) -> dict[str, Any]:
        meta = {
            "name": spec.model_name,
            "versions": [spec.model_version],
            "platform": "onnxruntime_onnx",
            "inputs": [s.to_json() for s in self.inputs.values()],
            "outputs": [s.to_json() for s in self.output_specs],
            "providers": self.providers,
            "conditions": self.conditions,
            "batching": {"maxBatchSize": self.max_batch, "batchable": self.batchable},
            "warmupSeconds": self.run_s,
            "pid": os.getpid(),
            "validation": self.validation,
            "benchmark": self.benchmark,
        }
        if self.stage is not None:
            meta["config"] = self.stage.report()
        if self.protections is not None:
            meta["sandbox"] = self.protections.to_json()
        probe = os.environ.get(TEST_PROBE_ENV)
        if probe:
            meta["testProbe"] = _run_test_probe(probe)
            print(f"worker test probe: {orjson.dumps(meta['testProbe']).decode()}", file=sys.stderr)
        return meta


def _run_test_probe(text: str) -> list[dict[str, str]]:
    """Try what :data:`TEST_PROBE_ENV` lists; each outcome ``ok`` or the OS's error."""
    try:
        steps = orjson.loads(text)
    except orjson.JSONDecodeError:
        return [{"error": f"{TEST_PROBE_ENV} is not JSON"}]
    results: list[dict[str, str]] = []
    for step in steps[:16] if isinstance(steps, list) else []:
        if not isinstance(step, dict) or len(step) != 1:
            continue
        ((what, target),) = step.items()
        outcome = "ok"
        try:
            if what == "open":
                with open(str(target), "rb") as f:
                    f.read(1)
            elif what in ("connect", "bind"):
                host, _, port = str(target).rpartition(":")
                family = socket.AF_INET6 if host.startswith("[") else socket.AF_INET
                host = host.strip("[]")
                with socket.socket(family, socket.SOCK_STREAM) as s:
                    s.settimeout(5)
                    if what == "connect":
                        s.connect((host, int(port)))
                    else:
                        s.bind((host, int(port)))
            elif what == "udp":
                socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()
            elif what == "secret":  # MOUNTPATH/KEY, through EDGEFLEET_SECRET_DIRS
                mount, _, key = str(target).rpartition("/")
                dirs = orjson.loads(os.environ.get(SECRET_DIRS_ENV, "{}"))
                if mount not in dirs:
                    outcome = "not mounted"
                else:
                    with open(os.path.join(dirs[mount], key), "rb") as f:
                        f.read(1)
            elif what == "config":  # the model configuration, through EDGEFLEET_MODEL_CONFIG
                path = os.environ.get(CONFIG_ENV)
                if not path:
                    outcome = "no config"
                else:
                    with open(path, "rb") as f:
                        data = orjson.loads(f.read()).get("data")
                    outcome = orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode()[:256]
            else:
                outcome = "unknown step"
        except OSError as exc:
            outcome = f"{type(exc).__name__}: errno {exc.errno}"
        results.append({"step": what, "target": str(target), "outcome": outcome})
    return results


RUNTIME_MODULES = (
    "numpy",
    "edged.runtime.tensors",
    "edged.runtime.validating",
    "encodings.cp437",  # zipfile's names (the validation set), imported when first needed
    "uvloop",
)
"""What a worker with a uid of its own imports while it is still root: the standard library
may live where only root can read (a Python under /root); nothing of the model or its inputs
yet. Not onnxruntime: importing it starts a thread, which must start inside the sandbox (it
imports no more of the standard library than these do; its own package must be readable)."""
FD_PATH = "/proc/self/fd/"


def _open_before_switch(spec: LaunchSpec) -> tuple[str, str]:
    """Still root, before the switch to the worker's own uid: import the runtime, and open
    what the worker reads later that its uid could not reach by path (its artifact and
    validation set in edged's 0700 data directory, its secrets under the 0700 secrets
    directory). Returns the paths to read them by afterwards (``/proc/self/fd/N``: the kernel
    checks the file's own mode there, not its parents'); each secret's is put in
    ``EDGEFLEET_SECRET_DIRS``."""
    import importlib

    for name in RUNTIME_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # uvloop is optional

    def by_fd(path: str, flags: int = os.O_RDONLY) -> str:
        return f"{FD_PATH}{os.open(path, flags | os.O_CLOEXEC)}"

    try:
        artifact = by_fd(spec.artifact_path)
    except OSError as exc:
        raise LoadError(
            "ArtifactUnreadable", f"cannot read {spec.artifact_path}: {exc.strerror}"
        ) from None
    validation = spec.validation_path
    if spec.validate and validation:
        try:
            validation = by_fd(validation)
        except OSError:
            pass  # evaluate() reports it missing
    if spec.secret_dirs:
        dirs: dict[str, str] = {}
        for mount, path in spec.secret_dirs:
            try:
                dirs[mount] = by_fd(path, os.O_RDONLY | os.O_DIRECTORY)
            except OSError as exc:
                raise LoadError(
                    "SecretUnavailable", f"cannot open {path}: {exc.strerror}"
                ) from None
        os.environ[SECRET_DIRS_ENV] = orjson.dumps(dirs).decode()
    if spec.config_dir:  # the directory by descriptor: a config swapped later is seen there
        try:
            config_dir = by_fd(spec.config_dir, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            pass  # none yet: nothing to read, as by its path
        else:
            os.environ[CONFIG_DIR_ENV] = config_dir
            os.environ[CONFIG_ENV] = f"{config_dir}/config.json"
    return artifact, validation


def _send_failure(sock: socket.socket, reason: str, message: str) -> None:
    payload = orjson.dumps({"reason": reason, "message": message})
    try:
        sock.sendall(encode_frame(FrameType.FAILED, 0, payload))
    except OSError:
        pass


async def _serve(
    sock: socket.socket,
    spec: LaunchSpec,
    model: Model,
    kept: tuple[socket.socket, int] | None,
    handoff: socket.socket | None = None,
) -> int:
    """Serve edged on ``sock``; ``kept`` (a kept worker's listening socket and a descriptor of
    /dev/null): when edged goes, wait for the next one there, up to ``orphan_timeout_s``."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()

    def on_term() -> None:
        if not done.done():
            done.set_result(0)

    loop.add_signal_handler(signal.SIGTERM, on_term)
    proto = WorkerProtocol(spec, model, done, kept=kept is not None)
    if handoff is not None:  # connections edged hands this worker (direct.py)
        proto.serve_direct(handoff)
    try:
        return await _serve_with(proto, sock, spec, kept, done)
    finally:
        proto.close()  # the runner thread ends after the batches handed to it


async def _serve_with(
    proto: WorkerProtocol,
    sock: socket.socket,
    spec: LaunchSpec,
    kept: tuple[socket.socket, int] | None,
    done: asyncio.Future[int],
) -> int:
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(lambda: proto, sock=sock)
    while kept is not None:
        either: list[asyncio.Future[Any]] = [done, proto.lost]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if done.done():
            break
        listener, null = kept
        os.dup2(null, 2)  # edged's end of the stderr pipe is gone: nobody reads it now
        conn = await _next_edged(listener, spec, done)
        if conn is None:
            if not done.done():
                done.set_result(0)  # orphaned: no edged came back within the bound
            break
        transport, _ = await loop.connect_accepted_socket(lambda: proto, sock=conn)
    code = await done
    transport.close()
    return code


ATTACH_HELLO_TIMEOUT_S = 5.0
_PEERCRED = struct.Struct("3i")


async def _next_edged(
    listener: socket.socket, spec: LaunchSpec, done: asyncio.Future[int]
) -> socket.socket | None:
    """The next edged's connection on ``listener``, within ``orphan_timeout_s``: from edged's
    uid only, saying :data:`ATTACH_HELLO`, with its end of a stderr pipe (that becomes this
    worker's stderr). None at the bound, or once the worker is told to stop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + spec.orphan_timeout_s
    while not done.done():
        left = deadline - loop.time()
        if left <= 0:
            return None
        accepting = asyncio.ensure_future(loop.sock_accept(listener))
        waiting: list[asyncio.Future[Any]] = [accepting, done]
        await asyncio.wait(waiting, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        if not accepting.done():
            accepting.cancel()
            continue
        conn, _ = accepting.result()
        _, uid, _ = _PEERCRED.unpack(
            conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        )
        if uid != spec.supervisor_uid:
            conn.close()  # not edged: the worker keeps waiting for edged
            continue
        try:
            conn.settimeout(ATTACH_HELLO_TIMEOUT_S)
            msg, fds, _, _ = socket.recv_fds(conn, len(ATTACH_HELLO), 1)
        except OSError:
            conn.close()
            continue
        for fd in fds:
            if msg == ATTACH_HELLO:
                os.dup2(fd, 2)
            os.close(fd)
        if msg != ATTACH_HELLO:
            conn.close()
            continue
        conn.setblocking(False)
        return conn
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # edged decides when a worker stops
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nor does a terminal that goes
    fd = int(argv[0])
    spec = LaunchSpec.from_json(orjson.loads(argv[-1]))
    # the hand-off socket: connections edged hands this worker to serve itself (direct.py)
    handoff = None
    for arg in argv[1:-1]:
        if arg.startswith("--handoff="):
            handoff = socket.socket(fileno=int(arg.split("=", 1)[1]))
    if not spec.attach_name:
        _die_with_parent()
    if spec.secret_dirs:  # mountPath -> the directory serving it (docs/security.md, Secrets)
        os.environ[SECRET_DIRS_ENV] = orjson.dumps(dict(spec.secret_dirs)).decode()
    if spec.config_dir:  # its model configuration (docs/model-config.md): read it when needed
        os.environ[CONFIG_DIR_ENV] = spec.config_dir
        os.environ[CONFIG_ENV] = os.path.join(spec.config_dir, "config.json")
    sock = socket.socket(fileno=fd)
    kept: tuple[socket.socket, int] | None = None
    try:
        if spec.attach_name:  # before the sandbox: /dev/null is not among what it may open
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                listener.bind("\0" + spec.attach_name)
                listener.listen(4)
            except OSError as exc:
                raise LoadError(
                    "AttachFailed", f"cannot listen on @{spec.attach_name}: {exc.strerror}"
                ) from None
            listener.setblocking(False)
            kept = (listener, os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC))
        apply_limits(spec.limits)
        artifact, validation = spec.artifact_path, spec.validation_path
        if spec.sandbox.separate_uid and spec.uid >= 0:
            artifact, validation = _open_before_switch(spec)
        protections = apply_sandbox(
            spec.sandbox,
            spec.artifact_path,
            (spec.validation_path,) if spec.validate and spec.validation_path else (),
            uid=spec.uid,
            uid_problem=spec.uid_problem,
            groups=spec.groups,
        )
        if spec.attach_name:  # the uid switch set the parent-death signal again: not for it
            _outlive_parent()
        data = _read_verified(artifact, spec.artifact_sha256)
        model = Model(spec, data, protections)
        del data
        try:  # its config's processing in force (runtime/configstage.py), and the revision's
            # accuracy with it, before READY (runtime/validating.py)
            model.validation = attach(model, spec, validation)
        except ValueError as exc:
            raise LoadError("ModelConfigInvalid", f"the model config cannot apply: {exc}") from None
        for path in (artifact,) if spec.validate else (artifact, validation):  # read, not kept
            if path.startswith(FD_PATH):
                os.close(int(path[len(FD_PATH) :]))
    except SandboxUnavailable as exc:
        _send_failure(sock, exc.reason, str(exc))
        return EXIT_LOAD_FAILED
    except LoadError as exc:
        _send_failure(sock, exc.reason, str(exc))
        return EXIT_LOAD_FAILED
    except OSError as exc:
        _send_failure(sock, "LimitsFailed", f"cannot apply resource limits: {exc}")
        return EXIT_LOAD_FAILED
    sock.setblocking(False)
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover - non-Linux
        runner = asyncio.run
    return int(runner(_serve(sock, spec, model, kept, handoff)))


if __name__ == "__main__":
    raise SystemExit(main())
