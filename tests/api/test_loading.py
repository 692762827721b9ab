"""Loading manifest files: YAML documents, JSON, duplicate keys, syntax errors.

Real files in pytest's tmp_path, real PyYAML (libyaml when present); nothing faked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgefleet.api import (
    MAX_FILE_BYTES,
    ModelDeployment,
    load_documents,
    load_manifest_file,
    load_manifests,
)
from edgefleet.errors import ValidationError


def deployment_yaml(name: str, version: str = '"1.0"') -> str:
    return (
        "apiVersion: edgefleet.io/v1\n"
        "kind: ModelDeployment\n"
        f"metadata: {{name: {name}}}\n"
        f"spec: {{model: {{name: {name}, version: {version}}}}}\n"
    )


def deployment_dict(name: str) -> dict[str, object]:
    return {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {"model": {"name": name, "version": "1.0"}},
    }


def error_of(text: str | bytes, source: str = "t.yaml") -> ValidationError:
    with pytest.raises(ValidationError) as info:
        load_documents(text, source=source)
    assert info.value.source == source
    return info.value


def test_multi_document_yaml_skips_empty_documents() -> None:
    text = "# comment\n---\n" + deployment_yaml("a") + "---\n---\n" + deployment_yaml("b") + "---\n"
    docs = load_documents(text, source="t.yaml")
    assert [d["metadata"]["name"] for d in docs] == ["a", "b"]


def test_empty_text_has_no_documents() -> None:
    assert load_documents("", source="t.yaml") == []
    assert load_documents("# nothing\n---\n", source="t.yaml") == []


def test_json_object_and_json_list() -> None:
    one = load_documents(json.dumps(deployment_dict("a")), source="t.json")
    assert one == [deployment_dict("a")]
    many = load_documents(json.dumps([deployment_dict("a"), deployment_dict("b")]), source="t.json")
    assert [d["metadata"]["name"] for d in many] == ["a", "b"]


def test_yaml_flow_mapping_is_not_mistaken_for_json() -> None:
    assert load_documents("{name: x, labels: {a: b}}", source="t.yaml") == [
        {"name": "x", "labels": {"a": "b"}}
    ]


def test_bytes_with_a_byte_order_mark() -> None:
    assert load_documents(b"\xef\xbb\xbfa: 1\n", source="t.yaml") == [{"a": 1}]


def test_not_utf8() -> None:
    assert "not UTF-8" in str(error_of(b"a: \xff\n"))


def test_non_mapping_documents_are_named_by_index() -> None:
    err = error_of("a: 1\n---\n- x\n---\nplain\n---\nb: 2\n")
    assert [str(p) for p in err.problems] == [
        "documents[1]: must be a mapping, got a list",
        'documents[2]: must be a mapping, got "plain"',
    ]


def test_json_list_items_must_be_objects() -> None:
    err = error_of('[{"a": 1}, 3]', source="t.json")
    assert [str(p) for p in err.problems] == ["documents[1]: must be a mapping, got 3"]


def test_yaml_syntax_error_names_line_and_column() -> None:
    err = error_of("a: 1\nb:\n  c: [1, 2\nd: 4\n")
    (problem,) = err.problems
    assert problem.message.startswith("invalid YAML at line 4, column 2:")
    assert str(err).startswith("t.yaml: invalid YAML at line")


def test_yaml_mapping_values_error() -> None:
    err = error_of("a: 1\nb: c: d\n")
    assert "invalid YAML at line 2, column 5: mapping values are not allowed" in str(err)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("a: 1\nb: 2\na: 3\n", 3),
        ("spec:\n  runtime:\n    maxBatchSize: 1\n    maxBatchSize: 8\n", 4),
        ("x: 1\n---\nm: {k: 1, k: 2}\n", 3),
    ],
)
def test_duplicate_yaml_keys_are_rejected(text: str, line: int) -> None:
    (problem,) = error_of(text).problems
    assert f"at line {line}" in problem.message
    assert "found duplicate key" in problem.message


def test_yaml_merge_keys_are_not_duplicates() -> None:
    text = "base: &b {a: 1, b: 2}\nderived:\n  <<: *b\n  b: 3\n"
    assert load_documents(text, source="t.yaml") == [
        {"base": {"a": 1, "b": 2}, "derived": {"a": 1, "b": 3}}
    ]


def test_duplicate_json_keys_are_rejected() -> None:
    err = error_of('{"a": 1, "b": {"c": 1, "c": 2}}', source="t.json")
    assert str(err) == 't.json: invalid JSON: found duplicate key "c"'


def test_text_over_one_mebibyte_is_rejected() -> None:
    text = "a: " + "x" * MAX_FILE_BYTES
    assert "larger than 1 MiB" in str(error_of(text))
    assert "larger than 1 MiB" in str(error_of(text.encode()))


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    assert error_of("[" * 200_000).problems


def test_load_manifests_returns_typed_objects() -> None:
    manifests = load_manifests(deployment_yaml("a") + "---\n" + deployment_yaml("b"), source="s")
    assert [type(m) for m in manifests] == [ModelDeployment, ModelDeployment]
    assert [m.name for m in manifests] == ["a", "b"]


def test_manifest_file_reports_problems_of_all_documents(tmp_path: Path) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_text(
        deployment_yaml("a", version="2.4")
        + "---\n"
        + deployment_yaml("b")
        + "---\n"
        + deployment_yaml("C")
    )
    with pytest.raises(ValidationError) as info:
        load_manifest_file(path)
    assert info.value.source == str(path)
    assert {p.path for p in info.value.problems} == {
        "documents[0].spec.model.version",
        "documents[2].metadata.name",
        "documents[2].spec.model.name",
    }


def test_single_document_file_has_plain_paths(tmp_path: Path) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_text(deployment_yaml("a").replace("spec:", "spec: {replicas: {total: -1}}\nx:"))
    with pytest.raises(ValidationError) as info:
        load_manifest_file(path)
    assert {p.path for p in info.value.problems} == {"spec.model", "spec.replicas.total", "x"}


def test_same_kind_and_name_twice_in_one_file(tmp_path: Path) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_text(deployment_yaml("a") + "---\n" + deployment_yaml("a"))
    with pytest.raises(ValidationError) as info:
        load_manifest_file(path)
    assert [str(p) for p in info.value.problems] == [
        'documents[1].metadata.name: ModelDeployment "a" is already in documents[0]'
    ]


def test_manifest_file_json(tmp_path: Path) -> None:
    path = tmp_path / "deploy.json"
    path.write_text(json.dumps([deployment_dict("a"), deployment_dict("b")]))
    assert [m.name for m in load_manifest_file(path)] == ["a", "b"]


def test_unreadable_file_is_a_validation_error(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="cannot read"):
        load_manifest_file(tmp_path / "missing.yaml")
    with pytest.raises(ValidationError, match="cannot read"):
        load_manifest_file(tmp_path)


def test_big_file_is_rejected_without_reading_it_all(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes(b"a: " + b"x" * (4 * MAX_FILE_BYTES))
    with pytest.raises(ValidationError, match="larger than 1 MiB"):
        load_manifest_file(path)
