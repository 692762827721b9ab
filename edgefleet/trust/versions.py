"""Model version comparison: semantic-version-like, pure.

``MAJOR.MINOR.PATCH...[-PRERELEASE][+BUILD]``: any number of numeric dotted parts, compared
as numbers, missing parts count as 0 (``1.2 == 1.2.0``); a prerelease is lower than the
release (``1.0.0-rc.1 < 1.0.0``), prerelease identifiers compare dot by dot, numeric ones as
numbers and below alphanumeric ones (SemVer 2.0 rule 11); build metadata (``+...``) is ignored.
A leading ``v`` is allowed. Anything else is not comparable (``ValueError``).
"""

from __future__ import annotations

from functools import total_ordering

from edgefleet.errors import TrustError


@total_ordering
class _PreId:
    __slots__ = ("num", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.num = int(text) if text.isdigit() else None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _PreId) and self.text == other.text

    def __lt__(self, other: _PreId) -> bool:
        if self.num is not None and other.num is not None:
            return self.num < other.num
        if self.num is not None or other.num is not None:
            return self.num is not None  # numeric identifiers are lower
        return self.text < other.text

    def __hash__(self) -> int:
        return hash(self.text)


VersionKey = tuple[tuple[int, ...], int, tuple[_PreId, ...]]


def version_key(version: str) -> VersionKey:
    """A sort key for ``version``; raises ValueError when it is not comparable."""
    text = version.strip()
    if text[:1] in ("v", "V"):
        text = text[1:]
    text = text.split("+", 1)[0]
    main, dash, pre = text.partition("-")
    parts = main.split(".")
    if not main or not all(p.isdigit() for p in parts):
        raise ValueError(
            f"version {version!r} is not comparable: expected numeric dotted parts "
            "such as 2.4.1 or 2.4.1-rc.1"
        )
    nums = [int(p) for p in parts]
    while len(nums) > 1 and nums[-1] == 0:
        nums.pop()
    if dash and (not pre or any(not p for p in pre.split("."))):
        raise ValueError(f"version {version!r} has an empty prerelease part")
    pre_ids = tuple(_PreId(p) for p in pre.split(".")) if dash else ()
    # A release sorts above every prerelease of the same numbers.
    return tuple(nums), 0 if dash else 1, pre_ids


def compare_versions(a: str, b: str) -> int:
    """-1, 0 or 1 as ``a`` is lower than, equal to or higher than ``b``."""
    ka, kb = version_key(a), version_key(b)
    return (ka > kb) - (ka < kb)


def require_comparable_version(version: str, *, what: str) -> None:
    """Refuse a model version that cannot be compared (``dev``, ``latest``...): once accepted
    it would make every later version of that name incomparable (a lock)."""
    try:
        version_key(version)
    except ValueError as exc:
        raise TrustError("VersionNotComparable", f"{what}: {exc}") from None
