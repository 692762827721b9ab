"""An AgentUpgrade's ``status``, from its rollout record and the planner's counts, pure
(:mod:`hub.decide.agentupgrade`; ``edgectl rollout status agentupgrade/NAME`` prints it)."""

from __future__ import annotations

from typing import Any

from edgefleet.api.agentupgrades import AgentUpgrade
from hub.decide.agentrevisions import AgentProgress, AgentUpgradeState
from hub.decide.revisions import RolloutPhase


def upgrade_status(
    upgrade: AgentUpgrade, state: AgentUpgradeState | None, progress: AgentProgress
) -> dict[str, Any]:
    """An AgentUpgrade's ``status``: its rollout (phase, revision, version, canary step), the
    devices' counts, every failed device with its reason, the devices sent back, and the
    ``Progressing`` condition (Kubernetes' words: RolloutPaused, RolledBack...)."""
    from edgefleet.api.conditions import Condition, ConditionStatus
    from edgefleet.timestamps import rfc3339

    if state is None:
        return {"phase": "Pending", "message": "no revision yet", **progress.to_json()}
    steps = upgrade.spec.rollout.steps
    if state.phase is RolloutPhase.ROLLED_BACK:
        condition = Condition("Progressing", ConditionStatus.FALSE, "RolledBack", state.message)
    elif state.phase is RolloutPhase.PAUSED:
        condition = Condition(
            "Progressing", ConditionStatus.UNKNOWN, "RolloutPaused", state.message
        )
    elif state.phase is RolloutPhase.COMPLETE:
        condition = Condition("Progressing", ConditionStatus.TRUE, "RolloutComplete", state.message)
    else:
        condition = Condition(
            "Progressing", ConditionStatus.TRUE, state.reason or "RollingUpdate", state.message
        )
    return {
        "phase": state.phase.value,
        "reason": state.reason,
        "message": state.message,
        "revision": state.revision,
        "version": state.current.version,
        "startedAt": rfc3339(state.started_at) if state.started_at else None,
        "changedAt": rfc3339(state.changed_at) if state.changed_at else None,
        "step": min(state.step + 1, len(steps)) if steps else 0,
        "stepCount": len(steps),
        "pastLastStep": state.step >= len(steps),
        "steps": [f"{w}%" for w in steps],
        **progress.to_json(),
        "failedDevices": dict(sorted(state.failed.items())),
        "rollbackDevices": dict(sorted(state.rollback.items())),
        **({"leavingDevices": dict(sorted(state.leaving.items()))} if state.leaving else {}),
        **({"heldDevices": dict(sorted(state.held.items()))} if state.held else {}),
        "conditions": [condition.to_json()],
    }
