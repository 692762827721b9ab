"""The AgentUpgrade kind: what it accepts, what it refuses (each problem naming its field)."""

from __future__ import annotations

from typing import Any

import pytest

from edgefleet.api import AgentUpgrade, parse_manifest
from edgefleet.api.quantities import IntOrPercent
from edgefleet.errors import ValidationError


def doc(spec: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    return {
        "apiVersion": "edgefleet.io/v1",
        "kind": "AgentUpgrade",
        "metadata": {"name": "edged-0-2-1"},
        "spec": {"version": "0.2.1", **(spec or {})},
        **more,
    }


def problems(d: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ValidationError) as caught:
        parse_manifest(d)
    return {p.path: p.message for p in caught.value.problems}


def test_the_documented_manifest_reads_and_round_trips() -> None:
    upgrade = parse_manifest(
        doc(
            {
                "selector": {"matchLabels": {"site": "retail"}},
                "rollout": {
                    "maxUnavailable": 1,
                    "progressDeadlineSeconds": 900,
                    "canary": {"steps": ["10%", "50%", "100%"]},
                    "failureThreshold": "5%",
                },
                "commit": {"deadlineSeconds": 300, "maxTries": 3},
            }
        )
    )
    assert isinstance(upgrade, AgentUpgrade)
    spec = upgrade.spec
    assert spec.version == "0.2.1"
    assert spec.selector.matches({"site": "retail", "x": "y"})
    assert not spec.selector.matches({"site": "depot"})
    assert spec.rollout.steps == (10, 50, 100)
    assert spec.rollout.failure_threshold == IntOrPercent(5, percent=True)
    assert spec.commit.deadline_s == 300 and spec.commit.max_tries == 3
    assert parse_manifest(upgrade.to_dict()) == upgrade


def test_defaults() -> None:
    upgrade = parse_manifest(doc())
    assert isinstance(upgrade, AgentUpgrade)
    rollout = upgrade.spec.rollout
    assert rollout.max_unavailable == IntOrPercent(1, percent=False)
    assert rollout.failure_threshold == IntOrPercent(1, percent=False)
    assert rollout.progress_deadline_s == 900 and rollout.steps == ()
    assert upgrade.spec.selector.matches({})  # no selector: every device


@pytest.mark.parametrize(
    ("spec", "path", "words"),
    [
        ({"versoin": "1"}, "spec.versoin", 'did you mean "version"'),
        ({"version": 2.4}, "spec.version", "write it in quotes"),
        ({"rollout": {"regions": ["eu"]}}, "spec.rollout.regions", "not supported yet"),
        ({"rollout": {"waves": [{"percent": "10%"}]}}, "spec.rollout.waves",
         "a percent wave is not supported for an AgentUpgrade"),
        ({"rollout": {"waves": [{"regions": ["eu"]}, {"regions": ["eu"]}]}},
         "spec.rollout.waves[1].regions[0]", "already in"),
        ({"rollout": {"waves": []}}, "spec.rollout.waves", "at least one wave"),
        ({"rollout": {"waves": [{"pause": {}}]}}, "spec.rollout.waves", "at least one wave of"),
        ({"rollout": {"canary": {"steps": ["50%", "10%"]}}}, "spec.rollout.canary.steps",
         "strictly increasing"),
        ({"rollout": {"canary": {"steps": [{"pause": {}}]}}}, "spec.rollout.canary.steps[0]",
         "rollout pause"),
        ({"rollout": {"canary": {"steps": ["0%"]}}}, "spec.rollout.canary.steps[0]",
         "more than 0%"),
        ({"rollout": {"canary": {"steps": []}}}, "spec.rollout.canary.steps", "at least one"),
        ({"rollout": {"canary": {"steps": [f"{i}%" for i in range(1, 30)]}}},
         "spec.rollout.canary.steps", "at most 20"),
        ({"rollout": {"canary": {}}}, "spec.rollout.canary.steps", "required"),
        ({"rollout": {"failureThreshold": 0}}, "spec.rollout.failureThreshold", "at least 1"),
        ({"rollout": {"failureThreshold": "0%"}}, "spec.rollout.failureThreshold", "at least 1"),
        ({"rollout": {"failureThreshold": "150%"}}, "spec.rollout.failureThreshold", "100%"),
        ({"rollout": {"maxUnavailable": 0}}, "spec.rollout.maxUnavailable", "at least 1"),
        ({"rollout": {"progressDeadlineSeconds": 5}}, "spec.rollout.progressDeadlineSeconds",
         "from 30"),
        ({"rollout": {"maxSurge": 1}}, "spec.rollout.maxSurge", "unknown field"),
        ({"commit": {"deadlineSeconds": 1}}, "spec.commit.deadlineSeconds", "from 10"),
        ({"commit": {"maxTries": 0}}, "spec.commit.maxTries", "from 1 to 10"),
        ({"commit": {"maxTries": 11}}, "spec.commit.maxTries", "from 1 to 10"),
        ({"commit": {"deadlineSeconds": 600, "maxTries": 3}},
         "spec.rollout.progressDeadlineSeconds", "commit.deadlineSeconds x commit.maxTries"),
        ({"selector": {"matchLabels": {"site": 3}}}, "spec.selector.matchLabels.site",
         "quotes"),
        ({"selector": {"nodeSelector": {}}}, "spec.selector.nodeSelector", "unknown field"),
        ({"selector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
         "spec.selector.matchExpressions[0].values", "at least one value"),
    ],
)  # fmt: skip
def test_refusals_name_the_field(spec: dict[str, Any], path: str, words: str) -> None:
    d = doc(spec)
    if "versoin" in spec:
        del d["spec"]["version"]
    found = problems(d)
    assert path in found, found
    assert words in found[path], found


def test_a_missing_version_is_refused() -> None:
    d = doc()
    del d["spec"]["version"]
    assert problems(d) == {"spec.version": "required field is missing"}
