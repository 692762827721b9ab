"""Precision variants against fp32, same run: latency, throughput and accuracy change.

The medium MLP (1024 -> 2048 -> 2048 -> 1000, float32) is built with ``onnx``; its fp16 and
int8 variants are built exactly as ``edgectl models variants`` builds them (onnxconverter-common
with float32 inputs and outputs kept; onnxruntime's dynamic int8 quantization). Each is run in
a bare ``InferenceSession`` on one intra-op thread (what a worker with a 1-core request gets):

* **latency**: p50 of batch-1 calls over ``--seconds``;
* **throughput**: rows/s of batch-8 calls (``maxBatchSize`` 8) over ``--seconds``;
* **accuracy change**: on a validation set of ``--samples`` random inputs labelled by the
  fp32 model (a random MLP has no ground truth: fp32 is 1.0 by construction, and a variant's
  change is the share of predictions it flips), measured with the devices' own evaluation
  (``edgefleet.validationsets``), plus the largest absolute difference of the logits.

Printed: per variant the figures and the ratios to fp32 (latency: fp32 / variant, >1 is faster;
throughput: variant / fp32). Repeated ``--reps`` times, interleaved; medians.
``.venv/bin/python bench/variants.py [--reps 3] [--seconds 3]``
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import bare_session, median, percentile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgectl.variants import write_variant
from edgefleet.demo import MEDIUM_MLP, build_mlp
from edgefleet.validationsets import evaluate

PRECISIONS = ("fp32", "fp16", "int8")


def timed(session: object, x: np.ndarray, seconds: float) -> list[float]:
    run = session.run  # type: ignore[attr-defined]
    feeds = {"input": x}
    for _ in range(20):
        run(None, feeds)
    out: list[float] = []
    end = time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        run(None, feeds)
        t1 = time.perf_counter()
        out.append(t1 - t0)
        if t1 >= end:
            return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--samples", type=int, default=2000)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = folder / "medium.onnx"
        build_mlp(model, MEDIUM_MLP, seed=7)
        files = {"fp32": model}
        for p in ("fp16", "int8"):
            files[p] = folder / f"medium.{p}.onnx"
            write_variant(model, p, files[p])
        sessions = {p: bare_session(f) for p, f in files.items()}
        sizes = {p: f.stat().st_size for p, f in files.items()}

        rng = np.random.default_rng(0)
        x = rng.standard_normal((args.samples, MEDIUM_MLP[0])).astype(np.float32)
        ref = np.concatenate(
            [sessions["fp32"].run(None, {"input": x[i : i + 64]})[0] for i in range(0, len(x), 64)]
        )
        validation = folder / "validation.npz"
        np.savez(validation, inputs=x, labels=ref.argmax(axis=-1))
        digest = hashlib.sha256(validation.read_bytes()).hexdigest()
        accuracy: dict[str, float] = {}
        max_diff: dict[str, float] = {}
        for p, s in sessions.items():
            result = evaluate(s, str(validation), digest)
            accuracy[p] = float(result["accuracy"])
            got = np.concatenate(
                [s.run(None, {"input": x[i : i + 64]})[0] for i in range(0, len(x), 64)]
            )
            max_diff[p] = float(np.abs(got.astype(np.float32) - ref).max())

        one = x[:1].copy()
        eight = x[:8].copy()
        p50: dict[str, list[float]] = {p: [] for p in PRECISIONS}
        rows: dict[str, list[float]] = {p: [] for p in PRECISIONS}
        for _ in range(args.reps):
            for p in PRECISIONS:  # interleaved: a noisy neighbour hits every variant alike
                p50[p].append(percentile(timed(sessions[p], one, args.seconds), 50))
                calls = timed(sessions[p], eight, args.seconds)
                rows[p].append(8 * len(calls) / sum(calls))

    lat = {p: median(v) for p, v in p50.items()}
    thr = {p: median(v) for p, v in rows.items()}
    print(f"medium MLP {MEDIUM_MLP}, 1 intra-op thread, {args.reps} reps of {args.seconds:g}s")
    print(
        f"{'variant':<8} {'bytes':>11} {'p50 b1':>9} {'lat x':>6} {'rows/s b8':>10} {'thr x':>6} "
        f"{'accuracy':>9} {'change':>8} {'max|diff|':>10}"
    )
    for p in PRECISIONS:
        print(
            f"{p:<8} {sizes[p]:>11} {lat[p] * 1e3:>7.3f}ms {lat['fp32'] / lat[p]:>6.2f} "
            f"{thr[p]:>10.0f} {thr[p] / thr['fp32']:>6.2f} {accuracy[p]:>9.4f} "
            f"{accuracy[p] - accuracy['fp32']:>+8.4f} {max_diff[p]:>10.3g}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
