"""What taking edged's control process out of the data path would give, measured against
edged itself and the bare ONNX Runtime call in the same run (issue 34, item 1: the design in
docs/edged.md, "The control process and the data path"; not built in edged yet).

    .venv/bin/python bench/directpath.py [--reps N] [--dur S]

The direct path is a prototype (``bench/directworker.py``): a process here accepts on a Unix
socket, reads the peer's credentials (as edged's admission does) and hands the connection to
a worker process over ``SCM_RIGHTS``; the worker serves it with the worker's own model load,
batch queue, decoding and encoding and edged's HTTP connection code. It has no sandbox
(``bench/sandbox.py`` measures that on its own), no probes, no hand-back and no drain.

Measured, each repetition in turn on the same machine minutes apart at most:
* tiny MLP, concurrency 1: p50 and p99 added over the bare batch-1 call, edged and direct;
* medium MLP, 8 client processes (one connection each), JSON and binary: requests per second
  against the bare batch-8 rows/s ceiling, and client p99 against the bare batch-8 call;
* the zero-cost bound of ``bench/inference.py`` (the batch-8 call plus the clients' own
  turnaround per batch) for each encoding, so each rate reads as a share of what any server
  could reach with these clients here.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson
from common import (
    Edged,
    ModelDef,
    RawClient,
    _noop,
    bare_loop,
    bare_session,
    infer_request,
    infer_request_binary,
    make_input,
    median,
    percentile,
    timed_calls,
    window_client,
)

from edged.runtime.launching import LaunchSpec, LimitsSpec, SandboxSpec

_PEERCRED = struct.Struct("3i")
HERE = Path(__file__).resolve().parent


class DirectPath:
    """The prototype: an acceptor thread here, a worker process serving handed sockets."""

    def __init__(self, model_path: Path, name: str, max_batch: int, workdir: Path) -> None:
        self.sock_path = str(workdir / f"{name}-direct.sock")
        spec = LaunchSpec(
            replica_id=f"{name}-0",
            workload=name,
            model_name=name,
            model_version="1.0.0",
            artifact_path=str(model_path),
            artifact_sha256=hashlib.sha256(model_path.read_bytes()).hexdigest(),
            providers=("CPUExecutionProvider",),
            intra_op_threads=1,
            max_batch_size=max_batch,
            max_queue_delay_s=0.002,
            limits=LimitsSpec(),
            sandbox=SandboxSpec(mode="off"),
        )
        self._spec = orjson.dumps(spec.to_json()).decode()
        self._chan: socket.socket | None = None
        self._listener: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self.handed = 0

    def __enter__(self) -> DirectPath:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._chan = ours
        self._proc = subprocess.Popen(
            [sys.executable, str(HERE / "directworker.py"), str(theirs.fileno()), self._spec],
            pass_fds=[theirs.fileno()],
            env={**os.environ, "PYTHONPATH": str(HERE.parent)},
        )
        theirs.close()
        ours.settimeout(120)
        if ours.recv(1) != b"R":
            raise RuntimeError("the direct worker did not start")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.sock_path)
        self._listener.listen(128)
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()
        return self

    def _accept(self) -> None:
        assert self._listener is not None and self._chan is not None
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            # admission, as edged's: who connected (then the connection cap, the ingress uids)
            _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            socket.send_fds(self._chan, [b"C"], [conn.fileno()])
            conn.close()
            self.handed += 1

    def worker_pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def __exit__(self, *exc: object) -> None:
        if self._listener is not None:
            self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        if self._chan is not None:
            self._chan.close()  # the worker's end reads EOF: it exits
        if self._proc is not None:
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        Path(self.sock_path).unlink(missing_ok=True)


def ms(s: float) -> float:
    return s * 1e3


def latency(args: argparse.Namespace, workdir: Path) -> list[dict[str, float]]:
    from edgefleet.demo import TINY_MLP

    model = ModelDef("tiny", TINY_MLP, max_batch_size=8)
    x = make_input(TINY_MLP[0], seed=1)
    req = infer_request(model.name, x)
    rows: list[dict[str, float]] = []
    with Edged([model]) as edged:
        sess = bare_session(edged.model_path(model))
        direct = DirectPath(edged.model_path(model), model.name, 8, workdir)
        with direct, RawClient(edged.infer_sock) as ec, RawClient(direct.sock_path) as dc:
            timed_calls(ec, req, 500)
            timed_calls(dc, req, 500)
            for _ in range(args.reps):
                bare = bare_loop(sess, x, n=args.lat_n, warmup=200)
                via_edged = timed_calls(ec, req, args.lat_n)
                via_direct = timed_calls(dc, req, args.lat_n)
                r = {"bare_p50_ms": ms(percentile(bare, 50))}
                for name, lat in (("edged", via_edged), ("direct", via_direct)):
                    r[f"{name}_added_p50_ms"] = ms(percentile(lat, 50)) - r["bare_p50_ms"]
                    r[f"{name}_added_p99_ms"] = ms(percentile(lat, 99) - percentile(bare, 99))
                r["direct_vs_edged_p50"] = r["direct_added_p50_ms"] / r["edged_added_p50_ms"]
                rows.append(r)
    return rows


def _window(pool: Any, sock: str, request: bytes, args: argparse.Namespace) -> dict[str, float]:
    t_start = time.monotonic() + args.warm
    t_end = t_start + args.dur
    out = pool.starmap(window_client, [(sock, request, t_start, t_end)] * args.clients, chunksize=1)
    rate = sum(cnt / el for cnt, el, _, _ in out if el > 0)
    lat = [v for _, _, ls, _ in out for v in ls]
    cpu = sum(c for _, _, _, c in out)
    return {
        "rate": rate,
        "p99_ms": ms(percentile(lat, 99)),
        "client_us": 1e6 * cpu / max(1.0, rate * args.dur),
    }


def throughput(args: argparse.Namespace, workdir: Path) -> list[dict[str, float]]:
    from edgefleet.demo import MEDIUM_MLP

    model = ModelDef("medium", MEDIUM_MLP, max_batch_size=8)
    x = make_input(MEDIUM_MLP[0], seed=2)
    x8 = x.repeat(8, axis=0)
    requests = {"json": infer_request(model.name, x), "binary": infer_request_binary(model.name, x)}
    ctx = multiprocessing.get_context("spawn")
    rows: list[dict[str, float]] = []
    with ctx.Pool(args.clients) as pool:
        pool.map(_noop, range(args.clients), chunksize=1)
        with Edged([model]) as edged:
            sess = bare_session(edged.model_path(model))
            with DirectPath(edged.model_path(model), model.name, 8, workdir) as direct:
                for _ in range(args.reps):
                    big = bare_loop(sess, x8, duration=2.0, warmup=20)
                    b8_s = percentile(big, 50)
                    ceiling = 8 * len(big) / sum(big)
                    r: dict[str, float] = {"ceiling_rows_s": ceiling, "bare_b8_ms": ms(b8_s)}
                    cores = os.cpu_count() or 1
                    paths = (("edged", edged.infer_sock), ("direct", direct.sock_path))
                    for enc, request in requests.items():
                        for name, sock in paths:
                            w = _window(pool, sock, request, args)
                            turnaround = args.clients * w["client_us"] / 1e6 / cores
                            bound = b8_s / (b8_s + turnaround)
                            r[f"{enc}_{name}_rps"] = w["rate"]
                            r[f"{enc}_{name}_ceil"] = w["rate"] / ceiling
                            r[f"{enc}_{name}_bound"] = w["rate"] / ceiling / bound
                            r[f"{enc}_{name}_p99_b8"] = w["p99_ms"] / ms(b8_s)
                        r[f"{enc}_direct_vs_edged"] = r[f"{enc}_direct_rps"] / r[f"{enc}_edged_rps"]
                    rows.append(r)
    return rows


def show(title: str, rows: list[dict[str, float]]) -> None:
    print(f"\n{title}")
    keys = list(rows[0])
    for k in keys:
        vals = "  ".join(f"{r[k]:10.3f}" for r in rows)
        print(f"  {k:26s} {vals}   median {median(r[k] for r in rows):10.3f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--lat-n", type=int, default=2000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--dur", type=float, default=4.0, help="seconds per throughput window")
    p.add_argument("--warm", type=float, default=1.0)
    p.add_argument("--only", choices=("latency", "throughput"))
    args = p.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="directpath-") as tmp:
        if args.only != "throughput":
            show("tiny MLP, concurrency 1 (ms added over the bare call; columns: repetitions)",
                 latency(args, Path(tmp)))  # fmt: skip
        if args.only != "latency":
            show("medium MLP, concurrency 8 (ceil: of the bare batch-8 rows/s; bound: of the "
                 "zero-cost bound; p99_b8: client p99 over the bare batch-8 call)",
                 throughput(args, Path(tmp)))  # fmt: skip
    print(f"\n(took {time.perf_counter() - t0:.0f} s; load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
