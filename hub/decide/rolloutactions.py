"""An operator's actions on a ModelDeployment's rollout, ``edgectl rollout pause|resume|
promote|abort|restart`` (Argo Rollouts' verbs): pure, each gives the new
:class:`~hub.decide.revisions.RolloutState` or raises :class:`ActionRefused` saying why it does
not apply now. The controller writes it (a compare-and-swap on the rollout record,
:meth:`hub.controllers.rollout.RolloutController.act`); ``actor`` names who acted (the admin
certificate's subject) in the message and its event.

* ``pause``: a Progressing rollout assigns no more devices (``Paused``).
* ``resume``: a paused rollout goes on (past the canary ``pause`` step it waits at); a rolled
  back or aborted one is retried from the start (the same revision).
* ``promote``: past the canary ``pause`` step the rollout is at, and the pauses right after it
  (timed or until resume); ``full``: past every remaining step (100%, still within
  ``maxSurge`` + ``maxUnavailable``), and the analysis no longer rolls it back (a device that
  refuses or fails the revision still does).
* ``abort``: a rollout in progress goes back to the stable revision (every device is sent it
  again), phase ``RolledBack`` with reason ``Aborted``; it stays so until the deployment's
  template changes (an apply, ``rollout undo``, ``rollout restart``) or ``rollout resume``
  retries it.
* ``restart``: a Complete rollout's revision is rolled out again: the rollout controller makes
  a new revision of the same template with the ``edgefleet.io/restartedAt`` annotation
  (:data:`~edgefleet.api.deployments.RESTARTED_AT`, which edged counts in its revision: new
  workers, a switch without downtime), rolled out as any other (canary, analysis, rollback).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from edgefleet.api import Canary
from edgefleet.timestamps import rfc3339
from edgefleet.trust.versions import version_key
from edgefleet.versioning import UNKNOWN_VERSION
from hub.decide.revisions import RolloutPhase, RolloutState

ACTIONS = ("pause", "resume", "promote", "abort", "restart")
RESTART_SINCE = (0, 2)
"""The first edged (major, minor) that counts the restart annotation in its revision: an older
one would keep its workers and report the revision ready at once, a restart that did not
happen."""
MAX_NAMED = 5


class ActionRefused(Exception):
    """An operator's rollout action that does not apply now; the message says why."""


def act(
    state: RolloutState,
    action: str,
    canary: Canary | None,
    now: float,
    *,
    actor: str,
    full: bool = False,
) -> RolloutState:
    """The rollout after ``actor``'s ``action`` (module doc); ``canary``: the deployment's
    ``spec.rollout.canary``; ``full``: ``promote --full``."""
    name = state.deployment
    by = f"by {actor}"
    if full and action != "promote":
        raise ActionRefused(f"--full applies to promote only, not {action}")
    if action == "pause":
        if state.phase is not RolloutPhase.PROGRESSING:
            raise ActionRefused(f"the rollout of {name} is {state.phase.value}, not Progressing")
        return replace(
            state, phase=RolloutPhase.PAUSED, reason="Paused", message=f"paused {by}",
            changed_at=now,
        )  # fmt: skip
    if action == "resume":
        return _resume(state, now, by)
    if (
        action in ("promote", "abort")
        and state.revision == state.stable
        and (state.phase in (RolloutPhase.PROGRESSING, RolloutPhase.PAUSED))
    ):  # the stable template applied again (hub.decide.rollout._reverting)
        raise ActionRefused(
            f"the rollout of {name} is its stable revision {state.revision} applied again, "
            f"sent to every device: nothing to {action} ({state.reason}); apply another "
            "version to move on"
        )
    if action == "promote":
        return _promote(state, canary, now, by, full=full)
    if action == "abort":
        if state.phase not in (RolloutPhase.PROGRESSING, RolloutPhase.PAUSED):
            retry = state.phase is RolloutPhase.ROLLED_BACK
            raise ActionRefused(
                f"the rollout of {name} is {state.phase.value}: nothing to abort"
                + (" (rollout resume retries it)" if retry else "")
            )
        return replace(
            state,
            phase=RolloutPhase.ROLLED_BACK,
            reason="Aborted",
            message=f"revision {state.revision} aborted {by}; every device is back on revision "
            f"{state.stable} until the deployment changes or rollout resume retries it",
            changed_at=now,
            failed={},
            full=False,
        )
    if action == "restart":
        if state.phase is not RolloutPhase.COMPLETE:
            hint = {
                RolloutPhase.PROGRESSING: "wait for it to end, or abort it",
                RolloutPhase.PAUSED: "resume or abort it first",
                RolloutPhase.ROLLED_BACK: "rollout resume retries its revision, rollout undo "
                "goes back",
            }[state.phase]
            raise ActionRefused(
                f"the rollout of {name} is {state.phase.value} (revision {state.revision}): "
                f"restart re-rolls a Complete revision; {hint}"
            )
        at = str(rfc3339(now, millis=True))
        if at == state.restarted_at:
            raise ActionRefused(f"{name} was restarted at {at} already")
        return replace(
            state,
            restarted_at=at,
            reason="Restarted",
            message=f"revision {state.revision} restarted {by}",
            changed_at=now,
        )
    raise ActionRefused(f"unknown rollout action {action!r} (one of {', '.join(ACTIONS)})")


def _resume(state: RolloutState, now: float, by: str) -> RolloutState:
    if state.phase is RolloutPhase.PAUSED:
        at_pause = state.reason == "CanaryPause"  # a pause step: go past it
        return replace(
            state,
            phase=RolloutPhase.PROGRESSING,
            reason="Resumed",
            message=f"resumed {by}"
            + (f" after the pause of canary step {state.step + 1}" if at_pause else ""),
            changed_at=now,
            progress_at=now,
            step=state.step + 1 if at_pause else state.step,
            step_at=now if at_pause else state.step_at,
        )
    if state.phase is RolloutPhase.ROLLED_BACK:
        return replace(
            state,
            phase=RolloutPhase.PROGRESSING,
            updated=frozenset(),
            reason="Retried",
            message=f"revision {state.revision} retried from the start {by}",
            changed_at=now,
            started_at=now,
            step=0,
            step_at=now,
            step_ready_at=0.0,
            progress_at=now,
            failed={},
            full=False,
        )
    raise ActionRefused(
        f"the rollout of {state.deployment} is {state.phase.value}: nothing to resume"
    )


def _promote(
    state: RolloutState, canary: Canary | None, now: float, by: str, *, full: bool
) -> RolloutState:
    name = state.deployment
    if state.phase not in (RolloutPhase.PROGRESSING, RolloutPhase.PAUSED):
        raise ActionRefused(
            f"the rollout of {name} is {state.phase.value}: nothing to promote"
            + (" (rollout resume retries it)" if state.phase is RolloutPhase.ROLLED_BACK else "")
        )
    if canary is None:
        raise ActionRefused(
            f"{name} has no canary steps (spec.rollout.canary): nothing to promote; it rolls "
            "out within maxSurge + maxUnavailable"
        )
    steps = canary.steps
    if state.step >= len(steps):
        raise ActionRefused(
            f"the rollout of {name} is past its {len(steps)} canary steps already: nothing to "
            "promote"
        )
    if state.phase is RolloutPhase.PAUSED and state.reason != "CanaryPause":
        raise ActionRefused(f"the rollout of {name} was paused by an operator: rollout resume")
    if full:
        to = len(steps)
        what = f"past every remaining canary step (from step {state.step + 1} of {len(steps)})"
    else:
        if not steps[state.step].pause:
            raise ActionRefused(
                f"the rollout of {name} is at canary step {state.step + 1} of {len(steps)} "
                f"({steps[state.step].weight}%), not at a pause: nothing to promote (--full "
                "skips the remaining steps)"
            )
        to = state.step
        while to < len(steps) and steps[to].pause:
            to += 1
        skipped = to - state.step
        what = f"past the pause{'s' if skipped > 1 else ''} of canary step" + (
            f"s {state.step + 1}-{to}" if skipped > 1 else f" {state.step + 1}"
        )
    return replace(
        state,
        phase=RolloutPhase.PROGRESSING,
        reason="Promoted",
        message=f"promoted {by} {what}",
        step=to,
        step_at=now,
        step_ready_at=0.0,
        changed_at=now,
        progress_at=now,
        full=full or state.full,
    )


def restart_refusal(name: str, agent_versions: Mapping[str, str]) -> str | None:
    """Why ``rollout restart`` of ``name`` is refused, given the edged version each targeted
    device reports (``""``: not reported): None when every device that says its version
    restarts workers for it."""
    old: list[str] = []
    for device, version in sorted(agent_versions.items()):
        if not version or version == UNKNOWN_VERSION:
            continue
        try:
            numbers = version_key(version)[0]
        except ValueError:
            continue
        if (*numbers, 0, 0)[:2] < RESTART_SINCE:
            old.append(f"{device} ({version})")
    if not old:
        return None
    more = f" and {len(old) - MAX_NAMED} more" if len(old) > MAX_NAMED else ""
    since = ".".join(str(n) for n in RESTART_SINCE)
    return (
        f"rollout restart of {name} is refused: edged before {since} keeps its workers for it "
        f"(a restart that would not happen) on {', '.join(old[:MAX_NAMED])}{more}; upgrade "
        "them first (kind: AgentUpgrade)"
    )
