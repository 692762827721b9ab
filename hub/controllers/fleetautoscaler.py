"""The fleet autoscaler controller (component ``autoscaler``): every ``period`` it reads what
the devices holding each scaled ``replicas.total`` deployment report (the cache), runs the pure
:func:`hub.decide.autoscale.plan_totals`, records each decision as an event on the deployment
(with the figures that caused it), and writes the totals to the cache
(:meth:`hub.state.cache.Cache.set_scaled_totals`): the change feed tells the scheduler of each
deployment whose total changed (:data:`hub.state.feed.SCALED`), and it places
``cache.scaled_totals`` instead of the spec's ``replicas.total``. Neither knows the other.

Periodic, not per key: its decisions are over windows of samples taken at a steady pace (the
devices refresh their figures every :data:`PERIOD_S`), so time, not a change, is what it
reacts to. A tick reads only the scaled deployments and the devices placed for them.

Its state (the recommendations of the windows, the totals) is in memory: a restarted hub
starts again from the spec's totals, and a window must be covered by new samples before it
scales (the autoscaler's own rule), so a restart never scales down at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from edgefleet.logs import get_logger
from edgefleet.supervising import wait_for_stop
from hub.decide.autoscale import DeviceLoad, FleetScaler, plan_totals, scaled
from hub.state.cache import Cache
from hub.state.writer import DeviceWriter

log = get_logger(__name__)

PERIOD_S = 5.0  # the devices refresh their figures this often (edged REPORT_FIGURES_EVERY_S)


class FleetAutoscaler:
    name = "autoscaler"

    def __init__(
        self,
        cache: Cache,
        writer: DeviceWriter,
        *,
        period_s: float = PERIOD_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._cache = cache
        self._writer = writer
        self._period = period_s
        self._clock = clock
        self._scalers: dict[str, FleetScaler] = {}

    @property
    def totals(self) -> dict[str, int]:
        """The totals the scheduler places instead of the spec's (the cache's), by
        deployment."""
        return self._cache.scaled_totals

    def total(self, name: str) -> int | None:
        """The total the scheduler places for ``name`` (None: the spec's)."""
        return self._cache.scaled_totals.get(name)

    async def run(self, stop: asyncio.Event) -> None:
        while not await wait_for_stop(stop, self._period):
            self.tick()

    def tick(self) -> bool:
        """One sample of every scaled deployment; whether a total changed."""
        cache = self._cache
        deployments = [d for d in cache.deployments.values() if scaled(d)]
        loads: dict[str, list[DeviceLoad]] = {}
        for dep in deployments:
            name = dep.metadata.name
            for device_name in sorted(cache.placements.get(name, ())):
                device = cache.devices.get(device_name)
                report = device.workloads.get(name) if device is not None else None
                if report is None:
                    continue
                sizing = report.sizing or {}
                loads.setdefault(name, []).append(
                    DeviceLoad(
                        device_name,
                        report.ready_replicas,
                        _figure(sizing.get("queueDepth")),
                        _figure(sizing.get("cpuPercent")),
                    )
                )
        result = plan_totals(deployments, loads, self._scalers, self._clock())
        self._scalers = dict(result.scalers)
        spec = {d.metadata.name: d.spec.replicas.total for d in deployments}
        changed = any(
            total != self.totals.get(name, spec[name]) for name, total in result.totals.items()
        )
        for name, decision in result.decisions:
            self._writer.event(
                "ModelDeployment",
                name,
                "Normal",
                decision.reason,
                f"replicas.total {decision.from_replicas} -> {decision.to_replicas}: "
                f"{decision.message}",
            )
            log.info(
                "fleet replicas scaled",
                deployment=name,
                reason=decision.reason,
                replicas_from=decision.from_replicas,
                replicas_to=decision.to_replicas,
                detail=decision.message,
            )
        # those other than the spec's; the change feed wakes the scheduler for each changed
        self._cache.set_scaled_totals(
            {name: total for name, total in result.totals.items() if total != spec[name]}
        )
        return changed


def _figure(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None
