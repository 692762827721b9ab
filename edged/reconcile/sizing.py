"""The sizing component: samples the workers, runs the autoscaler and the eviction (both pure),
and hands the replica count each workload wants now to the workload reconciler.

Every ``[scaling] samplePeriod`` while some workload has ``spec.scaling`` or an eviction floor
is configured; otherwise it sleeps until the desired state changes (no wake-ups). A sample per
workload: requests in flight from :class:`~edged.runtime.sampling.QueueMeter`, CPU of the
ready workers from ``/proc/<pid>/stat``, their resident memory; ``MemAvailable`` once. With
an eviction floor, the rows per batch of each batching replica follow the memory above it
(``batchsizing.py``), then eviction runs (``evicting.py``). A
change of a workload's count is logged with its figures and enqueues the workload's key: the
planner does the rest (new slots start, extra ones drain and stop).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from edged.reconcile.batchsizing import effective_batch, row_bytes, shape_row_bytes
from edged.reconcile.evicting import (
    Candidate,
    EvictionPolicy,
    EvictionState,
    plan_eviction,
)
from edged.reconcile.model import Phase
from edged.runtime.processes import Replica
from edged.runtime.sampling import QueueMeter, cpu_seconds, mem_available, rss_bytes
from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.api.conditions import Condition, ConditionStatus
from edgefleet.autoscaler import (
    Bounds,
    LoadSample,
    ScalerState,
    autoscale,
    initial_state,
)
from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop

REPORT_FIGURES_EVERY_S = 5.0
log = get_logger(__name__)


def _cpu_cost(w: DesiredWorkload) -> int:
    """Millicores one replica may use: its cpu request, else one core per intra-op thread."""
    spec = w.deployment.spec
    return spec.resources.cpu_millis or (spec.runtime.intra_op_threads or 1) * 1000


class Sizer:
    """Keeps, per workload, the replica count the autoscaler and eviction want."""

    name = "sizing"

    def __init__(
        self,
        *,
        workloads: Callable[[], Mapping[WorkloadName, DesiredWorkload]],
        replicas: Callable[[WorkloadName], list[Replica]],
        enqueue: Callable[[WorkloadName], None],
        period_s: float,
        eviction: EvictionPolicy | None,
        cpu_count: int,
        clock: Callable[[], float] = time.monotonic,
        read_available: Callable[[], int | None] = mem_available,
    ) -> None:
        self._workloads = workloads
        self._replicas = replicas
        self._enqueue = enqueue
        self._period = period_s
        self._policy = eviction
        self._cpu_count = cpu_count
        self._clock = clock
        self._read_available = read_available
        self.meter = QueueMeter()
        self._scalers: dict[WorkloadName, ScalerState] = {}
        self._eviction = EvictionState()
        self._cpu_seen: dict[int, tuple[float, float]] = {}  # pid -> (cpu seconds, at)
        self._replica_bytes: dict[WorkloadName, int] = {}  # most RSS seen of one replica
        self._available: int | None = None
        self._decided_at: dict[WorkloadName, float] = {}  # wall time of the last decision
        self._ready_rss: dict[int, int] = {}  # pid -> resident memory when first seen ready
        self._growth: dict[WorkloadName, int] = {}  # most RSS growth of a replica since ready
        # memory-aware batching: workload -> (declared, effective, bytes per row)
        self._batches: dict[WorkloadName, tuple[int, int, int]] = {}
        # the figures the hub gets (its fleet autoscaler): (taken at, in flight per replica,
        # CPU %), refreshed at most every REPORT_FIGURES_EVERY_S so the report stays steady
        self._reported: dict[WorkloadName, tuple[float, float | None, float | None]] = {}
        self._wake = asyncio.Event()

    # -- for the other parts ------------------------------------------------------------------
    def desired_changed(self) -> None:
        """The desired state changed: forget workloads no longer scaled (a later
        ``spec.scaling`` starts afresh from the spec's count), start sampling if something
        now needs it."""
        workloads = self._workloads()
        for name in list(self._scalers):
            w = workloads.get(name)
            if w is None or w.deployment.spec.scaling is None:
                del self._scalers[name]
                self._reported.pop(name, None)
                self._decided_at.pop(name, None)
        for seen in (self._replica_bytes, self._growth, self._batches):
            for name in set(seen) - set(workloads):
                del seen[name]
        self._wake.set()

    def size(
        self, name: WorkloadName, desired: DesiredWorkload
    ) -> tuple[int | None, tuple[Condition, ...]]:
        """The replicas ``name`` wants now (None: the spec's count) and why."""
        base = self._base(name, desired)
        evicted = self._eviction.evicted.get(name, 0)
        if not evicted:
            return (base if desired.deployment.spec.scaling is not None else None), ()
        want = max(0, base - evicted)
        return want, (
            Condition(
                "Evicted",
                ConditionStatus.TRUE,
                "MemoryPressure",
                f"{evicted} of {base} replica(s) stopped while the device is short of memory "
                "(lowest priority first); they start again when memory comes back",
            ),
        )

    def _reported_figures(self, name: WorkloadName, sample: LoadSample | None) -> dict[str, Any]:
        """The load figures for the hub (``queueDepth``: requests in flight per ready
        replica, ``cpu``: %), the latest sample's, refreshed at most every
        ``REPORT_FIGURES_EVERY_S`` and rounded, so steady load is not a report per sample."""
        now = self._clock()
        held = self._reported.get(name)
        if sample is not None and (held is None or now - held[0] >= REPORT_FIGURES_EVERY_S):
            per = round(sample.inflight / sample.ready, 1) if sample.ready else None
            cpu = round(sample.cpu_percent) if sample.cpu_percent is not None else None
            held = (now, per, cpu)
            self._reported[name] = held
        if held is None:
            return {"queueDepth": None, "cpu": None}
        return {"queueDepth": held[1], "cpu": held[2]}

    def status(self, name: WorkloadName) -> dict[str, Any] | None:
        """``scaling`` and ``eviction`` of a workload for /v1/status (None: neither applies)."""
        desired = self._workloads().get(name)
        if desired is None:
            return None
        out: dict[str, Any] = {}
        spec = desired.deployment.spec
        state = self._scalers.get(name)
        if spec.scaling is not None:
            sample = state.last_sample if state is not None else None
            last = state.last if state is not None else None
            out["reported"] = self._reported_figures(name, sample)
            out["scaling"] = {
                "minReplicas": spec.scaling.min_replicas,
                "maxReplicas": spec.scaling.max_replicas,
                "currentReplicas": sum(1 for r in self._replicas(name) if r.phase is Phase.READY),
                "desiredReplicas": self._base(name, desired),
                "inflightPerReplica": (
                    round(sample.inflight / sample.ready, 2) if sample and sample.ready else None
                ),
                "cpuPercent": (
                    round(sample.cpu_percent, 1)
                    if sample and sample.cpu_percent is not None
                    else None
                ),
                "lastDecision": (
                    {**last.to_json(), "at": self._decided_at.get(name)}
                    if last is not None
                    else None
                ),
            }
        batch = self._batches.get(name)
        if batch is not None:
            out["batching"] = {
                "maxBatchSize": batch[0],
                "effectiveMaxBatchSize": batch[1],
                "rowBytes": batch[2],
            }
        if self._policy is not None:
            out["eviction"] = {
                "priority": spec.effective_priority,
                "evictedReplicas": self._eviction.evicted.get(name, 0),
                "replicaBytes": self._replica_bytes.get(name),
            }
        return out or None

    def device_status(self) -> dict[str, Any] | None:
        """The device's memory as eviction sees it (None: eviction is off)."""
        if self._policy is None:
            return None
        return {
            "memoryAvailableFloor": self._policy.floor_bytes,
            "memoryAvailable": self._available,
            "underPressure": self._available is not None
            and self._available < self._policy.floor_bytes,
        }

    # -- the loop -----------------------------------------------------------------------------
    def _active(self) -> bool:
        return self._policy is not None or any(
            w.deployment.spec.scaling is not None for w in self._workloads().values()
        )

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self._active():
                self.tick()
                await wait_for_stop(stop, self._period)
                continue
            self._wake.clear()
            waits = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()

    def tick(self) -> None:
        """One sample of every workload: autoscale, then evict or restore."""
        now = self._clock()
        workloads = self._workloads()
        scaled = {n: w for n, w in workloads.items() if w.deployment.spec.scaling is not None}
        self.meter.watch(scaled)
        for name in set(self._scalers) - set(scaled):
            del self._scalers[name]
            self._decided_at.pop(name, None)
        seen_pids: set[int] = set()
        self._available = self._read_available()
        for name in workloads:
            for r in self._replicas(name):
                if r.pid is not None and r.phase is Phase.READY:
                    seen_pids.add(r.pid)
                    rss = rss_bytes(r.pid)
                    if rss is None:
                        continue
                    if rss > self._replica_bytes.get(name, 0):
                        self._replica_bytes[name] = rss
                    growth = rss - self._ready_rss.setdefault(r.pid, rss)
                    if growth > self._growth.get(name, 0):
                        self._growth[name] = growth
        for name, w in scaled.items():
            self._autoscale(name, w, workloads, now, seen_pids)
        for pid in set(self._cpu_seen) - seen_pids:
            del self._cpu_seen[pid]
        for pid in set(self._ready_rss) - seen_pids:
            del self._ready_rss[pid]
        if self._policy is not None:
            self._limit_batches(workloads)
            self._evict(workloads, now)

    def _base(self, name: WorkloadName, w: DesiredWorkload) -> int:
        spec = w.deployment.spec
        if spec.scaling is None:
            return spec.replicas.count_on_device()
        state = self._scalers.get(name)
        if state is None:
            state = self._scalers[name] = initial_state(
                spec.scaling, spec.replicas.count_on_device(), self._clock()
            )
        return state.current

    def _autoscale(
        self,
        name: WorkloadName,
        w: DesiredWorkload,
        workloads: Mapping[WorkloadName, DesiredWorkload],
        now: float,
        seen_pids: set[int],
    ) -> None:
        scaling = w.deployment.spec.scaling
        assert scaling is not None
        reps = self._replicas(name)
        started = [
            t0 for r in reps if r.channel is not None for _, t0 in r.channel.pending.values()
        ]
        inflight = self.meter.sample(name, started)
        ready = [r for r in reps if r.phase is Phase.READY and r.pid is not None]
        used = share = 0.0
        measured = False
        for r in ready:
            assert r.pid is not None
            seen_pids.add(r.pid)
            cpu = cpu_seconds(r.pid)
            if cpu is None:
                continue
            before = self._cpu_seen.get(r.pid)
            self._cpu_seen[r.pid] = (cpu, now)
            if before is None or now <= before[1]:
                continue
            measured = True
            used += cpu - before[0]
            cores = (r.spec.limits.cpu_millis or r.spec.intra_op_threads * 1000) / 1000
            share += cores * (now - before[1])
        cpu_percent = 100.0 * used / share if measured and share > 0 else None
        sample = LoadSample(len(ready), inflight, cpu_percent)
        state = self._scalers.get(name)
        if state is None:
            self._base(name, w)
            state = self._scalers[name]
        state, decision = autoscale(scaling, state, sample, self._bounds(name, w, workloads), now)
        self._scalers[name] = state
        if decision is not None:
            self._decided_at[name] = round(time.time(), 3)
            log.info(
                "replicas scaled",
                workload=name,
                replicas_from=decision.from_replicas,
                replicas_to=decision.to_replicas,
                reason=decision.reason,
                message=decision.message,
                inflight=round(inflight, 2),
                ready=len(ready),
                cpu_percent=None if cpu_percent is None else round(cpu_percent, 1),
            )
            self._enqueue(name)

    def _limit_batches(self, workloads: Mapping[WorkloadName, DesiredWorkload]) -> None:
        """Memory-aware batching: each batching replica's rows per batch, from the memory
        above the eviction floor shared by all of them (``batchsizing.py``)."""
        assert self._policy is not None
        if self._available is None:
            return
        batching = [
            (name, r)
            for name in workloads
            for r in self._replicas(name)
            if r.phase is Phase.READY and (r.metadata.get("batching") or {}).get("batchable")
        ]
        for name in set(self._batches) - {name for name, _ in batching}:
            del self._batches[name]
        for name, r in batching:
            declared = int(r.metadata["batching"]["maxBatchSize"])
            estimate = shape_row_bytes(
                r.metadata.get("inputs") or (), r.metadata.get("outputs") or ()
            )
            per_row = row_bytes(estimate, self._growth.get(name, 0), declared)
            rows = effective_batch(
                declared,
                available=self._available,
                reserve=self._policy.floor_bytes,
                sharing=len(batching),
                per_row=per_row,
            )
            if rows != (r.batch_limit or declared):
                r.limit_batch(rows)
            before = self._batches.get(name)
            self._batches[name] = (declared, rows, per_row)
            if before is not None and before[1] != rows:
                log.info(
                    "batch size changed",
                    workload=name,
                    rows_from=before[1],
                    rows_to=rows,
                    declared=declared,
                    memory_available=self._available,
                    floor=self._policy.floor_bytes,
                    row_bytes=per_row,
                    replicas=len(batching),
                )

    def _wanted(self, name: WorkloadName, w: DesiredWorkload) -> int:
        return self._base(name, w)

    def _bounds(
        self,
        name: WorkloadName,
        w: DesiredWorkload,
        workloads: Mapping[WorkloadName, DesiredWorkload],
    ) -> Bounds:
        others = sum(
            _cpu_cost(o) * max(0, self._wanted(n, o) - self._eviction.evicted.get(n, 0))
            for n, o in workloads.items()
            if n != name
        )
        cpu = max(0, self._cpu_count * 1000 - others) // _cpu_cost(w)
        memory = None
        per = max(w.deployment.spec.resources.memory_bytes or 0, self._replica_bytes.get(name, 0))
        if per > 0 and self._available is not None:
            reserve = self._policy.floor_bytes if self._policy is not None else 0
            running = sum(1 for r in self._replicas(name) if r.phase is not Phase.EXITED)
            memory = running + max(0, self._available - reserve) // per
        return Bounds(cpu=cpu, memory=memory)

    def _evict(self, workloads: Mapping[WorkloadName, DesiredWorkload], now: float) -> None:
        assert self._policy is not None
        candidates = [
            Candidate(
                name,
                w.deployment.spec.effective_priority,
                self._wanted(name, w),
                self._replica_bytes.get(name),
            )
            for name, w in workloads.items()
        ]
        self._eviction, events = plan_eviction(
            self._policy, self._eviction, candidates, self._available, now
        )
        for e in events:
            if e.kind == "evicted":
                log.warning("replica evicted", workload=e.workload, message=e.message)
            elif e.kind == "restored":
                log.info("replica restored", workload=e.workload, message=e.message)
            else:
                log.warning("nothing to evict", message=e.message)
            if e.workload:
                self._enqueue(WorkloadName(e.workload))
