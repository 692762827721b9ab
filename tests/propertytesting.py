"""Hypothesis settings for the property tests: a few thousand inputs by default, at least
100,000 in the nightly mode (``EDGEFLEET_NIGHTLY=1``). Each property test takes its example
count from :func:`examples`, so both modes run the same properties."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

NIGHTLY = os.environ.get("EDGEFLEET_NIGHTLY", "") not in ("", "0")


def examples(default: int, nightly: int = 100_000) -> settings:
    """Settings for a property test: ``default`` examples, ``nightly`` in the nightly mode;
    no deadline (shared, noisy machines) and no database of failures in the tree."""
    return settings(
        max_examples=nightly if NIGHTLY else default,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
