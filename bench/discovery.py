"""Discovery's cost: enumeration at start on this machine's real sysfs, and idle CPU.

    .venv/bin/python bench/discovery.py [--quick] [--json PATH]

1. Enumeration: ``merge(read_records())`` (every subsystem accelerators live in, records for
   the candidates, classification), median of repeats, warm; and once cold in a fresh process
   (import of pyudev + libudev + first enumeration). Baseline in the same run: pyudev listing
   *every* udev device of the machine once (``list(Context().list_devices())``).
   Target: <= 100 ms at start.
2. Idle cost: a process running the discovery component (udev monitor on the event loop,
   health sampled every ``healthPeriod``) is sampled with psutil ``cpu_times`` for 10 s
   (4 s with --quick), with the default period (30 s) and with 1 s (30x the default rate).
   Baseline: the same interpreter idling in ``asyncio`` for the same window.
   Target: < 0.2% of one core.
Not a test; always exits 0 unless something broke. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
TARGET_START_MS = 100.0
TARGET_IDLE_PCT = 0.2

COLD = """
import time
t0 = time.perf_counter()
from edged.discovery.classifying import merge
from edged.discovery.udev import read_records
found = merge(read_records())
print((time.perf_counter() - t0) * 1000, len(found))
"""

IDLE = """
import asyncio, sys, tempfile
from pathlib import Path
period = float(sys.argv[1])

async def main():
    stop = asyncio.Event()
    if period > 0:
        from edged.discovery.discovering import Discovery
        d = Discovery(data_dir=Path(tempfile.gettempdir()), python=sys.executable,
                      health_period_s=period, configured_providers=["CPUExecutionProvider"])
        await d.prepare()
        task = asyncio.ensure_future(d.run(stop))
    print("ready", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def enumeration(reps: int) -> dict[str, Any]:
    import pyudev

    from edged.discovery.classifying import merge
    from edged.discovery.udev import read_records

    ctx = pyudev.Context()
    t0 = time.perf_counter()
    n_all = len(list(ctx.list_devices()))
    all_ms = (time.perf_counter() - t0) * 1000
    times, found = [], 0
    for _ in range(reps):
        t0 = time.perf_counter()
        found = len(merge(read_records()))
        times.append((time.perf_counter() - t0) * 1000)
    colds = []
    for _ in range(max(1, reps // 10)):
        out = subprocess.run(
            [sys.executable, "-c", COLD], check=True, capture_output=True, text=True, cwd=ROOT
        ).stdout.split()
        colds.append(float(out[0]))
    return {
        "udev_devices": n_all,
        "list_all_devices_ms": all_ms,
        "enumerate_warm_ms_median": statistics.median(times),
        "enumerate_cold_ms_median": statistics.median(colds),
        "accelerators_found": found,
    }


def idle_cpu(period: float, seconds: float) -> dict[str, float]:
    proc = subprocess.Popen(
        [sys.executable, "-c", IDLE, str(period)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # settle
        p = psutil.Process(proc.pid)
        c0, t0 = p.cpu_times(), time.perf_counter()
        time.sleep(seconds)
        c1, wall = p.cpu_times(), time.perf_counter() - t0
        used = (c1.user - c0.user) + (c1.system - c0.system)
        return {"cpu_pct": 100.0 * used / wall, "rss_mib": p.memory_info().rss / (1 << 20)}
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    seconds = 4.0 if args.quick else 10.0
    e = enumeration(10 if args.quick else 50)
    print(
        f"udev devices on this machine: {e['udev_devices']}; accelerators found: "
        f"{e['accelerators_found']}"
    )
    print(f"baseline, pyudev listing every device: {e['list_all_devices_ms']:.1f} ms")
    ratio = e["enumerate_warm_ms_median"] / e["list_all_devices_ms"]
    print(
        f"discovery enumeration, warm (median): {e['enumerate_warm_ms_median']:.1f} ms "
        f"({ratio:.2f}x the baseline)"
    )
    ok = e["enumerate_cold_ms_median"] <= TARGET_START_MS
    print(
        f"discovery at start, cold (imports + first enumeration, median): "
        f"{e['enumerate_cold_ms_median']:.1f} ms  target <= {TARGET_START_MS:.0f} ms: "
        f"{'met' if ok else 'NOT met'}"
    )
    base = idle_cpu(0, seconds)
    idle30 = idle_cpu(30, seconds)
    idle1 = idle_cpu(1, seconds)
    print(
        f"idle baseline (asyncio, nothing running): {base['cpu_pct']:.3f}% of one core, "
        f"{base['rss_mib']:.1f} MiB"
    )
    for name, r in (("healthPeriod 30s (default)", idle30), ("healthPeriod 1s", idle1)):
        added = r["cpu_pct"] - base["cpu_pct"]
        print(
            f"discovery idle, {name}: {r['cpu_pct']:.3f}% of one core (+{added:.3f} over the "
            f"baseline; target < {TARGET_IDLE_PCT}%: "
            f"{'met' if r['cpu_pct'] < TARGET_IDLE_PCT else 'NOT met'}), "
            f"{r['rss_mib']:.1f} MiB (+{r['rss_mib'] - base['rss_mib']:.1f})"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"enumeration": e, "idle": {"baseline": base, "30s": idle30, "1s": idle1}}, indent=2
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
