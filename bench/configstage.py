"""The worker's processing stage's own cost (issue 36; docs/model-config.md "The processing
stage"): a batch run through ``edged.runtime.configstage.ConfigStage`` against the same batch
run by the bare ONNX Runtime session, in one run, on real ONNX Runtime.

Three ways, each timed over the same inputs, interleaved round by round (so drift of the
machine hits all three alike): the bare session (the baseline), the stage with no config (what
every worker now pays: the version check and the pass-through), and the stage with a config
normalising the input (scale, mean, std) and post-processing the output (a class map and a
threshold). Models: the tiny MLP (64-256-10: the stage's cost is largest against it) and the
medium one (1024-2048-2048-1000), at batch sizes 1 and 8. Printed: the median time per batch
of each, and each stage's as a ratio of the bare session's.

    .venv/bin/python bench/configstage.py [--rounds 2000] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import onnxruntime as ort

from edged.runtime.configstage import ConfigStage
from edged.runtime.tensors import spec_from_ort
from edged.state.modelconfigs import ConfigVolumes
from edgefleet.demo import MEDIUM_MLP, TINY_MLP, build_mlp
from edgefleet.modelprocessing import PROCESSING_KEY


def _stage(session: Any, volumes: ConfigVolumes, name: str) -> ConfigStage:
    inputs = {n.name: spec_from_ort(n) for n in session.get_inputs()}
    outputs = [spec_from_ort(n) for n in session.get_outputs()]
    stage = ConfigStage(session, str(volumes.config_path(name)), inputs, outputs)
    stage.start()
    return stage


def measure(sizes: tuple[int, ...], batch: int, rounds: int, tmp: Path) -> dict[str, Any]:
    model = build_mlp(tmp / f"m{sizes[0]}.onnx", sizes, seed=1)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    volumes = ConfigVolumes(tmp / f"configs{sizes[0]}-{batch}")
    volumes.ensure("bare")
    plain = _stage(session, volumes, "bare")
    classes = sizes[-1]
    processing = {
        "inputs": {"input": {"scale": 0.5, "mean": 0.1, "std": 2.0}},
        "outputs": {"logits": {"classMap": list(range(classes))[::-1], "threshold": 0.0}},
    }
    volumes.write("cfg", {"data": {PROCESSING_KEY: processing}, "files": {}}, None)
    configured = _stage(session, volumes, "cfg")
    assert configured.digest, "the config is in force"
    x = np.random.default_rng(0).standard_normal((batch, sizes[0])).astype(np.float32)
    feeds = {"input": x}
    runs = {
        "bare": lambda: session.run(["logits"], feeds),
        "stage, no config": lambda: plain.run(["logits"], feeds),
        "stage, config": lambda: configured.run(["logits"], feeds),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(50):  # warm-up
        for run in runs.values():
            run()
    for _ in range(rounds):
        for k, run in runs.items():
            t0 = time.perf_counter()
            run()
            times[k].append(time.perf_counter() - t0)
    medians = {k: statistics.median(v) for k, v in times.items()}
    return {
        "model": "x".join(map(str, sizes)),
        "batch": batch,
        "medianSeconds": medians,
        "ratio": {k: medians[k] / medians["bare"] for k in medians if k != "bare"},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as d:
        for sizes in (TINY_MLP, MEDIUM_MLP):
            for batch in (1, 8):
                rounds = args.rounds if sizes is TINY_MLP else max(50, args.rounds // 20)
                results.append(measure(sizes, batch, rounds, Path(d)))
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{'model':>24} {'batch':>5} {'bare':>10} {'stage':>10} {'ratio':>6} "
          f"{'+config':>10} {'ratio':>6}")  # fmt: skip
    for r in results:
        m, q = r["medianSeconds"], r["ratio"]
        print(
            f"{r['model']:>24} {r['batch']:>5} {m['bare'] * 1e6:>8.1f}us "
            f"{m['stage, no config'] * 1e6:>8.1f}us {q['stage, no config']:>6.2f} "
            f"{m['stage, config'] * 1e6:>8.1f}us {q['stage, config']:>6.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
