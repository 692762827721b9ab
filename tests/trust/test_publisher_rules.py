"""Publishers per deployment (``spec.publishers``): the pure check, as a table."""

from __future__ import annotations

from typing import Any

import pytest

from edgefleet.api.baselines import parse_security_baseline
from edgefleet.errors import TrustError
from edgefleet.trust.publishers import DelegatedRole, check_publisher

A, B, C = "a" * 64, "b" * 64, "c" * 64


def baseline(name: str, publishers: Any) -> Any:
    spec = {} if publishers is None else {"publishers": publishers}
    return parse_security_baseline(
        {
            "apiVersion": "edgefleet.io/v1",
            "kind": "SecurityBaseline",
            "metadata": {"name": name},
            "spec": spec,
        }
    )


VISION = [
    {"keys": [A], "deployments": ["vision-*"]},
    {"keys": [B], "deploymentLabels": {"team": "audio"}},
]

CASES = [
    # (baselines' publishers, deployment, labels, signers, threshold, role, refused with)
    ([None], "anything", {}, {C}, 1, None, None),  # no rules: the trust root decides
    ([VISION], "vision-front", {}, {A}, 1, None, None),
    ([VISION], "vision-front", {}, {B}, 1, None, "signed by key(s) bbbb"),  # trusted, not here
    ([VISION], "speech", {"team": "audio"}, {B}, 1, None, None),
    ([VISION], "speech", {"team": "video"}, {B}, 1, None, "no rule of SecurityBaseline b0"),
    ([VISION], "vision-front", {}, {A, C}, 2, None, "1 of the 2 signature(s)"),
    (
        [VISION, [{"keys": [A, C], "deployments": ["*"]}]],
        "vision-x",
        {},
        {A, C},
        2,
        None,
        "1 of the 2",
    ),  # every baseline must allow it: the first allows only A
    ([VISION, None], "vision-front", {}, {A}, 1, None, None),
    ([[]], "vision-front", {}, {A}, 1, None, "no rule"),  # [] = no publisher at all
    ([VISION], "vision-front", {}, {A}, 1, DelegatedRole("vision", frozenset({A}), 1), None),
    (
        [VISION],
        "vision-front",
        {},
        {A},
        1,
        DelegatedRole("lab", frozenset({B}), 1),
        "TUF publisher role 'lab'",
    ),  # the envelope's key is allowed, the TUF role that lists it not
    (
        [VISION],
        "vision-front",
        {},
        {A},
        1,
        DelegatedRole("two", frozenset({A, C}), 2),
        "TUF publisher role 'two'",
    ),
]


@pytest.mark.parametrize(
    ("rules", "dep", "labels", "signers", "threshold", "role", "refused"), CASES
)
def test_publisher_table(
    rules: list[Any],
    dep: str,
    labels: dict[str, str],
    signers: set[str],
    threshold: int,
    role: DelegatedRole | None,
    refused: str | None,
) -> None:
    baselines = [baseline(f"b{i}", r) for i, r in enumerate(rules)]

    def check() -> None:
        check_publisher(
            baselines,
            what="det 1.0.0",
            deployment=dep,
            labels=labels,
            signers=frozenset(signers),
            threshold=threshold,
            role=role,
        )

    if refused is None:
        check()
        return
    with pytest.raises(TrustError) as info:
        check()
    assert info.value.reason == "PublisherNotAllowed"
    assert refused in str(info.value) and "det 1.0.0" in str(info.value)
