"""The hub's cost of a fleet-wide model configuration change (kind: ModelConfig) against a
model version change of the same fleet, in one run (issue 36; docs/model-config.md).

A real ``hub serve`` (SQLite) and N simulated devices over real mTLS gRPC streams (each its
own certificate and HTTP/2 connection, spread over a few client processes: bench/simfleet.py,
as bench/fanout.py's): Hello, then an Ack for every desired state. The devices carry labels of
ten sites; the ModelConfig has fleet-wide defaults, an override per site and one for each of
N/20 devices by name, so the hub merges a config per device group and per named device.

Both changes go to every device at once (``maxSurge`` and ``maxUnavailable`` 100%: the
simulated devices send no status, so a rolling update would wait; bench/rollout.py measures
rollouts):

* **version change** (the baseline): the deployment moved to a new model version;
* **config change**: the ModelConfig's defaults changed (a new revision, every device sent its
  newly merged config).

For each: the time from the Apply to every device having received (and acknowledged) its
new desired state, the hub process' CPU seconds (user + system) and its bytes read and written
(/proc/PID/io) over that time, and the mean size of the desired states received; then the
config change's figures as a ratio of the version change's.

    .venv/bin/python bench/modelconfig.py --devices 1000 [--clients 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import percentile  # noqa: E402
from bench.simfleet import SimClients, apply_documents, proc_io, push_model, start_sim_hub  # noqa: E402

SITES = 10


def deployment(version: str) -> dict[str, Any]:
    return {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": "bench"},
        "spec": {
            "model": {"name": "bench", "version": version},
            "replicas": {"perDevice": 1},
            "rollout": {"maxSurge": "100%", "maxUnavailable": "100%"},
        },
    }


def model_config(n: int, threshold: float) -> dict[str, Any]:
    return {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelConfig",
        "metadata": {"name": "bench"},
        "spec": {
            "model": "bench",
            "data": {"threshold": threshold, "labels": [f"class-{i}" for i in range(80)]},
            "overrides": [
                *(
                    {"selector": {"site": f"s{s}"}, "data": {"zones": {"door": [s, s, 64, 64]}}}
                    for s in range(SITES)
                ),
                *(
                    {"devices": [f"sim-{i:05d}"], "data": {"crop": [i % 7, 0, 224, 224]}}
                    for i in range(0, n, 20)
                ),
            ][:64],
        },
    }


def _say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def measure(n: int, clients: int, workdir: Path) -> dict[str, Any]:
    import psutil

    sim = start_sim_hub(workdir, n, lambda i: {"site": f"s{i % SITES}"})
    devices = SimClients(sim, clients)
    got = devices.got
    try:
        proc = psutil.Process(sim.pid)
        for pushed in ("1.0.0", "1.0.1"):
            push_model(sim.data, pushed, seed=int(pushed.replace(".", "")))
        _say("pushed; applying")
        apply_documents(sim.data, sim.port, [deployment("1.0.0"), model_config(n, 0.5)], 120)
        devices.start()

        def change(
            docs: list[dict[str, Any]], done: Callable[[str, str, str], bool]
        ) -> dict[str, Any]:
            """Apply ``docs``; wait until ``done(version, digest, digest before)`` for every
            device; the figures of that change."""
            before = {k: r.config_digest for k, r in got.items()}

            def all_done() -> bool:
                return len(got) == n and all(
                    done(r.version, r.config_digest, before.get(k, "")) for k, r in got.items()
                )

            cpu0, io0 = sum(proc.cpu_times()[:2]), proc_io(sim.pid)
            t0 = apply_documents(sim.data, sim.port, docs, 120)
            devices.collect(all_done, 600)
            cpu1, io1 = sum(proc.cpu_times()[:2]), proc_io(sim.pid)
            lat = sorted(r.time - t0 for r in got.values())
            return {
                "all_acked_s": lat[-1],
                "p50_s": percentile(lat, 50),
                "hub_cpu_s": cpu1 - cpu0,
                "hub_io_bytes": io1 - io0,
                "desired_state_bytes": sum(r.size for r in got.values()) / n,
                "configs_changed": sum(
                    1 for k, r in got.items() if r.config_digest != before.get(k)
                ),
            }

        _say(f"{n} devices connecting")
        devices.collect(
            lambda: (
                len(got) == n
                and all(r.version == "1.0.0" and r.config_digest for r in got.values())
            ),
            600,
        )
        _say("every device runs 1.0.0 with its config; the version change")
        time.sleep(2.0)
        version = change([deployment("1.0.1")], lambda v, d, was: v == "1.0.1")
        time.sleep(2.0)
        _say("the config change")
        config = change([model_config(n, 0.6)], lambda v, d, was: bool(d) and d != was)
        ratio = {
            k: (config[k] / version[k] if version[k] else float("nan"))
            for k in ("all_acked_s", "hub_cpu_s", "hub_io_bytes", "desired_state_bytes")
        }
        return {
            "devices": n,
            "version_change": version,
            "config_change": config,
            "ratio": ratio,
            "reconnects": devices.reconnects,
        }
    finally:
        devices.stop()
        sim.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        row = measure(args.devices, args.clients, Path(tmp))
    if args.json:
        print(json.dumps(row, indent=2))
        return 0
    for what in ("version_change", "config_change"):
        r = row[what]
        print(
            f"N={row['devices']}  {what:15s} all acked {r['all_acked_s'] * 1000:7.0f} ms  "
            f"p50 {r['p50_s'] * 1000:6.0f} ms  hub CPU {r['hub_cpu_s']:6.2f} s  "
            f"hub I/O {r['hub_io_bytes'] / 2**20:6.1f} MiB  "
            f"desired state {r['desired_state_bytes']:6.0f} B/device",
            flush=True,
        )
    if row["reconnects"]:
        print(f"devices reconnected (why: count): {row['reconnects']}", flush=True)
    q = row["ratio"]
    print(
        f"config change / version change: time {q['all_acked_s']:.2f}x, hub CPU "
        f"{q['hub_cpu_s']:.2f}x, hub I/O {q['hub_io_bytes']:.2f}x, desired state "
        f"{q['desired_state_bytes']:.2f}x",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    sys.exit(main())
