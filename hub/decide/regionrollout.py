"""A root hub's rollout of a deployment as its regions report it (pure, tested as tables).

A root's own rollout record (:mod:`hub.decide.rollout`) is of the root's own devices: for a
deployment placed only in regions it has none and completes at once, whatever the regions
did. Without waves nothing else judged the regions, so the root said ``Complete`` of a
revision its only region had rolled back (docs/soak.md, the soak harness' defect 5). Here
the root's ``status.rollout`` is the rollout **across** its regions:

* ``Complete`` only once the root's own rollout is and every region the deployment goes to
  reports its rollout of *this* revision ``Complete``. A region's report names its rollout's
  revision by template hash (``RegionDeploymentStatus.rollout_template``), compared with the
  template the region's copy of the root's revision has (its overrides applied,
  :func:`hub.decide.wave.expected_template`), so a report of an earlier revision (sent before
  the region's rollout controller took up the new one) is never counted as this one's; a
  region that names no revision (a regional hub older than that field) is **not counted**
  as complete, and says so;
* ``RolledBack`` when a region reports its rollout of this revision rolled back, the region
  and its figures named in the message (reason ``RegionRolledBack``);
* ``Progressing`` meanwhile: reason ``RegionUnreachable`` while a region is not connected or
  has not reported the deployment (the waves' word for it), else ``RegionsProgressing``, the
  message naming each region not done and why.

A rollout in waves (:mod:`hub.decide.wave`) judges the regions itself while it is in
progress or rolled back; its state is then the root's rollout (:func:`across_regions` takes
it). A wave state that is ``Complete`` is checked as above too: a deployment's first revision
in waves, and a new one without waves, are sent to every region at once and marked Complete
by the waves before any region said anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgefleet.api.conditions import Condition, ConditionStatus
from hub.decide.revisions import RolloutPhase
from hub.decide.wave import RegionView, WavePhase, WaveState, region_done

MAX_NAMED = 8  # regions a message names before "and N more"


@dataclass(frozen=True, slots=True)
class AcrossRegions:
    """The root's rollout across its regions: what ``status.rollout`` says of it."""

    phase: str
    reason: str
    message: str
    # region -> why it is not counted as done with this revision (absent: done)
    not_done: Mapping[str, str] = field(default_factory=dict)
    # the root's revision the regions not done with this one serve (those that rolled it back
    # serve again), where they agree (None: unknown): the stable one across the regions
    stable: int | None = None


def _named(items: Sequence[str]) -> str:
    shown = "; ".join(items[:MAX_NAMED])
    return shown + (f"; and {len(items) - MAX_NAMED} more" if len(items) > MAX_NAMED else "")


def not_done_why(view: RegionView | None, expected: str) -> str:
    """Why ``view``'s region is not done with the revision of template ``expected`` ("" when
    it is: its last report says its rollout of that template is Complete, whether or not it
    is connected now)."""
    if view is None or not view.reported:
        if view is None or not view.connected:
            return "unreachable (not connected to the root)"
        return "has not reported the deployment yet"
    away = "" if view.connected else "; unreachable now (not connected to the root)"
    if not view.template:
        return (
            f"not counted: its report names no revision (a regional hub older than this root), "
            f"rollout {view.phase or 'not reported'}{away}"
        )
    if view.template != expected:
        return f"its rollout is still of another revision (rollout {view.phase}){away}"
    if region_done(view, expected):
        return ""
    return view.text() + away


def across_regions(
    own_phase: str,
    own_reason: str,
    own_message: str,
    revision: int,
    version: str,
    placed: Sequence[str],
    expected: Mapping[str, str],
    views: Mapping[str, RegionView],
    waves: WaveState | None = None,
    stable_of: Callable[[str, str], int | None] = lambda region, template: None,
) -> AcrossRegions:
    """The root's rollout of ``revision`` (model ``version``) across the regions ``placed``
    (those the deployment goes to), from its own rollout (``own_*``), each region's expected
    template of the revision (``expected``) and what each last reported (``views``).
    ``waves``: the deployment's wave state, when the root has one of this revision;
    ``stable_of(region, template)``: the root's revision whose template is ``template`` in
    ``region`` (a region's stable one), None if it keeps none."""
    own = AcrossRegions(own_phase, own_reason, own_message)
    if own_phase == RolloutPhase.ROLLED_BACK.value:
        return own  # the root's own devices rolled it back: that says it all
    if waves is not None and waves.revision == revision and waves.phase is not WavePhase.COMPLETE:
        # in waves, in progress or rolled back: the waves judge the regions
        if waves.phase is WavePhase.ROLLED_BACK or own_phase == RolloutPhase.COMPLETE.value:
            return AcrossRegions(waves.phase.value, waves.reason, waves.message)
        return own
    not_done = {r: why for r in placed if (why := not_done_why(views.get(r), expected.get(r, "")))}
    back = [
        r
        for r in placed
        if (v := views.get(r)) is not None
        and v.reported
        and v.template
        and v.template == expected.get(r)
        and v.phase == RolloutPhase.ROLLED_BACK.value
    ]
    if back:
        stables = {stable_of(r, views[r].stable_template) for r in back}
        stable = stables.pop() if len(stables) == 1 else None
        again = f"; revision {stable} is served there again" if stable is not None else ""
        message = (
            f"revision {revision} ({version}) was rolled back in region(s) "
            f"{', '.join(back)}: " + _named([f"{r}: {views[r].text()}" for r in back]) + again
        )
        return AcrossRegions(
            RolloutPhase.ROLLED_BACK.value, "RegionRolledBack", message, not_done, stable
        )
    # the revision the regions not done serve meanwhile, where they agree (None: unknown)
    kept = {
        stable_of(r, v.stable_template) if (v := views.get(r)) is not None else None
        for r in not_done
    }
    stable = kept.pop() if len(kept) == 1 else None
    if own_phase != RolloutPhase.COMPLETE.value:
        return AcrossRegions(own_phase, own_reason, own_message, not_done, stable)
    if not not_done:
        return AcrossRegions(
            own_phase,
            own_reason,
            f"{own_message}; every region ({', '.join(placed) or 'none enrolled'}) reports "
            f"revision {revision} ({version}) Complete"
            if placed
            else own_message,
        )
    away = [r for r in not_done if not (views.get(r) and views[r].connected and views[r].reported)]
    reason = "RegionUnreachable" if away else "RegionsProgressing"
    message = (
        f"revision {revision} ({version}) is not Complete in every region yet: "
        + _named([f"{r}: {why}" for r, why in not_done.items()])
        + f" (this hub's own devices: {own_reason or own_phase})"
    )
    return AcrossRegions(RolloutPhase.PROGRESSING.value, reason, message, not_done, stable)


def shown(
    status: Mapping[str, Any], across: AcrossRegions, stable_version: str = ""
) -> dict[str, Any]:
    """A deployment's ``status`` at the root with ``status.rollout`` across its regions: its
    phase, reason and message, ``notCounted`` (region -> why it is not done with the revision)
    and, rolled back, the ``Progressing`` condition False (reason ``RolledBack``)."""
    out = dict(status)
    rollout = dict(out.get("rollout") or {})
    changed = (rollout.get("phase"), rollout.get("reason")) != (across.phase, across.reason)
    rollout.update(phase=across.phase, reason=across.reason, message=across.message)
    if across.not_done:
        rollout["notCounted"] = dict(sorted(across.not_done.items()))
    if across.stable is not None:
        rollout["stableRevision"] = across.stable
        if stable_version:
            rollout["stableVersion"] = stable_version
    out["rollout"] = rollout
    if changed and across.phase in (RolloutPhase.ROLLED_BACK.value, RolloutPhase.PROGRESSING.value):
        rolled_back = across.phase == RolloutPhase.ROLLED_BACK.value
        condition = Condition(
            "Progressing",
            ConditionStatus.FALSE if rolled_back else ConditionStatus.TRUE,
            "RolledBack" if rolled_back else across.reason,
            across.message,
        ).to_json()
        conditions = list(out.get("conditions", []))
        at = [i for i, c in enumerate(conditions) if c.get("type") == "Progressing"]
        if at:
            conditions[at[0]] = condition
        else:
            conditions.append(condition)
        out["conditions"] = conditions
    return out
