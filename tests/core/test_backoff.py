"""The one backoff type (pure): growth, cap, jitter bounds."""

import random

import pytest

from edgefleet.backoff import Backoff, Jitter


@pytest.mark.parametrize(
    ("failures", "expected"),
    [(0, 0.05), (1, 0.1), (2, 0.2), (10, 51.2), (13, 300.0), (10_000, 300.0), (-1, 0.05)],
)
def test_exponential_then_capped(failures: int, expected: float) -> None:
    assert Backoff(0.05, 300.0).delay(failures) == pytest.approx(expected)


def test_equal_jitter_stays_between_half_and_the_ceiling() -> None:
    b = Backoff(1.0, 60.0, Jitter.EQUAL, fraction=0.5)
    rng = random.Random(1)
    delays = [b.delay(3, rng) for _ in range(1000)]
    assert all(4.0 <= d <= 8.0 for d in delays)
    assert max(delays) - min(delays) > 3.0  # it does spread


def test_full_jitter_is_uniform_below_the_ceiling() -> None:
    b = Backoff(1.0, 60.0, Jitter.FULL)
    rng = random.Random(2)
    delays = [b.delay(20, rng) for _ in range(1000)]
    assert all(0.0 <= d <= 60.0 for d in delays)
    assert min(delays) < 5.0 and max(delays) > 55.0


@pytest.mark.parametrize(("base", "cap", "fraction"), [(0, 1, 0.5), (2, 1, 0.5), (1, 2, 1.5)])
def test_nonsense_is_refused(base: float, cap: float, fraction: float) -> None:
    with pytest.raises(ValueError):
        Backoff(base, cap, Jitter.EQUAL, fraction=fraction)
