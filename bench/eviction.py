"""The critical workload's latency while edged evicts the others, against no pressure.

One edged serves two tiny-MLP workloads: ``critical`` (priority 1000, one replica) and
``batch`` (priority -10, two replicas), with ``[eviction] memoryAvailableFloor = 500Mi``.
``MemAvailable`` is read from a file this bench writes (edged's test-only seam
``EDGED_TEST_MEMINFO``), so the pressure is exact and repeatable. A sequential client calls
``critical`` throughout; a second one keeps ``batch`` busy.

* **baseline**: plenty of memory, ``seconds`` of calls: p50 and p99 of ``critical``;
* **eviction**: MemAvailable drops to 300Mi; the calls from then until both ``batch``
  replicas are stopped and one more second: p50, p99, and failed calls (must be 0).

Printed: both, and the ratio of the p99s (1.0: eviction costs the critical workload nothing).
Repeated ``--reps`` times (memory restored and ``batch`` back in between); medians.
``.venv/bin/python bench/eviction.py [--reps 3] [--seconds 5]``
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

from common import (
    Edged,
    ModelDef,
    RawClient,
    infer_request,
    make_input,
    manifest_yaml,
    median,
    percentile,
)

TINY = (64, 256, 10)
MIB = 1 << 20


def write_available(path: Path, mib: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"MemTotal: 8000000 kB\nMemAvailable: {mib * 1024} kB\n")
    tmp.replace(path)


def batch_pids(e: Edged) -> int:
    return len(e.worker_pids().get("batch", []))


def calls(client: RawClient, request: bytes, until: float) -> tuple[list[float], int]:
    """Sequential calls until ``until`` (monotonic); latencies and failed calls."""
    lat, failed = [], 0
    while time.monotonic() < until:
        t0 = time.perf_counter()
        status, _ = client.call(request)
        lat.append(time.perf_counter() - t0)
        failed += status != 200
    return lat, failed


def calls_during_eviction(e: Edged, client: RawClient, request: bytes) -> tuple[list[float], int]:
    """Sequential calls until both batch replicas are gone, and one second more."""
    lat, failed = [], 0
    deadline = time.monotonic() + 120
    while batch_pids(e) and time.monotonic() < deadline:
        more, bad = calls(client, request, time.monotonic() + 0.1)
        lat += more
        failed += bad
    more, bad = calls(client, request, time.monotonic() + 1.0)
    return lat + more, failed + bad


def background(sock: str, request: bytes, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            with RawClient(sock, timeout=10) as c:
                while not stop.is_set():
                    c.call(request)  # 503 while evicted: fine
        except (OSError, ValueError):
            time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    critical = ModelDef("critical", TINY, seed=1)
    batch = ModelDef("batch", TINY, seed=2)
    meminfo = Path(os.environ.get("TMPDIR", "/tmp")) / f"edged-bench-meminfo-{os.getpid()}"
    write_available(meminfo, 4000)
    os.environ["EDGED_TEST_MEMINFO"] = str(meminfo)  # inherited by edged
    config = (
        '[scaling]\nsamplePeriod = "200ms"\n'
        '[eviction]\nmemoryAvailableFloor = "500Mi"\nhysteresis = "10%"\ninterval = "500ms"\n'
    )
    base_p50, base_p99, ev_p50, ev_p99, failures = [], [], [], [], 0
    try:
        with Edged([critical, batch], config_text=config) as e:
            for m, replicas, priority in ((critical, 1, 1000), (batch, 2, -10)):
                text = manifest_yaml(m, e.model_path(m).name)
                text = text.replace("perDevice: 1", f"perDevice: {replicas}")
                (e.manifests / f"{m.name}.yaml").write_text(text + f"  priority: {priority}\n")
            deadline = time.monotonic() + 120
            while batch_pids(e) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            req_c = infer_request("critical", make_input(TINY[0], 1))
            req_b = infer_request("batch", make_input(TINY[0], 2))
            stop = threading.Event()
            bg = threading.Thread(target=background, args=(e.infer_sock, req_b, stop))
            bg.start()
            try:
                with RawClient(e.infer_sock) as c:
                    calls(c, req_c, time.monotonic() + 1)  # warm-up
                    for _ in range(args.reps):
                        lat, failed = calls(c, req_c, time.monotonic() + args.seconds)
                        base_p50.append(percentile(lat, 50))
                        base_p99.append(percentile(lat, 99))
                        failures += failed
                        write_available(meminfo, 300)
                        lat, failed = calls_during_eviction(e, c, req_c)
                        ev_p50.append(percentile(lat, 50))
                        ev_p99.append(percentile(lat, 99))
                        failures += failed
                        write_available(meminfo, 4000)
                        deadline = time.monotonic() + 120
                        while batch_pids(e) < 2 and time.monotonic() < deadline:
                            time.sleep(0.1)
                        time.sleep(1.0)
            finally:
                stop.set()
                bg.join(timeout=30)
    finally:
        meminfo.unlink(missing_ok=True)
    print(f"critical workload, tiny MLP, {args.reps} reps (medians), batch workload busy too")
    for what, p50, p99 in (
        ("no pressure:    ", base_p50, base_p99),
        ("during eviction:", ev_p50, ev_p99),
    ):
        print(f"{what} p50 {median(p50) * 1e3:7.3f} ms  p99 {median(p99) * 1e3:7.3f} ms")
    print(f"failed critical calls: {failures}")
    ratio = median(ev_p99) / median(base_p99)
    print(f"ratio p99 during eviction / p99 without pressure: {ratio:.2f}")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
