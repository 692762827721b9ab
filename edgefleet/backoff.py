"""Exponential backoff: the one type every retry of the project computes its delay with.

``Backoff(base, cap, jitter)`` is a pure policy: ``delay(failures, rng)`` gives the delay after
``failures`` consecutive failures (0: the first retry), ``base * 2**failures`` capped at ``cap``
(the exponent is capped too: ``2.0 ** 1024`` overflows, and a thing may fail for days), then
jittered:

* ``Jitter.NONE``: exactly that;
* ``Jitter.EQUAL``: multiplied by a factor uniform in ``(1 - fraction, 1]`` (the work queue:
  never above the cap, never below ``1 - fraction`` of it);
* ``Jitter.FULL``: uniform in ``[0, delay]`` (AWS's "full jitter": a hub restart does not bring
  every device back at the same instant).

Users: the work queues of edged (per-key retries), the hub link's reconnects, the component
supervisor's restarts, the crash-loop backoff of worker replicas and the hub's batch loops.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

_MAX_EXPONENT = 62


class Jitter(StrEnum):
    NONE = "none"
    EQUAL = "equal"
    FULL = "full"


@dataclass(frozen=True, slots=True)
class Backoff:
    base: float
    cap: float
    jitter: Jitter = Jitter.NONE
    fraction: float = 0.5  # for Jitter.EQUAL

    def __post_init__(self) -> None:
        if not 0 < self.base <= self.cap:
            raise ValueError(f"backoff needs 0 < base <= cap, got {self.base} and {self.cap}")
        if not 0 <= self.fraction <= 1:
            raise ValueError(f"jitter fraction must be between 0 and 1, got {self.fraction}")

    def ceiling(self, failures: int) -> float:
        """The delay after ``failures`` consecutive failures, before jitter."""
        return float(min(self.base * 2.0 ** min(max(failures, 0), _MAX_EXPONENT), self.cap))

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """The delay after ``failures`` consecutive failures (0: the first retry)."""
        ceiling = self.ceiling(failures)
        if self.jitter is Jitter.NONE:
            return ceiling
        draw = (rng or random).random()
        if self.jitter is Jitter.EQUAL:
            return ceiling * (1.0 - self.fraction * draw)
        return ceiling * draw
