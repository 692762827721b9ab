"""A second client's latency while hostile clients attack another model on the same device.

    .venv/bin/python bench/hostile.py [--quick] [--json PATH]

Two tiny MLPs on one edged. A steady client (one keep-alive connection, raw HTTP, one request
at a time) asks the "bystander" model for a fixed window without any attack (the baseline,
same run), then during each attack against the "victim" model, run from another process:

* slow clients: 300 connections that send a request's first line and then one header byte
  every 0.5 s (each is cut by the header timeout and reconnects);
* big bodies: announced 60 MB bodies (refused from their headers) and chunked bodies of "0,"
  that never end (cut at the model's limit), reopened every 10 ms as edged cuts them.

Figures: the bystander's requests/s and p99 in each window, and p99 under attack / p99 without
(the issue's target: <= 2x). Repeated (3 times, once with --quick); medians quoted.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Edged, ModelDef, RawClient, infer_request, make_input, median, percentile

TARGET_P99_RATIO = 2.0
VICTIM = "/v2/models/victim/infer"


def slow_clients(sock_path: str, until: float, n: int = 300) -> int:
    """Connections that never finish their headers; reopened when cut. Returns how many cut."""
    socks: list[socket.socket] = []
    cut = 0

    def opened() -> socket.socket | None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(sock_path)
            s.setblocking(False)
            s.send(f"POST {VICTIM} HTTP/1.1\r\nHost: e\r\nX-Slow: ".encode())
        except OSError:
            s.close()
            return None
        return s

    while time.monotonic() < until:
        while len(socks) < n and time.monotonic() < until:
            s = opened()
            if s is None:
                break
            socks.append(s)
        alive = []
        for s in socks:
            try:
                s.send(b"x")
                alive.append(s)
            except OSError:
                s.close()
                cut += 1
        socks = alive
        time.sleep(0.5)
    for s in socks:
        s.close()
    return cut


def big_bodies(sock_path: str, until: float) -> int:
    """Announced 60 MB bodies and never-ending chunked ones (4 MB each before giving up),
    one after another, 10 ms apart: the attack of the issue (8 + 4 such bodies) reopened as
    edged cuts them, not a flood that takes a core from everyone (no server can help that:
    the kernel's scheduler and cgroups do)."""
    refused = 0
    chunk = b"%x\r\n%s\r\n" % (65536, b"0," * 32768)
    while time.monotonic() < until:
        for head in (
            f"POST {VICTIM} HTTP/1.1\r\nHost: e\r\nContent-Length: 60000000\r\n\r\n",
            f"POST {VICTIM} HTTP/1.1\r\nHost: e\r\nTransfer-Encoding: chunked\r\n\r\n",
        ):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(5)
            try:
                s.connect(sock_path)
                s.sendall(head.encode())
                try:
                    for _ in range(64):
                        s.sendall(chunk)
                except OSError:
                    pass
                if s.recv(64).startswith(b"HTTP/1.1 413"):
                    refused += 1
            except OSError:
                pass
            finally:
                s.close()
            time.sleep(0.01)
    return refused


def attack(kind: str, sock_path: str, until: float) -> int:
    return slow_clients(sock_path, until) if kind == "slow" else big_bodies(sock_path, until)


def window(client: RawClient, request: bytes, seconds: float) -> list[float]:
    lat: list[float] = []
    end = time.perf_counter() + seconds
    while (t0 := time.perf_counter()) < end:
        status, _ = client.call(request)
        if status != 200:
            raise RuntimeError(f"the bystander got {status}")
        lat.append(time.perf_counter() - t0)
    return lat


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    reps = 1 if args.quick else 3
    seconds = 3.0 if args.quick else 6.0
    from edgefleet.demo import TINY_MLP

    models = [ModelDef("victim", TINY_MLP, max_batch_size=8), ModelDef("bystander", TINY_MLP, 8)]
    req = infer_request("bystander", make_input(TINY_MLP[0], seed=1))
    ctx = multiprocessing.get_context("spawn")
    rows: list[dict[str, float]] = []
    print(f"hostile clients vs a second client: {reps} repetition(s), {os.cpu_count()} CPUs")
    with (
        Edged(models, config_text='[inference]\nheaderTimeout = "2s"\n') as edged,
        ctx.Pool(1) as pool,
        RawClient(edged.infer_sock) as client,
    ):
        window(client, req, 0.5)
        for _ in range(reps):
            r: dict[str, float] = {}
            base = window(client, req, seconds)
            r["base_rps"] = len(base) / seconds
            r["base_p99_ms"] = percentile(base, 99) * 1e3
            for kind in ("slow", "big"):
                until = time.monotonic() + seconds + 1.0
                res = pool.apply_async(attack, (kind, edged.infer_sock, until))
                time.sleep(1.0)  # the attack is on
                lat = window(client, req, seconds)
                r[f"{kind}_count"] = float(res.get(seconds + 30))
                r[f"{kind}_rps"] = len(lat) / seconds
                r[f"{kind}_p99_ms"] = percentile(lat, 99) * 1e3
                r[f"{kind}_ratio"] = r[f"{kind}_p99_ms"] / r["base_p99_ms"]
            rows.append(r)
            print(
                "  rep: base {base_rps:.0f}/s p99 {base_p99_ms:.3f} ms | slow clients "
                "{slow_rps:.0f}/s p99 {slow_p99_ms:.3f} ms ({slow_ratio:.2f}x, "
                "{slow_count:.0f} cut) | big bodies {big_rps:.0f}/s p99 {big_p99_ms:.3f} ms "
                "({big_ratio:.2f}x, {big_count:.0f} refused)".format(**r)
            )
    m = {k: median(r[k] for r in rows) for k in rows[0]}
    for kind, what in (("slow", "slow clients"), ("big", "big bodies")):
        ok = m[f"{kind}_ratio"] <= TARGET_P99_RATIO
        print(
            f"median: under {what}, the second client's p99 is {m[f'{kind}_ratio']:.2f}x its "
            f"p99 without attack (target <= {TARGET_P99_RATIO}x) {'OK' if ok else 'MISSED'}"
        )
    if args.json:
        args.json.write_text(json.dumps({"reps": rows, "median": m}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
