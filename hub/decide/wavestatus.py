"""What ``edgectl`` shows of a rollout in waves at a root hub (pure): each wave's regions and
how far each got (:func:`waves_status`), from the :class:`hub.decide.wave.WaveState` and what the
regions last reported. The steps themselves are decided in :mod:`hub.decide.wave`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from edgefleet.api import Condition, ConditionStatus, Wave
from edgefleet.timestamps import rfc3339
from hub.decide.analysis import Analysis
from hub.decide.wave import RegionView, WavePhase, WaveState, region_done, wave_regions


def _shown_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A history entry as status shows it: its time in RFC 3339."""
    at = entry.get("at")
    return {**entry, "at": rfc3339(at)} if isinstance(at, int | float) else dict(entry)


def waves_status(
    waves: Sequence[Wave],
    state: WaveState,
    placed: Sequence[str],
    expected: Mapping[str, str],
    views: Mapping[str, RegionView],
    analysis: Analysis | None = None,
) -> dict[str, Any]:
    """``status.rollout.waves`` at the root: the rollout across regions, and each wave with
    its regions, its state (Pending, Progressing, Paused, Passed, Failed) and their figures;
    the analysis across regions now, if the deployment has one."""
    rows = []
    for i in range(len(waves) + 1):
        if i < len(waves) and waves[i].pause:
            regions: list[str] = []
            kind: dict[str, Any] = {"pause": waves[i].to_dict()["pause"]}
        elif i < len(waves) and waves[i].percent is not None:
            pct = waves[i].percent or 0
            if i < state.step or state.phase is WavePhase.COMPLETE:
                regions = sorted(r for r, w in state.weights.items() if w >= pct)
            else:
                regions = wave_regions(waves, i, placed, state.released)
            kind = {"percent": pct}
        else:
            regions = wave_regions(waves, i, placed)
            kind = {"regions": regions}
            if i >= len(waves):
                kind["rest"] = True
        if state.phase is WavePhase.COMPLETE or i < state.step:
            shown = "Passed"
        elif state.phase is WavePhase.ROLLED_BACK and i == state.step:
            shown = "Failed"
        elif i == state.step:
            shown = "Paused" if state.phase is WavePhase.PAUSED else "Progressing"
        else:
            shown = "Pending"
        region_rows = {}
        for r in regions:
            v = views.get(r)
            region_rows[r] = {
                "connected": bool(v and v.connected),
                **(
                    {"reportedAt": rfc3339(v.reported_at)}
                    if v is not None and v.reported_at
                    else {}
                ),
                "sent": (
                    f"{state.weight_for(r)}%"
                    if state.weight_for(r) is not None
                    else "new"
                    if state.sends_new(r)
                    else "stable"
                ),
                "updatedToRevision": region_done(v, expected.get(r, "")),
                **(v.figures() if v is not None and v.reported else {}),
            }
            new = v.revisions.get(expected.get(r, "")) if v is not None else None
            if new is not None:
                region_rows[r]["newRevision"] = {
                    "devices": new.devices,
                    "requests": new.requests,
                    "errors": new.errors,
                    "latencyP95Seconds": new.latency_p95_s,
                    "accuracy": new.accuracy,
                }
        rows.append({"wave": i + 1, **kind, "state": shown, "regions": region_rows})
    if not rows[-1]["regions"]:
        rows = rows[:-1]  # no region is left for after the last wave
    away = state.reason == "RegionUnreachable"
    reachable = Condition(
        "RegionsReachable",
        ConditionStatus.of(not away),
        "RegionUnreachable" if away else "Reachable",
        state.message if away else "every region of the current wave reports to the root",
    )
    return {
        "conditions": [reachable.to_json()],
        "revision": state.revision,
        "stableRevision": state.stable,
        "version": state.version,
        "stableVersion": state.stable_version,
        "phase": state.phase.value,
        "reason": state.reason,
        "message": state.message,
        "step": state.step + 1,
        "waveCount": len(waves),
        "released": sorted(state.released),
        "startedAt": rfc3339(state.started_at) if state.started_at else None,
        "changedAt": rfc3339(state.changed_at) if state.changed_at else None,
        "waves": rows,
        "history": [_shown_entry(h) for h in state.history],
        **({"analysis": analysis.to_json()} if analysis is not None else {}),
        **({"readyAt": rfc3339(state.ready_at)} if state.ready_at else {}),
    }
