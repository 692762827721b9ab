"""Shared pieces of edged's benchmarks (see /work/shared/BENCHMARKS.md for the method).

- :class:`Edged`: run ``edged run`` on a temporary data dir with generated ModelDeployment
  manifests, wait for readiness with a deadline, stop it with SIGTERM (SIGKILL if it hangs):
  :mod:`edgefleet.launching`, the helper the quickstart and the tests use too.
- :class:`RawClient`: a sequential HTTP/1.1 keep-alive client over a Unix socket that sends a
  pre-encoded request (bytes built once) and reads the reply by parsing ``Content-Length`` only
  (no JSON parsing), so the client's own cost stays at a few tens of microseconds.
- :func:`bare_loop`: the baseline, a bare ``InferenceSession.run`` loop, batch 1,
  ``intra_op_num_threads = 1``, same input.
- :func:`start_bench_hub`, :func:`enroll_device`: a real hub (``hub init``, ``hub serve``) and
  a device enrolled with it (``hub token create``, ``edged enroll``).

This module imports only the standard library at the top: benchmark client processes are
started with ``spawn`` and should come up fast and small.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgefleet.launching import LaunchedEdged, LaunchedHub

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # so ``edgefleet.demo`` imports when run as ``python bench/x.py``
    sys.path.insert(0, str(REPO))


# -- statistics ---------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """Percentile q (0..100) with linear interpolation between ranks; nan when empty."""
    s = sorted(values)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


# -- models and requests --------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelDef:
    """A model to deploy: its name, MLP layer sizes and deployment settings."""

    name: str
    sizes: tuple[int, ...]
    max_batch_size: int = 1
    cpu: str | None = None  # resources.cpu, e.g. "1" or "500m"; None: no resources section
    seed: int = 0
    probe_period_s: float | None = None  # spec.probes.readiness.periodSeconds (None: default)


def manifest_yaml(m: ModelDef, model_file: str) -> str:
    lines = [
        "apiVersion: edgefleet.io/v1",
        "kind: ModelDeployment",
        "metadata:",
        f"  name: {m.name}",
        "spec:",
        "  model:",
        f"    name: {m.name}",
        '    version: "1.0.0"',
        f"    path: {model_file}",
        "  runtime:",
        f"    maxBatchSize: {m.max_batch_size}",
        "    maxQueueDelay: 2ms",
        "    executionProviders: [CPUExecutionProvider]",
        "  replicas: {perDevice: 1}",
    ]
    if m.cpu is not None:
        lines.append(f'  resources: {{cpu: "{m.cpu}"}}')
    if m.probe_period_s is not None:
        lines.append(f"  probes: {{readiness: {{periodSeconds: {m.probe_period_s}}}}}")
    return "\n".join(lines) + "\n"


def make_input(n_in: int, seed: int = 0) -> Any:
    """A (1, n_in) float32 array, the same one for the bare loop and the edged path."""
    import numpy as np

    return np.random.default_rng(seed).standard_normal((1, n_in)).astype(np.float32)


def infer_request(model: str, x: Any) -> bytes:
    """The whole HTTP/1.1 request (headers and JSON body) for one inference, encoded once."""
    from edgefleet.inference import infer_path, infer_request_body

    body = infer_request_body({"input": x})
    head = (
        f"POST {infer_path(model)} HTTP/1.1\r\n"
        "Host: localhost\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


def infer_request_binary(model: str, x: Any) -> bytes:
    """The same inference with the binary tensor extension both ways (raw float32 input bytes
    after a JSON header, binary outputs), encoded once."""
    import orjson

    from edgefleet.inference import infer_path

    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [int(n) for n in x.shape],
                    "parameters": {"binary_data_size": int(x.nbytes)},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    body = header + x.tobytes()
    head = (
        f"POST {infer_path(model)} HTTP/1.1\r\n"
        "Host: localhost\r\n"
        "Content-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


def get_request(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()


# -- the raw client -------------------------------------------------------------------------------
class RawClient:
    """Sequential keep-alive HTTP/1.1 over a Unix socket; replies framed by Content-Length."""

    def __init__(self, path: str, timeout: float = 30.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self._buf = b""

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, request: bytes) -> tuple[int, int]:
        """Send one pre-encoded request, read its reply; returns (status, body length)."""
        self.sock.sendall(request)
        status, length, _ = self._read_reply(keep_body=False)
        return status, length

    def get(self, path: str) -> tuple[int, bytes]:
        """A GET whose body is wanted (readiness and status, not timed)."""
        self.sock.sendall(get_request(path))
        status, _, body = self._read_reply(keep_body=True)
        return status, body

    def _read_reply(self, *, keep_body: bool) -> tuple[int, int, bytes]:
        sock = self.sock
        buf = self._buf
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            chunk = sock.recv(262144)
            if not chunk:
                raise ConnectionError("edged closed the connection")
            buf += chunk
        i = buf.find(b"Content-Length: ", 0, end)
        if i < 0:  # not how edged writes it: fall back to a case-insensitive search
            i = buf.lower().find(b"content-length:", 0, end)
            if i < 0:
                raise ValueError("reply without Content-Length")
            i += 15
        else:
            i += 16
        j = buf.find(b"\r\n", i)
        length = int(buf[i:j])
        total = end + 4 + length
        while len(buf) < total:
            chunk = sock.recv(max(262144, total - len(buf)))
            if not chunk:
                raise ConnectionError("edged closed the connection")
            buf += chunk
        status = int(buf[9:12])
        body = buf[end + 4 : total] if keep_body else b""
        self._buf = buf[total:]
        return status, length, body


def timed_calls(client: RawClient, request: bytes, n: int) -> list[float]:
    """n sequential calls; per-call seconds (perf_counter). Raises on a non-200 reply."""
    out = [0.0] * n
    call = client.call
    pc = time.perf_counter
    for k in range(n):
        t0 = pc()
        status, _ = call(request)
        out[k] = pc() - t0
        if status != 200:
            raise RuntimeError(f"edged answered {status}")
    return out


# -- the baseline ---------------------------------------------------------------------------------
def bare_session(model_path: str | Path) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    return ort.InferenceSession(
        str(model_path), sess_options=opts, providers=["CPUExecutionProvider"]
    )


def wake_penalty(session: Any, x: Any, *, n: int = 400, idle_s: float = 0.0003) -> float:
    """How much slower the same small ``session.run`` is right after the thread slept for
    ``idle_s`` than back to back (medians): the cost of waking an idle CPU on this machine.
    A request that crosses processes pays it at each hop (1 would be no penalty; the 2-core
    CI machine, a VM, shows 3-4.6x)."""
    feeds = {"input": x}
    run = session.run
    pc = time.perf_counter
    for _ in range(50):
        run(None, feeds)
    hot: list[float] = []
    cold: list[float] = []
    for _ in range(n):
        t0 = pc()
        run(None, feeds)
        hot.append(pc() - t0)
    for _ in range(n):
        time.sleep(idle_s)
        t0 = pc()
        run(None, feeds)
        cold.append(pc() - t0)
    return percentile(cold, 50) / percentile(hot, 50)


def bare_loop(
    session: Any, x: Any, *, n: int | None = None, duration: float | None = None, warmup: int = 50
) -> list[float]:
    """Per-call seconds of ``session.run`` on ``x`` (batch 1 for the baseline): n calls, or as
    many as fit in ``duration`` seconds."""
    feeds = {"input": x}
    run = session.run
    pc = time.perf_counter
    for _ in range(warmup):
        run(None, feeds)
    out: list[float] = []
    append = out.append
    if n is not None:
        for _ in range(n):
            t0 = pc()
            run(None, feeds)
            append(pc() - t0)
        return out
    assert duration is not None
    end = pc() + duration
    while True:
        t0 = pc()
        run(None, feeds)
        t1 = pc()
        append(t1 - t0)
        if t1 >= end:
            return out


# -- edged ----------------------------------------------------------------------------------------
@dataclass
class Edged:
    """An ``edged run`` process on a temporary directory, serving ``models``.

    Use as a context manager: the process is always stopped (SIGTERM, then SIGKILL) and the
    temporary directory removed, also on errors.
    """

    models: Sequence[ModelDef] = ()
    ready_timeout: float = 120.0
    config_text: str | None = None  # an edged.toml to pass with --config
    keep_dir: bool = False
    root: Path = field(init=False)
    launched: LaunchedEdged | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="edged-bench-"))
        self.manifests = self.root / "manifests"
        self.data = self.root / "data"
        self.log_path = self.root / "edged.log"
        self.manifests.mkdir()

    @property
    def infer_sock(self) -> str:
        return str(self.data / "infer.sock")

    @property
    def status_sock(self) -> str:
        return str(self.data / "edged.sock")

    @property
    def pid(self) -> int:
        assert self.launched is not None
        return self.launched.pid

    def model_path(self, m: ModelDef) -> Path:
        return self.manifests / f"{m.name}.onnx"

    def start(self) -> Edged:
        from edgefleet.demo import build_mlp
        from edgefleet.launching import start_edged
        from edgefleet.trust.signing import create_root, generate_key_pair, sign_artifact

        # Fully signed, as on a device: a publisher key, a trust root, signed metadata.
        key = self.root / "publisher"
        generate_key_pair(key)
        create_root(
            root_keys=[key.with_suffix(".key")],
            artifact_keys=[key.with_suffix(".pub")],
            out=self.root / "trust-root.json",
        )
        for m in self.models:
            build_mlp(self.model_path(m), m.sizes, seed=m.seed)
            sign_artifact(
                self.model_path(m), name=m.name, version="1.0.0", keys=[key.with_suffix(".key")]
            )
            (self.manifests / f"{m.name}.yaml").write_text(
                manifest_yaml(m, self.model_path(m).name)
            )
        cfg = self.root / "edged.toml"
        trust = f'\n[trust]\nrootFile = "{self.root / "trust-root.json"}"\n'
        cfg.write_text((self.config_text or "") + trust)
        self.launched = start_edged(
            self.data,
            manifests=self.manifests,
            config=cfg,
            log=self.log_path,
            args=["--log-level", "warning"],
            cwd=REPO,
        )
        self.wait_ready()
        return self

    def wait_ready(self) -> float:
        """Wait until edged is ready and every model answers ready; returns seconds.
        ``edgefleet.launching.LaunchError`` (with the log's tail) when it exits or times out."""
        assert self.launched is not None
        names = [m.name for m in self.models]
        return self.launched.wait_ready(self.ready_timeout, models=names)

    def status(self) -> dict[str, Any]:
        """``GET /v1/status`` on the status socket."""
        with RawClient(self.status_sock, timeout=5) as c:
            code, body = c.get("/v1/status")
        if code != 200:
            raise RuntimeError(f"GET /v1/status answered {code}")
        doc: dict[str, Any] = json.loads(body)
        return doc

    def metrics(self) -> dict[str, float]:
        """``GET /metrics`` on the status socket: series (``name{labels}``) -> value."""
        with RawClient(self.status_sock, timeout=5) as c:
            code, body = c.get("/metrics")
        if code != 200:
            raise RuntimeError(f"GET /metrics answered {code}")
        out: dict[str, float] = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                series, _, value = line.rpartition(" ")
                out[series] = float(value)
        return out

    def worker_pids(self) -> dict[str, list[int]]:
        """workload name -> replica pids, from ``GET /v1/status``."""
        out: dict[str, list[int]] = {}
        for w in self.status().get("workloads", []):
            name = w.get("name") or w.get("workload") or "?"
            out[name] = [r["pid"] for r in w.get("replicas", []) if r.get("pid")]
        return out

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> int | None:
        code = self.launched.stop(timeout) if self.launched is not None else None
        if not self.keep_dir:
            shutil.rmtree(self.root, ignore_errors=True)
        return code

    def __enter__(self) -> Edged:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of one process (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / tick
    except (OSError, IndexError, ValueError):
        return 0.0


# -- a hub and an enrolled device -----------------------------------------------------------------
@dataclass(frozen=True)
class BenchHub:
    hub: LaunchedHub
    data: Path
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def start_bench_hub(work: Path) -> BenchHub:
    """``hub init`` in ``work/hub`` and ``hub serve`` (log: ``work/hub.log``), listening; the
    caller stops it (``.hub.stop``)."""
    import subprocess

    from edgefleet.launching import free_port_pair, program_command, start_hub

    port = free_port_pair()
    address = f"127.0.0.1:{port}"
    data = work / "hub"
    subprocess.run(program_command("hub", "init", "--data-dir", data, "--hub-address", address),
                   check=True, capture_output=True, timeout=60)  # fmt: skip
    hub = start_hub(data, listen=address, log=work / "hub.log")
    try:
        hub.wait_listening(30)
    except BaseException:
        hub.stop(15)
        raise
    return BenchHub(hub, data, port)


def enroll_device(hub: BenchHub, device: Path, name: str = "dev") -> None:
    """``edged enroll`` of a device with data dir ``device`` as ``name``, with a join token
    from ``hub token create`` and the CA and TUF root hashes it prints."""
    import subprocess

    from edgefleet.launching import program_command

    token = subprocess.run(
        program_command("hub", "token", "create", "--data-dir", hub.data),
        check=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    pin = token.stderr.split("CA hash ")[1].strip()
    root_pin = token.stderr.split("root hash ")[1].split(";")[0]
    subprocess.run(
        program_command("edged", "enroll", "--hub", hub.address, "--ca-hash", pin,
                        "--root-hash", root_pin, "--data-dir", device, "--name", name,
                        "--enroll-address", f"127.0.0.1:{hub.port + 1}"),
        check=True, capture_output=True, timeout=60,
        env={**os.environ, "EDGED_TOKEN": token.stdout.strip()},
    )  # fmt: skip


def fmt_ms(s: float) -> str:
    return f"{s * 1e3:.3f}"


# -- concurrent clients (one process each) -------------------------------------------------------
def window_client(
    sock_path: str, request: bytes, t_start: float, t_end: float
) -> tuple[int, float, list[float], float]:
    """One benchmark client process: warm up until ``t_start``, then measure until ``t_end``.

    ``t_start``/``t_end`` are ``time.monotonic()`` values (CLOCK_MONOTONIC, the same in every
    process). Returns (requests completed in the window, seconds from the window's start to the
    last completion, per-request seconds measured with perf_counter, this client's own CPU
    seconds in the window).
    """
    off = time.monotonic() - time.perf_counter()
    start = t_start - off
    end = t_end - off
    pc = time.perf_counter
    lat: list[float] = []
    with RawClient(sock_path) as c:
        call = c.call
        while pc() < start:
            if call(request)[0] != 200:
                raise RuntimeError("edged answered an error during warm-up")
        t_first = pc()
        cpu0 = time.process_time()
        t1 = t_first
        while t1 < end:
            t0 = pc()
            status, _ = call(request)
            t1 = pc()
            if status != 200:
                raise RuntimeError(f"edged answered {status}")
            lat.append(t1 - t0)
        cpu = time.process_time() - cpu0
    return len(lat), t1 - t_first, lat, cpu


def _noop(_: int) -> int:
    return os.getpid()
