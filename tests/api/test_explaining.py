"""``explain``'s schema, read from the API's own readers: every field of a full manifest is in
it, with the type, requiredness, accepted values and default the validation has; a path that
does not exist is an error naming the fields there are. Pure: no hub, nothing faked."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from manifesttesting import DESIGN_EXAMPLE

from edgefleet.api import SUPPORTED_KINDS, parse_manifest
from edgefleet.api.explaining import ExplainError, FieldSchema, explain, schema_of


def _paths(doc: Any, prefix: str = "") -> Iterator[str]:
    """Every field path of a document; list items share their list's path (as in explain)."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            path = f"{prefix}.{key}" if prefix else key
            yield path
            if not path.endswith(("labels", "annotations", "nodeSelector", "requiredLabels")):
                yield from _paths(value, path)
    elif isinstance(doc, list):
        for item in doc:
            yield from _paths(item, prefix)


def _node(kind: str, path: str) -> FieldSchema:
    return explain(kind, path)


def test_every_field_of_a_full_canonical_manifest_is_explained() -> None:
    doc = yaml.safe_load(DESIGN_EXAMPLE)
    doc["spec"]["power"]["lowBattery"] = {"below": "20%", "precision": "int8"}
    canonical = parse_manifest(doc).to_dict()
    schema = schema_of("ModelDeployment")
    for path in _paths(canonical):
        node = schema
        for part in path.split("."):
            assert part in node.fields, f"{path}: not in explain's schema"
            node = node.fields[part]


@pytest.mark.parametrize(
    ("kind", "path", "type_", "required", "accepts", "default"),
    [
        ("ModelDeployment", "spec", "<Object>", True, (), None),
        ("ModelDeployment", "spec.model.version", "<string>", True,
         ('must be a version such as "2.4.1": letters, digits, ".", "_", "+" and "-"',), None),
        ("ModelDeployment", "spec.runtime.maxBatchSize", "<integer>", False,
         ("must be an integer", "must be from 1 to 1024"), 1),
        ("ModelDeployment", "spec.runtime.maxQueueDelay", "<string>", False,
         ('must be a duration such as "500ms", "60s" or "1h30m"', "must be at most 1s"), "2ms"),
        ("ModelDeployment", "spec.runtime.precision", "<string>", False,
         ("must be one of fp32, fp16, int8",), None),
        ("ModelDeployment", "spec.placement.tolerations", "<[]Object>", False, (), None),
        ("ModelDeployment", "spec.placement.tolerations.effect", "<string>", False,
         ("must be one of NoSchedule, PreferNoSchedule, NoExecute",), None),
        ("ModelDeployment", "spec.placement.nodeSelector", "<map[string]string>", False, None,
         None),
        ("ModelDeployment", "spec.scaling.maxReplicas", "<integer>", True,
         ("must be an integer", "must be from 1 to 100000"), None),
        ("ModelDeployment", "spec.rollout.maxSurge", "<string>", False, None, "25%"),
        ("SecurityBaseline", "spec.requireTpm", "<boolean>", False, ("must be true or false",),
         False),
        ("Secret", "spec.requireTpm", "<boolean>", False, ("must be true or false",), False),
        ("SecurityBaseline", "spec.requireMeasurementPcr", "<boolean>", False,
         ("must be true or false",), None),  # written only when set (to_dict)
        ("DeviceHealthPolicy", "spec.hysteresis", "<string>", False,
         ('must be a percentage such as "50%"',), "5%"),
    ],
)  # fmt: skip
def test_fields_say_what_the_validation_says(
    kind: str,
    path: str,
    type_: str,
    required: bool,
    accepts: tuple[str, ...] | None,
    default: object,
) -> None:
    node = _node(kind, path)
    assert (node.type, node.required, node.default) == (type_, required, default)
    if accepts is not None:
        assert node.accepts == accepts


def test_every_kind_has_a_schema_with_descriptions() -> None:
    for kind in SUPPORTED_KINDS:
        schema = schema_of(kind)
        assert schema.description, kind
        assert list(schema.fields)[:4] == ["apiVersion", "kind", "metadata", "spec"]
        assert schema.fields["metadata"].fields["name"].required
    assert "ONNX Runtime" in _node("ModelDeployment", "spec.runtime").description
    # a field two kinds share a path for says what it means for each
    assert "TPM-attested devices" in _node("Secret", "spec.requireTpm").description
    assert "implies requireAttestation" in _node("SecurityBaseline", "spec.requireTpm").description
    measured = _node("SecurityBaseline", "spec.requireMeasurementPcr").description
    assert "trust.measurementPcr" in measured and "implies requireTpm" in measured


@pytest.mark.parametrize(
    ("kind", "path", "message"),
    [
        ("ModelDeployment", "spec.nope",
         'field "nope" does not exist in ModelDeployment.spec (fields: model, runtime,'),
        ("ModelDeployment", "spec.model.name.x",
         'field "x" does not exist in ModelDeployment.spec.model.name (fields: none'),
        ("Pod", "", "unknown kind 'Pod' (one of ModelDeployment,"),
    ],
)  # fmt: skip
def test_what_does_not_exist_is_named(kind: str, path: str, message: str) -> None:
    with pytest.raises(ExplainError) as info:
        explain(kind, path)
    assert str(info.value).startswith(message)
