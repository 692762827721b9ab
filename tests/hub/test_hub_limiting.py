"""hub.api.ratelimit.RateLimiter as a table: calls with the ``now`` passed in, answers expected.
Nothing faked: the limiter has no clock of its own."""

from __future__ import annotations

import pytest

from hub.api.ratelimit import Rate, RateLimiter


@pytest.mark.parametrize(
    ("rate", "calls", "expected"),
    [
        # a burst of 3, then refused until a token refills (1 per second)
        (Rate(1, 3), [("a", 0.0)] * 4, [True, True, True, False]),
        (Rate(1, 3), [("a", 0.0)] * 3 + [("a", 0.5), ("a", 1.0)], [True] * 3 + [False, True]),
        # keys are independent
        (Rate(1, 1), [("a", 0.0), ("b", 0.0), ("a", 0.0)], [True, True, False]),
        # refilling never goes above the burst
        (Rate(10, 2), [("a", 0.0), ("a", 100.0), ("a", 100.0), ("a", 100.0)], [True] * 3 + [False]),
        # a clock that goes backwards refills nothing
        (Rate(1, 1), [("a", 10.0), ("a", 5.0)], [True, False]),
    ],
)
def test_rate_limiter_table(
    rate: Rate, calls: list[tuple[str, float]], expected: list[bool]
) -> None:
    limiter = RateLimiter(rate)
    assert [limiter.allow(key, now) for key, now in calls] == expected


def test_memory_is_bounded_and_retry_after_says_when() -> None:
    limiter = RateLimiter(Rate(2, 1), max_keys=100)
    for i in range(10_000):
        limiter.allow(f"10.0.{i // 256}.{i % 256}", 0.0)
    assert len(limiter) == 100
    assert limiter.retry_after("x", 0.0) == 0.0
    assert limiter.allow("x", 0.0) and not limiter.would_allow("x", 0.0)
    assert limiter.retry_after("x", 0.0) == pytest.approx(0.5)


def test_a_rate_must_make_sense() -> None:
    for bad in ((0, 1), (-1, 1), (1, 0)):
        with pytest.raises(ValueError, match="per_second"):
            Rate(*bad)
