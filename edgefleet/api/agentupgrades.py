"""The ``AgentUpgrade`` kind: a fleet's edged moved to another release (issue 32,
docs/agent-updates.md "The AgentUpgrade kind")::

    apiVersion: edgefleet.io/v1
    kind: AgentUpgrade
    metadata: {name: edged-0-2-1}
    spec:
      version: 0.2.1
      selector: {matchLabels: {site: retail}}
      rollout:
        maxUnavailable: 1               # devices between being sent the release and done
        progressDeadlineSeconds: 900    # a device not done this long after it was sent: failed
        canary: {steps: [10%, 50%, 100%]}
        failureThreshold: 1             # or "5%": failed devices that stop the rollout
      commit: {deadlineSeconds: 300, maxTries: 3}

The hub (hub.decide.agentupgrade) decides which devices are sent the release and when; the
device verifies, installs and tries it, and its launcher goes back by itself when it does not
commit (edged/launcher/). At a root hub, ``spec.rollout.waves`` (the same waves as a
ModelDeployment's: ``{regions: [...]}`` and pauses; no ``percent``) rolls the upgrade out
region by region (hub.decide.agentwaves); ``spec.rollout.regions`` is refused: not supported
yet.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from edgefleet.api.fieldsyntax import step_percent, version_string
from edgefleet.api.meta import ObjectMeta, SpecObject, label_key, label_value
from edgefleet.api.placement import SelectorRequirement, _read_requirement
from edgefleet.api.quantities import (
    IntOrPercent,
    describe,
    parse_int_or_percent,
)
from edgefleet.api.rollouts import Wave, _read_waves
from edgefleet.api.validating import Reader, int_in

KIND = "AgentUpgrade"

MAX_STEPS = 20
MAX_EXPRESSIONS = 32
MIN_COMMIT_DEADLINE_S = 10
MAX_COMMIT_DEADLINE_S = 86_400
MAX_TRIES = 10
MAX_PROGRESS_DEADLINE_S = 30 * 86_400
NOT_SUPPORTED_YET = (
    "not supported yet: at a root hub, spec.rollout.waves names the regions of each wave"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentSelector:
    """``spec.selector``: the devices the upgrade is for (every label must match; empty: every
    device of the hub)."""

    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[SelectorRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            e.matches(labels) for e in self.match_expressions
        )

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in sorted(self.match_labels.items())]
        parts += [e.describe() for e in self.match_expressions]
        return ",".join(parts) or "<every device>"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.match_labels:
            out["matchLabels"] = dict(sorted(self.match_labels.items()))
        if self.match_expressions:
            out["matchExpressions"] = [e.to_dict() for e in self.match_expressions]
        return out


_ONE = IntOrPercent(1, percent=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentRollout:
    """``spec.rollout``: how fast, in what steps, and when the upgrade stops and reverts."""

    max_unavailable: IntOrPercent = _ONE
    progress_deadline_s: int = 900
    steps: tuple[int, ...] = ()  # canary steps, percentages of the devices, increasing
    failure_threshold: IntOrPercent = _ONE
    # a root hub (federation): the regions the upgrade goes to, wave by wave (each region
    # runs it with the settings above on its own devices)
    waves: tuple[Wave, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "maxUnavailable": self.max_unavailable.to_yaml(),
            "progressDeadlineSeconds": self.progress_deadline_s,
            "failureThreshold": self.failure_threshold.to_yaml(),
        }
        if self.steps:
            out["canary"] = {"steps": [f"{s}%" for s in self.steps]}
        if self.waves:
            out["waves"] = [w.to_dict() for w in self.waves]
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentCommit:
    """``spec.commit``: what a device is given to commit the new release (its launcher goes
    back to the committed one after ``deadline_s`` without a commit, or ``max_tries`` starts)."""

    deadline_s: int = 300
    max_tries: int = 3

    def to_dict(self) -> dict[str, Any]:
        return {"deadlineSeconds": self.deadline_s, "maxTries": self.max_tries}


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentUpgradeSpec:
    version: str
    selector: AgentSelector = AgentSelector()
    rollout: AgentRollout = AgentRollout()
    commit: AgentCommit = AgentCommit()

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "selector": self.selector.to_dict(),
            "rollout": self.rollout.to_dict(),
            "commit": self.commit.to_dict(),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentUpgrade(SpecObject):
    """A fleet's edged moved to another release, canary steps first; stopped and reverted past
    its failure threshold."""

    KIND: ClassVar[str] = KIND

    metadata: ObjectMeta
    spec: AgentUpgradeSpec


def _threshold(value: object) -> IntOrPercent:
    parsed = parse_int_or_percent(value)
    if parsed.value == 0:
        raise ValueError(
            f"must be at least 1 (a count) or 1% (a percentage), got {describe(value)}"
        )
    return parsed


def _max_unavailable(value: object) -> IntOrPercent:
    parsed = parse_int_or_percent(value)
    if parsed.value == 0:
        raise ValueError(
            f"must be at least 1 or 1%: a device being updated is unavailable while edged "
            f"switches, got {describe(value)}"
        )
    return parsed


def _read_selector(r: Reader | None) -> AgentSelector:
    if r is None:
        return AgentSelector()
    expressions = []
    items = r.items("matchExpressions")
    if len(items) > MAX_EXPRESSIONS:
        r.problems.add(r.at("matchExpressions"), f"at most {MAX_EXPRESSIONS}, got {len(items)}")
        items = []
    for path, item in items:
        item_reader = r.problems.reader(item, path)
        if item_reader is not None:
            expressions.append(_read_requirement(item_reader))
    return AgentSelector(
        match_labels=r.string_map("matchLabels", label_key, label_value) or {},
        match_expressions=tuple(expressions),
    )


def _read_steps(r: Reader) -> tuple[int, ...]:
    steps: list[int] = []
    if not r.has("steps"):
        r.problems.add(r.at("steps"), "required field is missing")
        return ()
    items = r.items("steps")
    if r.raw("steps") == []:
        r.problems.add(r.at("steps"), "must list at least one step")
    if len(items) > MAX_STEPS:
        r.problems.add(r.at("steps"), f"at most {MAX_STEPS} steps, got {len(items)}")
        return ()
    for path, item in items:
        if isinstance(item, Mapping):
            r.problems.add(
                path,
                'must be a percentage of the devices such as "10%" (pauses are not steps of '
                "an AgentUpgrade: edgectl rollout pause agentupgrade/NAME)",
            )
            continue
        weight = r.problems.convert(path, item, step_percent, None)
        if weight is not None:
            steps.append(weight)
    if any(later <= earlier for earlier, later in itertools.pairwise(steps)):
        r.problems.add(r.at("steps"), "must be strictly increasing percentages")
    return tuple(steps)


def _read_rollout(r: Reader | None) -> AgentRollout:
    default = AgentRollout()
    if r is None:
        return default
    if r.has("regions"):
        r.problems.add(r.at("regions"), NOT_SUPPORTED_YET)
    waves = _read_waves(r)
    for i, wave in enumerate(waves):
        if wave.percent is not None:
            r.problems.add(
                r.at("waves"),
                f"wave {i + 1}: a percent wave is not supported for an AgentUpgrade (each "
                "region's canary steps set the percentages of its devices): name regions",
            )
    canary = r.section("canary")
    return AgentRollout(
        max_unavailable=r.optional("maxUnavailable", _max_unavailable, default.max_unavailable),
        progress_deadline_s=r.optional(
            "progressDeadlineSeconds",
            int_in(30, MAX_PROGRESS_DEADLINE_S),
            default.progress_deadline_s,
        ),
        steps=() if canary is None else _read_steps(canary),
        failure_threshold=r.optional("failureThreshold", _threshold, default.failure_threshold),
        waves=waves,
    )


def _read_commit(r: Reader | None) -> AgentCommit:
    default = AgentCommit()
    if r is None:
        return default
    return AgentCommit(
        deadline_s=r.optional(
            "deadlineSeconds",
            int_in(MIN_COMMIT_DEADLINE_S, MAX_COMMIT_DEADLINE_S),
            default.deadline_s,
        ),
        max_tries=r.optional("maxTries", int_in(1, MAX_TRIES), default.max_tries),
    )


def read_agent_upgrade(metadata: ObjectMeta, r: Reader | None) -> AgentUpgrade:
    """The kind's reader for :func:`edgefleet.api.manifests.read_manifest`."""
    if r is None:  # the spec is required: read_manifest recorded the problem
        return AgentUpgrade(metadata=metadata, spec=AgentUpgradeSpec(version=""))
    spec = AgentUpgradeSpec(
        version=r.required("version", version_string, ""),
        selector=_read_selector(r.section("selector")),
        rollout=_read_rollout(r.section("rollout")),
        commit=_read_commit(r.section("commit")),
    )
    if spec.commit.deadline_s * spec.commit.max_tries > spec.rollout.progress_deadline_s:
        r.problems.add(
            f"{r.at('rollout')}.progressDeadlineSeconds",
            f"must be at least commit.deadlineSeconds x commit.maxTries "
            f"({spec.commit.deadline_s * spec.commit.max_tries} s): a device's own tries must "
            f"end before the hub counts it failed, got {spec.rollout.progress_deadline_s}",
        )
    return AgentUpgrade(metadata=metadata, spec=spec)
