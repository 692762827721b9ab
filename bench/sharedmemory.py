"""A 224x224x3 float32 frame sent to edged three ways in one run: the system shared-memory
extension, the binary tensor extension, JSON; requests per second and CPU per request.

    .venv/bin/python bench/sharedmemory.py [--quick] [--json PATH]

The model is an MLP whose input is the frame flattened (150,528 floats, 602,112 bytes) and
whose output is 10 floats. One keep-alive client on infer.sock sends pre-encoded requests
one after the other (concurrency 1), the three ways interleaved (each first in turn), each
repeated (5 times, once with --quick); medians are quoted. With shared memory the frame is
put in a region of /dev/shm once and registered (``tritonclient``'s layout: the request
names the input's and the output's region, offset and size); the output comes back in its
region. CPU per request: edged's control process, its worker (all threads, schedstat's
nanoseconds) and the client, over each window. The bare ``InferenceSession.run`` of the
same frame (one thread) is context; ratios are against the binary extension, measured in
the same run. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    Edged,
    ModelDef,
    RawClient,
    bare_loop,
    bare_session,
    cpu_seconds,
    infer_request,
    infer_request_binary,
    median,
    percentile,
)

FRAME = (224, 224, 3)
N_IN = 224 * 224 * 3
SIZES = (N_IN, 16, 10)
OUT_BYTES = 10 * 4


def _post(path: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"{extra}Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def shm_request(
    model: str, region: str, in_bytes: int, out_bytes: int, shape: list[int] | None = None
) -> bytes:
    """What tritonclient sends for an input and an output in regions (its JSON, no binary):
    the input at the region's start, the output right after it."""
    import orjson

    body = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": shape or [1, N_IN],
                    "datatype": "FP32",
                    "parameters": {
                        "shared_memory_region": region,
                        "shared_memory_byte_size": in_bytes,
                    },
                }
            ],
            "outputs": [
                {
                    "name": "logits",
                    "parameters": {
                        "binary_data": False,
                        "shared_memory_region": region,
                        "shared_memory_byte_size": out_bytes,
                        "shared_memory_offset": in_bytes,
                    },
                }
            ],
        }
    )
    return _post(f"/v2/models/{model}/infer", body)


class ShmFrame:
    """A region in /dev/shm holding ``x`` (room for the output after it), registered with an
    edged as ``name``; every client of the same uid may name it. ``close`` removes it."""

    def __init__(self, x: Any, out_bytes: int, name: str = "frame") -> None:
        self.name = name
        self.in_bytes = int(x.nbytes)
        self.size = self.in_bytes + out_bytes
        self.key = f"edged-bench-{os.getpid()}-{name}"
        self.path = Path("/dev/shm") / self.key
        self.fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.ftruncate(self.fd, self.size)
        os.pwrite(self.fd, x.tobytes(), 0)
        self.shape = [int(n) for n in x.shape]

    def register(self, sock_path: str) -> None:
        body = json.dumps({"key": "/" + self.key, "byte_size": self.size}).encode()
        with RawClient(sock_path) as client:
            client.sock.sendall(_post(f"/v2/systemsharedmemory/region/{self.name}/register", body))
            status, _, reply = client._read_reply(keep_body=True)
        if status != 200:
            raise RuntimeError(f"register answered {status}: {reply!r}")

    def request(self, model: str) -> bytes:
        return shm_request(model, self.name, self.in_bytes, self.size - self.in_bytes, self.shape)

    def output(self, n: int) -> bytes:
        return os.pread(self.fd, n, self.in_bytes)

    def close(self) -> None:
        os.close(self.fd)
        self.path.unlink(missing_ok=True)


def cpu_ns(pid: int) -> float:
    """Seconds on a CPU of every thread of ``pid`` (schedstat: nanoseconds, not the 10 ms
    ticks of /proc/PID/stat); falls back to those ticks where schedstat is missing."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return cpu_seconds(pid)
    return total / 1e9


def window(client: RawClient, request: bytes, n: int, pids: list[int]) -> dict[str, float]:
    cpu0 = [cpu_ns(p) for p in pids]
    c0 = time.process_time()
    lat = [0.0] * n
    pc = time.perf_counter
    t0 = pc()
    for k in range(n):
        t = pc()
        status, _ = client.call(request)
        lat[k] = pc() - t
        if status != 200:
            raise RuntimeError(f"edged answered {status}")
    wall = pc() - t0
    client_cpu = time.process_time() - c0
    cpu = [cpu_ns(p) - c for p, c in zip(pids, cpu0, strict=True)]
    return {
        "rps": n / wall,
        "p50_ms": percentile(lat, 50) * 1e3,
        "edged_cpu_us": cpu[0] / n * 1e6,
        "worker_cpu_us": sum(cpu[1:]) / n * 1e6,
        "client_cpu_us": client_cpu / n * 1e6,
        "total_cpu_us": (sum(cpu) + client_cpu) / n * 1e6,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    model = ModelDef("frame", SIZES, max_batch_size=1)
    x = np.random.default_rng(2).random(FRAME, dtype=np.float32).reshape(1, N_IN)
    frame = ShmFrame(x, OUT_BYTES)
    try:
        with Edged([model]) as edged:
            sess = bare_session(edged.model_path(model))
            bare = bare_loop(sess, x, n=args.n, warmup=20)
            ref = sess.run(None, {"input": x})[0]
            pids = [edged.pid, *[p for ps in edged.worker_pids().values() for p in ps]]
            frame.register(edged.infer_sock)
            ways = {
                "shm": frame.request(model.name),
                "binary": infer_request_binary(model.name, x),
                "json": infer_request(model.name, x),
            }
            with RawClient(edged.infer_sock) as client:
                for req in ways.values():  # warm up each way
                    for _ in range(args.warmup):
                        if client.call(req)[0] != 200:
                            raise RuntimeError("warm-up failed")
                got = np.frombuffer(frame.output(OUT_BYTES), dtype=np.float32)
                np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)
                reps: dict[str, list[dict[str, float]]] = {w: [] for w in ways}
                order = list(ways.items())
                for rep in range(args.reps):
                    for way, req in order[rep % 3 :] + order[: rep % 3]:  # each first in turn
                        n = args.n if way != "json" else max(20, args.n // 4)
                        reps[way].append(window(client, req, n, pids))
    finally:
        frame.close()
    med = {w: {k: median(r[k] for r in rs) for k in rs[0]} for w, rs in reps.items()}
    return {
        "frame": list(FRAME),
        "input_bytes": int(x.nbytes),
        "bare_p50_ms": percentile(bare, 50) * 1e3,
        "reps": reps,
        "median": med,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one repetition, fewer requests")
    p.add_argument("--json", type=Path, help="also write the figures as JSON here")
    p.add_argument("--reps", type=int, help="repetitions (default 3, 1 with --quick)")
    p.add_argument("--n", type=int, help="requests per window (JSON: a quarter)")
    args = p.parse_args()
    args.reps = args.reps or (1 if args.quick else 5)
    args.n = args.n or (100 if args.quick else 400)
    args.warmup = 5 if args.quick else 20
    out = run(args)
    med = out["median"]
    base = med["binary"]
    print(
        f"224x224x3 float32 frame ({out['input_bytes']} bytes), concurrency 1, "
        f"bare ORT p50 {out['bare_p50_ms']:.3f} ms; medians of {args.reps}"
    )
    cols = ("rps", "p50_ms", "edged_cpu_us", "worker_cpu_us", "client_cpu_us", "total_cpu_us")
    ratios = f"{'rps/binary':>12}{'cpu/binary':>12}"
    print(f"{'way':8}" + "".join(f"{c:>15}" for c in cols) + ratios)
    for way, m in med.items():
        print(
            f"{way:8}"
            + "".join(f"{m[c]:15.3f}" for c in cols)
            + f"{m['rps'] / base['rps']:12.2f}{m['total_cpu_us'] / base['total_cpu_us']:12.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
