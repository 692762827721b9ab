"""One model name per device: which deployments may not both be applied, and which one of
two deployments of a model a device is sent (pure functions, tested as tables in
``tests/hub/test_hub_modelclaiming.py``).

edged serves the Open Inference Protocol by model name (``/v2/models/{name}/infer``): two
workloads of one model name on one device would share one route, so requests would be answered
(and counted, for the canary analysis) by only one of them. The rule, in three places:

* at apply (:func:`model_conflicts`): a ``ModelDeployment`` is refused when another one with
  the same ``spec.model.name`` (stored, or in the same apply) could be placed on a device it
  could be placed on. Two placements *could share a device* unless no set of labels satisfies
  both: they want different values of one label (``nodeSelector``, ``matchExpressions`` In,
  NotIn, Exists, DoesNotExist), or disjoint ``placement.regions`` or ``placement.zones``.
  Decided from the manifests alone, not from today's devices, so a device enrolled or
  relabelled later cannot bring the two together;
* when a device's desired state is built (:func:`one_per_model`): should two deployments of a
  model still reach one device (stored by a hub before this rule, or by federation), it is sent
  one, the one it already runs, else the first by name, and the other is excluded with a reason;
* on the device: edged routes each model name to one workload and says so (docs/edged.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from edgefleet.api import ModelDeployment, parse_manifest
from edgefleet.api.manifests import SelectorOperator
from hub.decide.apply import ParsedObject
from hub.decide.placement import ZONE_LABEL, Projection

# placement.regions is matched against the device's region or, without one, the hub's: a
# device always has exactly one, so it is a label of its own here
_REGIONS = "placement.regions"


@dataclass(slots=True)
class _Wanted:
    """What the placements ask of one label key (all of them together)."""

    allowed: frozenset[str] | None = None  # None: any value (or none)
    forbidden: set[str] = field(default_factory=set)
    present: bool = False  # must have the label
    absent: bool = False  # must not have it

    def allow(self, values: Iterable[str]) -> None:
        values = frozenset(values)
        self.allowed = values if self.allowed is None else self.allowed & values
        self.present = True

    def satisfiable(self) -> bool:
        if self.absent and self.present:
            return False
        return self.allowed is None or bool(self.allowed - self.forbidden)


def _ask(wanted: dict[str, _Wanted], dep: ModelDeployment) -> None:
    placement = dep.spec.placement
    if placement.regions:
        wanted.setdefault(_REGIONS, _Wanted()).allow(placement.regions)
    if placement.zones:
        wanted.setdefault(ZONE_LABEL, _Wanted()).allow(placement.zones)
    for key, value in placement.node_selector.items():
        wanted.setdefault(key, _Wanted()).allow((value,))
    for req in placement.match_expressions:
        w = wanted.setdefault(req.key, _Wanted())
        if req.operator is SelectorOperator.IN:
            w.allow(req.values)
        elif req.operator is SelectorOperator.NOT_IN:
            w.forbidden.update(req.values)
        elif req.operator is SelectorOperator.EXISTS:
            w.present = True
        else:
            w.absent = True


def could_share_a_device(a: ModelDeployment, b: ModelDeployment) -> bool:
    """Whether some device's labels could satisfy the placements of both ``a`` and ``b``.

    A label key both constrain is checked together; ``topology.edgefleet.io/region`` in a
    selector is checked apart from ``placement.regions`` (a device without that label is in
    the hub's region), so the answer errs towards "could"."""
    wanted: dict[str, _Wanted] = {}
    _ask(wanted, a)
    _ask(wanted, b)
    return all(w.satisfiable() for w in wanted.values())


@dataclass(frozen=True, slots=True)
class ModelConflict:
    """``deployment`` (``documents[index]`` of the apply) may share a device with ``other``,
    which deploys the same ``model``."""

    index: int
    deployment: str
    other: str
    model: str
    other_in_apply: bool  # ``other`` is in the same apply, not stored

    def describe(self) -> str:
        where = "in this apply" if self.other_in_apply else "already applied"
        return (
            f'documents[{self.index}].spec.model.name: ModelDeployment "{self.deployment}" '
            f'deploys model "{self.model}", which ModelDeployment "{self.other}" ({where}) '
            "deploys on devices both could be placed on: a device serves one deployment per "
            f'model name; delete "{self.other}" first, rename the model, or give the two '
            "placements different values of one label (nodeSelector, matchExpressions), "
            "regions or zones"
        )


def model_conflicts(
    applied: Sequence[tuple[int, ModelDeployment]], stored: Mapping[str, ModelDeployment]
) -> list[ModelConflict]:
    """Each deployment of an apply (``(document index, deployment)``) that could share a
    device with another deployment of its model name: one stored under another name, or an
    earlier one of the same apply. A stored deployment the apply replaces counts as its new
    manifest."""
    replaced = {dep.metadata.name for _, dep in applied}
    by_model: dict[str, list[ModelDeployment]] = {}
    for name in sorted(stored.keys() - replaced):
        dep = stored[name]
        by_model.setdefault(dep.spec.model.name, []).append(dep)
    out: list[ModelConflict] = []
    earlier: dict[str, list[ModelDeployment]] = {}
    for index, dep in applied:
        model = dep.spec.model.name
        for others, in_apply in ((by_model.get(model, ()), False), (earlier.get(model, ()), True)):
            other = next((o for o in others if could_share_a_device(dep, o)), None)
            if other is not None:
                out.append(
                    ModelConflict(index, dep.metadata.name, other.metadata.name, model, in_apply)
                )
                break
        earlier.setdefault(model, []).append(dep)
    return out


def apply_refusal(
    parsed: Sequence[ParsedObject], stored: Mapping[str, ModelDeployment]
) -> str | None:
    """Why an apply (its parsed documents, in order) is refused under the rule, naming every
    conflict; None when it is not."""
    applied = []
    for index, obj in enumerate(parsed):
        if obj.kind == ModelDeployment.KIND:
            dep = parse_manifest(dict(obj.manifest))
            assert isinstance(dep, ModelDeployment)
            applied.append((index, dep))
    conflicts = model_conflicts(applied, stored)
    if not conflicts:
        return None
    return "nothing applied: " + "; ".join(c.describe() for c in conflicts)


def one_per_model(
    projection: Projection,
    deployments: Mapping[str, ModelDeployment],
    *,
    previous: frozenset[str],
) -> Projection:
    """``projection`` with at most one deployment per model name: of several, the one the
    device was last given (the first by name of those), else the first by name; each other
    is excluded, naming the one kept."""
    kept: dict[str, str] = {}
    order = sorted(projection.names, key=lambda n: (n not in previous, n))
    for name in order:
        dep = deployments.get(name)
        if dep is not None:
            kept.setdefault(dep.spec.model.name, name)
    names: list[str] = []
    excluded = dict(projection.excluded)
    for name in projection.names:
        dep = deployments.get(name)
        model = dep.spec.model.name if dep is not None else None
        if model is None or kept[model] == name:
            names.append(name)
        else:
            excluded[name] = (
                f'model "{model}" is served on this device by ModelDeployment "{kept[model]}": '
                "a device serves one deployment per model name"
            )
    return Projection(tuple(names), excluded)
