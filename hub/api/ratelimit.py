"""Rate limits for what arrives from outside: token buckets per key, bounded in memory.

A :class:`RateLimiter` holds one token bucket per key (a source address, a token id, a device
name). ``allow(key, now)`` takes one token if there is one. It is a pure function of the calls
made and the ``now`` passed in (no clock of its own), so it is tested as a table.

Memory is bounded: at most ``max_keys`` buckets are kept; past that the least recently used
one is dropped (it is most likely refilled already; an attacker with more addresses than
``max_keys`` gets a fresh bucket per address, which is no worse than one bucket per address).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Rate:
    """``per_second`` tokens refill every second, up to ``burst`` held at once."""

    per_second: float
    burst: int

    def __post_init__(self) -> None:
        if self.per_second <= 0 or self.burst < 1:
            raise ValueError(f"a rate needs per_second > 0 and burst >= 1, got {self}")


class RateLimiter:
    def __init__(self, rate: Rate, *, max_keys: int = 10_000) -> None:
        self.rate = rate
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key: tokens, at

    def _level(self, key: str, now: float) -> float:
        held = self._buckets.get(key)
        if held is None:
            return float(self.rate.burst)
        tokens, at = held
        return min(float(self.rate.burst), tokens + max(0.0, now - at) * self.rate.per_second)

    def allow(self, key: str, now: float) -> bool:
        """Take one token for ``key`` if it has one; whether it had."""
        level = self._level(key, now)
        if level < 1.0:
            self._buckets[key] = (level, now)
            self._buckets.move_to_end(key)
            return False
        self._buckets[key] = (level - 1.0, now)
        self._buckets.move_to_end(key)
        if len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return True

    def would_allow(self, key: str, now: float) -> bool:
        """Whether ``allow`` would say yes, without taking anything."""
        return self._level(key, now) >= 1.0

    def retry_after(self, key: str, now: float) -> float:
        """Seconds until ``key`` has a token again (0 when it has one)."""
        return max(0.0, (1.0 - self._level(key, now)) / self.rate.per_second)

    def __len__(self) -> int:
        return len(self._buckets)
