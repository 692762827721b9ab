"""Drift detection's idle cost: CPU per check of the drift watch, and what that is as a share
of one core at the default period (30 s) and at 1 s.

    .venv/bin/python bench/drift.py [--quick] [--blobs N] [--json PATH]

A store of N blobs (default 50, 1 MiB each, named by their digest, read-only), a config
file, and the watch's real ``check()`` (scandir, stat fingerprints, the config's digest,
edged's cgroup and ``/proc`` when it has a cgroup of its own, the descriptors of every process
of the machine and ``/proc/net/{tcp,tcp6,unix}`` for open model files and listeners), measured with
``time.process_time`` over many checks once the first (which trusts what it finds) is done.
Baseline in the same run: one ``os.scandir`` of the same directory (the least any store
check must do). Target: < 0.2% of one core at the default period.

The open watch (fanotify, when this runs with CAP_SYS_ADMIN): the component itself runs
(``run()``, default period) for ``--idle`` seconds while nothing opens the store, and its CPU
and the process's context switches are compared with the same wait with no watch at all; then
one process opens every blob once, and the CPU per event edged reads is reported.

Not a test; always exits 0 unless something broke. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edged.compliance.checking import DriftAction  # noqa: E402
from edged.compliance.drift import (  # noqa: E402
    DEFAULT_PERIOD_S,
    DriftWatch,
    IngressRules,
)

TARGET_PCT = 0.2


def _switches() -> int:
    """Context switches of this process's threads (a wakeup is one)."""
    total = 0
    for task in os.listdir("/proc/self/task"):
        for line in Path(f"/proc/self/task/{task}/status").read_text().splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total


async def measure_idle(blobs: Path, config: Path, seconds: float) -> dict[str, object]:
    """Idle CPU and wakeups of the drift component with and without the open watch."""

    def watch_of() -> DriftWatch:
        return DriftWatch(
            blobs=blobs,
            config_path=config,
            action=lambda: DriftAction.ALERT,
            period=lambda: DEFAULT_PERIOD_S,
            act=lambda plan: None,
            on_change=lambda: None,
        )

    async def window() -> tuple[float, int]:
        c0, s0 = time.process_time(), _switches()
        await asyncio.sleep(seconds)
        return time.process_time() - c0, _switches() - s0

    out: dict[str, object] = {}
    plain = watch_of()
    await plain.check()
    cpu, sw = await window()  # the check's period is 30 s: no check in the window
    out["without_watch_pct_of_core"] = round(cpu / seconds * 100, 4)
    out["without_watch_wakeups_per_s"] = round(sw / seconds, 2)
    watch = watch_of()
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    while watch.checked_at is None:  # noqa: ASYNC110 (a bench: polls the watch's state)
        await asyncio.sleep(0.01)
    out["open_watch"] = watch.open_watch_reason or "in force"
    cpu, sw = await window()
    out["with_watch_pct_of_core"] = round(cpu / seconds * 100, 4)
    out["with_watch_wakeups_per_s"] = round(sw / seconds, 2)
    if watch.open_watch_reason is None:
        names = [str(p) for p in await asyncio.to_thread(lambda: list(blobs.iterdir()))]
        code = "import sys, time\nfor n in sys.argv[1:]: open(n, 'rb').close()\ntime.sleep(1)"
        c0 = time.process_time()
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, *names)
        while watch.open_counts["events"] < len(names):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        used = time.process_time() - c0
        await proc.wait()
        out["open_events"] = watch.open_counts["events"]
        out["cpu_per_open_event_us"] = round(used / len(names) * 1e6, 1)
    stop.set()
    await task
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--blobs", type=int, default=50)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of each idle wait")
    args = parser.parse_args()
    if args.quick:
        args.idle = min(args.idle, 3.0)
    checks = 50 if args.quick else 300
    with tempfile.TemporaryDirectory(prefix="ef-bench-drift-") as tmp:
        blobs = Path(tmp) / "sha256"
        blobs.mkdir()
        for i in range(args.blobs):
            data = os.urandom(1 << 20) + i.to_bytes(4, "big")
            path = blobs / hashlib.sha256(data).hexdigest()
            path.write_bytes(data)
            path.chmod(0o444)
        config = Path(tmp) / "edged.toml"
        config.write_text("[workers]\nsandbox = 'landlock'\n" * 20)
        watch = DriftWatch(
            blobs=blobs,
            config_path=config,
            action=lambda: DriftAction.ALERT,
            period=lambda: DEFAULT_PERIOD_S,
            act=lambda plan: None,
            on_change=lambda: None,
            ingress=lambda: IngressRules(None, ()),
        )

        async def run() -> list[float]:
            await watch.check()  # the first check trusts what is there
            out = []
            for _ in range(checks):
                t0 = time.process_time()
                found = await watch.check()
                out.append(time.process_time() - t0)
                assert not found, found
            return out

        costs = asyncio.run(run())
        idle = asyncio.run(measure_idle(blobs, config, args.idle))
        scans = []
        for _ in range(checks):
            t0 = time.process_time()
            with os.scandir(blobs) as it:
                for _entry in it:
                    pass
            scans.append(time.process_time() - t0)
    per_check = statistics.mean(costs)
    baseline = statistics.mean(scans)
    figures = {
        "blobs": args.blobs,
        "checks": checks,
        "cpu_per_check_ms": round(per_check * 1000, 3),
        "scandir_baseline_ms": round(baseline * 1000, 3),
        "ratio_to_scandir": round(per_check / baseline, 1) if baseline else None,
        "idle_pct_of_core_default_period": round(per_check / DEFAULT_PERIOD_S * 100, 4),
        "idle_pct_of_core_at_1s": round(per_check / 1.0 * 100, 3),
        "processes_checked": watch.status(quarantined=None)["processesChecked"],
        "descriptors_checked": watch.status(quarantined=None)["descriptorsChecked"],
        "processes_on_machine": sum(1 for n in os.listdir("/proc") if n.isdigit()),
    }
    print(f"drift watch over {args.blobs} blobs, {checks} checks (mean CPU)")
    print(f"  per check           {figures['cpu_per_check_ms']:.3f} ms "
          f"(scandir alone {figures['scandir_baseline_ms']:.3f} ms)")  # fmt: skip
    print(
        f"  idle, default {DEFAULT_PERIOD_S:.0f} s  {figures['idle_pct_of_core_default_period']}"
        f" % of a core (target < {TARGET_PCT} %)"
    )
    print(f"  idle, every 1 s     {figures['idle_pct_of_core_at_1s']} % of a core")
    print(f"  processes in edged's cgroup checked: {figures['processes_checked']}")
    print(
        f"  descriptors of {figures['processes_on_machine']} processes scanned (open model "
        f"files, listeners): {figures['descriptors_checked']}"
    )
    figures.update(idle)
    print(f"  open watch: {idle['open_watch']}")
    for mode in ("without_watch", "with_watch"):
        print(
            f"  idle {args.idle:.0f} s {mode.replace('_', ' '):14} "
            f"{idle[mode + '_pct_of_core']} % of a core, "
            f"{idle[mode + '_wakeups_per_s']} context switches/s"
        )
    if "cpu_per_open_event_us" in idle:
        print(
            f"  {idle['open_events']} opens by another process: "
            f"{idle['cpu_per_open_event_us']} us of CPU per event"
        )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
