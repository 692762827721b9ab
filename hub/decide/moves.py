"""Moving ``replicas.total`` placements within the rollout budget (pure, no I/O, no clock).

The scheduler (:mod:`hub.decide.schedule`) says where a deployment's replicas should run; when it
moves one (its device stopped matching: labels, region, zone, accelerator, a changed
``spec.placement``), :func:`plan_move` decides what devices are sent the deployment **now**:

* a leaving device whose replica serves and that may keep it (:attr:`Replica.may_drain`) is
  kept *draining* while stopping it would leave fewer than ``total - maxUnavailable``
  replicas serving; the replacement starts first and the old one stops once enough of the
  new ones serve;
* a leaving device whose replica does not serve (its device is NotReady, removed, failed to
  load it) stops at once: stopping it costs no availability. So do hard evictions
  (``may_drain`` False: NoExecute taints, NotReady beyond the grace, preemption, capacity,
  a scale-down);
* new placements start while the devices sent stay within ``total + maxSurge``; the rest
  *wait* (placed, their room taken, not sent yet).

Budget as a rolling update's (:func:`hub.decide.rollout.resolve_budget`): ``maxUnavailable`` rounds
down, ``maxSurge`` up, both of ``total``; both 0 is one unavailable. Tested as tables in
``tests/hub/test_hub_moving.py``; :class:`hub.controllers.placement.Scheduler` applies it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from hub.decide.rollout import Budget

MOVING = "moving: "  # how a move's note in the Scheduled condition begins


@dataclass(frozen=True, slots=True)
class Replica:
    """One device a deployment is placed on or was sent, as a move sees it."""

    serving: bool = False  # the device is connected and some revision serves there
    may_drain: bool = True  # leaving: may keep serving until replaced (False: stops now)


@dataclass(frozen=True, slots=True)
class MoveStep:
    """What a deployment's devices are sent now."""

    sent: frozenset[str]  # started placements and draining devices
    waiting: frozenset[str] = frozenset()  # placed, held back by maxSurge
    draining: frozenset[str] = frozenset()  # moved off, serving until replaced
    stopped: frozenset[str] = frozenset()  # sent before, not any more
    serving: int = 0  # replicas serving among the devices sent

    @property
    def moving(self) -> bool:
        return bool(self.waiting or self.draining)

    def note(self, budget: Budget) -> str:
        """For the ``Scheduled`` condition while a move is under way."""
        parts = []
        if self.draining:
            parts.append(
                f"{len(self.draining)} replica(s) on {', '.join(sorted(self.draining)[:5])} "
                f"serve until their replacements are ready (maxUnavailable {budget.unavailable})"
            )
        if self.waiting:
            parts.append(
                f"{len(self.waiting)} placement(s) wait to start (maxSurge {budget.surge})"
            )
        return MOVING + "; ".join(parts)


def plan_move(
    total: int,
    budget: Budget,
    target: Collection[str],
    sent: Collection[str],
    replicas: Mapping[str, Replica],
) -> MoveStep:
    """The devices to send now (pure; see the module doc).

    ``target``: the scheduler's placements; ``sent``: the devices sent the deployment so far
    (placements started and draining ones); ``replicas``: what is known of each of them (a
    device missing here neither serves nor may drain)."""
    unknown = Replica(serving=False, may_drain=False)
    started = sorted(d for d in target if d in sent)
    new = sorted(d for d in target if d not in sent)
    leaving = sorted(d for d in sent if d not in target)
    serving = sum(replicas.get(d, unknown).serving for d in started)
    drainers = [d for d in leaving if replicas.get(d, unknown).serving and replicas[d].may_drain]
    floor = max(total - budget.unavailable, 0)
    keep = min(len(drainers), max(floor - serving, 0))
    draining = drainers[:keep]
    room = max(total + budget.surge - len(started) - len(draining), 0)
    start, waiting = new[:room], new[room:]
    return MoveStep(
        sent=frozenset((*started, *start, *draining)),
        waiting=frozenset(waiting),
        draining=frozenset(draining),
        stopped=frozenset(leaving) - frozenset(draining),
        serving=serving + len(draining),
    )


def plan_moves(
    totals: Mapping[str, tuple[int, Budget]],
    targets: Mapping[str, Collection[str]],
    sent: Mapping[str, Collection[str]],
    replicas: Mapping[str, Mapping[str, Replica]],
) -> dict[str, MoveStep]:
    """:func:`plan_move` for each deployment of ``totals`` (deployment -> total, budget)."""
    empty: Sequence[str] = ()
    return {
        name: plan_move(
            total,
            budget,
            targets.get(name, empty),
            sent.get(name, empty),
            replicas.get(name, {}),
        )
        for name, (total, budget) in totals.items()
    }
