"""Keeping the rollout budget when a step would send devices another revision outside it: the
devices held on what they run and released in turn (:func:`hold`, called by
:func:`hub.decide.rollout.plan_rollout`; pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from hub.decide.revisions import RolloutPhase, RolloutState
from hub.decide.rollout import Budget, DeviceView, Event, Step, TargetPhase

HELD_NAMES_SHOWN = 10
"""Devices an event about held devices names (then how many more)."""


def hold(
    step: Step,
    before: RolloutState,
    views_of: Mapping[int, Sequence[DeviceView]],
    budget: Budget,
) -> Step:
    """Keep the rollout budget when a step would switch devices outside it.

    Only :func:`_assign` switches devices within the budget. Every other step that changes
    what a device is sent sends it back to the stable revision at once: a rollback, the
    stable template applied again (``rollout undo``), a new template while devices run the
    one it replaces. Each of those devices that is ready on what it runs is
    *held* there (``RolloutState.held``) and released in name order while the devices
    switching or unavailable are fewer than ``maxSurge + maxUnavailable``, as Kubernetes
    rolls a ``rollout undo`` within the budget; one that does not serve what it is held on
    (broken, still starting: going back costs nothing) is released at once, one away (not
    eligible) when it returns, and one the rollout assigns its revision is no longer held
    (that switch is within the budget): a rollout assigns held devices first, and a step
    that makes a new revision releases none within the budget (the next step assigns them
    theirs, so a canary replaced by a newer one switches straight to it). A released device
    is *returning* until it is ready on what it is sent, and counts against the budget until
    then. Found by the soak harness (docs/soak.md, seed 62, run C): the stable template
    applied again switched two devices at once, budget 1.

    ``views_of``: the targeted devices seen for each revision by number (a revision missing:
    nobody runs it yet)."""
    after = step.state if step.state is not None else before
    seen = {n: {v.name: v for v in vs} for n, vs in views_of.items()}
    targeted = seen.get(before.revision, {})

    def view(number: int, name: str) -> DeviceView:
        return seen.get(number, {}).get(name) or DeviceView(name)

    assigned = after.updated - before.updated if after.revision == before.revision else set()
    held = {d: n for d, n in before.held.items() if d in targeted and d not in assigned}
    returning = {d for d in before.returning if d in targeted and d not in assigned}
    for name in targeted:
        ran = before.revision_for(name)
        if name in held or name in assigned or after.unheld_revision_for(name) == ran:
            continue
        if view(ran, name).target is TargetPhase.READY:  # away too: it switches on return
            held[name] = ran
    probe = replace(after, held=held)
    returning = {
        d
        for d in returning
        if d not in held
        and view(probe.revision_for(d), d).eligible
        and view(probe.revision_for(d), d).target not in (TargetPhase.READY, TargetPhase.BROKEN)
    }
    busy = len(returning)
    for name, v in targeted.items():
        if name in held or name in returning or not v.eligible:
            continue
        if name in after.updated and after.phase is not RolloutPhase.ROLLED_BACK:
            if view(after.revision, name).target not in (TargetPhase.READY, TargetPhase.BROKEN):
                busy += 1  # being updated
        elif not v.serving:
            busy += 1  # unavailable
    released: list[str] = []
    # a new revision made this step: its rollout assigns the held devices first (a direct
    # switch, rather than back to the stable revision and then forward again)
    wait = step.revision is not None
    for name in sorted(held):
        number = held[name]
        if after.unheld_revision_for(name) == number:
            del held[name]  # sent what it runs again: nothing to switch
            continue
        on = view(number, name)
        if not on.eligible:
            continue  # away: released once it is back
        if on.target is TargetPhase.READY:
            if wait or busy >= budget.total:
                continue
            busy += 1
            returning.add(name)
        del held[name]
        released.append(name)
    if held == dict(before.held) and returning == set(before.returning):
        return step
    new = replace(after, held=held, returning=frozenset(returning))
    events = step.events
    fresh = [d for d in held if d not in before.held]
    if fresh:
        kept = _numbers(held[d] for d in fresh)
        events += (
            Event(
                "Normal",
                "DevicesHeld",
                f"{_names(fresh)} kept on revision {kept} where they serve, each to switch "
                f"within the budget ({budget.total} at once)",
            ),
        )
    if released:
        numbers = _numbers(after.unheld_revision_for(d) for d in released)
        events += (
            Event(
                "Normal",
                "DevicesReleased",
                f"{_names(released)} sent revision {numbers} ({len(held)} held still)",
            ),
        )
    return replace(step, state=new, events=events)


def _names(names: Sequence[str]) -> str:
    shown = sorted(names)[:HELD_NAMES_SHOWN]
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def _numbers(numbers: Iterable[int]) -> str:
    return ", ".join(str(n) for n in sorted(set(numbers)))
