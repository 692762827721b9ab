"""A replica's model is measured as its worker starts (WorkerPool's ``measure``: edged's
TPM extend, docs/trust.md): a worker that is ready first serves once the measurement ended,
and a measurement that does not end (a slow TPM) holds serving up for a bound only. Real
worker processes and ONNX Runtime; the measurement is a coroutine the test controls (the
TPM side, with swtpm: tests/e2e/test_measured_loading.py)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path

from asynctesting import async_test, eventually
from workerprocess import launch_spec

from edged.reconcile.model import Phase
from edged.runtime.launching import SandboxSpec
from edged.runtime.workerpool import WorkerPool
from edged.workloads import WorkloadName
from edgefleet.api import Probes
from edgefleet.demo import TINY_MLP, build_mlp


async def _until(cond: Callable[[], object], what: str, timeout: float = 120.0) -> None:
    await eventually(cond, timeout, what, interval=0.02)


def _model(tmp_path: Path) -> tuple[Path, str]:
    path = build_mlp(tmp_path / "m.onnx", TINY_MLP, seed=1)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


@async_test
async def test_a_ready_worker_serves_once_its_model_is_measured(tmp_path: Path) -> None:
    model, sha = _model(tmp_path)
    release = asyncio.Event()
    measured: list[str] = []
    serving: list[bool] = []

    async def measure(digest: str) -> None:
        measured.append(digest)
        await release.wait()

    pool = WorkerPool(
        notify=lambda _w: None,
        on_serving_change=lambda _r, ready: serving.append(ready),
        on_result=lambda *_: None,
        measure=measure,
        measure_wait_s=600,
    )
    await pool.start(
        launch_spec(model, sha, SandboxSpec(mode="off")), WorkloadName("w"), "r1", 0, Probes()
    )
    (rep,) = pool.replicas()
    assert measured == [sha]  # started with the process, before it loads the model
    await _until(lambda: rep.metadata, "the worker's READY")
    await asyncio.sleep(0.3)
    assert rep.phase is Phase.STARTING and serving == []  # not serving unmeasured
    release.set()
    await _until(lambda: rep.phase is Phase.READY, "serving after the measurement")
    assert serving == [True]
    await pool.shutdown(timeout=10)


@async_test
async def test_a_measurement_that_does_not_end_holds_serving_up_for_a_bound_only(
    tmp_path: Path,
) -> None:
    model, sha = _model(tmp_path)
    never = asyncio.Event()

    async def measure(digest: str) -> None:
        await never.wait()

    pool = WorkerPool(
        notify=lambda _w: None,
        on_serving_change=lambda _r, ready: None,
        on_result=lambda *_: None,
        measure=measure,
        measure_wait_s=0.5,
    )
    await pool.start(
        launch_spec(model, sha, SandboxSpec(mode="off")), WorkloadName("w"), "r1", 0, Probes()
    )
    (rep,) = pool.replicas()
    await _until(lambda: rep.phase is Phase.READY, "serving despite the slow measurement")
    never.set()
    await pool.shutdown(timeout=10)
