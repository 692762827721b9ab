"""The agent controller: applies edged.agent.planning's step (docs/agent-updates.md, "On the
device"). Level-triggered: each pass re-reads what the hub asks (DesiredState.agent), what
runs (the version, the launcher's slot and trial), launcher.json and the installed slots, and
does the one next step; its work queue (one key) owns the retries.

An update: Downloading (the injected fetch verifies and streams the release: edged.hublink.
agentreleases) -> Installing (edged.agent.installing, into the inactive slot) -> SmokeTesting
(the new slot's ``edged check``) -> Switching (``request.json`` for the launcher, with the
workloads serving now, then edged exits; the launcher starts the trial) -> Trying (the new
edged commits once healthy: ``EDGED_COMMIT=1`` to the launcher) -> Committed, or RolledBack
by the launcher with its reason. A refusal (a release this device cannot run, one that fails
its smoke test) is Failed for that upgrade revision and recorded in ``D/agent/agent.json``:
not retried until the hub asks for another version or revision.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edged.agent.installing import InstallRefused, Platform, install_release
from edged.agent.planning import (
    PACKAGE,
    AbortTrial,
    Commit,
    Desired,
    Health,
    LauncherView,
    Outcome,
    Phase,
    Report,
    Running,
    SwitchTo,
    Update,
    WaitHealthy,
    plan,
)
from edged.agent.smoketesting import smoke_test
from edged.launcher.state import SLOTS, read_state, slot_version
from edged.reconcile.running import Result
from edged.state import formats
from edgefleet.errors import ArtifactError, StateError, TemporaryError
from edgefleet.logs import get_logger
from edgefleet.persisting import read_json, write_json_atomic
from edgefleet.versioning import source_tree_version

if TYPE_CHECKING:
    from edged.hublink.agentreleases import FetchRelease
    from edgefleet.v1 import device_pb2

log = get_logger(__name__)

KEY = "agent"
RESYNC_S = 30.0
TRIAL_POLL_S = 1.0
MAX_MESSAGE = 1024


def desired_of(agent: device_pb2.DesiredAgent | None) -> Desired | None:
    """DesiredState.agent as plain data (None: the hub asks for nothing)."""
    if agent is None or not agent.version:
        return None
    deadline = agent.commit_deadline.ToTimedelta().total_seconds() if agent.HasField(
        "commit_deadline"
    ) else 300.0  # fmt: skip
    return Desired(
        version=agent.version,
        upgrade=agent.upgrade,
        upgrade_revision=agent.upgrade_revision,
        commit_deadline_s=min(max(deadline, 10.0), 86400.0),
        max_tries=min(max(agent.max_tries or 3, 1), 100),
    )


def package_version(data_dir: Path, running: str, slot: str) -> str:
    """The base install's edged version (what the package slot runs)."""
    if slot in ("", PACKAGE):
        return running
    slots = str(data_dir / "agent" / "slots")
    for entry in sys.path:
        if not entry or entry.startswith(slots) or not (Path(entry) / "edgefleet").is_dir():
            continue
        found = source_tree_version(Path(entry))
        if found:
            return found
        from importlib import metadata  # here: ~2 MiB that a source tree never needs

        for dist in metadata.distributions(name="edgefleet", path=[entry]):
            return str(dist.version)
    return ""


class AgentController:
    """The device side of edged's self-update; ``reconcile`` is run by a Runner."""

    def __init__(
        self,
        data_dir: Path,
        *,
        version: str,
        config_path: Path | None,
        notify: Callable[[str], bool],
        fetch: FetchRelease | None,
        health: Callable[[], Health],
        serving: Callable[[], set[str]],
        request_stop: Callable[[str], None],
        enqueue: Callable[[], None] = lambda: None,
        environ: Mapping[str, str] | None = None,
        install: Callable[..., Any] = install_release,
        smoke: Callable[..., Awaitable[None]] = smoke_test,
        clock: Callable[[], float] = time.time,
    ) -> None:
        env = os.environ if environ is None else environ
        self.data_dir = data_dir
        self.agent_dir = data_dir / "agent"
        self.config_path = config_path
        self._notify = notify
        self._fetch = fetch
        self._health = health
        self._serving = serving
        self._request_stop = request_stop
        self._enqueue = enqueue
        self._install = install
        self._smoke = smoke
        self._clock = clock
        slot = env.get("EDGED_SLOT", "")
        self.running = Running(
            version=version,
            slot=slot if slot in (PACKAGE, *SLOTS) else "",
            trial=env.get("EDGED_TRIAL") == "1",
            package_version=package_version(data_dir, version, slot),
        )
        self.platform = Platform.of_this_device()
        self.desired: Desired | None = None
        self._desired_proto: device_pb2.DesiredAgent | None = None
        self.failed = self._load_failed()
        self.phase, self.reason, self.message = Phase.IDLE, "", ""
        self.changed_at = clock()
        self.bytes_done = self.bytes_total = 0
        self._view = LauncherView()
        self._stopping = False
        self._observe_at_start()

    def _observe_at_start(self) -> None:
        """The phase launcher.json gives before the first pass (the status socket opens
        before the controllers start): a rollback or commit is said from the first answer."""
        step = plan(None, self.running, self._read_view(), Health(False, False, False), self.failed)
        if isinstance(step, Report):
            self._set(step.phase, step.reason, step.message)
        elif isinstance(step, WaitHealthy):
            self._set(Phase.TRYING, "WaitingForHealth", step.missing)

    def _read_view(self) -> LauncherView:
        state, problem = read_state(self.agent_dir / "launcher.json")
        if problem:
            log.warning("launcher state", problem=problem)
        slots = {s: v for s in SLOTS if (v := slot_version(self.data_dir, s))}
        self._view = LauncherView.of(state, slots)
        return self._view

    def set_fetch(self, fetch: FetchRelease | None) -> None:
        self._fetch = fetch

    def progress(self, done: int, total: int) -> None:
        """The download's progress (the fetch calls it once the metadata verified), for
        AgentStatus.bytes_done/total."""
        self.bytes_done, self.bytes_total = done, total
        if self.phase == Phase.VERIFYING:
            self._set(Phase.DOWNLOADING, "", f"downloading {total} bytes")

    # -- inputs ---------------------------------------------------------------------------
    def desired_changed(self, agent: device_pb2.DesiredAgent | None) -> None:
        """The hub's DesiredState.agent (from each DesiredState the link accepts)."""
        desired = desired_of(agent)
        self._desired_proto = agent  # the newest signed metadata, even for the same version
        if desired != self.desired:
            self.desired = desired
            self._enqueue()

    def _load_failed(self) -> Outcome | None:
        try:
            doc = read_json(self.agent_dir / "agent.json")
        except StateError:
            return None
        f = doc.get("failed") if isinstance(doc, dict) else None
        if not isinstance(f, dict):
            return None
        return Outcome(
            outcome=Phase.FAILED,
            version=str(f.get("version", "")),
            reason=str(f.get("reason", "")),
            message=str(f.get("message", "")),
            upgrade=str(f.get("upgrade", "")),
            upgrade_revision=int(f.get("upgradeRevision", 0) or 0),
        )

    def _record_failed(self, desired: Desired, reason: str, message: str) -> None:
        self.failed = Outcome(Phase.FAILED, desired.version, reason, message[:MAX_MESSAGE],
                              desired.upgrade, desired.upgrade_revision)  # fmt: skip
        write_json_atomic(
            self.agent_dir / "agent.json",
            {"failed": {"version": desired.version, "reason": reason,
                        "message": message[:MAX_MESSAGE], "upgrade": desired.upgrade,
                        "upgradeRevision": desired.upgrade_revision, "at": self._clock()}},
        )  # fmt: skip
        self._set(Phase.FAILED, reason, message)
        log.warning("agent update failed", version=desired.version, reason=reason, error=message)

    def _clear_failed(self) -> None:
        if self.failed is not None:
            write_json_atomic(self.agent_dir / "agent.json", {})
            self.failed = None

    def _set(self, phase: str, reason: str = "", message: str = "") -> None:
        if (phase, reason, message) != (self.phase, self.reason, self.message):
            self.phase, self.reason, self.message = phase, reason, message[:MAX_MESSAGE]
            self.changed_at = self._clock()

    # -- the reconcile --------------------------------------------------------------------
    async def reconcile(self, key: str) -> Result:
        if self._stopping:
            return Result()
        step = plan(self.desired, self.running, self._read_view(), self._health(), self.failed)
        if isinstance(step, Report):
            self._set(step.phase, step.reason, step.message)
            return Result(requeue_after=RESYNC_S)
        if isinstance(step, WaitHealthy):
            self._set(Phase.TRYING, "WaitingForHealth", step.missing)
            return Result(requeue_after=TRIAL_POLL_S)
        if isinstance(step, Commit):
            if not self._notify("EDGED_COMMIT=1"):
                raise TemporaryError("cannot reach the launcher's notify socket to commit")
            formats.committed()
            # Committed once launcher.json says so (the next pass), not before
            self._set(Phase.TRYING, "Committing", "connected, state loaded, workloads serving")
            log.info("agent release commits", version=self.running.version)
            return Result(requeue_after=TRIAL_POLL_S)
        if isinstance(step, AbortTrial):
            self._request({"action": "abort", "reason": step.reason, "message": step.message})
            self._switching(step.message)
            return Result()
        if isinstance(step, SwitchTo | Update):
            self._clear_failed()  # another attempt: its outcome is the one to report next
        if isinstance(step, SwitchTo):
            assert self.desired is not None
            self._request_try(step.slot, step.version, self.desired)
            return Result()
        assert isinstance(step, Update)
        return await self._update(step)

    async def _update(self, step: Update) -> Result:
        desired, agent = self.desired, self._desired_proto
        assert desired is not None and agent is not None
        if self._fetch is None:
            self._record_failed(desired, "NotSupportedYet", "this edged has no release fetch")
            return Result()
        self._set(Phase.VERIFYING, "", f"checking the signed metadata of {desired.version}")
        self.bytes_done, self.bytes_total = 0, 0
        try:
            release = await self._fetch(agent)
        except TemporaryError as exc:
            self._set(Phase.DOWNLOADING, "HubUnreachable", str(exc))
            raise
        except ArtifactError as exc:
            self._record_failed(desired, exc.reason, str(exc))
            return Result()
        self.bytes_done = self.bytes_total = release.length
        self._set(Phase.INSTALLING, "", f"installing {desired.version} into slot {step.slot}")
        try:
            installed = await asyncio.to_thread(
                self._install, release, self.data_dir, step.slot, device=self.platform
            )
            self._set(Phase.SMOKE_TESTING, "", f"edged check of {desired.version}")
            await self._smoke(
                installed.root, desired.version, data_dir=self.data_dir,
                config_path=self.config_path,
            )  # fmt: skip
        except InstallRefused as exc:
            self._record_failed(desired, exc.reason, exc.message)
            return Result()
        finally:  # installed or refused: the slot holds it now, or it is never wanted again
            release.path.unlink(missing_ok=True)
        if self.desired != desired:  # the hub changed its mind meanwhile: look again
            return Result(requeue_after=0)
        self._request_try(step.slot, desired.version, desired)
        return Result()

    def _request_try(self, slot: str, version: str, desired: Desired) -> None:
        self._request(
            {
                "action": "try",
                "slot": slot,
                "version": version,
                "maxTries": desired.max_tries,
                "commitDeadlineSeconds": desired.commit_deadline_s,
                "upgrade": desired.upgrade,
                "upgradeRevision": desired.upgrade_revision,
                "context": {"servedBefore": sorted(self._serving())},
            }
        )
        self._switching(f"switching to {version} (slot {slot})")

    def _request(self, doc: dict[str, Any]) -> None:
        doc = {**doc, "id": f"{int(self._clock())}-{secrets.token_hex(6)}"}
        write_json_atomic(self.agent_dir / "request.json", doc)

    def _switching(self, message: str) -> None:
        self._set(Phase.SWITCHING, "", message)
        self._stopping = True
        log.info("edged exits for the launcher", why=message)
        self._request_stop(message)

    # -- what it reports ------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The ``agent`` section of ``/v1/status`` and, mapped, Status.agent."""
        view, desired = self._view, self.desired
        trying = view.trying
        committed = view.committed_version or (
            self.running.package_version if view.committed == PACKAGE else ""
        )
        upgrade, revision = "", 0
        # a failure still shown (the controller has not acted on a newer desired release
        # yet) is said with the attempt it is of, never with the newer one: the hub would
        # take it for that one's failure (seen in the lab: revision 4 stopped 0.3 s after
        # being sent, for revision 3's CommitDeadlineExceeded)
        outcome = self.failed if self.failed is not None else view.last
        earlier = (
            self.phase in (Phase.ROLLED_BACK, Phase.FAILED)
            and outcome is not None
            and desired is not None
            and (outcome.version, outcome.upgrade, outcome.upgrade_revision)
            != (desired.version, desired.upgrade, desired.upgrade_revision)
        )
        if trying is not None:
            upgrade, revision = trying.upgrade, trying.upgrade_revision
        elif desired is not None and not earlier:
            upgrade, revision = desired.upgrade, desired.upgrade_revision
        elif self.failed is not None:  # the refusal reported (planning: until replaced)
            upgrade, revision = self.failed.upgrade, self.failed.upgrade_revision
        elif view.last is not None:
            upgrade, revision = view.last.upgrade, view.last.upgrade_revision
        tries = trying.tries if trying is not None else 0
        if trying is None and self.failed is None and view.last is not None:
            tries = view.last.tries
        return {
            "version": self.running.version,
            "slot": self.running.slot,
            "committedVersion": committed,
            "phase": self.phase,
            "reason": self.reason,
            "message": self.message,
            "tries": tries,
            "launcher": bool(self.running.slot),
            "desiredVersion": desired.version if desired is not None else "",
            "upgrade": upgrade,
            "upgradeRevision": revision,
            "bytesDone": self.bytes_done,
            "bytesTotal": self.bytes_total,
            "arch": self.platform.arch,
            "pythonAbi": self.platform.python_abi,
            "changedAt": self.changed_at,
        }
