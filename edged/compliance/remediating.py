"""Doing what the baselines' drift action asks (:func:`edged.compliance.checking.plan_remediation`
decided), and the device's quarantine.

:meth:`Remediator.remediate` moves files added to the store into ``quarantine/``, has changed
blobs checked again (``rotten``: quarantined in the store, so their workloads fetch them again),
kills stray processes, and quarantines the device when the action says so: every replica stops
and none starts (:meth:`Remediator.quarantined_reason`) until an operator removes
``D/state/quarantine.json``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from edged.compliance.checking import Finding, Remediation
from edged.runtime.workerpool import WorkerPool
from edged.workloads import DesiredWorkload, WorkloadName
from edgefleet.artifacts.storing import ArtifactStore
from edgefleet.logs import get_logger
from edgefleet.persisting import read_json, write_json_atomic

log = get_logger(__name__)

REREAD_S = 1.0  # the quarantine file is read again (in a thread) at most this often


class Remediator:
    def __init__(
        self,
        quarantine_path: Path,
        store: ArtifactStore,
        pool: WorkerPool,
        *,
        workloads: Callable[[], Mapping[WorkloadName, DesiredWorkload]],
        findings: Callable[[], Sequence[Finding]],
        rotten: Callable[[WorkloadName, str], None],
        device_changed: Callable[[], None],
        enqueue_workloads: Callable[[], None],
    ) -> None:
        """``workloads``: the accepted desired state's; ``findings``: the drift watch's last;
        ``rotten(workload, sha256)``: have a blob checked and quarantined if its bytes changed;
        ``device_changed``: the device's status changed; ``enqueue_workloads``: every workload
        looks again (the quarantine was cleared)."""
        self.quarantine_path = quarantine_path
        self._store = store
        self._pool = pool
        self._workloads = workloads
        self._findings = findings
        self._rotten = rotten
        self._device_changed = device_changed
        self._enqueue_workloads = enqueue_workloads
        # the quarantine as last read from disk, read again in a thread at most every
        # REREAD_S when asked: the event loop (which answers inference, status and health
        # checks, and builds the status from this) never waits on the disk (a slow or stuck
        # disk held them all on this read of a file that is not there)
        self._reason = self._read_reason()
        self._read_at = time.monotonic()
        self._reading: asyncio.Task[None] | None = None

    def quarantined_reason(self) -> str | None:
        """Why this device is quarantined (drift under ``drift.action: quarantine``), until an
        operator removes ``D/state/quarantine.json`` (seen within :data:`REREAD_S` of a call,
        then every workload looks again)."""
        if time.monotonic() - self._read_at >= REREAD_S:
            self._read_again()
        return self._reason

    def _read_reason(self) -> str | None:
        try:
            doc = read_json(self.quarantine_path)
        except (OSError, ValueError):
            return f"quarantined ({self.quarantine_path} is unreadable)"
        if doc is None:
            return None
        reason = doc.get("reason", "?") if isinstance(doc, dict) else "?"
        return f"quarantined after drift: {reason} (clear: remove {self.quarantine_path})"

    def _read_again(self) -> None:
        if self._reading is not None and not self._reading.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (edged starting, a tool): read here
            self._set_reason(self._read_reason())
            return
        self._reading = loop.create_task(self._read_in_thread())

    async def _read_in_thread(self) -> None:
        self._set_reason(await asyncio.to_thread(self._read_reason))

    def _set_reason(self, reason: str | None) -> None:
        before, self._reason, self._read_at = self._reason, reason, time.monotonic()
        if before is not None and reason is None:
            log.info("quarantine cleared")
            self._enqueue_workloads()
        if before != reason:
            self._device_changed()

    def drift_changed(self) -> None:
        """The drift watch's view changed: status, and the workloads once the quarantine is
        cleared."""
        self._device_changed()
        self._read_again()

    def remediate(self, plan: Remediation) -> None:
        """Perform what the baselines' drift action asks (``plan_remediation`` decided)."""
        now = time.time()
        store, pool = self._store, self._pool
        for name in plan.remove_files:
            target = store.root / "quarantine" / f"{name}.{int(now)}"
            try:
                os.replace(store.root / "sha256" / name, target)
                log.warning("drift remediated", action="moved to quarantine", path=str(target))
            except OSError as exc:
                log.error("drift not remediated", path=name, error=str(exc))
        for sha in plan.requarantine_blobs:
            try:
                os.chmod(store.path_for(sha), 0o444)
            except OSError:
                pass  # gone or not ours: the check that follows finds out what it is
            users = {w.name for w in self._workloads().values() if w.sha256 == sha}
            users |= {r.workload for r in pool.replicas() if r.spec.artifact_sha256 == sha}
            for workload in sorted(users):
                self._rotten(workload, sha)
            for rep in pool.replicas():
                if rep.spec.artifact_sha256 == sha and rep.pid is not None:
                    pool.kill(rep.id, "ArtifactChanged", f"blob {sha} changed on disk")
        for pid in plan.kill_pids:
            try:
                os.kill(pid, signal.SIGKILL)
                log.warning("drift remediated", action="killed process", pid=pid)
            except ProcessLookupError:
                log.info("drift not remediated", pid=pid, reason="the process is gone")
            except OSError as exc:
                log.error("drift not remediated", pid=pid, error=str(exc))
        if plan.quarantine and self._reason is None:
            reason = "; ".join(f.message for f in self._findings()[:4])
            write_json_atomic(self.quarantine_path, {"at": now, "reason": reason})
            self._reason, self._read_at = self._read_reason(), time.monotonic()
            log.error("device quarantined", reason=reason)
            for rep in pool.replicas():
                pool.stop(rep.id)
            self._device_changed()
