"""Autoscale reaction time: from a sustained queue to the new replica serving.

One edged serves the medium MLP (maxBatchSize 1, 1 CPU per replica). In the same run:

* **baseline**: the manifest asks for a second replica (perDevice 1 -> 2); the time until it
  is ready is what starting a replica costs here, the part of any reaction no autoscaler can
  save;
* **autoscale**: ``spec.scaling`` (1..2, queueDepthUp 4, scaleUpWindow W) and a load that
  keeps 18 requests in flight (3 connections, 6 pipelined each) starts; the reaction time is
  from the load's start until the status shows the second replica ready (then the router
  sends it requests). Split into the decision (W plus up to one sample period) and the start.

Printed: medians over the repetitions and the ratio reaction / (W + baseline start): 1.0 would
be an autoscaler that costs nothing beyond its window. Run: ``.venv/bin/python
bench/autoscaling.py [--reps 3] [--window 2]``.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from pathlib import Path

from common import Edged, ModelDef, infer_request, make_input, manifest_yaml, median

MEDIUM = (1024, 2048, 2048, 1000)
PERIOD_S = 0.25


class Load:
    """Threads that each keep ``window`` pipelined requests in flight until stopped."""

    def __init__(self, sock_path: str, request: bytes, connections: int, window: int) -> None:
        self._stop = threading.Event()
        self.errors: list[str] = []
        self._threads = [
            threading.Thread(target=self._run, args=(sock_path, request, window), daemon=True)
            for _ in range(connections)
        ]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)

    def _run(self, path: str, request: bytes, window: int) -> None:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(60)
                s.connect(path)
                s.sendall(request * window)
                buf, outstanding = b"", window
                while outstanding:
                    end = buf.find(b"\r\n\r\n")
                    if end < 0:
                        chunk = s.recv(65536)
                        if not chunk:
                            raise ConnectionError("closed")
                        buf += chunk
                        continue
                    i = buf.lower().find(b"content-length:", 0, end) + 15
                    total = end + 4 + int(buf[i : buf.find(b"\r\n", i)])
                    while len(buf) < total:
                        buf += s.recv(65536)
                    if buf[9:12] != b"200":
                        raise RuntimeError(f"answered {buf[9:12]!r}")
                    buf = buf[total:]
                    outstanding -= 1
                    if not self._stop.is_set():
                        s.sendall(request)
                        outstanding += 1
        except Exception as exc:
            self.errors.append(repr(exc))


def ready_replicas(e: Edged, name: str) -> int:
    for w in e.status()["workloads"]:
        if w["name"] == name:
            return sum(1 for r in w["replicas"] if r["ready"])
    return 0


def wait(cond, timeout: float, what: str) -> float:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return time.monotonic()
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting for {what}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--window", type=float, default=2.0, help="scaleUpWindow, seconds")
    args = ap.parse_args()
    m = ModelDef("m", MEDIUM, max_batch_size=1, cpu="1")
    base = manifest_yaml(m, "m.onnx")
    scaling = (
        "  scaling: {minReplicas: 1, maxReplicas: 2, queueDepthUp: 4, cpuDownBelow: 40%, "
        f'scaleUpWindow: "{args.window}s", scaleDownWindow: "2s"}}\n'
    )
    config = f'[scaling]\nsamplePeriod = "{int(PERIOD_S * 1000)}ms"\n'
    request = infer_request("m", make_input(MEDIUM[0]))
    starts, reactions, decisions = [], [], []
    with Edged([m], config_text=config) as e:
        manifest: Path = e.manifests / "m.yaml"
        for _ in range(args.reps):
            # baseline: a second replica asked for by the manifest
            t0 = time.monotonic()
            manifest.write_text(base.replace("perDevice: 1", "perDevice: 2"))
            t1 = wait(lambda: ready_replicas(e, "m") == 2, 120, "the second replica")
            starts.append(t1 - t0)
            manifest.write_text(base)
            wait(lambda: ready_replicas(e, "m") == 1, 120, "back to one replica")
            time.sleep(1.0)  # the stopped worker's exit
            # autoscale: scaling on, then a sustained queue
            manifest.write_text(base + scaling)
            wait(lambda: "scaling" in e.status()["workloads"][0], 60, "scaling in status")
            time.sleep(args.window + PERIOD_S * 2)  # the window covered by idle samples
            t0 = time.monotonic()
            load = Load(e.infer_sock, request, connections=3, window=6)
            try:
                t1 = wait(lambda: ready_replicas(e, "m") == 2, 120, "the autoscaled replica")
            finally:
                load.stop()
            if load.errors:
                raise SystemExit(f"load failed: {load.errors[:3]}")
            last = e.status()["workloads"][0]["scaling"]["lastDecision"]
            reactions.append(t1 - t0)
            decisions.append(last["at"] - (time.time() - (time.monotonic() - t0)))
            print(
                f"  start {starts[-1]:.3f} s, decision {decisions[-1]:.3f} s, "
                f"serving {reactions[-1]:.3f} s ({last['message']})",
                flush=True,
            )
            manifest.write_text(base)  # scaling off: back to the spec's one replica
            wait(lambda: ready_replicas(e, "m") == 1, 120, "back to one replica")
            time.sleep(1.0)
    start, reaction, decision = median(starts), median(reactions), median(decisions)
    print(f"scaleUpWindow {args.window:g}s, samplePeriod {PERIOD_S:g}s, {args.reps} reps")
    print(f"baseline: a replica asked for by the manifest ready after   {start:7.3f} s")
    print(f"autoscale: queue sustained -> decision                       {decision:7.3f} s")
    print(f"autoscale: queue sustained -> new replica serving            {reaction:7.3f} s")
    ratio = reaction / (args.window + start)
    print(f"ratio reaction / (window + baseline start)                  {ratio:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
