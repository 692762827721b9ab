"""The runner: the one place that owns retries, timeouts, error capture and reconcile metrics.

A reconciler gets only a key, re-reads everything about it, and either returns a
:class:`Result` or raises. The runner turns that into the key's next step:

==============================  ==============================================  =================
reconciler outcome              what the runner does                            ``result`` label
==============================  ==============================================  =================
``Result()``                    forget the key's backoff; done                  ``success``
``Result(requeue_after=x)``     forget the backoff; queue again after x         ``requeue``
:class:`TemporaryError`         log a warning; retry with per-key backoff       ``temporary_error``
:class:`PermanentError`         log an error; forget; no retry until re-added   ``permanent_error``
any other exception, timeout    log with traceback; retry with per-key backoff  ``error``
==============================  ==============================================  =================

``on_error(key, exc)`` is called for every failure (to record a condition, say). Reconcilers never
sleep or loop to retry: they raise or return ``requeue_after``.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from edgefleet.errors import PermanentError, TemporaryError
from edgefleet.logs import get_logger
from edgefleet.metrics import Counter, Gauge, Histogram, Registry
from edgefleet.workqueue import QueueShutDown, WorkQueue

log = get_logger(__name__)

K = TypeVar("K", bound=Hashable)
K_contra = TypeVar("K_contra", bound=Hashable, contravariant=True)

DEFAULT_GRACE = 10.0


@dataclass(frozen=True)
class Result:
    """What a reconcile asks for next.

    ``requeue_after``: seconds after which the key is reconciled again (a deadline to check, a
    periodic probe). None (or 0, as in controller-runtime) means done until something enqueues
    the key again. Negative values are a bug in the reconciler and raise ValueError.
    """

    requeue_after: float | None = None

    def __post_init__(self) -> None:
        if self.requeue_after is not None and not self.requeue_after >= 0:
            raise ValueError(f"requeue_after must be None or >= 0, got {self.requeue_after}")


class Reconciler(Protocol[K_contra]):
    async def reconcile(self, key: K_contra) -> Result: ...


class _Metrics:
    """The runner metrics of one registry, shared by every runner that reports to it."""

    _by_registry: weakref.WeakKeyDictionary[Registry, _Metrics] = weakref.WeakKeyDictionary()

    def __init__(self, registry: Registry) -> None:
        self.total: Counter = registry.counter(
            "edged_reconcile_total", "Reconciles by outcome.", ("controller", "result")
        )
        self.duration: Histogram = registry.histogram(
            "edged_reconcile_duration_seconds", "Time spent in one reconcile.", ("controller",)
        )
        self.depth: Gauge = registry.gauge(
            "edged_workqueue_depth", "Keys waiting in the work queue now.", ("controller",)
        )
        self.retries: Counter = registry.counter(
            "edged_workqueue_retries_total", "Keys re-queued with backoff.", ("controller",)
        )

    @classmethod
    def of(cls, registry: Registry) -> _Metrics:
        metrics = cls._by_registry.get(registry)
        if metrics is None:
            metrics = cls._by_registry[registry] = cls(registry)
        return metrics


class Runner(Generic[K]):
    """Runs ``workers`` coroutines that take keys from ``queue`` and reconcile them.

    The queue guarantees that one key is never reconciled by two workers at once. ``timeout``
    bounds one reconcile (None: no bound); a timeout counts as an unexpected error. ``grace`` is
    how long ``run`` waits for in-flight reconciles after ``stop`` is set before cancelling them.
    """

    def __init__(
        self,
        name: str,
        reconciler: Reconciler[K],
        queue: WorkQueue[K],
        *,
        workers: int = 4,
        timeout: float | None = 300.0,
        grace: float = DEFAULT_GRACE,
        metrics: Registry | None = None,
        on_error: Callable[[K, BaseException], None] | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 or None, got {timeout}")
        self.name = name
        self._reconciler = reconciler
        self._queue = queue
        self._workers = workers
        self._timeout = timeout
        self._grace = grace
        self._on_error = on_error
        self._count: dict[str, Callable[[], None]] = {}
        self._observe: Callable[[float], None] | None = None
        self._retried: Callable[[], None] | None = None
        if metrics is not None:
            self._register_metrics(_Metrics.of(metrics))

    def _register_metrics(self, m: _Metrics) -> None:
        for result in ("success", "requeue", "temporary_error", "permanent_error", "error"):
            self._count[result] = m.total.labels(controller=self.name, result=result).inc
        self._observe = m.duration.labels(controller=self.name).observe
        self._retried = m.retries.labels(controller=self.name).inc
        queue = self._queue
        m.depth.labels(controller=self.name).set_function(lambda: len(queue))

    async def run(self, stop: asyncio.Event) -> None:
        """Reconcile until ``stop`` is set; then shut the queue down and drain the workers."""
        log.info("runner started", controller=self.name, workers=self._workers)
        tasks = [
            asyncio.create_task(self._work(), name=f"{self.name}-worker-{i}")
            for i in range(self._workers)
        ]
        try:
            await stop.wait()
            self._queue.shutdown()
            _, pending = await asyncio.wait(tasks, timeout=self._grace)
            if pending:
                log.warning(
                    "reconciles still running after grace, cancelling",
                    controller=self.name,
                    count=len(pending),
                    grace=self._grace,
                )
        finally:
            self._queue.shutdown()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            log.info("runner stopped", controller=self.name)

    async def _work(self) -> None:
        queue = self._queue
        while True:
            try:
                key = await queue.get()
            except QueueShutDown:
                return
            try:
                await self._process(key)
            finally:
                queue.done(key)

    async def _process(self, key: K) -> None:
        started = time.monotonic()
        try:
            result = await self._reconcile(key)
        except TemporaryError as exc:
            delay = self._retry(key)
            log.warning(
                "reconcile failed, will retry",
                controller=self.name,
                key=key,
                error=str(exc),
                retry_in=round(delay, 3),
                attempt=self._queue.num_requeues(key),
            )
            self._failed(key, exc, "temporary_error")
        except PermanentError as exc:
            self._queue.forget(key)
            log.error("reconcile failed permanently", controller=self.name, key=key, error=str(exc))
            self._failed(key, exc, "permanent_error")
        except _ReconcileTimeoutError as exc:
            delay = self._retry(key)
            log.warning(
                "reconcile timed out, will retry",
                controller=self.name,
                key=key,
                timeout=self._timeout,
                retry_in=round(delay, 3),
            )
            self._failed(key, exc, "error")
        except (KeyboardInterrupt, SystemExit):
            raise  # the process is going down; asyncio re-raises these from the loop
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError) and _being_cancelled():
                raise  # the worker itself is being cancelled (shutdown after grace)
            delay = self._retry(key)
            log.exception(
                "reconcile crashed, will retry",
                controller=self.name,
                key=key,
                error=repr(exc),
                retry_in=round(delay, 3),
            )
            self._failed(key, exc, "error")
        else:
            self._queue.forget(key)
            after = result.requeue_after
            if after:
                self._queue.add_after(key, after)
                self._counted("requeue")
            else:
                self._counted("success")
        finally:
            if self._observe is not None:
                self._observe(time.monotonic() - started)

    async def _reconcile(self, key: K) -> Result:
        """One reconcile under the timeout. A TimeoutError raised by the reconciler itself is
        not the runner's timeout: it passes through as an unexpected error."""
        timeout = asyncio.timeout(self._timeout)
        try:
            async with timeout:
                result = await self._reconciler.reconcile(key)
        except TimeoutError as exc:
            if timeout.expired():
                raise _ReconcileTimeoutError(f"reconcile took over {self._timeout}s") from exc
            raise
        if not isinstance(result, Result):
            raise TypeError(f"reconcile() must return a Result, got {type(result).__name__}")
        return result

    def _retry(self, key: K) -> float:
        delay = self._queue.add_rate_limited(key)
        if self._retried is not None:
            self._retried()
        return delay

    def _failed(self, key: K, exc: BaseException, result: str) -> None:
        self._counted(result)
        if self._on_error is None:
            return
        try:
            self._on_error(key, exc)
        except Exception:
            log.exception("on_error callback failed", controller=self.name, key=key)

    def _counted(self, result: str) -> None:
        count = self._count.get(result)
        if count is not None:
            count()


class _ReconcileTimeoutError(TimeoutError):
    """The runner's timeout for one reconcile expired (what ``on_error`` gets then)."""


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
