"""Version order, as a table."""

from __future__ import annotations

import pytest

from edgefleet.trust.versions import compare_versions


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("1.0.0", "1.0.0", 0),
        ("1.0", "1.0.0", 0),
        ("v2.4.1", "2.4.1", 0),
        ("1.0.0+build.7", "1.0.0", 0),
        ("1.0.1", "1.0.0", 1),
        ("1.10.0", "1.9.0", 1),
        ("2", "1.99.99", 1),
        ("1.0.0-rc.1", "1.0.0", -1),
        ("1.0.0-alpha", "1.0.0-alpha.1", -1),
        ("1.0.0-alpha.1", "1.0.0-alpha.beta", -1),
        ("1.0.0-beta.2", "1.0.0-beta.11", -1),
        ("1.0.0-rc.1", "0.9.9", 1),
        ("1.2.3.4", "1.2.3", 1),
    ],
)
def test_compare(a: str, b: str, expected: int) -> None:
    assert compare_versions(a, b) == expected
    assert compare_versions(b, a) == -expected


@pytest.mark.parametrize("bad", ["latest", "1.x", "", "1..2", "1.0-", "1.0.0-rc..1"])
def test_not_comparable(bad: str) -> None:
    with pytest.raises(ValueError, match="version"):
        compare_versions(bad, "1.0.0")
