"""The ``spec.placement`` section of a ModelDeployment: which devices may run it (selectors,
tolerations, regions, topology spread, affinity) and how the scheduler scores them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from edgefleet.api.meta import (
    dns_label,
    label_key,
    label_value,
)
from edgefleet.api.quantities import (
    describe,
    format_duration,
    parse_duration,
)
from edgefleet.api.validating import (
    Reader,
    as_bool,
    int_in,
    one_of,
)


class TolerationOperator(StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class SelectorOperator(StrEnum):
    """``placement.matchExpressions[].operator``: Kubernetes' set-based selector operators."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class PlacementStrategy(StrEnum):
    """How the scheduler scores devices: least allocated first, or most allocated first."""

    SPREAD = "Spread"
    BIN_PACK = "BinPack"


@dataclass(frozen=True, slots=True, kw_only=True)
class Toleration:
    """Tolerates device taints, as in Kubernetes. An empty key with Exists tolerates all."""

    key: str = ""
    operator: TolerationOperator = TolerationOperator.EQUAL
    value: str = ""
    effect: TaintEffect | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.key:
            out["key"] = self.key
        out["operator"] = self.operator.value
        if self.value:
            out["value"] = self.value
        if self.effect is not None:
            out["effect"] = self.effect.value
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class TopologySpread:
    """Spread replicas over the values of the device label ``key``."""

    key: str
    min_per_domain: int = 1
    max_skew: int | None = None  # hard: no domain more than this above the emptiest one

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "minPerDomain": self.min_per_domain}
        if self.max_skew is not None:
            out["maxSkew"] = self.max_skew
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class SelectorRequirement:
    """One of ``placement.matchExpressions``: a set-based label requirement."""

    key: str
    operator: SelectorOperator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        have = labels.get(self.key)
        if self.operator is SelectorOperator.IN:
            return have is not None and have in self.values
        if self.operator is SelectorOperator.NOT_IN:
            return have is None or have not in self.values
        if self.operator is SelectorOperator.EXISTS:
            return have is not None
        return have is None

    def describe(self) -> str:
        if self.operator in (SelectorOperator.IN, SelectorOperator.NOT_IN):
            return f"{self.key} {self.operator.value} ({','.join(self.values)})"
        return f"{self.key} {self.operator.value}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "operator": self.operator.value}
        if self.values:
            out["values"] = list(self.values)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """``spec.placement``: which devices may run the model (used by the hub's scheduler)."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[SelectorRequirement, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    regions: tuple[str, ...] = ()
    zones: tuple[str, ...] = ()
    topology_spread: TopologySpread | None = None
    # not on a device without every one of these deployments / with any one of them
    deployment_affinity: tuple[str, ...] = ()
    deployment_anti_affinity: tuple[str, ...] = ()
    strategy: PlacementStrategy = PlacementStrategy.SPREAD
    # not on a device whose self-benchmark of the model (a p95, measured when a revision
    # starts there) is above this; a device not measured yet may be placed, and is left when
    # its figure is over
    max_latency_p95_s: float | None = None
    # only on TPM-attested devices (an attestation key bound to the TPM's EK, last evidence
    # trusted); the device refuses it too when it holds no such key (docs/trust.md)
    require_tpm: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.require_tpm:
            out["requireTpm"] = True
        if self.node_selector:
            out["nodeSelector"] = dict(sorted(self.node_selector.items()))
        if self.match_expressions:
            out["matchExpressions"] = [e.to_dict() for e in self.match_expressions]
        if self.tolerations:
            out["tolerations"] = [t.to_dict() for t in self.tolerations]
        if self.regions:
            out["regions"] = list(self.regions)
        if self.zones:
            out["zones"] = list(self.zones)
        if self.topology_spread is not None:
            out["topologySpread"] = self.topology_spread.to_dict()
        if self.deployment_affinity:
            out["deploymentAffinity"] = list(self.deployment_affinity)
        if self.deployment_anti_affinity:
            out["deploymentAntiAffinity"] = list(self.deployment_anti_affinity)
        if self.strategy is not PlacementStrategy.SPREAD:
            out["strategy"] = self.strategy.value
        if self.max_latency_p95_s is not None:
            out["maxLatencyP95"] = format_duration(self.max_latency_p95_s)
        return out


def _toleration_key(value: object) -> str:
    return "" if value == "" else label_key(value)


def _read_requirement(r: Reader) -> SelectorRequirement:
    key = r.required("key", label_key, "")
    operator = r.required("operator", one_of(SelectorOperator), SelectorOperator.EXISTS)
    values = tuple(r.list_of("values", label_value, unique=True) or ())
    if operator in (SelectorOperator.IN, SelectorOperator.NOT_IN):
        if not values:
            r.problems.add(r.at("values"), f"must list at least one value for {operator.value}")
    elif r.has("values"):
        r.problems.add(r.at("values"), f"must be empty when operator is {operator.value}")
    return SelectorRequirement(key=key, operator=operator, values=values)


def _read_toleration(r: Reader) -> Toleration:
    key = r.optional("key", _toleration_key, "")
    operator = r.optional("operator", one_of(TolerationOperator), TolerationOperator.EQUAL)
    value = r.optional("value", label_value, "")
    if operator is TolerationOperator.EXISTS and value:
        r.problems.add(r.at("value"), "must be empty when operator is Exists")
    if operator is TolerationOperator.EQUAL and key == "" and r.raw("key") in (None, ""):
        r.problems.add(r.at("key"), "required when operator is Equal")
    return Toleration(
        key=key,
        operator=operator,
        value=value,
        effect=r.optional("effect", one_of(TaintEffect), None),
    )


def _latency_bound(value: object) -> float:
    seconds = parse_duration(value)
    if not 0 < seconds <= 60:
        raise ValueError(f"must be more than 0 and at most 60s, got {describe(value)}")
    return seconds


def read_placement(r: Reader | None) -> Placement:
    if r is None:
        return Placement()
    tolerations = []
    for path, item in r.items("tolerations"):
        item_reader = r.problems.reader(item, path)
        if item_reader is not None:
            tolerations.append(_read_toleration(item_reader))
    expressions = []
    for path, item in r.items("matchExpressions"):
        item_reader = r.problems.reader(item, path)
        if item_reader is not None:
            expressions.append(_read_requirement(item_reader))
    spread = r.section("topologySpread")
    return Placement(
        node_selector=r.string_map("nodeSelector", label_key, label_value) or {},
        match_expressions=tuple(expressions),
        tolerations=tuple(tolerations),
        regions=tuple(r.list_of("regions", dns_label, unique=True) or ()),
        zones=tuple(r.list_of("zones", label_value, unique=True) or ()),
        topology_spread=None
        if spread is None
        else TopologySpread(
            key=spread.required("key", label_key, ""),
            min_per_domain=spread.optional("minPerDomain", int_in(1, None), 1),
            max_skew=spread.optional("maxSkew", int_in(1, None), None),
        ),
        deployment_affinity=tuple(r.list_of("deploymentAffinity", dns_label, unique=True) or ()),
        deployment_anti_affinity=tuple(
            r.list_of("deploymentAntiAffinity", dns_label, unique=True) or ()
        ),
        max_latency_p95_s=r.optional("maxLatencyP95", _latency_bound, None),
        strategy=r.optional("strategy", one_of(PlacementStrategy), PlacementStrategy.SPREAD),
        require_tpm=r.optional("requireTpm", as_bool, False),
    )
