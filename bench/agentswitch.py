"""Requests failed, and the longest time without an answer, while edged restarts under steady
inference load (issue 32 item 4). Not a test.

Method (/work/shared/BENCHMARKS.md: a baseline measured in the same run): a real ``edged run``
serving the tiny MLP (two replicas), ``--clients`` clients each on its own keep-alive
connection to ``infer.sock`` at a steady ``--rate`` (requests/s; pre-encoded request,
Content-Length framing; a slow answer delays the next, nothing is sent in a burst); a
request that fails (connection refused, reset or closed, any status but 200) is sent again
once on a new connection, and counts as failed only when that fails too. While they run, edged
is restarted ``--restarts`` times (SIGTERM, wait for its exit, start it again at once: what
``systemctl restart`` does; with ``--crash``, SIGKILL instead: a crash, then ``Restart=``)
and the bench waits for answers again before the next one.

Three ways, same run, same load:

* **baseline** (today's behaviour): ``[workers] keepOnExit = false``, no descriptor store:
  the workers stop with edged and start again, infer.sock is removed and bound again;
* **adopt**: ``keepOnExit = true``, no descriptor store: the workers are adopted, infer.sock
  is bound again (refused connections in the gap);
* **adopt+fdstore**: ``keepOnExit = true`` under a descriptor store as systemd or the launcher
  keeps one (``tests/e2e/fdstoretesting.py``: FDSTORE=1 / LISTEN_FDS): workers adopted and
  infer.sock kept listening across the restart.

Figures per way: requests answered, failed (after the retry), retried, the longest time
without an answer (any client), and the median of the per-restart gaps; the ratio of each
way's longest gap to the baseline's. Goal: 0 failed with adopt+fdstore.

    .venv/bin/python bench/agentswitch.py [--restarts 5] [--crash] [--clients 2] [--rate 100]
                                          [--json PATH]
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, RawClient, infer_request, make_input, median

sys.path.insert(0, str(REPO / "tests" / "e2e"))  # the descriptor store harness of the tests

MANIFEST = """\
apiVersion: edgefleet.io/v1
kind: ModelDeployment
metadata: {name: tiny}
spec:
  model: {name: tiny, version: "1.0.0", path: tiny.onnx}
  runtime: {maxBatchSize: 8, executionProviders: [CPUExecutionProvider]}
  replicas: {perDevice: 2}
  probes:
    startup: {timeoutSeconds: 60}
    readiness: {periodSeconds: 1, timeoutSeconds: 1}
"""
WAYS = ("baseline", "adopt", "adopt+fdstore")


class Load:
    """Closed-loop clients with one retry each; answers are time-stamped for the gaps."""

    def __init__(self, sock: str, clients: int, rate: float) -> None:
        self.sock = sock
        self.period = 1.0 / rate
        self.request = infer_request("tiny", make_input(64))
        self.answers: list[float] = []  # monotonic times of answers, all clients
        self.failed: list[str] = []
        self.retried = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def _client(self) -> None:
        conn: RawClient | None = None
        due = time.monotonic()
        while not self._stop.is_set():
            due += self.period  # a steady rate: a request that fails fast does not hurry the next
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            else:
                due = time.monotonic()  # behind (a slow answer): no burst to catch up
            why = ""
            for attempt in range(2):  # the request, and the one retry
                try:
                    if conn is None:
                        conn = RawClient(self.sock, timeout=60)
                    status, _ = conn.call(self.request)
                    why = "" if status == 200 else f"HTTP {status}"
                except (OSError, ValueError) as exc:
                    why = type(exc).__name__
                if why and conn is not None:
                    conn.close()
                    conn = None
                if not why:
                    break
                if attempt == 0:
                    with self._lock:
                        self.retried += 1
            with self._lock:
                if why:
                    self.failed.append(why)
                else:
                    self.answers.append(time.monotonic())
        if conn is not None:
            conn.close()

    def answered(self) -> int:
        with self._lock:
            return len(self.answers)

    def longest_gap(self, since: float = 0.0) -> float:
        """The longest time without an answer from the last answer before ``since`` on."""
        with self._lock:
            times = sorted(self.answers)
        start = max(0, bisect.bisect_left(times, since) - 1)
        times = times[start:]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(90)


def _wait(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def run_way(
    way: str, restarts: int, clients: int, rate: float, *, crash: bool = False
) -> dict[str, Any]:
    from edgefleet.demo import TINY_MLP, build_mlp
    from edgefleet.launching import start_edged

    root = Path(tempfile.mkdtemp(prefix="edged-switch-"))
    manifests, data = root / "manifests", root / "data"
    manifests.mkdir()
    build_mlp(manifests / "tiny.onnx", TINY_MLP, seed=1)
    (manifests / "tiny.yaml").write_text(MANIFEST)
    keep = "false" if way == "baseline" else "true"
    config = root / "edged.toml"
    config.write_text(
        f'[trust]\nallowUnsigned = true\nrootFile = "{root / "absent.json"}"\n'
        f'[workers]\nkeepOnExit = {keep}\norphanTimeout = "1m"\n'
    )
    store = None
    python: Path | None = None
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "INVOCATION_ID")}
    if way == "adopt+fdstore":
        from fdstoretesting import FdStore

        store = FdStore(root / "fdstore")
        python, env = store.python, store.env

    def start() -> Any:
        return start_edged(
            data,
            manifests=manifests,
            config=config,
            log=root / "edged.log",
            args=["--log-level", "warning"],
            env=env,
            cwd=REPO,
            python=python,
        )

    launched = start()
    sock = str(data / "infer.sock")
    gaps: list[float] = []
    pids_kept = 0
    try:
        launched.wait_ready(120, models=["tiny"])
        if store is not None:
            _wait("infer.sock in the store", lambda: "inference" in store.names(), 10)
        with Load(sock, clients, rate) as load:
            _wait("answers", lambda: load.answered() > 50, 30)
            for _ in range(restarts):
                before = _worker_pids(data)
                since = time.monotonic()
                if crash:
                    launched.kill()  # a crash: SIGKILL, no drain, no record written at the stop
                else:
                    launched.stop(60)
                launched = start()
                count = load.answered()
                _wait("answers after the restart", lambda n=count: load.answered() > n + 20, 120)
                launched.wait_ready(120, models=["tiny"])
                time.sleep(0.5)
                gaps.append(load.longest_gap(since))
                pids_kept += before == _worker_pids(data)
        result = {
            "answered": load.answered(),
            "failed": len(load.failed),
            "failures": sorted(set(load.failed)),
            "retried": load.retried,
            "longest_gap_s": max(gaps),
            "median_gap_s": median(gaps),
            "gaps_s": [round(g, 3) for g in gaps],
            "workers_kept": pids_kept,
            "restarts": restarts,
        }
    finally:
        launched.stop(60)
        _kill_kept(data)  # the workers the last edged kept: their records name them
        if store is not None:
            store.close()
        shutil.rmtree(root, ignore_errors=True)
    return result


def _worker_pids(data: Path) -> list[int]:
    from edgefleet.devicestatus import send_request

    _, body, _ = send_request(str(data / "edged.sock"), "GET", "/v1/status", timeout=5)
    doc = json.loads(body)
    return sorted(r["pid"] for w in doc["workloads"] for r in w["replicas"] if r.get("pid"))


def _kill_kept(data: Path) -> None:
    import signal

    for path in (data / "state" / "workers").glob("*.json"):
        try:
            pid = json.loads(path.read_text())["pid"]
            fd = os.pidfd_open(pid)
        except (OSError, ValueError, KeyError):
            continue
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        finally:
            os.close(fd)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--restarts", type=int, default=5)
    parser.add_argument(
        "--crash", action="store_true", help="kill -9 edged instead of SIGTERM (a crash)"
    )
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--rate", type=float, default=100.0, help="requests/s per client")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    socket.setdefaulttimeout(None)
    results = {}
    for way in WAYS:
        print(
            f"-- {way}: {args.restarts} {'crashes' if args.crash else 'restarts'} under "
            f"{args.clients} clients at "
            f"{args.rate:g} requests/s each",
            flush=True,
        )
        results[way] = run_way(way, args.restarts, args.clients, args.rate, crash=args.crash)
        r = results[way]
        print(
            f"   answered {r['answered']}, failed {r['failed']} {r['failures'] or ''}, "
            f"retried {r['retried']}, longest gap {r['longest_gap_s'] * 1000:.0f} ms "
            f"(median per restart {r['median_gap_s'] * 1000:.0f} ms), "
            f"workers kept {r['workers_kept']}/{r['restarts']}; gaps {r['gaps_s']}",
            flush=True,
        )
    base = results["baseline"]["longest_gap_s"]
    print()
    print(f"{'way':<15}{'failed':>8}{'longest gap':>14}{'vs baseline':>13}{'workers kept':>14}")
    for way, r in results.items():
        ratio = r["longest_gap_s"] / base if base else float("nan")
        print(
            f"{way:<15}{r['failed']:>8}{r['longest_gap_s'] * 1000:>12.0f}ms{ratio:>12.2f}x"
            f"{r['workers_kept']:>10}/{r['restarts']}"
        )
    goal = results["adopt+fdstore"]["failed"] == 0
    met = "met" if goal else "NOT met"
    print(f"\ngoal: 0 failed requests across restarts with adopt+fdstore: {met}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
