"""What the device tells the hub, gathered from edged's parts for each Hello and Status.

:class:`ReportGatherer` reads discovery's view of the device, the accepted desired state, each
workload's status, the hub source's problems and incoming revisions, each revision's measures,
validation and self-benchmark, sizing, the sandboxes in force and the drift watch's view, and
hands them to :func:`edged.hublink.devicereport.build_device_report` (pure).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from edged.hublink.devicereport import DeviceReport, SandboxReport, build_device_report
from edged.reconcile.sizing import Sizer
from edged.runtime.configreports import workload_config
from edged.runtime.workerpool import WorkerPool
from edged.serving.measuring import RevisionMeters, benchmark_of, validation_of
from edged.sources.hub import HubSource
from edged.state.desired import DesiredState
from edged.statusboard import StatusBoard
from edged.workloads import WorkloadName


class ReportGatherer:
    def __init__(
        self,
        *,
        device: Callable[[], Mapping[str, Any]],
        desired: DesiredState,
        board: StatusBoard,
        source: HubSource,
        meters: RevisionMeters,
        pool: WorkerPool,
        sizer: Sizer,
        compliance: Callable[[], dict[str, Any]],
        agent: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """``device``: discovery's status (``{}`` when discovery is off); ``board``: each
        workload's status; ``source``: the hub's desired state (its problems and incoming
        revisions); ``pool``: the replicas (validation, self-benchmark, sandboxes);
        ``compliance``: ``device.compliance`` of ``/v1/status``."""
        self._device = device
        self._desired = desired
        self._board = board
        self._source = source
        self._meters = meters
        self._pool = pool
        self._sizer = sizer
        self._compliance = compliance
        self._agent = agent

    def report(self) -> DeviceReport:
        report = self._report()
        if self._agent is None:
            return report
        doc = self._agent()
        doc.pop("changedAt", None)  # the hub hears of a change, not of every pass
        return replace(report, agent=doc)

    def _report(self) -> DeviceReport:
        pool = self._pool
        return build_device_report(
            self._device(),
            self._desired.workloads,
            self._board.workload_status,
            self._source.problems,
            self._source.incoming,
            measures_of=self._meters.of,
            validation_of=lambda w, rev: validation_of(pool.replicas(w), rev, self._written(w)),
            benchmark_of=lambda w, rev: benchmark_of(pool.replicas(w), rev),
            sizing_of=self._sizer.status,
            sandboxes_of=self.sandboxes_of,
            compliance=self.compliance(),
            config_of=lambda w: workload_config(
                self._source.config_status(w), pool.replicas(w), self._wanted(w)
            ),
        )

    def _wanted(self, workload: WorkloadName) -> str:
        """The revision (hash) the workload wants ("": not reconciled yet)."""
        st = self._board.workload_status(workload)
        return st.revision if st is not None else ""

    def _written(self, workload: WorkloadName) -> str:
        """The digest of the model config edged wrote for ``workload`` ("" none)."""
        return self._source.config_status(workload)[0]

    def compliance(self) -> dict[str, Any]:
        """``device.compliance`` without the time of the check: the hub hears of a change,
        not of every check."""
        doc = self._compliance()
        doc["checked"] = doc.pop("checkedAt") is not None
        doc["opensWatchReason"] = doc.pop("opensWatch")["reason"]  # not its counters
        return doc

    def sandboxes_of(self, workload: WorkloadName) -> tuple[SandboxReport, ...]:
        """What confines each replica of ``workload`` whose worker reported a sandbox in
        force, by revision and slot."""
        out = []
        for rep in sorted(self._pool.replicas(workload), key=lambda r: (r.revision, r.slot)):
            doc = rep.sandbox_status()
            if doc.get("inForce"):
                out.append(SandboxReport.of(rep.id, rep.revision, doc))
        return tuple(out)
