"""The work a worker overlaps with ONNX Runtime (issue 34, item 2) reaches edged's metrics: a
real edged serves a model slowed deterministically (``tests/slowmodel.py``) to more clients
at once than a batch holds, so requests arrive, are decoded and handed over while a batch
runs; ``/metrics`` shows the overlap counters grow with each wave of clients, never past what
edged itself forwarded and answered, and edged refuses none of the worker's honest reports
(``edged/runtime/overlapstats.py``); nor of the answers it says it wrote
(``edged/runtime/answerstats.py``). Counters, not clocks: nothing here asserts a duration."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from harness import Edged, wait_for, write_manifest
from metricstesting import series_value
from slowmodel import WIDTH, expected, slow_model

CLIENTS = 16  # two batches' worth of clients at once: one batch runs while the next arrives
ROUNDS = 3  # requests per client per wave
NAMES = (
    "edged_inference_overlapped_decodes_total",
    "edged_inference_overlapped_encodes_total",
    "edged_inference_staged_batches_total",
)


def test_overlap_counters_grow_in_edgeds_metrics(tmp_path: Path, edged_factory) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    _, moved = slow_model(manifests / "slow.onnx", layers=128)
    write_manifest(manifests, name="slow", path="slow.onnx", batch=8, period=1)
    e: Edged = edged_factory(manifests).start()
    e.wait_ready()
    wait_for(lambda: e.workload("slow")["readyReplicas"] == 1, 60, "the slow model ready")
    x = np.linspace(-1, 1, WIDTH, dtype=np.float32).reshape(1, WIDTH)
    want = expected(x, moved)

    def client(_: int) -> None:
        for _ in range(ROUNDS):
            status, doc = e.infer("slow", x)
            assert status == 200, doc
            (out,) = doc["outputs"]
            got = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
            np.testing.assert_array_equal(got, want)

    def metric(name: str) -> float:
        text = e.request("GET", "/metrics", sock=e.status_sock)[1].decode()
        return series_value(text, f'{name}{{workload="slow"}}')

    def counted(sent: int) -> tuple[float, ...]:
        """The overlap totals once the worker's report after ``sent`` requests is counted
        (its batch totals come in the same PONG, at its next liveness probe: every second)."""
        batched = "edged_inference_batched_requests_total"
        wait_for(lambda: metric(batched) == sent, 30, f"{sent} batched requests counted")
        return tuple(metric(n) for n in NAMES)

    def wave() -> None:
        with ThreadPoolExecutor(CLIENTS) as pool:
            list(pool.map(client, range(CLIENTS)))

    sent = 0

    def waves_until(grown: Callable[[tuple[float, ...]], bool]) -> tuple[float, ...]:
        """Waves of clients until the counted totals satisfy ``grown`` (five at most: a loaded
        machine may serialize one; each wave only adds)."""
        nonlocal sent
        for _ in range(5):
            wave()
            sent += CLIENTS * ROUNDS
            now = counted(sent)
            assert max(now) <= sent, (now, sent)  # each is of a request edged forwarded
            if grown(now):
                break
        return now

    assert counted(0) == (0.0, 0.0, 0.0)
    first = waves_until(lambda t: all(v > 0 for v in t))
    assert all(v > 0 for v in first), first
    later = waves_until(lambda t: all(v > f for v, f in zip(t, first, strict=True)))
    assert all(v > f for v, f in zip(later, first, strict=True)), (first, later)
    # the answers the worker reports it wrote (answerstats.py): every request edged forwarded,
    # counted once its report came, each held for no longer than edged measured it
    worker = "edged_inference_worker_duration_seconds"
    wait_for(lambda: metric(f"{worker}_count") == sent, 30, f"{sent} worker answers counted")
    assert metric(f"{worker}_sum") <= metric("edged_inference_request_duration_seconds_sum")
    assert e.terminate() == 0
    log = e.log_path.read_text()
    assert "worker overlap totals not counted" not in log  # an honest worker is never refused
    assert "worker answer totals not counted" not in log
