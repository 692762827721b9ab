"""Switching devices back within the rollout budget (hub.decide.rolloutholds.hold), the pure planner
driven against simulated devices: each device starts the revision it is sent beside what it
runs, drops the others once it is ready there (edged's switch without downtime), and refuses
a broken one (keeping what it ran). At every step, the devices switching in their own view
stay within maxSurge + maxUnavailable, whatever the operator applies: a forward rollout, the
stable template again in the middle of it (``rollout undo``), a newer template in the middle
of a return, a broken revision rolled back. Found by the soak harness (docs/soak.md, seed 62,
run C): the stable template applied again switched two devices at once against a budget of
1."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from edgefleet.api import ModelDeployment, parse_manifest
from hub.decide.rollout import (
    DeviceView,
    Revision,
    RolloutPhase,
    RolloutState,
    Step,
    TargetPhase,
    plan_rollout,
    resolve_budget,
    template_hash,
)

T = 1_000.0
BROKEN_VERSION = "9.0.0"


def manifest(version: str, **rollout: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": "det"},
        "spec": {"model": {"name": "det", "version": version}, "rollout": rollout},
    }
    dep = parse_manifest(doc)
    assert isinstance(dep, ModelDeployment)
    return dep.to_dict()


@dataclass
class SimDevice:
    """What one device runs: revision -> steps since it started it (ready after LOAD)."""

    name: str
    runs: dict[int, int] = field(default_factory=dict)
    refused: set[int] = field(default_factory=set)
    started: list[int] = field(default_factory=list)  # every revision it started, in turn

    def ready(self, number: int) -> bool:
        return self.runs.get(number, -1) >= LOAD

    def switching(self) -> bool:
        """Starting a revision beside another, or serving nothing: what the soak harness
        counts against the budget in the device's own view."""
        return not any(self.ready(n) for n in self.runs) or any(
            not self.ready(n) for n in self.runs
        )

    def send(self, number: int, broken: bool) -> None:
        if broken:
            self.refused.add(number)  # refused: it keeps what it runs
            return
        if number not in self.runs:
            self.runs[number] = 0
            self.started.append(number)

    def tick(self, sent: int) -> None:
        for n in self.runs:
            self.runs[n] += 1
        if self.ready(sent):  # the switch is done: the others drain
            self.runs = {sent: self.runs[sent]}

    def view(self, number: int) -> DeviceView:
        serving = any(self.ready(n) for n in self.runs)
        if number in self.refused:
            target = TargetPhase.BROKEN
        elif self.ready(number):
            target = TargetPhase.READY
        elif number in self.runs:
            target = TargetPhase.PROGRESSING
        else:
            target = TargetPhase.ABSENT
        reason = f"{number} refused" if target is TargetPhase.BROKEN else ""
        return DeviceView(self.name, True, "", target, reason, serving)


LOAD = 3


class Fleet:
    def __init__(self, n: int, **rollout: Any) -> None:
        self.rollout = rollout
        self.devices = [SimDevice(f"d{i}", {1: LOAD}) for i in range(n)]
        first = manifest("1.0.0", **rollout)
        self.revisions: dict[int, Revision] = {
            1: Revision("det", 1, template_hash(first), first, T)
        }
        self.state = RolloutState("det", 1, 1, phase=RolloutPhase.COMPLETE)
        self.manifest = first
        self.t = T
        self.most_switching = 0
        self.events: list[str] = []

    def apply(self, version: str) -> None:
        self.manifest = manifest(version, **self.rollout)

    def step(self, *, holds: bool = True) -> Step:
        self.t += 1
        dep = parse_manifest(self.manifest)
        assert isinstance(dep, ModelDeployment)
        views_of = {n: [d.view(n) for d in self.devices] for n in self.revisions}
        current = views_of[self.state.revision]
        step = plan_rollout(
            dep, self.manifest, self.revisions, self.state, current, self.t,
            views_of=views_of if holds else None,
        )  # fmt: skip
        if step.revision is not None:
            self.revisions[step.revision.number] = step.revision
        self.state = step.state or self.state
        self.events += [f"{e.reason}: {e.message}" for e in step.events]
        for d in self.devices:
            sent = self.state.revision_for(d.name)
            broken = self.revisions[sent].model[1] == BROKEN_VERSION
            d.send(sent, broken)
        for d in self.devices:
            d.tick(self.state.revision_for(d.name))
        self.most_switching = max(self.most_switching, sum(d.switching() for d in self.devices))
        return step

    def run(self, steps: int, **kwargs: Any) -> None:
        for _ in range(steps):
            self.step(**kwargs)

    def settled(self, version: str) -> bool:
        numbers = {n for n, r in self.revisions.items() if r.model[1] == version}
        return all(
            len(d.runs) == 1 and next(iter(d.runs)) in numbers and d.ready(next(iter(d.runs)))
            for d in self.devices
        )


BUDGET_1 = {"maxSurge": 0, "maxUnavailable": 1}


def test_the_stable_template_again_mid_rollout_switches_back_within_the_budget() -> None:
    fleet = Fleet(5, **BUDGET_1)
    fleet.apply("1.1.0")
    fleet.run(12)  # about three devices on 1.1.0, one switching
    on_new = [d.name for d in fleet.devices if 2 in d.runs]
    assert len(on_new) >= 2, on_new
    fleet.apply("1.0.0")  # the stable template again: rollout undo
    fleet.run(60)
    assert fleet.settled("1.0.0"), [d.runs for d in fleet.devices]
    assert fleet.state.phase is RolloutPhase.COMPLETE and not fleet.state.held
    assert fleet.most_switching <= 1, fleet.events
    assert any(e.startswith("DevicesHeld") for e in fleet.events), fleet.events


def test_without_holds_the_same_undo_switches_every_updated_device_at_once() -> None:
    """The defect the holds mend, on the same scenario (views_of None: no holds)."""
    fleet = Fleet(5, **BUDGET_1)
    fleet.apply("1.1.0")
    fleet.run(12)
    fleet.apply("1.0.0")
    fleet.run(60, holds=False)
    assert fleet.settled("1.0.0")
    assert fleet.most_switching >= 2


def test_a_rollback_sends_the_broken_device_back_at_once_and_the_healthy_ones_in_turn() -> None:
    fleet = Fleet(4, **BUDGET_1)
    fleet.apply("1.1.0")
    fleet.run(60)
    assert fleet.settled("1.1.0") and fleet.state.phase is RolloutPhase.COMPLETE
    fleet.most_switching = 0
    fleet.apply(BROKEN_VERSION)  # refused by the first device: rolled back at once
    fleet.run(60)
    assert fleet.state.phase is RolloutPhase.ROLLED_BACK
    assert fleet.settled("1.1.0")
    assert fleet.most_switching <= 1


@pytest.mark.parametrize("then", ["1.2.0", "1.1.0"])
def test_a_newer_template_during_a_return_keeps_the_budget_and_completes(then: str) -> None:
    """Mid-return, a newer template (or the left one again: a new revision, a copy): the
    devices held on the left revision switch to it directly, within the budget."""
    fleet = Fleet(6, **BUDGET_1)
    fleet.apply("1.1.0")
    fleet.run(16)
    fleet.apply("1.0.0")
    fleet.run(3)
    assert fleet.state.held, "some devices are still held on 1.1.0"
    fleet.apply(then)
    fleet.run(120)
    assert fleet.settled(then), [d.runs for d in fleet.devices]
    assert fleet.state.phase is RolloutPhase.COMPLETE and not fleet.state.held
    assert not fleet.state.returning
    assert fleet.most_switching <= 1, fleet.events


@pytest.mark.parametrize("budget", [{"maxSurge": 1, "maxUnavailable": 1}, {"maxSurge": "50%"}])
def test_larger_budgets_return_more_devices_at_once_and_never_more(budget: Any) -> None:
    fleet = Fleet(6, **budget)
    rollout = parse_manifest(manifest("1.0.0", **budget)).spec.rollout  # type: ignore[union-attr]
    total = resolve_budget(rollout.max_surge, rollout.max_unavailable, 6).total
    assert total >= 2
    fleet.apply("1.1.0")
    fleet.run(8)
    fleet.apply("1.0.0")
    fleet.run(60)
    assert fleet.settled("1.0.0")
    assert fleet.most_switching <= total


def test_a_held_device_away_is_released_when_it_returns() -> None:
    """A device on the left revision that is away (not eligible) when the stable template is
    applied again keeps it until it is back, then switches within the budget."""
    fleet = Fleet(4, **BUDGET_1)
    fleet.apply("1.1.0")
    while not (fleet.devices[1].ready(2) and fleet.devices[0].ready(2)):
        fleet.step()
    away = fleet.devices[1]
    view = away.view

    def not_eligible(number: int) -> DeviceView:
        return replace(view(number), eligible=False, skip_reason="device is NotReady")

    away.view = not_eligible  # type: ignore[method-assign]
    fleet.apply("1.0.0")
    fleet.run(40)
    assert fleet.state.held == {"d1": 2}, fleet.state.held  # kept on 1.1.0 while away
    assert fleet.state.phase is RolloutPhase.PROGRESSING
    assert fleet.devices[0].runs.keys() == {1}  # the other one went back
    away.view = view  # type: ignore[method-assign]
    fleet.run(20)
    assert fleet.settled("1.0.0") and fleet.state.phase is RolloutPhase.COMPLETE
    assert fleet.most_switching <= 1, fleet.events


def test_a_canary_replaced_by_a_newer_one_switches_straight_to_it() -> None:
    """The canary devices of 1.1.0, paused, then 1.2.0 applied: they go from 1.1.0 to 1.2.0
    directly (held, then assigned first), not back to 1.0.0 and forward again."""
    canary = {**BUDGET_1, "canary": {"steps": ["50%", {"pause": {}}]}}
    fleet = Fleet(4, **canary)
    fleet.apply("1.1.0")
    fleet.run(20)
    assert fleet.state.phase is RolloutPhase.PAUSED
    canaried = [d for d in fleet.devices if 2 in d.runs]
    assert len(canaried) == 2
    fleet.apply("1.2.0")
    fleet.run(20)
    assert fleet.state.phase is RolloutPhase.PAUSED and not fleet.state.held
    for d in canaried:
        assert d.started == [2, 3], (d.name, d.started)
    assert fleet.most_switching <= 1, fleet.events


def test_held_and_returning_survive_the_store() -> None:
    state = RolloutState("det", 1, 1, held={"a": 2}, returning=frozenset({"b"}))
    doc = state.to_json()
    assert doc["held"] == {"a": 2} and doc["returning"] == ["b"]
    back = RolloutState.from_json(doc)
    assert back == state
    assert back.revision_for("a") == 2 and back.revision_for("b") == 1
    assert "held" not in RolloutState("det", 1, 1).to_json()
