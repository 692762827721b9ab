"""What edged's runners run: the workload reconciler, the static source's, and the resync.

Each gets the few functions it needs, not the daemon: the workload reconciler observes the
pool and the store, plans (pure, ``planning.py``), records the planned status and applies;
the static source's reads the manifests directory and hands the result on. They return a
:class:`~edged.reconcile.running.Result` or raise; the runner owns every retry.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager

from edged.discovery.providers import ProviderSelection
from edged.reconcile.model import (
    Action,
    ObservedWorkload,
    PrecisionChoice,
    ProviderChoice,
    ReplicaObservation,
    WorkloadStatus,
)
from edged.reconcile.planning import plan
from edged.reconcile.precision import PowerState, choose_precision
from edged.reconcile.running import Result
from edged.sources.static import StaticManifests, SyncResult
from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.api.conditions import Condition
from edgefleet.artifacts.variants import variants_of
from edgefleet.errors import TemporaryError
from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop

STATIC_KEY = "static"  # the static source runner's one key
log = get_logger("edged.reconcile")

SelectProviders = Callable[[Sequence[str], str | None], ProviderSelection]
# the replicas a workload wants now (autoscaler, eviction) and why; None: the spec's count
SizeWorkload = Callable[[WorkloadName, DesiredWorkload], tuple[int | None, tuple[Condition, ...]]]


class WorkloadReconciler:
    """Reconciles one workload: observe, plan (pure), record the status, apply."""

    def __init__(
        self,
        *,
        desired: Callable[[WorkloadName], DesiredWorkload | None],
        observe: Callable[[WorkloadName], tuple[ReplicaObservation, ...]],
        has_artifact: Callable[[str], bool],
        select_providers: SelectProviders | None,
        quarantined: Callable[[str], bool] = lambda sha256: False,
        record_status: Callable[[WorkloadName, WorkloadStatus | None], None],
        apply: Callable[[DesiredWorkload | None, tuple[Action, ...]], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
        size: SizeWorkload | None = None,
        power: Callable[[], PowerState] | None = None,
    ) -> None:
        """``select_providers``: discovery's choice of execution providers (None: discovery
        is off, the spec's list as is); ``size``: the replica count of the autoscaler and
        eviction (None: the spec's count); ``power``: the device's local time and battery,
        for ``runtime.precision`` and ``spec.power`` (None: the model file is served)."""
        self._power = power
        self._precisions: dict[WorkloadName, PrecisionChoice] = {}
        self._desired = desired
        self._observe = observe
        self._has_artifact = has_artifact
        self._quarantined = quarantined
        self._select = select_providers
        self._record = record_status
        self._apply = apply
        self._clock = clock
        self._size = size

    async def reconcile(self, key: WorkloadName) -> Result:
        desired = self._desired(key)
        present = self._has_artifact(desired.sha256) if desired is not None else True
        wanted, why = (
            (None, ()) if self._size is None or desired is None else self._size(key, desired)
        )
        observed = ObservedWorkload(
            replicas=self._observe(key),
            artifact_present=present,
            artifact_quarantined=not present
            and desired is not None
            and self._quarantined(desired.sha256),
            providers=self._choose_providers(desired),
            wanted_replicas=wanted,
            sizing_conditions=why,
            precision=self._choose_precision(key, desired),
        )
        p = plan(key, desired, observed, self._clock())
        self._record(key, p.status)
        await self._apply(desired, p.actions)
        return Result(requeue_after=p.requeue_after)

    def _choose_precision(
        self, key: WorkloadName, desired: DesiredWorkload | None
    ) -> PrecisionChoice | None:
        """The precision variant to serve now; logs each change (an event with the reason)."""
        spec = desired.deployment.spec if desired is not None else None
        if (
            self._power is None
            or desired is None
            or spec is None
            or (spec.power is None and spec.runtime.precision is None)
        ):
            self._precisions.pop(key, None)
            return None
        choice = choose_precision(spec, variants_of(desired.sha256, desired.extras), self._power())
        last = self._precisions.get(key)
        if last is None or (last.sha256, last.reason, last.conditions) != (
            choice.sha256,
            choice.reason,
            choice.conditions,
        ):
            log.info(
                "precision chosen",
                workload=key,
                precision=choice.precision,
                reason=choice.reason,
                because=choice.message,
            )
            for cond in choice.conditions:
                log.warning(
                    "precision variant missing",
                    workload=key,
                    reason=cond.reason,
                    detail=cond.message,
                )
        self._precisions[key] = choice
        return choice

    def _choose_providers(self, desired: DesiredWorkload | None) -> ProviderChoice | None:
        if self._select is None or desired is None:
            return None
        spec = desired.deployment.spec
        sel = self._select(spec.runtime.execution_providers, spec.resources.accelerator)
        return ProviderChoice(sel.providers, sel.fell_back, sel.message)


class StaticSourceReconciler:
    """Reads the manifests directory (in a thread) and hands the result to ``accept``.

    ``current``: the static workloads accepted so far (a file that became invalid keeps its
    own); ``syncing``: held while the directory is read (no garbage collection meanwhile).
    """

    def __init__(
        self,
        source: StaticManifests,
        *,
        current: Callable[[], Mapping[WorkloadName, DesiredWorkload]],
        syncing: Callable[[], AbstractContextManager[None]],
        accept: Callable[[SyncResult], Awaitable[None]],
    ) -> None:
        self._source = source
        self._current = current
        self._syncing = syncing
        self._accept = accept

    async def reconcile(self, key: str) -> Result:
        current = dict(self._current())
        with self._syncing():
            result = await asyncio.to_thread(self._source.sync, current)
        await self._accept(result)
        if result.retryable:
            raise TemporaryError("some manifests refer to model files that cannot be read yet")
        return Result()


class Resync:
    """The safety net of level-triggered control: every key is looked at periodically."""

    name = "resync"

    def __init__(self, enqueue_all: Callable[[], None], period: float) -> None:
        self._enqueue_all = enqueue_all
        self._period = period

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if not await wait_for_stop(stop, self._period):
                self._enqueue_all()
