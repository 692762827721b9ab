"""edged's footprint: RSS and CPU of the control process (workers excluded), idle and loaded.

    .venv/bin/python bench/footprint.py [--quick] [--json PATH]

1. A bare Python interpreter, idle, for scale (what any Python daemon starts from).
2. edged with an empty manifests directory: after it is ready and has settled for a second,
   the edged process alone is sampled with psutil for 10 s (3 s with --quick): RSS (mean and
   max) and CPU in % of one core over the whole window.
3. edged with two models (tiny + medium MLP): the control process's RSS and CPU, and
   separately each worker's RSS; then again after serving some requests.
4. edged enrolled with a real hub (``hub init`` + ``hub serve`` on loopback, ``edged enroll``
   with a token): connected, its first desired state taken (TUF included), idle: RSS, USS,
   PSS, the mappings that hold most of it, and the same with MALLOC_ARENA_MAX=2 (the systemd
   unit could set it); against a bare ``python -c "import grpc"`` in the same run.
5. ``--imports``: the cost of each import the enrolled control process makes, in its order, in
   a fresh interpreter (``-X importtime`` and RSS/USS after each), then what edged no longer
   imports, each measured on top (docs/edged.md, "Footprint").
See bench/README.md and /work/shared/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from common import (
    REPO,
    Edged,
    ModelDef,
    RawClient,
    enroll_device,
    infer_request,
    make_input,
    start_bench_hub,
)

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
        "pss_mib": p.memory_full_info().pss / MIB,
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


def bare_import(module: str, seconds: float) -> dict[str, float]:
    """A Python process that imported ``module`` and sleeps (the floor of a gRPC client)."""
    code = f"import {module}, time; time.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(1.5)
        return sample(proc.pid, seconds)
    finally:
        proc.kill()
        proc.wait()


def mappings(pid: int, top: int = 6) -> list[tuple[str, float, float]]:
    """(mapping, RSS MiB, private MiB) of the ``top`` largest, from /proc/PID/smaps."""
    rss: dict[str, int] = {}
    private: dict[str, int] = {}
    name = "[anon]"
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if not parts[0].endswith(":"):
                name = Path(parts[5]).name if len(parts) > 5 else "[anon]"
            elif parts[0] == "Rss:":
                rss[name] = rss.get(name, 0) + int(parts[1])
            elif parts[0] in ("Private_Clean:", "Private_Dirty:"):
                private[name] = private.get(name, 0) + int(parts[1])
    biggest = sorted(rss, key=lambda k: -rss[k])[:top]
    return [(k, rss[k] / 1024, private.get(k, 0) / 1024) for k in biggest]


ENROLLED_CONFIG = """\
[trust]
rootFile = "{absent}"
"""


def enrolled_idle(seconds: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """A real hub and one edged enrolled with it, connected and settled; its control process
    sampled like the standalone one."""
    from edgefleet.launching import start_edged

    work = Path(tempfile.mkdtemp(prefix="bench-footprint-"))
    hub = start_bench_hub(work)
    edged = None
    try:
        device = work / "dev"
        enroll_device(hub, device)
        config = work / "edged.toml"
        config.write_text(ENROLLED_CONFIG.format(absent=work / "no-root"))
        edged = start_edged(
            device,
            config=config,
            log=work / "edged.log",
            args=["--log-level", "warning"],
            env={**os.environ, **(env or {})},
        )

        def settled() -> bool:
            with RawClient(str(device / "edged.sock"), timeout=5) as c:
                code, body = c.get("/v1/status")
            link = json.loads(body).get("hub") or {} if code == 200 else {}
            return bool(link.get("connected") and link.get("generation") and link["tufRequired"])

        edged.wait_until(settled, timeout=60, what="the first desired state")
        time.sleep(2.0)  # settle: startup work is not idle cost
        out: dict[str, Any] = sample(edged.pid, seconds)
        out["mappings"] = mappings(edged.pid)
        out["threads"] = psutil.Process(edged.pid).num_threads()
        return out
    finally:
        if edged is not None:
            edged.stop(30)
        hub.hub.stop(15)
        import shutil

        shutil.rmtree(work, ignore_errors=True)


def top_imports(path: Path) -> list[str]:
    """The modules ``path`` imports at its top level, in order (``from X import y``: X)."""
    import ast

    found: list[str] = []
    for node in ast.parse(path.read_text()).body:
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        found += [n for n in names if n != "__future__" and n not in found]
    return found


# What the enrolled control process imports, in its order: (label, code run in the child).
ENROLLED_IMPORTS = [
    ("edged.cli (arguments, config, logs)", "import edged.cli"),
    *[(m, f"import {m}") for m in top_imports(REPO / "edged" / "daemon.py")],
    ("edged.daemon (the rest of it)", "import edged.daemon"),
    ("uvloop (the event loop)", "import uvloop"),
    ("grpc (core + aio)", "import grpc, grpc.aio"),
    ("edged.hublink.linking (stubs, protobuf)", "import edged.hublink.linking"),
    ("tuf.api.metadata (+ securesystemslib, cryptography)", "import tuf.api.metadata"),
    (
        "tuf.ngclient (its urllib3 fetcher left out)",
        "from edged.trust.tufclient import _without_urllib3; _without_urllib3(); "
        "import tuf.ngclient",
    ),
]
# What it no longer imports (issue 34), each measured on top of all the above.
NO_LONGER = [
    ("yaml (edgefleet.api.yamlloading)", "import edgefleet.api.yamlloading"),
    ("cryptography.x509 (certificate dates)", "import cryptography.x509"),
    ("importlib.metadata (versions)", "import importlib.metadata"),
    ("http.client (edged status only)", "import edgefleet.devicestatus"),
    ("tarfile (installing a release)", "import tarfile"),
    ("urllib3 (python-tuf's default fetcher)", "import urllib3"),
]
CHILD = """
import json, sys
def mem():
    got = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("Rss", "Private_Clean", "Private_Dirty"):
                got[k] = int(v.split()[0])
    return got["Rss"], got["Private_Clean"] + got["Private_Dirty"]
print(json.dumps(["python", *mem(), len(sys.modules)]), flush=True)
sys.stderr.write("step done\\n")
sys.stderr.flush()
for label, code in json.loads(sys.argv[1]):
    exec(code, {})
    print(json.dumps([label, *mem(), len(sys.modules)]), flush=True)
    sys.stderr.write("step done\\n")  # -X importtime writes to stderr too: this splits it
    sys.stderr.flush()
"""


def import_table() -> list[dict[str, Any]]:
    """Each step's RSS and USS growth (MiB), modules added and import time (ms, from
    ``-X importtime``: the sum of the top-level imports it made)."""
    steps = ENROLLED_IMPORTS + NO_LONGER
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", CHILD, json.dumps(steps)],
        check=True, capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    marks = [json.loads(line) for line in done.stdout.splitlines()]
    # each step's import time: its top-level imports (no indent) up to its "step done"
    # (times[0]: the interpreter's own start)
    times = [0]
    for line in done.stderr.splitlines():
        if line == "step done":
            times.append(0)
        elif line.startswith("import time:") and "cumulative" not in line:
            _, cumulative, name = line.split("|")
            if not name.startswith("  "):
                times[-1] += int(cumulative)
    rows = []
    for (label, rss, private, mods), (_, rss0, private0, mods0) in zip(
        marks[1:], marks, strict=False
    ):
        rows.append({
            "step": label,
            "rss_mib": (rss - rss0) / 1024,
            "uss_mib": (private - private0) / 1024,
            "modules": mods - mods0,
            "total_rss_mib": rss / 1024,
            "no_longer": label in dict(NO_LONGER),
            "import_ms": times[len(rows) + 1] / 1000,
        })  # fmt: skip
    rows.insert(0, {"step": "python (bare interpreter)", "rss_mib": marks[0][1] / 1024,
                    "uss_mib": marks[0][2] / 1024, "modules": marks[0][3],
                    "total_rss_mib": marks[0][1] / 1024, "no_longer": False,
                    "import_ms": times[0] / 1000})  # fmt: skip
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="shorter sampling windows")
    p.add_argument(
        "--imports", action="store_true", help="only the table of each import's cost (~5 s)"
    )
    p.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = p.parse_args()
    idle_s = 3.0 if args.quick else 10.0
    loaded_s = 2.0 if args.quick else 5.0
    t_all = time.perf_counter()
    result: dict[str, Any] = {}
    if args.imports:
        rows = import_table()
        result["imports"] = rows
        print("each import of an enrolled edged's control process, in its order (fresh "
              "interpreter; MiB = 2^20 bytes)\n")  # fmt: skip
        print(f"{'step':<52}{'RSS +':>8}{'USS +':>8}{'modules':>9}{'ms':>8}{'RSS':>8}")
        hidden = [r["step"] for r in rows if r["modules"] == 0]
        for r in rows:
            if r["modules"] == 0:
                continue  # imported already by an earlier step: listed below
            if r["no_longer"] and not rows[rows.index(r) - 1]["no_longer"]:
                print("-- no longer imported while idle (each on top of the above):")
            print(f"{r['step']:<52}{r['rss_mib']:8.1f}{r['uss_mib']:8.1f}{r['modules']:9d}"
                  f"{r.get('import_ms', 0.0):8.1f}{r['total_rss_mib']:8.1f}")  # fmt: skip
        print(f"(already imported by an earlier step, no cost: {', '.join(hidden)})")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=2) + "\n")
        return 0

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

    grpc_only = bare_import("grpc", min(idle_s, 3.0))
    result["bare_grpc"] = grpc_only
    enrolled = enrolled_idle(idle_s)
    arena = enrolled_idle(min(idle_s, 3.0), {"MALLOC_ARENA_MAX": "2"})
    result["enrolled"] = enrolled
    result["enrolled_arena_max_2"] = arena
    row(
        "python -c 'import grpc', idle:",
        f"RSS {grpc_only['rss_mib']:6.1f} MiB  (USS {grpc_only['uss_mib']:.1f})",
    )
    row(
        f"edged enrolled, idle {enrolled['seconds']:.0f} s:",
        f"RSS {enrolled['rss_mib']:6.1f} MiB  (max {enrolled['rss_max_mib']:.1f}, USS "
        f"{enrolled['uss_mib']:.1f}, PSS {enrolled['pss_mib']:.1f}), CPU "
        f"{enrolled['cpu_pct']:.2f} %, {enrolled['threads']} threads",
    )
    for name, rss, private in enrolled["mappings"]:
        row(f"  {name[:36]}", f"RSS {rss:6.1f} MiB  (private {private:.1f})")
    row(
        "  the same with MALLOC_ARENA_MAX=2:",
        f"RSS {arena['rss_mib']:6.1f} MiB  (USS {arena['uss_mib']:.1f})",
    )

    ok_rss = idle["rss_mib"] <= TARGET_RSS_MIB
    ok_cpu = idle["cpu_pct"] < TARGET_CPU_PCT
    result["summary"] = {
        "idle_rss_mib": idle["rss_mib"],
        "idle_cpu_pct": idle["cpu_pct"],
        "loaded_control_rss_mib": loaded["rss_mib"],
        "enrolled_idle_rss_mib": enrolled["rss_mib"],
        "enrolled_idle_uss_mib": enrolled["uss_mib"],
        "enrolled_rss_ok": enrolled["rss_mib"] <= TARGET_RSS_MIB,
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
    ok_enrolled = enrolled["rss_mib"] <= TARGET_RSS_MIB
    print(
        f"enrolled, idle: RSS {enrolled['rss_mib']:.1f} MiB (target <= {TARGET_RSS_MIB:.0f}) "
        f"{'OK' if ok_enrolled else 'MISSED'}, USS {enrolled['uss_mib']:.1f} MiB; "
        f"{enrolled['rss_mib'] / grpc_only['rss_mib']:.2f}x a bare 'import grpc' process "
        f"({grpc_only['rss_mib']:.1f} MiB), {enrolled['rss_mib'] / idle['rss_mib']:.2f}x "
        f"standalone; MALLOC_ARENA_MAX=2: {arena['rss_mib']:.1f} MiB"
    )
    print(f"(took {time.perf_counter() - t_all:.0f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
