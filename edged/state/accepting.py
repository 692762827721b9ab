"""Accepting desired state: the merge of the sources becomes the accepted desired state.

The static source hands over each read of its directory (:meth:`Acceptor.static_read`); the
hub's accepted state is read through ``hub`` whenever :meth:`Acceptor.accept` runs (the hub
link calls it once a state from the hub is persisted). :func:`merge_sources` decides (pure),
:meth:`DesiredState.replace` persists, then ``on_accepted(merged, changed)`` lets the daemon
act on it (health policies, routes, the workload keys that changed).
"""

from __future__ import annotations

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

    def static_read(
        self,
        workloads: Mapping[WorkloadName, DesiredWorkload],
        policies: Sequence[DeviceHealthPolicy],
        baselines: Sequence[SecurityBaseline] = (),
    ) -> None:
        """The static source read its directory: accept the merge with what it gave."""
        self._static = SourceState(dict(workloads), tuple(policies), tuple(baselines))
        self.accept()

    def accept(self) -> None:
        """Merge the sources, persist the result, and hand it on."""
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
        changed = self._desired.replace(merged.workloads)
        if changed:
            log.info(
                "desired state accepted",
                generation=self._desired.generation,
                changed=",".join(sorted(changed)),
            )
        self._on_accepted(merged, changed)
