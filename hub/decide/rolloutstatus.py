"""A deployment's rollout as operators see it: ``status.rollout`` and the conditions it changes.
Pure, tested as tables.

:func:`hub.decide.status.deployment_status` says what devices report against what they are sent;
it knows nothing of the rollout. Once a rollout is **rolled back**, the deployment still asks
for the rejected version while every device is sent the stable one: without the rollout's
word, ``Progressing`` would say ``RollingOut 0 of N devices serve version X`` for ever. Here:

* ``Progressing`` is ``False``, reason ``RolledBack`` (``RolloutAborted`` after ``rollout
  abort``), its message naming the rejected
  revision and version, why (the rollout's reason and message: the devices and their
  failures, or the analysis' figures) and the stable version sent instead; a paused rollout
  is ``Unknown``, reason ``RolloutPaused`` (Kubernetes' ``DeploymentPaused``);
* ``status.rollout`` names both versions (``version``, ``stableVersion``) and the devices the
  rollout was rolled back for (``failedDevices``: device -> reason). ``status.failing`` stays
  what fails *now* on what devices are sent;
* every time is RFC 3339 UTC (``startedAt``, ``changedAt``), like the rest of the status.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edgefleet.api.conditions import Condition, ConditionStatus
from edgefleet.timestamps import rfc3339
from hub.decide.revisions import Revision, RolloutPhase, RolloutState

MAX_NAMED = 3  # devices a condition's message names before "and N more"


def rollout_json(
    state: RolloutState,
    version: str,
    stable_version: str,
    progress: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``status.rollout``: the rollout record as shown, with ``progress`` (the counts of
    :meth:`hub.decide.rollout.Progress.to_json`) when known."""
    return {
        "revision": state.revision,
        "version": version,
        "stableRevision": state.stable,
        "stableVersion": stable_version,
        "phase": state.phase.value,
        "reason": state.reason,
        "message": state.message,
        "startedAt": rfc3339(state.started_at) if state.started_at else None,
        "changedAt": rfc3339(state.changed_at) if state.changed_at else None,
        "steps": state.steps,
        "failedDevices": dict(sorted(state.failed.items())),
        # devices kept on what they run until the budget lets them switch (hold), and those
        # switching back, counted against the budget until they are ready
        "heldDevices": dict(sorted(state.held.items())),
        "returningDevices": sorted(state.returning),
        **(progress or {}),
    }


def rollout_condition(
    state: RolloutState, version: str, stable_version: str, failing_now: int = 0
) -> Condition | None:
    """The ``Progressing`` condition the rollout's phase decides (None: the devices' counts
    decide it, :func:`hub.decide.status.deployment_status`)."""
    if state.phase is RolloutPhase.ROLLED_BACK:
        named = sorted(state.failed)
        devices = ", ".join(named[:MAX_NAMED]) + (
            f" and {len(named) - MAX_NAMED} more" if len(named) > MAX_NAMED else ""
        )
        message = (
            f"rolled back to revision {state.stable} ({stable_version}), {state.reason}: "
            f"{state.message}"
        )
        if devices and not all(d in state.message for d in named[:MAX_NAMED]):
            message += f" (on {devices})"
        if failing_now:
            message += f"; {failing_now} device(s) fail revision {state.stable} now"
        reason = "RolloutAborted" if state.reason == "Aborted" else "RolledBack"
        return Condition("Progressing", ConditionStatus.FALSE, reason, message)
    if state.phase is RolloutPhase.PAUSED:
        return Condition(
            "Progressing",
            ConditionStatus.UNKNOWN,
            "RolloutPaused",
            f"revision {state.revision} ({version}) from revision {state.stable} "
            f"({stable_version}): {state.message}",
        )
    return None


def with_rollout(
    status: Mapping[str, Any],
    state: RolloutState,
    version: str,
    stable_version: str,
    progress: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A deployment's ``status`` (:meth:`hub.decide.status.DeploymentStatus.to_json`) with its
    rollout: ``status.rollout`` and the ``Progressing`` condition in its place."""
    out = dict(status)
    condition = rollout_condition(state, version, stable_version, len(status.get("failing", {})))
    if condition is not None:
        out["conditions"] = [
            condition.to_json() if c.get("type") == "Progressing" else c
            for c in status.get("conditions", [])
        ]
    out["rollout"] = rollout_json(state, version, stable_version, progress)
    return out


def rollout_versions(revisions: Mapping[int, Revision], state: RolloutState) -> tuple[str, str]:
    """(the version being rolled out, the stable one) from the stored revisions ("" for a
    revision no longer kept)."""
    current, stable = revisions.get(state.revision), revisions.get(state.stable)
    return (
        current.model[1] if current is not None else "",
        stable.model[1] if stable is not None else "",
    )
