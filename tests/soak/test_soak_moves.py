"""The soak harness's "no replica moves off a device Ready in its own view" judgement
(``soakrun.Sampler._view``), on made-up samples of the devices' status: a removal is excused
only by a fault of the device, a disconnection in its own view, or a stopped replica it was
connected to, within the look-back; anything else is a violation."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from soakrun import PLACED, Recorder, Sampler


def sampler(windows: list[dict[str, Any]]) -> Sampler:
    replicas = [SimpleNamespace(address="127.0.0.1:1"), SimpleNamespace(address="127.0.0.1:2")]
    fleet: Any = SimpleNamespace(replicas=replicas, sim_devices=50)
    faults: Any = SimpleNamespace(windows=windows)
    return Sampler(fleet, Recorder(), faults)


def status(holds: bool, connected: bool = True, hub: str = "127.0.0.1:1") -> dict[str, Any]:
    workloads = [{"name": PLACED, "replicas": [{"version": "1.0.0", "ready": True}]}]
    return {"hub": {"hub": hub, "connected": connected}, "workloads": workloads if holds else []}


def window(target: str, action: str, begin: float, end: float) -> dict[str, Any]:
    return {"target": target, "kind": "x", "action": action, "begin": begin, "end": end}


def run(s: Sampler, samples: list[tuple[float, dict[str, Any] | None]]) -> list[dict[str, Any]]:
    for t, doc in samples:
        s._view("dev-0", t, doc)
    return s.moves


def steady(until: float, **kw: Any) -> list[tuple[float, dict[str, Any] | None]]:
    return [(float(t), status(True, **kw)) for t in range(int(until))]


def test_a_move_off_a_connected_device_with_no_fault_is_a_violation() -> None:
    s = sampler([])
    moves = run(s, [*steady(40), (40.0, status(False))])
    assert [m["excused"] for m in moves] == [None]
    assert any(e["kind"] == "violation" for e in s.rec.events)


def test_a_hub_restart_excuses_nothing_on_a_device_that_stayed_connected() -> None:
    """The defect the invariant names: a replica killed and started again (the devices fail
    over and stay connected) must not count its downtime against them."""
    s = sampler([window("eu-r0", "kill", 20.0, 26.0)])
    samples = [*steady(20), *steady(40, hub="127.0.0.1:2")[20:], (40.0, status(False))]
    assert [m["excused"] for m in run(s, samples)] == [None]


def test_the_devices_own_faults_and_disconnections_excuse_a_move() -> None:
    for windows, samples in (
        ([window("dev-0", "kill", 30.0, 35.0)], [*steady(40), (40.0, status(False))]),
        ([window("dev-0-net", "cut", 25.0, 38.0)], [*steady(40), (40.0, status(False))]),
        ([], [*steady(30), (30.0, None), (31.0, status(True, connected=False)),
              *steady(40)[32:], (40.0, status(False))]),
        ([window("eu-r0", "stop", 28.0, 36.0)], [*steady(40), (40.0, status(False))]),
    ):  # fmt: skip
        moves = run(sampler(windows), samples)
        assert len(moves) == 1 and moves[0]["excused"] is not None, (windows, moves)


def test_a_fault_older_than_the_look_back_excuses_nothing() -> None:
    s = sampler([window("dev-0", "kill", 1.0, 2.0)])
    assert s.lookback < 60
    moves = run(s, [*steady(80), (80.0, status(False))])
    assert [m["excused"] for m in moves] == [None]


def test_a_stopped_replica_the_device_was_not_on_excuses_nothing() -> None:
    s = sampler([window("eu-r1", "stop", 30.0, 36.0)])
    moves = run(s, [*steady(40), (40.0, status(False))])
    assert [m["excused"] for m in moves] == [None]
