"""edgectl's patches as tables: RFC 7386 (merge), RFC 6902 (json) and the strategic merge of
lists of named items. Pure."""

from __future__ import annotations

from typing import Any

import pytest

from edgectl.patching import PatchError, apply_patch, json_patch, merge_patch, strategic_patch

# RFC 7386, appendix A
MERGE_CASES = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(("target", "patch", "expected"), MERGE_CASES)
def test_merge_patch_is_rfc_7386(target: Any, patch: Any, expected: Any) -> None:
    assert merge_patch(target, patch) == expected


DOC = {"baz": "qux", "foo": "bar", "list": ["a", "b"], "o": {"x": 1}}


@pytest.mark.parametrize(
    ("ops", "expected"),
    [
        ([{"op": "add", "path": "/hello", "value": ["w"]}], {**DOC, "hello": ["w"]}),
        ([{"op": "add", "path": "/list/1", "value": "z"}], {**DOC, "list": ["a", "z", "b"]}),
        ([{"op": "add", "path": "/list/-", "value": "z"}], {**DOC, "list": ["a", "b", "z"]}),
        ([{"op": "remove", "path": "/baz"}], {k: v for k, v in DOC.items() if k != "baz"}),
        ([{"op": "remove", "path": "/list/0"}], {**DOC, "list": ["b"]}),
        ([{"op": "replace", "path": "/baz", "value": "boo"}], {**DOC, "baz": "boo"}),
        (
            [{"op": "move", "from": "/o/x", "path": "/o/y"}],
            {**DOC, "o": {"y": 1}},
        ),
        ([{"op": "copy", "from": "/foo", "path": "/o/foo"}], {**DOC, "o": {"x": 1, "foo": "bar"}}),
        ([{"op": "test", "path": "/baz", "value": "qux"}], DOC),
        ([{"op": "add", "path": "/a~1b", "value": 1}], {**DOC, "a/b": 1}),
    ],
)
def test_json_patch_is_rfc_6902(ops: list[Any], expected: Any) -> None:
    assert json_patch(DOC, ops) == expected
    assert DOC["list"] == ["a", "b"] and DOC["o"] == {"x": 1}  # the document is not changed


@pytest.mark.parametrize(
    ("ops", "why"),
    [
        ([{"op": "test", "path": "/baz", "value": "x"}], r"\[0\]: test failed"),
        ([{"op": "remove", "path": "/nope"}], r"\[0\]: /nope does not exist"),
        ([{"op": "replace", "path": "/nope", "value": 1}], "does not exist"),
        ([{"op": "add", "path": "/list/9", "value": 1}], "index 9 is out of range"),
        ([{"op": "add", "path": "/list/01", "value": 1}], "is not an index"),
        ([{"op": "add", "path": "x", "value": 1}], "must be a JSON pointer"),
        ([{"op": "add", "path": "/x"}], "add needs a value"),
        ([{"op": "explode", "path": "/x"}], "must be add, remove, replace, move, copy or test"),
        ([{"op": "move", "from": "/o", "path": "/o/x/y"}], "into itself"),
        ({"op": "add"}, "must be a list of operations"),
        ([{"op": "add", "path": "/baz/x", "value": 1}], "inside a string"),
    ],
)
def test_a_json_patch_that_cannot_apply_says_where(ops: Any, why: str) -> None:
    with pytest.raises(PatchError, match=why):
        json_patch(DOC, ops)


SECRETS = {"spec": {"secrets": [{"name": "a", "mountPath": "/a"}, {"name": "b"}], "x": [1, 2]}}


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        # a named item merges into its namesake, a new one is added at the end
        (
            {"spec": {"secrets": [{"name": "b", "mountPath": "/b"}, {"name": "c"}]}},
            [{"name": "a", "mountPath": "/a"}, {"name": "b", "mountPath": "/b"}, {"name": "c"}],
        ),
        ({"spec": {"secrets": [{"name": "a", "$patch": "delete"}]}}, [{"name": "b"}]),
        ({"spec": {"secrets": [{"name": "a", "mountPath": None}]}}, [{"name": "a"}, {"name": "b"}]),
    ],
)
def test_a_strategic_patch_merges_lists_of_named_items_by_name(
    patch: Any, expected: list[Any]
) -> None:
    got = strategic_patch(SECRETS, patch)
    assert got["spec"]["secrets"] == expected and got["spec"]["x"] == [1, 2]


def test_a_strategic_patch_replaces_other_lists_and_refuses_other_directives() -> None:
    assert strategic_patch(SECRETS, {"spec": {"x": [3]}})["spec"]["x"] == [3]
    with pytest.raises(PatchError, match=r"spec.\$retainKeys: not supported yet"):
        strategic_patch(SECRETS, {"spec": {"$retainKeys": ["x"]}})
    with pytest.raises(PatchError, match="not supported yet"):
        strategic_patch(SECRETS, {"spec": {"secrets": [{"name": "a", "$patch": "replace"}]}})


def test_apply_patch_checks_the_shape() -> None:
    with pytest.raises(PatchError, match="a merge patch must be an object, got a list"):
        apply_patch({}, [1], "merge")
    with pytest.raises(PatchError, match="unknown patch type 'xml'"):
        apply_patch({}, {}, "xml")
    with pytest.raises(PatchError, match="must be an object, got int"):
        apply_patch({"a": 1}, [{"op": "replace", "path": "", "value": 3}], "json")
