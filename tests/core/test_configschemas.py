"""The config schema subset (edgefleet.configschemas) and the hub's check of a ModelConfig
against it (hub.decide.modelconfigs.schema_problems): problems named by their field path in
the ModelConfig, unsupported keywords refused, bounds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from edgefleet.api import parse_manifest
from edgefleet.api.modelconfigs import ModelConfig
from edgefleet.configschemas import (
    MAX_PROBLEMS,
    MAX_SCHEMA_BYTES,
    SchemaError,
    parse_schema,
)
from hub.decide.modelconfigs import schema_problems

SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["threshold"],
    "additionalProperties": False,
    "properties": {
        "threshold": {"type": "number", "minimum": 0, "maximum": 1},
        "labels": {"enum": ["coco", "coco-eu"]},
        "zones": {
            "type": "object",
            "additionalProperties": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0},
                "minItems": 4,
                "maxItems": 4,
            },
        },
        "name": {"type": "string", "maxLength": 5},
    },
}


def schema(doc: Any = SCHEMA) -> Any:
    return parse_schema(json.dumps(doc).encode())


def test_values_checked_with_their_paths() -> None:
    found = {
        p.path: p.message
        for p in schema().problems(
            {"threshold": 1.5, "labels": "x", "zones": {"door": [0, -1, 2]}, "name": "toolong",
             "extra": 1}
        )
    }  # fmt: skip
    assert found == {
        "data.threshold": "must be at most 1, got 1.5",
        "data.labels": 'must be one of "coco", "coco-eu", got "x"',
        "data.zones.door": "must have at least 4 items",
        "data.zones.door[1]": "must be at least 0, got -1",
        "data.name": "must be at most 5 characters",
        "data.extra": "is not a key the schema knows (it knows: labels, name, threshold, zones)",
    }
    assert {p.path for p in schema().problems({})} == {"data.threshold"}
    assert schema().problems({"threshold": 1}) == []  # an integer is a number
    wide = schema({"type": "object", "additionalProperties": {"type": "string"}})
    assert len(wide.problems({f"k{i}": i for i in range(100)})) == MAX_PROBLEMS


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"$ref": "#/x"}, "keyword '$ref' is not supported"),
        ({"properties": {"a": {"pattern": "a+"}}}, "at properties.a: keyword 'pattern'"),
        ({"type": "float"}, "must be one of object"),
        ({"required": "a"}, "must be a list of property names"),
        ({"minimum": "1"}, "must be a number"),
        ({"multipleOf": 0}, "must be more than 0"),
        ([1], "must be a JSON object"),
    ],
)
def test_schemas_it_cannot_check_are_refused(doc: Any, message: str) -> None:
    with pytest.raises(SchemaError, match=message.replace("$", r"\$").replace("(", r"\(")):
        schema(doc)


def test_schema_bounds() -> None:
    with pytest.raises(SchemaError, match="bytes"):
        parse_schema(b" " * (MAX_SCHEMA_BYTES + 1))
    deep: Any = {"type": "object"}
    for _ in range(20):
        deep = {"properties": {"a": deep}}
    with pytest.raises(SchemaError, match="nested more than"):
        schema(deep)
    with pytest.raises(SchemaError, match="not JSON"):
        parse_schema(b"{")


def config(spec: dict[str, Any]) -> ModelConfig:
    m = parse_manifest(
        {"apiVersion": "edgefleet.io/v1", "kind": "ModelConfig", "metadata": {"name": "c"},
         "spec": {"model": "det", **spec}}
    )  # fmt: skip
    assert isinstance(m, ModelConfig)
    return m


def test_every_override_merged_over_the_defaults_is_checked_and_named() -> None:
    c = config(
        {
            "data": {"threshold": 0.5, "zones": {"door": [0, 0, 1, 1]}},
            "overrides": [
                {"selector": {"site": "a"}, "data": {"threshold": 2}},
                {"devices": ["cam-1"], "data": {"zones": {"door": [0, 0, 1]}}},
                {"selector": {"site": "b"}, "data": {"threshold": None}},
                {"selector": {"site": "c"}, "data": {"labels": "coco"}},
            ],
        }
    )
    found = schema_problems(c, schema(), [])
    assert found == [
        "spec.overrides[0].data.threshold: must be at most 1, got 2 "
        "(spec.overrides[0] over the defaults)",
        "spec.overrides[1].data.zones.door: must have at least 4 items "
        "(spec.overrides[1] over the defaults)",
        "spec: spec.overrides[2] over the defaults: data.threshold: is required by the schema",
    ]
    # a default that breaks it is named at spec.data
    assert schema_problems(config({"data": {"threshold": -1}}), schema(), []) == [
        "spec.data.threshold: must be at least 0, got -1"
    ]
    # a device matching two overrides gets their combination checked too
    both = config(
        {
            "data": {"threshold": 0.5},
            "overrides": [
                {"selector": {"site": "a"}, "data": {"zones": {"x": [0, 0, 1, 1]}}},
                {"devices": ["cam-9"], "data": {"zones": {"x": None, "y": [0, 0, 1, 1]}}},
            ],
        }
    )
    assert schema_problems(both, schema(), [("cam-9", {"site": "a"})]) == []


def test_a_merge_too_large_for_a_device_is_named() -> None:
    from hub.decide.modelconfigs import size_problems

    chunk = "x" * 15_000
    c = config(
        {
            "data": {"base": 1},
            "overrides": [
                {"selector": {f"l{i}": "y"}, "data": {f"k{i}{j}": chunk for j in range(4)}}
                for i in range(5)
            ],
        }
    )
    assert size_problems(c, [("cam-1", {"l0": "y"})]) == []  # one override: small enough
    everything = {f"l{i}": "y" for i in range(5)}
    found = size_problems(c, [("cam-1", {"l0": "y"}), ("cam-2", everything)])
    assert len(found) == 1
    assert found[0].startswith("spec: merged for device cam-2: the config is ")
    assert "once merged, more than 262144" in found[0]
