"""Which edged releases a regional hub fetches from its root, and when (hub.decide.agentrelay),
and what the root says of a region that refused one (hub.decide.agentwaves)."""

from __future__ import annotations

from typing import Any

from hub.decide import agentrelay, regionslice
from hub.decide.agentrelay import RECHECK_HELD_S, RETRY_FIRST_S, RETRY_MAX_S, Attempt
from hub.decide.agentwaves import read_region_claim


def upgrade(name: str, version: Any, waves: Any = None) -> dict[str, Any]:
    rollout: dict[str, Any] = {"progressDeadlineSeconds": 600}
    if waves is not None:
        rollout["waves"] = waves
    return {
        "apiVersion": "edgefleet.io/v1",
        "kind": "AgentUpgrade",
        "metadata": {"name": name},
        "spec": {"version": version, "selector": {}, "rollout": rollout},
    }


def test_wanted_versions_are_those_of_upgrades_in_waves_only() -> None:
    objects = [
        upgrade("a", "0.3.0", [{"regions": ["eu"]}]),
        upgrade("b", "0.2.0", [{"regions": ["us"]}, {"pause": {}}]),
        upgrade("c", "0.9.0"),  # the root's own devices: no region fetches it
        upgrade("d", "0.3.0", [{"regions": ["us"]}]),  # the same version once
        upgrade("e", 7, [{"regions": ["us"]}]),  # not a version
        upgrade("f", "x" * 200, [{"regions": ["us"]}]),  # too long
        {"kind": "ModelDeployment", "metadata": {"name": "m"}, "spec": {"version": "1.0.0"}},
    ]
    assert agentrelay.wanted_versions(objects) == ("0.2.0", "0.3.0")
    many = [upgrade(f"u{i}", f"1.0.{i:03}", [{"regions": ["eu"]}]) for i in range(100)]
    got = agentrelay.wanted_versions(many)
    assert len(got) == agentrelay.MAX_WANTED and got[-1] == "1.0.099"


def test_the_slice_names_the_versions_and_its_digest_changes_with_them() -> None:
    plain = regionslice.plan_slice("eu", [upgrade("c", "0.9.0")], {}, {}, [])
    waved = regionslice.plan_slice(
        "eu", [upgrade("c", "0.9.0"), upgrade("a", "0.3.0", [{"regions": ["eu"]}])], {}, {}, []
    )
    assert plain.agent_versions == () and waved.agent_versions == ("0.3.0",)
    assert plain.digest != waved.digest
    # not released yet: the upgrade itself is not in the slice, its version is
    assert waved.objects == ()
    # a generator is read once only: the objects are kept
    again = regionslice.plan_slice("eu", iter([upgrade("a", "0.3.0", [{}])]), {}, {}, [])
    assert again.agent_versions == ("0.3.0",)


def test_a_region_sent_the_previous_version_is_named_the_new_one_too() -> None:
    # revision 1 (0.3.0) done in eu, 0.4.0 applied: until eu's wave, eu is sent the upgrade at
    # 0.3.0, yet its wave waits for eu to hold 0.4.0, so the slice must name 0.4.0 (found by
    # bench/agentwaves.py: the region never fetched it and the wave waited ReleaseMissing)
    applied = upgrade("a", "0.4.0", [{"regions": ["eu"]}])
    sent = {**applied, "spec": {**applied["spec"], "version": "0.3.0", "rollout": {}}}
    got = regionslice.plan_slice("eu", [sent], {}, {}, [], root_objects=[applied])
    assert got.agent_versions == ("0.4.0",)
    # what eu was sent alone (no waves left in it) names nothing
    alone = regionslice.plan_slice("eu", [sent], {}, {}, [])
    assert alone.agent_versions == () and alone.digest != got.digest


def test_due_fetches_one_wanted_version_not_held_outside_its_backoff() -> None:
    wanted = ["0.3.0", "0.2.0", "0.4.0"]
    assert agentrelay.due(wanted, {"0.2.0"}, {}, 100.0) == "0.3.0"
    every = {"0.2.0", "0.3.0", "0.4.0"}
    assert agentrelay.due(wanted, every, {}, 100.0, dict.fromkeys(every, 99.0)) is None
    waiting = {"0.3.0": Attempt(1, 110.0, "UNAVAILABLE: down")}
    assert agentrelay.due(wanted, {"0.2.0"}, waiting, 100.0) == "0.4.0"
    both = waiting | {"0.4.0": Attempt(2, 120.0, "x", refused=True)}
    asked = {"0.2.0": 99.0}  # the held one was asked a moment ago
    assert agentrelay.due(wanted, {"0.2.0"}, both, 100.0, asked) is None
    assert agentrelay.due(wanted, {"0.2.0"}, both, 110.0, asked) == "0.3.0"
    assert agentrelay.due([], set(), {}, 0.0) is None


def test_a_held_version_is_asked_again_now_and_then_after_the_missing_ones() -> None:
    wanted = ["0.2.0", "0.3.0"]
    # held, never asked: asked (a platform the root holds that the region lacks)
    assert agentrelay.due(wanted, {"0.2.0", "0.3.0"}, {}, 100.0) == "0.2.0"
    # a missing version goes first
    assert agentrelay.due(wanted, {"0.2.0"}, {}, 100.0, {}) == "0.3.0"
    checked = {"0.2.0": 100.0, "0.3.0": 100.0}
    assert agentrelay.due(wanted, {"0.2.0", "0.3.0"}, {}, 101.0, checked) is None
    later = 100.0 + RECHECK_HELD_S
    assert agentrelay.due(wanted, {"0.2.0", "0.3.0"}, {}, later, checked) == "0.2.0"
    # a held version waiting out a backoff waits it out too
    waiting = {"0.2.0": Attempt(1, later + 5, "UNAVAILABLE")}
    assert agentrelay.due(wanted, {"0.2.0", "0.3.0"}, waiting, later, checked) == "0.3.0"
    assert agentrelay.kept(checked, ["0.3.0"]) == {"0.3.0": 100.0}


def test_a_failed_try_backs_off_doubling_to_a_ceiling() -> None:
    a = agentrelay.failed(None, "Timeout", 0.0, refused=False)
    assert (a.failures, a.retry_at) == (1, RETRY_FIRST_S)
    b = agentrelay.failed(a, "Timeout", 10.0, refused=False)
    assert b.retry_at == 10.0 + 2 * RETRY_FIRST_S
    for _ in range(20):
        b = agentrelay.failed(b, "SignerNotDelegated: x" * 100, 10.0, refused=True)
    assert b.retry_at == 10.0 + RETRY_MAX_S and b.refused
    assert len(b.reason) == agentrelay.MAX_REFUSAL_TEXT
    jittered = agentrelay.failed(None, "x", 0.0, refused=False, jitter=0.5)
    assert jittered.retry_at == RETRY_FIRST_S / 2


def test_refusals_reported_for_versions_not_held_and_forgotten_once_unwanted() -> None:
    attempts = {
        "0.3.0": Attempt(1, 5.0, "SignerNotDelegated: a model key", refused=True),
        "0.4.0": Attempt(1, 5.0, "UNAVAILABLE: root away"),  # not a refusal
        "0.5.0": Attempt(1, 5.0, "DigestMismatch: other bytes", refused=True),
    }
    assert agentrelay.refusals(attempts, {"0.5.0"}) == {"0.3.0": "SignerNotDelegated: a model key"}
    assert set(agentrelay.kept(attempts, ["0.4.0"])) == {"0.4.0"}
    many = {f"1.0.{i:02}": Attempt(1, 0.0, "r", refused=True) for i in range(40)}
    assert len(agentrelay.refusals(many, ())) == agentrelay.MAX_REFUSALS


def test_the_root_reads_a_regions_refusals_bounded() -> None:
    claim = {"releases": ["0.2.0"], "refusals": {"0.3.0": "SignerNotDelegated: " + "x" * 900}}
    view = read_region_claim("eu", claim, upgrade="u", connected=True, inventory_total=2,
                              revision=0, version="")  # fmt: skip
    assert (
        view.refusals["0.3.0"].startswith("SignerNotDelegated")
        and len(view.refusals["0.3.0"]) <= 512
    )
    hostile = read_region_claim(
        "eu",
        {"refusals": ["not", "a", "map"]},
        upgrade="u",
        connected=True,
        inventory_total=2,
        revision=0,
        version="",
    )
    assert hostile.refusals == {}
