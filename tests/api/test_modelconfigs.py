"""The ModelConfig kind (edgefleet.api.modelconfigs): reading, its bounds and the field paths
of its problems, credential-like keys, and the merge order as a table."""

from __future__ import annotations

from typing import Any

import pytest

from edgefleet.api import parse_manifest
from edgefleet.api.modelconfigs import (
    ALLOW_KEYS_ANNOTATION,
    MAX_DEPTH,
    MAX_OVERRIDES,
    ModelConfig,
    credential_word,
    merge_for_device,
)
from edgefleet.errors import ValidationError


def config(spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "edgefleet.io/v1",
        "kind": "ModelConfig",
        "metadata": {"name": "detector", **meta},
        "spec": {"model": "detector", **spec},
    }


def parsed(spec: dict[str, Any], **meta: Any) -> ModelConfig:
    m = parse_manifest(config(spec, **meta))
    assert isinstance(m, ModelConfig)
    return m


def problems(spec: dict[str, Any], **meta: Any) -> dict[str, str]:
    with pytest.raises(ValidationError) as info:
        parse_manifest(config(spec, **meta))
    return {p.path: p.message for p in info.value.problems}


def test_round_trip() -> None:
    m = parsed(
        {
            "data": {"threshold": 0.5, "zones": [[0, 0, 640, 480]]},
            "files": {"labels.txt": "person\ncar\n"},
            "overrides": [
                {"selector": {"region": "eu"}, "data": {"threshold": 0.6}},
                {"devices": ["cam-1"], "data": {"threshold": None}, "files": {"labels.txt": None}},
            ],
        }
    )
    assert parse_manifest(m.to_dict()) == m


SPEC = {
    "data": {"threshold": 0.5, "zones": {"door": [0, 0, 10, 10]}, "labels": "coco"},
    "files": {"crop.json": "{}"},
    "overrides": [
        {
            "selector": {"region": "eu", "site": "store-7"},
            "data": {"zones": {"till": [1, 1, 2, 2]}},
        },
        {"selector": {"region": "eu"}, "data": {"threshold": 0.6, "labels": "coco-eu"}},
        {"selector": {"site": "store-7"}, "data": {"threshold": 0.7}},
        {"devices": ["cam-1"], "data": {"threshold": 0.9, "labels": None}},
        {"devices": ["cam-1", "cam-2"], "data": {"threshold": 0.8}, "files": {"crop.json": None}},
    ],
}

# device, labels -> expected data, the source of threshold
MERGE_TABLE = [
    ("cam-9", {}, {"threshold": 0.5, "zones": {"door": [0, 0, 10, 10]}, "labels": "coco"},
     "spec (defaults)"),
    ("cam-9", {"region": "us"}, {"threshold": 0.5, "zones": {"door": [0, 0, 10, 10]},
     "labels": "coco"}, "spec (defaults)"),
    ("cam-9", {"region": "eu"}, {"threshold": 0.6, "zones": {"door": [0, 0, 10, 10]},
     "labels": "coco-eu"}, "spec.overrides[1] (selector region=eu)"),
    # two one-label selectors: equally specific, the one listed later wins
    ("cam-9", {"region": "eu", "site": "store-7"},
     {"threshold": 0.7, "zones": {"door": [0, 0, 10, 10], "till": [1, 1, 2, 2]},
      "labels": "coco-eu"}, "spec.overrides[2] (selector site=store-7)"),
    # a device override beats every selector; the later device override wins over the earlier
    ("cam-1", {"region": "eu", "site": "store-7"},
     {"threshold": 0.8, "zones": {"door": [0, 0, 10, 10], "till": [1, 1, 2, 2]}},
     "spec.overrides[4] (device cam-1,cam-2)"),
    ("cam-2", {}, {"threshold": 0.8, "zones": {"door": [0, 0, 10, 10]}, "labels": "coco"},
     "spec.overrides[4] (device cam-1,cam-2)"),
]  # fmt: skip


@pytest.mark.parametrize(("device", "labels", "data", "source"), MERGE_TABLE)
def test_merge_order(device: str, labels: dict[str, str], data: Any, source: str) -> None:
    merged = merge_for_device(parsed(SPEC), device, labels)
    assert merged.data == data
    assert merged.sources["data.threshold"] == source
    # the two-label selector is more specific than the one-label ones, wherever it is listed
    if labels == {"region": "eu", "site": "store-7"}:
        assert merged.steps[-1 if device != "cam-1" else 3].startswith("spec.overrides[0]")
        assert merged.sources["data.zones.till"].startswith("spec.overrides[0]")
        assert merged.sources["data.zones.door"] == "spec (defaults)"


def test_files_removed_by_null_and_digest_follows_content() -> None:
    m = parsed(SPEC)
    a = merge_for_device(m, "cam-2", {})
    assert a.files == {}
    b = merge_for_device(m, "cam-9", {})
    assert b.files == {"crop.json": "{}"}
    assert a.digest() != b.digest()
    assert merge_for_device(m, "cam-9", {"region": "us"}).digest() == b.digest()
    assert b.digest().startswith("sha256:")


def test_problems_name_their_paths() -> None:
    found = problems(
        {
            "data": {"a": None, "b": float("inf")},
            "files": {"../x": "y", "ok.txt": 3},
            "overrides": [
                {"selector": {"region": "eu"}, "devices": ["cam-1"], "data": {"x": 1}},
                {"selector": {}},
                {"devices": ["Not A Name"], "data": {"x": 1}},
                "nope",
            ],
        }
    )
    assert "null is only meaningful" in found["spec.data.a"]
    assert "finite" in found["spec.data.b"]
    assert "file name" in found['spec.files["../x"]']
    assert "text" in found['spec.files["ok.txt"]']
    assert "exactly one of" in found["spec.overrides[0]"]
    assert "sets nothing" in found["spec.overrides[1]"]
    assert "spec.overrides[2].devices[0]" in found
    assert "mapping" in found["spec.overrides[3]"]


def test_bounds() -> None:
    deep: Any = 1
    for _ in range(MAX_DEPTH + 1):
        deep = {"k": deep}
    assert "too deeply" in " ".join(problems({"data": deep}).values())
    wide = {"data": {f"k{i}": list(range(50)) for i in range(100)}}
    assert "more than" in problems(wide)["spec.data"]
    big = {"data": {f"k{i}": "x" * 10000 for i in range(10)}}
    assert "bytes" in problems(big)["spec.data"]
    many = {"overrides": [{"devices": ["a"], "data": {"x": 1}}] * (MAX_OVERRIDES + 1)}
    assert "at most" in problems(many)["spec.overrides"]
    assert "at most" in problems({"files": {"a": "x" * (33 * 1024)}})["spec.files.a"]


@pytest.mark.parametrize(
    ("key", "word"),
    [("password", "password"), ("dbPassword", "password"), ("auth_token", "auth"),
     ("accessToken", "token"),
     ("apiKey", "api key"), ("API-KEY", "api key"), ("client_secret", "secret"),
     ("privateKey", "private key"), ("max_tokens", None), ("tokenizer", None),
     ("keypoints", None), ("threshold", None), ("secretary_zone", None)],
)  # fmt: skip
def test_credential_words(key: str, word: str | None) -> None:
    assert credential_word(key) == word


def test_credential_keys_refused_unless_named() -> None:
    spec = {
        "data": {"db": {"password": "x"}, "max_tokens": 5},
        "overrides": [{"devices": ["cam-1"], "files": {"api-key.txt": "y"}}],
    }
    found = problems(spec)
    assert set(found) == {"spec.data.db.password", 'spec.overrides[0].files["api-key.txt"]'}
    assert "password" in found["spec.data.db.password"]
    assert ALLOW_KEYS_ANNOTATION in found["spec.data.db.password"]
    # forced: the annotation names both keys
    parsed(spec, annotations={ALLOW_KEYS_ANNOTATION: "password, api-key.txt"})
