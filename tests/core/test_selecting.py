"""The label selector both the hub (List) and edgectl use: a table of selectors against one
label set, and a table of refusals with their reasons. Pure: no hub."""

from __future__ import annotations

import pytest

from edgefleet.selecting import parse_selector

LABELS = {"site": "retail", "accelerator": "npu"}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("", True),
        ("site=retail", True),
        ("site==retail", True),
        ("site=depot", False),
        ("site!=depot", True),
        ("zone!=a", True),  # absent labels match !=, as in Kubernetes
        ("accelerator", True),
        ("!accelerator", False),
        ("!zone", True),
        (" site = retail , accelerator ", True),
        ("site=retail,zone", False),
        ("example.com/tier=", False),
        ("site in (retail)", True),
        ("site in (depot, retail)", True),
        ("site in (depot,lab)", False),
        ("zone in (a)", False),  # in needs the label
        ("site notin (depot)", True),
        ("site notin (retail,depot)", False),
        ("zone notin (a)", True),  # absent labels match notin, as in Kubernetes
        ("site in (retail),accelerator notin (gpu),!zone", True),
        ("site in (retail,depot),accelerator=gpu", False),
    ],
)
def test_selector_matches(selector: str, matches: bool) -> None:
    assert parse_selector(selector).matches(LABELS) is matches


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("a=b=c", "more than one operator"),
        ("a,,b", "requirement 2 is empty"),
        ("site in ()", "in needs at least one value"),
        ("site in (a", "a '\\(' without its '\\)'"),
        ("site in a)", "a '\\)' without its '\\('"),
        ("site in ((a))", "nested parentheses"),
        ("site within (a)", "KEY in \\(V1,V2\\)"),
        ("site in (a b)", "must be a label value"),
        ("Bad Key", "must be a label key"),
        ("a=b c", "must be a label value"),
    ],
)
def test_selector_errors(selector: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_selector(selector)


@pytest.mark.parametrize(
    ("selector", "canonical"),
    [
        ("site = retail,  !zone", "site=retail,!zone"),
        ("site in (b, a),x notin (c)", "site in (a,b),x notin (c)"),
        ("a!=b,c", "a!=b,c"),
    ],
)
def test_selector_text_round_trips(selector: str, canonical: str) -> None:
    assert str(parse_selector(selector)) == canonical
    assert str(parse_selector(canonical)) == canonical
