"""Figures that no single device (or region) decides: pure functions, tested as tables.

The canary analysis (:mod:`hub.decide.analysis`) and the analysis across regions
(:mod:`hub.decide.wave`)
compare error rates made of counters that members (devices, or regions at a root hub) report
themselves. A sum of those counters lets one member that reports 2^40 requests decide the
rate; here each member is taken apart instead:

* :func:`screen` turns one member's counter samples into its requests and errors over the
  window, or says why they are **impossible**: errors above requests, errors that went down
  while requests did not (a restart resets both; requests going down is a restart and counts
  again from 0, as Prometheus' ``rate`` does), more requests than the member could answer
  (:data:`MAX_REQUESTS_PER_REPLICA_S` per ready replica, :data:`MAX_REQUESTS_PER_DEVICE_S`
  per device of a region, over the samples' span of at least :data:`MIN_SPAN_S`). An
  impossible member is left out of the analysis altogether and named (an event);
* :func:`weigh` adds up the members of one side with **bounded weights**: each member's rate
  weighs its requests in the window, but never more than the heaviest *other* member's
  requests (of the members that answered any), so no member counts for more than another
  one does;
* :func:`without_each` gives the same totals with each member left out in turn (in
  ``O(n log n)``, not ``O(n^2)``): the analysis takes a decision only where leaving out any
  one member would take the same one; otherwise it is inconclusive and waits, naming the
  member that alone decides it (:func:`hub.decide.analysis.analyze`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

MAX_REQUESTS_PER_REPLICA_S = 10_000.0
"""Requests per second one ready replica may plausibly answer: an ONNX Runtime worker on an
edge device answers hundreds to a few thousand a second; ten thousand leaves room for tiny
models with batching. A device counts at least one replica."""

MAX_REQUESTS_PER_DEVICE_S = 10 * MAX_REQUESTS_PER_REPLICA_S
"""The same bound for a region's figures at the root, per device of the region serving the
revision (its report says how many, not their replicas: ten replicas' worth each)."""

MIN_SPAN_S = 1.0
"""The shortest span the bound is applied over (samples taken close together)."""


class CounterSample(Protocol):
    @property
    def at(self) -> float: ...
    @property
    def requests(self) -> int: ...
    @property
    def errors(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Counts:
    """One member's requests and errors over the window (screened), and its latency p95 where
    it measured one."""

    name: str
    requests: int
    errors: int
    latency_p95_s: float | None = None


def screen(
    samples: Sequence[CounterSample], now: float, window: float, per_second: float
) -> tuple[int, int] | str:
    """(requests, errors) within the last ``window`` seconds of ``samples`` (oldest first):
    from the newest sample taken at least a window ago (else the oldest) to the newest; a
    counter that went down (the member restarted) counts again from 0. Or why they are
    impossible (see the module doc); ``per_second``: the most requests per second the member
    may answer."""
    for s in samples:
        if s.requests < 0 or s.errors < 0:
            return f"negative counters (requests {s.requests}, errors {s.errors})"
        if s.errors > s.requests:
            return f"errors ({s.errors}) above requests ({s.requests})"
        if not math.isfinite(s.at):
            return f"a sample at {s.at}"
    if not samples:
        return 0, 0
    start = 0
    for i, s in enumerate(samples):
        if s.at <= now - window:
            start = i
    requests = errors = 0
    prev = samples[start]
    for s in samples[start + 1 :]:
        if s.requests < prev.requests:  # a restart: both counters from 0
            requests += s.requests
            errors += s.errors
        elif s.errors < prev.errors:
            return (
                f"errors went down from {prev.errors} to {s.errors} while requests did not "
                f"({prev.requests} to {s.requests})"
            )
        else:
            requests += s.requests - prev.requests
            errors += s.errors - prev.errors
        prev = s
    span = max(MIN_SPAN_S, samples[-1].at - samples[start].at)
    if not requests <= per_second * span:  # also a NaN bound
        return f"{requests} requests in {span:g} s, above the plausible {per_second:g} per second"
    return requests, errors


def replicas_bound(ready_replicas: int) -> float:
    """The most requests per second a device with ``ready_replicas`` may answer."""
    return MAX_REQUESTS_PER_REPLICA_S * max(1, ready_replicas)


def _weights(counts: Sequence[Counts]) -> list[int]:
    """Each member's weight: its requests, at most the heaviest other member's (of those that
    answered any: a side's only member with requests keeps them all)."""
    if len(counts) < 2:
        return [c.requests for c in counts]
    order = sorted(range(len(counts)), key=lambda i: -counts[i].requests)
    first, second = counts[order[0]].requests, counts[order[1]].requests
    second = second or first
    return [min(c.requests, second if i == order[0] else first) for i, c in enumerate(counts)]


def _share(c: Counts, weight: int) -> int:
    """``c``'s errors at ``weight`` requests (its rate kept; rounded half up, exact ints)."""
    if c.requests in (0, weight):
        return c.errors
    return (c.errors * weight + c.requests // 2) // c.requests


def weigh(counts: Sequence[Counts]) -> tuple[int, int]:
    """(requests, errors) of one side: each member's rate weighted by its requests, bounded
    by the heaviest other member's (see the module doc); errors / requests is the side's
    error rate."""
    requests = errors = 0
    for c, w in zip(counts, _weights(counts), strict=True):
        requests += w
        errors += _share(c, w)
    return requests, errors


def without_each(counts: Sequence[Counts]) -> dict[str, tuple[int, int]]:
    """Member name -> :func:`weigh` of the others. Leaving out a member other than the two
    heaviest changes no one else's bound, so its share is subtracted; for the two heaviest
    the totals are made again."""
    if not counts:
        return {}
    weights = _weights(counts)
    requests, errors = weigh(counts)
    heaviest = set(sorted(range(len(counts)), key=lambda i: -counts[i].requests)[:2])
    out: dict[str, tuple[int, int]] = {}
    for i, c in enumerate(counts):
        if i in heaviest:
            out[c.name] = weigh([o for j, o in enumerate(counts) if j != i])
        else:
            out[c.name] = (requests - weights[i], errors - _share(c, weights[i]))
    return out


def worst_latency_without_each(counts: Sequence[Counts]) -> dict[str, float | None]:
    """Member name -> the highest latency p95 of the others (None: none measured one)."""
    measured = sorted(
        ((c.latency_p95_s, i) for i, c in enumerate(counts) if c.latency_p95_s is not None),
        reverse=True,
    )
    out: dict[str, float | None] = {}
    for i, c in enumerate(counts):
        others = [p for p, j in measured[:2] if j != i]
        out[c.name] = others[0] if others else None
    return out


def newly_excluded(excluded: Mapping[str, str], announced: Iterable[str]) -> list[tuple[str, str]]:
    """The members of ``excluded`` (name -> why) not ``announced`` yet, by name: what an
    event names once, while the member stays excluded."""
    seen = set(announced)
    return sorted((name, why) for name, why in excluded.items() if name not in seen)
