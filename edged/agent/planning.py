"""The agent controller's planner (pure): what the hub asks edged to run (DesiredState.agent),
what runs and what the launcher says, in; the next step out (docs/agent-updates.md, "On the
device"). edged.agent.controller applies the step.

* On trial (this edged is the launcher's trying slot): commit once healthy (connected to the
  hub, state loaded, reconcile running, every workload that served before the switch serving
  again), wait otherwise (the launcher's deadline and try counter end a trial that never gets
  there); abort the trial when the hub now asks for another version.
* Committed: nothing while the hub asks for what runs; otherwise switch to a slot that holds
  the asked version already (the package included: a rollback by the hub), or update into the
  inactive slot. A version that failed (or rolled back) for an upgrade's revision is not tried
  again for that revision: the device reports it and the hub decides.
* The last outcome is reported until a new desired release replaces it: a rollback (the
  launcher's ``last``) and a refusal (``failed``, D/agent/agent.json, which the controller
  clears when it starts another attempt) stay the device's phase once the hub stops asking.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PACKAGE = "package"


class Phase:
    IDLE = "Idle"
    DOWNLOADING = "Downloading"
    VERIFYING = "Verifying"
    INSTALLING = "Installing"
    SMOKE_TESTING = "SmokeTesting"
    SWITCHING = "Switching"
    TRYING = "Trying"
    COMMITTED = "Committed"
    ROLLED_BACK = "RolledBack"
    FAILED = "Failed"


@dataclass(frozen=True, slots=True)
class Desired:
    """DesiredState.agent, as plain data."""

    version: str
    upgrade: str = ""
    upgrade_revision: int = 0
    commit_deadline_s: float = 300.0
    max_tries: int = 3


@dataclass(frozen=True, slots=True)
class Running:
    version: str
    slot: str  # "a", "b", "package"; "" outside the launcher
    trial: bool = False
    package_version: str = ""  # the base install's edged


@dataclass(frozen=True, slots=True)
class Trial:
    slot: str
    version: str
    tries: int = 0
    max_tries: int = 3
    upgrade: str = ""
    upgrade_revision: int = 0
    served_before: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Outcome:
    """The launcher's last outcome (Committed, RolledBack, ...), or a failure edged recorded."""

    outcome: str
    version: str = ""
    reason: str = ""
    message: str = ""
    upgrade: str = ""
    upgrade_revision: int = 0
    tries: int = 0


@dataclass(frozen=True, slots=True)
class LauncherView:
    committed: str = PACKAGE
    committed_version: str = ""
    trying: Trial | None = None
    last: Outcome | None = None
    slots: Mapping[str, str] = field(default_factory=dict)  # installed slot -> version

    @classmethod
    def of(cls, state: Mapping[str, Any], slots: Mapping[str, str]) -> LauncherView:
        """From launcher.json as edged.launcher.state.read_state returns it."""
        t = state.get("trying")
        trying = None
        if isinstance(t, Mapping):
            context = t.get("context") if isinstance(t.get("context"), Mapping) else {}
            served = context.get("servedBefore", []) if context else []
            trying = Trial(
                slot=str(t.get("slot", "")),
                version=str(t.get("version", "")),
                tries=int(t.get("tries", 0)),
                max_tries=int(t.get("maxTries", 3)),
                upgrade=str(t.get("upgrade", "")),
                upgrade_revision=int(t.get("upgradeRevision", 0)),
                served_before=tuple(str(s) for s in served if isinstance(s, str)),
            )
        last = state.get("last")
        outcome = None
        if isinstance(last, Mapping):
            outcome = Outcome(
                outcome=str(last.get("outcome", "")),
                version=str(last.get("version", "")),
                reason=str(last.get("reason", "")),
                message=str(last.get("message", "")),
                upgrade=str(last.get("upgrade", "")),
                upgrade_revision=int(last.get("upgradeRevision", 0) or 0),
                tries=int(last.get("tries", 0) or 0),
            )
        return cls(
            committed=str(state.get("committed", PACKAGE)),
            committed_version=str(state.get("committedVersion", "")),
            trying=trying,
            last=outcome,
            slots=dict(slots),
        )


@dataclass(frozen=True, slots=True)
class Health:
    connected: bool
    state_loaded: bool
    reconcile_running: bool
    serving: frozenset[str] = frozenset()

    def missing(self, served_before: tuple[str, ...]) -> str:
        """What keeps a trial from committing ("" when nothing)."""
        if not self.state_loaded:
            return "the persisted state is not loaded"
        if not self.reconcile_running:
            return "reconcile is not running"
        if not self.connected:
            return "not connected to the hub"
        back = sorted(set(served_before) - self.serving)
        if back:
            return f"not serving again: {', '.join(back[:5])}"
        return ""


# -- steps --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Report:
    """Nothing to do; report this."""

    phase: str
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class Commit:
    pass


@dataclass(frozen=True, slots=True)
class WaitHealthy:
    missing: str


@dataclass(frozen=True, slots=True)
class AbortTrial:
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class SwitchTo:
    """Ask the launcher to try ``slot``, which holds ``version`` already."""

    slot: str
    version: str


@dataclass(frozen=True, slots=True)
class Update:
    """Fetch, install into ``slot``, smoke-test, then switch to it."""

    version: str
    slot: str


Step = Report | Commit | WaitHealthy | AbortTrial | SwitchTo | Update


def _same_attempt(o: Outcome | None, desired: Desired) -> bool:
    return (
        o is not None
        and o.version == desired.version
        and o.upgrade == desired.upgrade
        and o.upgrade_revision == desired.upgrade_revision
    )


def plan(
    desired: Desired | None,
    running: Running,
    launcher: LauncherView,
    health: Health,
    failed: Outcome | None = None,
) -> Step:
    """The next step of the agent controller (the module doc)."""
    if not running.slot:
        if desired is not None and desired.version != running.version:
            return Report(
                Phase.FAILED,
                "NoLauncher",
                "edged runs outside edged-launcher and cannot update itself",
            )
        return Report(Phase.IDLE)
    trying = launcher.trying
    if running.trial and trying is not None and trying.slot == running.slot:
        if desired is not None and desired.version != trying.version:
            return AbortTrial(
                "RolledBackByHub",
                f"the hub asks for {desired.version} while {trying.version} is on trial",
            )
        missing = health.missing(trying.served_before)
        return WaitHealthy(missing) if missing else Commit()
    last = launcher.last
    if desired is None or desired.version == running.version:
        if failed is not None:  # the latest outcome: a new attempt clears it (the controller)
            return Report(Phase.FAILED, failed.reason, failed.message)
        if last is not None and last.outcome == "Committed" and last.version == running.version:
            return Report(Phase.COMMITTED, "Committed", last.message)
        if last is not None and last.outcome == "RolledBack":
            return Report(Phase.ROLLED_BACK, last.reason, last.message)
        return Report(Phase.IDLE)
    if _same_attempt(failed, desired):
        assert failed is not None
        return Report(Phase.FAILED, failed.reason, failed.message)
    if last is not None and last.outcome == "RolledBack" and _same_attempt(last, desired):
        return Report(Phase.ROLLED_BACK, last.reason, last.message)
    if running.package_version == desired.version and running.slot != PACKAGE:
        return SwitchTo(PACKAGE, desired.version)
    for slot, version in sorted(launcher.slots.items()):
        if version == desired.version and slot != running.slot:
            return SwitchTo(slot, version)
    return Update(desired.version, inactive_slot(running.slot, launcher.committed))


def inactive_slot(running: str, committed: str) -> str:
    """The slot to install into: neither the one running nor the committed one."""
    for slot in ("a", "b"):
        if slot not in (running, committed):
            return slot
    return "a"  # unreachable: at most two of a, b, package are taken
