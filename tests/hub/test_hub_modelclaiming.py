"""One model name per device (hub.decide.modelclaim) as tables: pure functions, no hub, no store."""

from __future__ import annotations

from typing import Any

import pytest

from edgefleet.api import ModelDeployment, parse_manifest
from hub.decide.apply import parse_documents
from hub.decide.modelclaim import (
    apply_refusal,
    could_share_a_device,
    model_conflicts,
    one_per_model,
)
from hub.decide.placement import Projection


def deployment(name: str, model: str = "mlp", **placement: Any) -> ModelDeployment:
    doc = {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {"model": {"name": model, "version": "1.0.0"}, "placement": placement},
    }
    dep = parse_manifest(doc)
    assert isinstance(dep, ModelDeployment)
    return dep


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        out["values"] = list(values)
    return out


@pytest.mark.parametrize(
    ("a", "b", "share"),
    [
        pytest.param({}, {}, True, id="both-everywhere"),
        pytest.param({"nodeSelector": {"site": "a"}}, {}, True, id="one-everywhere"),
        pytest.param(
            {"nodeSelector": {"site": "a"}}, {"nodeSelector": {"site": "b"}}, False, id="sel-differ"
        ),
        pytest.param(
            {"nodeSelector": {"site": "a"}}, {"nodeSelector": {"pool": "x"}}, True, id="sel-keys"
        ),
        pytest.param(
            {"nodeSelector": {"site": "a"}}, {"nodeSelector": {"site": "a"}}, True, id="sel-same"
        ),
        pytest.param({"regions": ["eu"]}, {"regions": ["us"]}, False, id="regions-disjoint"),
        pytest.param({"regions": ["eu", "us"]}, {"regions": ["us"]}, True, id="regions-overlap"),
        pytest.param({"zones": ["z1"]}, {"zones": ["z2"]}, False, id="zones-disjoint"),
        pytest.param(
            {"matchExpressions": [expr("site", "In", "a", "b")]},
            {"matchExpressions": [expr("site", "In", "c")]},
            False,
            id="in-in-disjoint",
        ),
        pytest.param(
            {"matchExpressions": [expr("site", "In", "a", "b")]},
            {"nodeSelector": {"site": "b"}},
            True,
            id="in-sel-overlap",
        ),
        pytest.param(
            {"matchExpressions": [expr("site", "In", "a")]},
            {"matchExpressions": [expr("site", "NotIn", "a")]},
            False,
            id="in-notin",
        ),
        pytest.param(
            {"matchExpressions": [expr("site", "In", "a", "b")]},
            {"matchExpressions": [expr("site", "NotIn", "a")]},
            True,
            id="in-notin-overlap",
        ),
        pytest.param(
            {"matchExpressions": [expr("gpu", "Exists")]},
            {"matchExpressions": [expr("gpu", "DoesNotExist")]},
            False,
            id="exists-absent",
        ),
        pytest.param(
            {"nodeSelector": {"gpu": "yes"}},
            {"matchExpressions": [expr("gpu", "DoesNotExist")]},
            False,
            id="sel-absent",
        ),
        pytest.param(
            {"matchExpressions": [expr("gpu", "NotIn", "a")]},
            {"matchExpressions": [expr("gpu", "DoesNotExist")]},
            True,
            id="notin-absent",
        ),
        pytest.param(
            {"nodeSelector": {"site": "a"}, "regions": ["eu"]},
            {"nodeSelector": {"site": "a"}, "regions": ["us"]},
            False,
            id="one-key-enough",
        ),
    ],
)
def test_could_share_a_device(a: dict[str, Any], b: dict[str, Any], share: bool) -> None:
    da, db = deployment("a", **a), deployment("b", **b)
    assert could_share_a_device(da, db) is share
    assert could_share_a_device(db, da) is share  # symmetric


RETAIL = deployment("retail", nodeSelector={"site": "retail"})
FACTORY = deployment("factory", nodeSelector={"site": "factory"})
EVERYWHERE = deployment("everywhere")
OTHER_MODEL = deployment("audio", model="audio")


@pytest.mark.parametrize(
    ("applied", "stored", "expected"),
    [
        pytest.param([EVERYWHERE], {}, [], id="alone"),
        pytest.param([EVERYWHERE], {"everywhere": EVERYWHERE}, [], id="reapplied"),
        pytest.param(
            [deployment("everywhere", nodeSelector={"site": "factory"})],
            {"everywhere": EVERYWHERE, "retail": RETAIL},
            [],
            id="replaced-moves-away",
        ),
        pytest.param([EVERYWHERE], {"retail": RETAIL}, [("everywhere", "retail", False)], id="new"),
        pytest.param([FACTORY], {"retail": RETAIL}, [], id="disjoint"),
        pytest.param([OTHER_MODEL], {"retail": RETAIL}, [], id="other-model"),
        pytest.param([RETAIL, EVERYWHERE], {}, [("everywhere", "retail", True)], id="same-apply"),
        pytest.param(
            [RETAIL, FACTORY, EVERYWHERE],
            {},
            [("everywhere", "retail", True)],
            id="first-conflict-named",
        ),
        pytest.param(
            [EVERYWHERE],
            {"retail": RETAIL, "factory": FACTORY},
            [("everywhere", "factory", False)],
            id="stored-by-name",
        ),
    ],
)
def test_model_conflicts(
    applied: list[ModelDeployment],
    stored: dict[str, ModelDeployment],
    expected: list[tuple[str, str, bool]],
) -> None:
    found = model_conflicts(list(enumerate(applied)), stored)
    assert [(c.deployment, c.other, c.other_in_apply) for c in found] == expected


def test_apply_refusal_names_both_deployments_and_the_model() -> None:
    doc = b'{"apiVersion":"edgefleet.io/v1","kind":"ModelDeployment","metadata":{"name":"b"},'
    doc += b'"spec":{"model":{"name":"mlp","version":"1.0.0"}}}'
    why = apply_refusal(parse_documents([doc]), {"a": deployment("a")})
    assert why is not None
    assert why.startswith("nothing applied: documents[0].spec.model.name:")
    assert 'ModelDeployment "b"' in why and 'ModelDeployment "a"' in why
    assert 'model "mlp"' in why and "delete" in why
    assert apply_refusal(parse_documents([doc]), {"b": deployment("b")}) is None


@pytest.mark.parametrize(
    ("names", "previous", "kept", "dropped"),
    [
        pytest.param(("a", "b", "x"), frozenset(), ("a", "x"), "b", id="first-by-name"),
        pytest.param(("a", "b", "x"), frozenset({"b"}), ("b", "x"), "a", id="already-running"),
        pytest.param(("a", "b", "x"), frozenset({"a", "b"}), ("a", "x"), "b", id="both-ran"),
        pytest.param(("b", "x"), frozenset({"a"}), ("b", "x"), None, id="one-left"),
    ],
)
def test_one_per_model(
    names: tuple[str, ...], previous: frozenset[str], kept: tuple[str, ...], dropped: str | None
) -> None:
    deps = {"a": deployment("a"), "b": deployment("b"), "x": deployment("x", model="x")}
    got = one_per_model(Projection(names, {"z": "elsewhere"}), deps, previous=previous)
    assert got.names == kept
    assert set(got.excluded) == {"z"} | ({dropped} if dropped else set())
    if dropped is not None:
        other = ({"a", "b"} - {dropped}).pop()
        assert f'ModelDeployment "{other}"' in got.excluded[dropped]
