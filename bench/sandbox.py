"""The worker sandbox's cost: worker start time and tiny-model p50, with and without it.

    .venv/bin/python bench/sandbox.py [--quick] [--json PATH]

Real worker processes (``python -m edged.runtime.worker``) are started on a socket pair, as
edged starts them, with three sandboxes in turn, interleaved round by round so that a noisy
neighbour hits each alike:

* ``off`` — the baseline: no Landlock, no no_new_privs, no seccomp;
* ``landlock`` — Landlock (filesystem, TCP, scopes) and no_new_privs;
* ``landlock+seccomp`` — what edged does by default when it is not root;
* ``landlock+seccomp+uid`` — what edged does by default as root: the worker also switches to
  a uid of its own (``runtime/identities.py``; only when this runs as root). Its start is
  also given as a ratio to ``landlock+seccomp``'s.
* ``landlock+seccomp+uid+addr`` — the same with egress rules that name addresses: edged's
  cgroup and BPF programs (``runtime/egressfilter.py``) made for each start, counted in it.

1. Start: from spawning the process until READY (imports, sandbox, artifact read and hash,
   session, warm-up). Median over the rounds; target <= 50 ms more than ``off``.
2. p50: the tiny MLP (64 -> 256 -> 10), one client sending INFER frames one at a time with a
   pre-encoded JSON body, round trip measured from write to the RESULT frame. The frames are
   what edged forwards, so the HTTP server's cost (the same with and without a sandbox) is
   left out. Median of each round's p50; target: <= 5% over ``off``.
3. CPU time (user + system, from ``/proc``) the worker spent until READY and per request:
   what the sandbox costs in work, which a loaded machine does not blur the way it blurs
   wall-clock times (a shared, busy machine makes the wall-clock figures above noise).

Not a test; always exits 0 unless something broke. See bench/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edged.runtime.framing import HEADER, HEADER_SIZE, U32, FrameType  # noqa: E402
from edged.runtime.identities import WorkerUids  # noqa: E402
from edged.runtime.launching import LaunchSpec, LimitsSpec, SandboxSpec  # noqa: E402
from edgefleet.demo import TINY_MLP, build_mlp  # noqa: E402

TARGET_START_MS = 50.0
TARGET_P50_PCT = 5.0
NO_HEADER_LENGTH = 0xFFFFFFFF

SANDBOXES = {
    "off": SandboxSpec(mode="off"),
    "landlock": SandboxSpec(mode="landlock"),
    "landlock+seccomp": SandboxSpec(mode="landlock", seccomp=True),
}
if os.geteuid() == 0:
    SANDBOXES["landlock+seccomp+uid"] = SandboxSpec(
        mode="landlock", seccomp=True, separate_uid=True
    )
    # egress by address (a cgroup BPF program, egressfilter.py): the cgroup and its programs
    # are made per start, as edged does, and that time counts in the start
    SANDBOXES["landlock+seccomp+uid+addr"] = SandboxSpec(
        mode="landlock", seccomp=True, separate_uid=True, network=True,
        connect_ports=(8080,), egress_rules=((8080, "127.0.0.1/32"), (443, "")),
    )  # fmt: skip


class Worker:
    def __init__(self, artifact: Path, sha256: str, sandbox: SandboxSpec, uid: int = -1) -> None:
        spec = LaunchSpec(
            replica_id="bench-0", workload="bench", model_name="mlp", model_version="1",
            artifact_path=str(artifact), artifact_sha256=sha256,
            providers=("CPUExecutionProvider",), intra_op_threads=1, max_batch_size=8,
            max_queue_delay_s=0.002, limits=LimitsSpec(), sandbox=sandbox,
            uid=uid if sandbox.separate_uid else -1,
        )  # fmt: skip
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
        self.t0 = time.perf_counter()
        self.egress_cgroup = ""
        if sandbox.egress_rules:
            from edged.runtime import egressfilter

            self.egress_cgroup = str(egressfilter.prepare("bench-0", sandbox.egress_rules))
            spec = dataclasses.replace(
                spec, sandbox=dataclasses.replace(sandbox, egress_cgroup=self.egress_cgroup)
            )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edged.runtime.worker", str(child.fileno()),
             orjson.dumps(spec.to_json()).decode()],
            pass_fds=(child.fileno(),), env=env, cwd="/", stdin=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        child.close()
        self.sock = parent
        self.buf = b""
        self.next_id = 1

    def frame(self) -> tuple[int, int, bytes]:
        while True:
            if len(self.buf) >= HEADER_SIZE:
                length, ftype, req_id = HEADER.unpack_from(self.buf, 0)
                end = HEADER_SIZE + length
                if len(self.buf) >= end:
                    payload = self.buf[HEADER_SIZE:end]
                    self.buf = self.buf[end:]
                    return ftype, req_id, payload
            data = self.sock.recv(1 << 16)
            if not data:
                raise RuntimeError(f"worker exited with {self.proc.wait(10)}")
            self.buf += data

    def cpu_s(self) -> float:
        """User + system CPU seconds this worker (all its threads) has used so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def ready(self) -> tuple[float, dict[str, Any]]:
        ftype, _, payload = self.frame()
        elapsed = time.perf_counter() - self.t0
        if ftype != FrameType.READY:
            raise RuntimeError(f"worker did not start: {payload!r}")
        return elapsed, orjson.loads(payload)

    def latencies(self, body: bytes, n: int) -> list[float]:
        out = []
        for _ in range(n):
            req_id = self.next_id
            self.next_id += 1
            frame = HEADER.pack(len(body) + 4, FrameType.INFER, req_id) + U32.pack(NO_HEADER_LENGTH)
            t0 = time.perf_counter()
            self.sock.sendall(frame + body)
            ftype, got, _ = self.frame()
            out.append(time.perf_counter() - t0)
            assert ftype == FrameType.RESULT and got == req_id
        return out

    def close(self) -> None:
        self.sock.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        if self.egress_cgroup:
            from edged.runtime import egressfilter

            egressfilter.remove(self.egress_cgroup)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and requests")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    rounds, requests = (3, 500) if args.quick else (7, 2000)
    with tempfile.TemporaryDirectory(prefix="ef-bench-sandbox-") as tmp:
        model = build_mlp(Path(tmp) / "tiny.onnx", TINY_MLP)
        sha = hashlib.sha256(model.read_bytes()).hexdigest()
        body = orjson.dumps(
            {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64],
                         "data": [0.25] * 64}]}
        )  # fmt: skip
        starts: dict[str, list[float]] = {k: [] for k in SANDBOXES}
        p50s: dict[str, list[float]] = {k: [] for k in SANDBOXES}
        start_cpu: dict[str, list[float]] = {k: [] for k in SANDBOXES}
        request_cpu: dict[str, list[float]] = {k: [] for k in SANDBOXES}
        in_force: dict[str, Any] = {}
        uids = WorkerUids()
        uid = uids.acquire("bench-0", "bench/0") if "landlock+seccomp+uid" in SANDBOXES else -1
        for r in range(rounds):
            order = list(SANDBOXES) if r % 2 == 0 else list(reversed(SANDBOXES))
            for name in order:
                w = Worker(model, sha, SANDBOXES[name], uid)
                try:
                    elapsed, meta = w.ready()
                    start_cpu[name].append(w.cpu_s() * 1000)
                    in_force[name] = meta.get("sandbox")
                    w.latencies(body, 200)  # warm the path
                    before = w.cpu_s()
                    lat = w.latencies(body, requests)
                    request_cpu[name].append((w.cpu_s() - before) / requests * 1e6)
                finally:
                    w.close()
                starts[name].append(elapsed * 1000)
                p50s[name].append(statistics.median(lat) * 1e6)
        uids.release_all()
    base_start = statistics.median(starts["off"])
    base_p50 = statistics.median(p50s["off"])
    base_start_cpu = statistics.median(start_cpu["off"])
    base_request_cpu = statistics.median(request_cpu["off"])
    figures: dict[str, Any] = {"rounds": rounds, "requests": requests, "sandboxes": {}}
    print(f"worker start (spawn to READY) and tiny-model p50 over frames; {rounds} rounds")
    print(
        f"{'sandbox':<26} {'start ms':>9} {'+ms':>7} {'p50 us':>8} {'+%':>7}"
        f" {'start cpu ms':>13} {'+ms':>7} {'cpu/req us':>11} {'+%':>7}"
    )
    for name in SANDBOXES:
        start = statistics.median(starts[name])
        p50 = statistics.median(p50s[name])
        extra_ms = start - base_start
        extra_pct = (p50 / base_p50 - 1) * 100
        cpu_start = statistics.median(start_cpu[name])
        cpu_req = statistics.median(request_cpu[name])
        cpu_start_extra = cpu_start - base_start_cpu
        cpu_req_pct = (cpu_req / base_request_cpu - 1) * 100 if base_request_cpu else 0.0
        figures["sandboxes"][name] = {
            "start_cpu_ms": round(cpu_start, 2),
            "start_cpu_extra_ms": round(cpu_start_extra, 2),
            "cpu_per_request_us": round(cpu_req, 2),
            "cpu_per_request_extra_pct": round(cpu_req_pct, 2),
            "start_ms": round(start, 2),
            "start_extra_ms": round(extra_ms, 2),
            "p50_us": round(p50, 2),
            "p50_extra_pct": round(extra_pct, 2),
            "in_force": in_force.get(name),
        }
        print(
            f"{name:<26} {start:9.1f} {extra_ms:7.1f} {p50:8.1f} {extra_pct:7.2f}"
            f" {cpu_start:13.1f} {cpu_start_extra:7.1f} {cpu_req:11.1f} {cpu_req_pct:7.2f}"
        )
    default = figures["sandboxes"]["landlock+seccomp"]
    print(
        f"default sandbox: start +{default['start_extra_ms']:.1f} ms (target <= "
        f"{TARGET_START_MS:.0f}), p50 {default['p50_extra_pct']:+.2f}% (target <= "
        f"{TARGET_P50_PCT:.0f}%); CPU: start +{default['start_cpu_extra_ms']:.1f} ms, "
        f"per request {default['cpu_per_request_extra_pct']:+.2f}%"
    )
    with_uid = figures["sandboxes"].get("landlock+seccomp+uid")
    if with_uid is None:
        print("separate uid: not measured (needs root)")
    else:
        ratio = with_uid["start_ms"] / default["start_ms"]
        figures["uid_start_ratio"] = round(ratio, 3)
        print(
            f"separate uid: start {with_uid['start_ms']:.1f} ms against "
            f"{default['start_ms']:.1f} ms without it: ratio {ratio:.3f} "
            f"({with_uid['start_ms'] - default['start_ms']:+.1f} ms); CPU to READY "
            f"{with_uid['start_cpu_ms']:.1f} ms against {default['start_cpu_ms']:.1f} ms; "
            f"p50 {with_uid['p50_us']:.1f} us against {default['p50_us']:.1f} us"
        )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
