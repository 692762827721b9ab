"""edged's footprint: RSS and CPU of the control process (workers excluded), idle and loaded.

    .venv/bin/python bench/footprint.py [--quick] [--json PATH]

1. A bare Python interpreter, idle, for scale (what any Python daemon starts from).
2. edged with an empty manifests directory: after it is ready and has settled for a second,
   the edged process alone is sampled with psutil for 10 s (3 s with --quick): RSS (mean and
   max) and CPU in % of one core over the whole window.
3. edged with two models (tiny + medium MLP): the control process's RSS and CPU, and
   separately each worker's RSS; then again after serving some requests.
See bench/README.md and /work/shared/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from common import Edged, ModelDef, RawClient, infer_request, make_input

TARGET_RSS_MIB = 50.0
TARGET_CPU_PCT = 1.0
MIB = 1 << 20


def sample(pid: int, seconds: float, period: float = 0.25) -> dict[str, float]:
    """RSS (MiB, mean and max over samples), USS at the end, CPU % of one core over the window."""
    p = psutil.Process(pid)
    p.cpu_percent(None)
    cpu0 = p.cpu_times()
    t0 = time.perf_counter()
    rss: list[int] = []
    end = t0 + seconds
    while True:
        rss.append(p.memory_info().rss)
        now = time.perf_counter()
        if now >= end:
            break
        time.sleep(min(period, end - now))
    cpu1 = p.cpu_times()
    wall = time.perf_counter() - t0
    used = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return {
        "rss_mib": sum(rss) / len(rss) / MIB,
        "rss_max_mib": max(rss) / MIB,
        "uss_mib": p.memory_full_info().uss / MIB,
        "cpu_pct": 100.0 * used / wall,
        "seconds": wall,
        "samples": len(rss),
    }


def row(label: str, text: str) -> None:
    print(f"{label:<40}{text}")


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / MIB


def bare_python(seconds: float) -> dict[str, float]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        time.sleep(0.5)
        return sample(proc.pid, seconds)
    finally:
        proc.kill()
        proc.wait()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="shorter sampling windows")
    p.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = p.parse_args()
    idle_s = 3.0 if args.quick else 10.0
    loaded_s = 2.0 if args.quick else 5.0
    t_all = time.perf_counter()
    result: dict[str, Any] = {}

    print("edged footprint benchmark (control process only unless stated; MiB = 2^20 bytes)\n")
    base = bare_python(min(idle_s, 3.0))
    result["bare_python"] = base
    row(
        "bare Python interpreter, idle:",
        f"RSS {base['rss_mib']:6.1f} MiB  (USS {base['uss_mib']:.1f})",
    )

    with Edged([]) as edged:
        time.sleep(1.0)  # settle: startup work is not idle cost
        idle = sample(edged.pid, idle_s)
        idle["children"] = len(psutil.Process(edged.pid).children(recursive=True))
    result["idle"] = idle
    row(
        f"edged, no models, idle {idle['seconds']:.0f} s:",
        f"RSS {idle['rss_mib']:6.1f} MiB  (max {idle['rss_max_mib']:.1f}, USS "
        f"{idle['uss_mib']:.1f}), CPU {idle['cpu_pct']:.2f} % of one core, "
        f"{idle['children']} child processes",
    )
    row("", f"(CPU time is counted in 10 ms ticks: resolution {1 / idle['seconds']:.2f} %)")

    from edgefleet.demo import MEDIUM_MLP, TINY_MLP

    tiny = ModelDef("tiny", TINY_MLP, max_batch_size=8)
    medium = ModelDef("medium", MEDIUM_MLP, max_batch_size=8)
    with Edged([tiny, medium]) as edged:
        time.sleep(1.0)
        pids = edged.worker_pids()
        loaded = sample(edged.pid, loaded_s)
        workers = {
            name: {"pid": ps[0], "rss_mib": rss_mib(ps[0])} for name, ps in pids.items() if ps
        }
        # and after serving: buffers and per-connection state of the control process
        reqs = [
            (infer_request("tiny", make_input(64)), 2000),
            (infer_request("medium", make_input(1024)), 300),
        ]
        with RawClient(edged.infer_sock) as c:
            for req, n in reqs:
                for _ in range(n):
                    if c.call(req)[0] != 200:
                        raise RuntimeError("inference failed")
        served = sample(edged.pid, loaded_s)
        for name, ps in pids.items():
            if ps:
                workers[name]["rss_after_mib"] = rss_mib(ps[0])
    result["loaded"] = {"control": loaded, "control_after_requests": served, "workers": workers}
    row(
        f"edged, tiny + medium loaded, {loaded['seconds']:.0f} s:",
        f"RSS {loaded['rss_mib']:6.1f} MiB  (max {loaded['rss_max_mib']:.1f}, USS "
        f"{loaded['uss_mib']:.1f}), CPU {loaded['cpu_pct']:.2f} %",
    )
    row(
        "  after 2300 requests, idle again:",
        f"RSS {served['rss_mib']:6.1f} MiB  (max {served['rss_max_mib']:.1f}, USS "
        f"{served['uss_mib']:.1f}), CPU {served['cpu_pct']:.2f} %",
    )
    for name, w in workers.items():
        row(
            f"  worker {name} (pid {w['pid']}):",
            f"RSS {w['rss_mib']:6.1f} MiB  (after requests {w.get('rss_after_mib', 0.0):.1f})",
        )
    total = served["rss_mib"] + sum(w.get("rss_after_mib", w["rss_mib"]) for w in workers.values())
    row("  control + workers:", f"RSS {total:6.1f} MiB (shared pages counted twice)")

    ok_rss = idle["rss_mib"] <= TARGET_RSS_MIB
    ok_cpu = idle["cpu_pct"] < TARGET_CPU_PCT
    result["summary"] = {
        "idle_rss_mib": idle["rss_mib"],
        "idle_cpu_pct": idle["cpu_pct"],
        "loaded_control_rss_mib": loaded["rss_mib"],
        "rss_ok": ok_rss,
        "cpu_ok": ok_cpu,
    }
    result["targets"] = {"idle_rss_mib": TARGET_RSS_MIB, "idle_cpu_pct": TARGET_CPU_PCT}
    print("\n==== summary ====")
    print(
        f"idle control process: RSS {idle['rss_mib']:.1f} MiB (target <= {TARGET_RSS_MIB:.0f}) "
        f"{'OK' if ok_rss else 'MISSED'}; CPU {idle['cpu_pct']:.2f} % of one core (target < "
        f"{TARGET_CPU_PCT:.0f} %) {'OK' if ok_cpu else 'MISSED'}; bare Python "
        f"{base['rss_mib']:.1f} MiB"
    )
    print(
        f"two models loaded: control RSS {loaded['rss_mib']:.1f} MiB "
        f"({served['rss_mib']:.1f} after requests); workers "
        + ", ".join(f"{n} {w['rss_mib']:.1f} MiB" for n, w in workers.items())
    )
    print(f"(took {time.perf_counter() - t_all:.0f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
