"""The worker's own CPU per request, against ONNX Runtime's CPU per row, in the same run.

    .venv/bin/python bench/workercost.py [--reps N] [--json PATH]

What ``inference.py``'s throughput cannot show on a machine shared with other work (its wall
time ratios then follow the scheduler, not edged): the inference worker's Python per request
(frames in, decode, batch queue, batch of 8 rows, slices, encode, frames out) measured with
``time.process_time`` in this process, with ``session.run`` stubbed (it returns a fixed
batch-8 answer at once), against the bare ONNX Runtime batch-8 call's CPU per row on the
medium MLP (one thread), the work the worker wraps. The real ``WorkerProtocol`` and codec run;
eight INFER frames (JSON bodies, then binary-extension bodies) arrive in one read and run as
one batch. Ratios: worker Python per request / ORT per row (lower is better), and
ORT / (ORT + Python): the share of a core the model gets when both run on one core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import bare_loop, bare_session, infer_request, infer_request_binary, make_input, median

BATCH = 8


class _Transport:
    def write(self, data: bytes) -> None:
        pass

    def writelines(self, parts: list[bytes]) -> None:
        pass

    def is_closing(self) -> bool:
        return False


def _frames(kind: str, x: Any) -> bytes:
    from edged.runtime.framing import HEADER, NO_HEADER_LENGTH, U32, FrameType

    out = []
    for i in range(BATCH):
        req = infer_request("medium", x) if kind == "json" else infer_request_binary("medium", x)
        body = req[req.index(b"\r\n\r\n") + 4 :]
        hlen = NO_HEADER_LENGTH
        if kind == "binary":
            hlen = int(req.split(b"Inference-Header-Content-Length: ")[1].split(b"\r\n")[0])
        out.append(HEADER.pack(len(body) + 4, FrameType.INFER, i + 1) + U32.pack(hlen) + body)
    return b"".join(out)


async def _worker_us(x: Any, n_out: int, batches: int, reps: int) -> dict[str, list[float]]:
    import numpy as np

    from edged.runtime import workerprotocol
    from edged.runtime.tensors import TensorSpec

    answer = np.random.default_rng(0).standard_normal((BATCH, n_out)).astype(np.float32)

    class Session:
        def run(self, outputs: Any, feeds: dict[str, Any]) -> list[Any]:
            return [answer[: len(next(iter(feeds.values())))]]

    model = types.SimpleNamespace(
        inputs={"input": TensorSpec("input", "FP32", (-1, x.shape[1]))},
        outputs=("output",),
        batchable=True,
        max_batch=BATCH,
        run_s=0.0,  # inline: no executor thread, so process_time sees all of it
        session=Session(),
        metadata=lambda spec: {},
    )
    spec = types.SimpleNamespace(model_name="medium", model_version="1.0.0", max_queue_delay_s=0.0)
    done = asyncio.get_running_loop().create_future()
    proto = workerprotocol.WorkerProtocol(spec, model, done)  # type: ignore[arg-type]
    proto.connection_made(_Transport())  # type: ignore[arg-type]
    out: dict[str, list[float]] = {}
    for kind in ("json", "binary"):
        data = _frames(kind, x)
        for _ in range(batches // 4):
            proto.data_received(data)
        runs = []
        for _ in range(reps):
            t0 = time.process_time()
            for _ in range(batches):
                proto.data_received(data)
            runs.append(1e6 * (time.process_time() - t0) / (batches * BATCH))
        out[kind] = runs
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=7, help="repetitions (medians quoted)")
    p.add_argument("--batches", type=int, default=300, help="batches of 8 per repetition")
    p.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = p.parse_args()
    from edgefleet.demo import MEDIUM_MLP, build_mlp

    x = make_input(MEDIUM_MLP[0], seed=2)
    with tempfile.TemporaryDirectory(prefix="workercost-") as tmp:
        path = Path(tmp) / "medium.onnx"
        build_mlp(path, MEDIUM_MLP, seed=0)
        sess = bare_session(path)
        x8 = x.repeat(BATCH, axis=0)
        ort: list[float] = []
        for _ in range(args.reps):
            t0 = time.process_time()
            calls = bare_loop(sess, x8, n=60, warmup=5)
            ort.append(1e6 * (time.process_time() - t0) / ((len(calls) + 5) * BATCH))
    worker = asyncio.run(_worker_us(x, MEDIUM_MLP[-1], args.batches, args.reps))
    ort_us = median(ort)
    result: dict[str, Any] = {"ort_us_per_row": ort_us, "ort_reps": ort}
    print(f"medium MLP {list(MEDIUM_MLP)}, batches of {BATCH}, {args.reps} repetitions (medians)")
    print(f"ONNX Runtime, bare batch-{BATCH} call: {ort_us:.1f} us CPU per row")
    for kind, runs in worker.items():
        us = median(runs)
        result[kind] = {
            "worker_us_per_req": us,
            "reps": runs,
            "vs_ort": us / ort_us,
            "model_share": ort_us / (ort_us + us),
        }
        print(
            f"{kind:>6}: worker Python {us:6.1f} us per request (spread {min(runs):.1f}-"
            f"{max(runs):.1f}) = {us / ort_us:.2f}x ORT's per row; the model's share of one core "
            f"{ort_us / (ort_us + us):.2f}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
