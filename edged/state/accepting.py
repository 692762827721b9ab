"""Accepting desired state: the merge of the sources becomes the accepted desired state.

The static source hands over each read of its directory (:meth:`Acceptor.static_read`); the
hub's accepted state is read through ``hub`` whenever :meth:`Acceptor.accept` runs (the hub
link calls it once a state from the hub is persisted). :func:`merge_sources` decides (pure),
:meth:`DesiredState.replace` persists, then ``on_accepted(merged, changed)`` lets the daemon
act on it (health policies, routes, the workload keys that changed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

from edged.state.desired import DesiredState
from edged.state.merging import MergedState, NameConflict, SourceState, merge_sources
from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.api import DeviceHealthPolicy, SecurityBaseline
from edgefleet.logs import get_logger

log = get_logger(__name__)

OnAccepted = Callable[[MergedState, set[WorkloadName]], None]


class Acceptor:
    def __init__(
        self,
        desired: DesiredState,
        *,
        static_read: bool,
        hub: Callable[[], SourceState] | None,
        on_accepted: OnAccepted,
    ) -> None:
        """``static_read``: False while a static source has yet to read its directory (the
        accepted static workloads stand in for it); True when there is none."""
        self._desired = desired
        self._static: SourceState | None = SourceState({}) if static_read else None
        self._hub = hub
        self._on_accepted = on_accepted
        self._conflicts: tuple[NameConflict, ...] = ()
        self._lock = asyncio.Lock()

    def static_read(
        self,
        workloads: Mapping[WorkloadName, DesiredWorkload],
        policies: Sequence[DeviceHealthPolicy],
        baselines: Sequence[SecurityBaseline] = (),
    ) -> None:
        """The static source read its directory: accept the merge with what it gave."""
        self._static = SourceState(dict(workloads), tuple(policies), tuple(baselines))
        self.accept()

    async def static_read_in_thread(
        self,
        workloads: Mapping[WorkloadName, DesiredWorkload],
        policies: Sequence[DeviceHealthPolicy],
        baselines: Sequence[SecurityBaseline] = (),
    ) -> None:
        """:meth:`static_read`, accepted with :meth:`accept_in_thread`."""
        self._static = SourceState(dict(workloads), tuple(policies), tuple(baselines))
        await self.accept_in_thread()

    def accept(self) -> None:
        """Merge the sources, persist the result, and hand it on (edged starting: before the
        event loop serves anything)."""
        merged = self._merge()
        self._accepted(merged, self._desired.replace(merged.workloads))

    async def accept_in_thread(self) -> None:
        """:meth:`accept`, the desired state written in a thread (the event loop, which answers
        inference and health checks, never waits on the disk), one acceptance at a time; the
        merge is made when this one's turn comes, so it holds the sources' latest."""
        async with self._lock:
            merged = self._merge()
            self._accepted(merged, await self._desired.replace_in_thread(merged.workloads))

    def _merge(self) -> MergedState:
        merged = merge_sources(
            self._static, self._hub() if self._hub is not None else None, self._desired.workloads
        )
        for c in merged.conflicts:
            if c not in self._conflicts:
                log.warning(
                    "workload defined by both sources, the static one runs",
                    workload=c.name,
                    kept=c.kept,
                    dropped=c.dropped,
                )
        self._conflicts = merged.conflicts
        return merged

    def _accepted(self, merged: MergedState, changed: set[WorkloadName]) -> None:
        if changed:
            log.info(
                "desired state accepted",
                generation=self._desired.generation,
                changed=",".join(sorted(changed)),
            )
        self._on_accepted(merged, changed)
