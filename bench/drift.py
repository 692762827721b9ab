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
from edged.compliance.watching import (  # noqa: E402
    DEFAULT_PERIOD_S,
    DriftWatch,
    IngressRules,
)

TARGET_PCT = 0.2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--blobs", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
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
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
