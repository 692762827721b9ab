"""Prometheus metrics in the text exposition format 0.0.4, without a dependency.

    registry = Registry()
    reconciles = registry.counter("edged_reconcile_total", "Reconciles.", ("controller", "result"))
    ok = reconciles.labels(controller="models", result="success")   # cache the child
    ok.inc()
    registry.render()   # served at /metrics with CONTENT_TYPE

Everything runs on one event loop, so there are no locks: ``inc()``, ``set()`` and ``observe()``
are a few attribute operations on a child. ``labels()`` looks the child up in a dict; hot paths
keep the child they got. Gauges may instead take a callback (``set_function``) that is evaluated
when the registry is rendered, for values that already live elsewhere (a queue's depth).
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Generic, TypeVar

from edgefleet.logs import get_logger

log = get_logger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Bucket upper bounds in seconds, as the Prometheus clients use; ``+Inf`` is always added.
DEFAULT_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def format_value(value: float) -> str:
    """A sample value as Prometheus writes it: ``1.0``, ``0.25``, ``+Inf``, ``NaN``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format_labels(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    pairs = ",".join(f'{n}="{_escape_label_value(v)}"' for n, v in zip(names, values, strict=True))
    return "{" + pairs + "}"


class CounterChild:
    """One labelled series of a counter: a value that only goes up."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"a counter only goes up, got inc({amount})")
        self.value += amount


class GaugeChild:
    """One labelled series of a gauge: a value set directly or read from a callback."""

    __slots__ = ("function", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.function: Callable[[], float] | None = None

    def set(self, value: float) -> None:
        self.value = value

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set_function(self, function: Callable[[], float]) -> None:
        """Read the value from ``function()`` each time the registry is rendered."""
        self.function = function

    def read(self) -> float:
        return self.value if self.function is None else float(self.function())


class HistogramChild:
    """One labelled series of a histogram. Counts are kept per bucket, summed when rendered."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds  # sorted upper bounds, the last one +Inf
        self.counts = [0] * len(bounds)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # Buckets are "less than or equal": the first bound >= value.
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def add(self, counts: Sequence[int], total: float) -> None:
        """Observations counted elsewhere over the same bounds: one count per bucket (not
        cumulative), and the sum of their values."""
        if len(counts) != len(self.counts):
            raise ValueError(f"{len(counts)} bucket counts for {len(self.counts)} buckets")
        for i, n in enumerate(counts):
            self.counts[i] += n
        self.sum += total


_Child = TypeVar("_Child", CounterChild, GaugeChild, HistogramChild)


class _Family(Generic[_Child]):
    """A named metric with its label names and one child per combination of label values."""

    kind = ""

    def __init__(self, name: str, help: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.help = help
        self.labelnames: tuple[str, ...] = tuple(labelnames)
        self._children: dict[tuple[str, ...], _Child] = {}
        # Without labels the family has exactly one series, used through the family's methods.
        self._only: _Child | None = None if self.labelnames else self._child_for(())

    def _new_child(self) -> _Child:
        raise NotImplementedError

    def _child_for(self, values: tuple[str, ...]) -> _Child:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._new_child()
        return child

    def labels(self, **labelvalues: object) -> _Child:
        """The child for these label values, created on first use. Keep it on hot paths."""
        try:
            values: tuple[str, ...] | None = tuple(str(labelvalues[n]) for n in self.labelnames)
        except KeyError:
            values = None
        if values is None or len(labelvalues) != len(self.labelnames):
            raise ValueError(
                f"{self.name}: labels() needs exactly {list(self.labelnames)}, "
                f"got {sorted(labelvalues)}"
            )
        return self._child_for(values)

    def _unlabelled(self) -> _Child:
        if self._only is None:
            raise ValueError(f"{self.name} has labels {list(self.labelnames)}: use .labels()")
        return self._only

    def samples(self) -> Iterator[str]:
        raise NotImplementedError

    def render(self) -> Iterator[str]:
        yield f"# HELP {self.name} {_escape_help(self.help)}"
        yield f"# TYPE {self.name} {self.kind}"
        yield from self.samples()


class Counter(_Family[CounterChild]):
    kind = "counter"

    def _new_child(self) -> CounterChild:
        return CounterChild()

    def inc(self, amount: float = 1.0) -> None:
        self._unlabelled().inc(amount)

    def samples(self) -> Iterator[str]:
        for values, child in self._children.items():
            labels = _format_labels(self.labelnames, values)
            yield f"{self.name}{labels} {format_value(child.value)}"


class Gauge(_Family[GaugeChild]):
    kind = "gauge"

    def _new_child(self) -> GaugeChild:
        return GaugeChild()

    def set(self, value: float) -> None:
        self._unlabelled().set(value)

    def inc(self, amount: float = 1.0) -> None:
        self._unlabelled().inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self._unlabelled().dec(amount)

    def set_function(self, function: Callable[[], float]) -> None:
        self._unlabelled().set_function(function)

    def replace(self, series: Mapping[tuple[str, ...], float]) -> None:
        """Exactly these labelled series from now on, the others dropped: for label values
        that come and go (the versions devices run). The caller bounds how many."""
        if not self.labelnames or any(len(v) != len(self.labelnames) for v in series):
            raise ValueError(f"{self.name}: each series needs values for {list(self.labelnames)}")
        self._children = {}
        for values, value in series.items():
            self._child_for(tuple(str(v) for v in values)).set(value)

    def samples(self) -> Iterator[str]:
        for values, child in self._children.items():
            try:
                value = child.read()
            except Exception as exc:
                # One broken callback must not break the whole scrape.
                log.warning("gauge callback failed", metric=self.name, error=repr(exc))
                continue
            labels = _format_labels(self.labelnames, values)
            yield f"{self.name}{labels} {format_value(value)}"


class Histogram(_Family[HistogramChild]):
    kind = "histogram"

    def __init__(
        self, name: str, help: str, labelnames: Sequence[str], buckets: Sequence[float]
    ) -> None:
        bounds = [float(b) for b in buckets]
        if any(math.isnan(b) for b in bounds) or any(a >= b for a, b in itertools.pairwise(bounds)):
            raise ValueError(f"{name}: buckets must be strictly increasing, got {list(buckets)}")
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.bounds: tuple[float, ...] = tuple(bounds)
        super().__init__(name, help, labelnames)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self.bounds)

    def observe(self, value: float) -> None:
        self._unlabelled().observe(value)

    def samples(self) -> Iterator[str]:
        names = (*self.labelnames, "le")
        for values, child in self._children.items():
            cumulative = 0
            for bound, count in zip(self.bounds, child.counts, strict=True):
                cumulative += count
                labels = _format_labels(names, (*values, format_value(bound)))
                yield f"{self.name}_bucket{labels} {cumulative}"
            labels = _format_labels(self.labelnames, values)
            yield f"{self.name}_sum{labels} {format_value(child.sum)}"
            yield f"{self.name}_count{labels} {cumulative}"


Metric = Counter | Gauge | Histogram
_M = TypeVar("_M", Counter, Gauge, Histogram)


class Registry:
    """The metrics of one process, rendered in registration order."""

    def __init__(self) -> None:
        self._metrics: dict[str, Metric] = {}

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Counter:
        name, labelnames = self._check(name, labelnames)
        return self._register(Counter(name, help, labelnames))

    def gauge(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Gauge:
        name, labelnames = self._check(name, labelnames)
        return self._register(Gauge(name, help, labelnames))

    def histogram(
        self,
        name: str,
        help: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> Histogram:
        name, labelnames = self._check(name, labelnames)
        if "le" in labelnames:
            raise ValueError(f"{name}: 'le' is reserved for histogram buckets")
        return self._register(Histogram(name, help, labelnames, buckets))

    def get(self, name: str) -> Metric | None:
        """The metric registered under ``name``, if any."""
        return self._metrics.get(name)

    def render(self) -> str:
        """Every metric in the Prometheus text format 0.0.4 (serve with ``CONTENT_TYPE``)."""
        lines = [line for metric in self._metrics.values() for line in metric.render()]
        return "\n".join(lines) + "\n" if lines else ""

    def _check(self, name: str, labelnames: Sequence[str]) -> tuple[str, tuple[str, ...]]:
        if isinstance(labelnames, str):
            raise TypeError(f"{name}: labelnames must be a sequence of names, not a string")
        if not _METRIC_NAME.fullmatch(name):
            raise ValueError(f"invalid metric name {name!r}")
        for label in labelnames:
            if not _LABEL_NAME.fullmatch(label) or label.startswith("__"):
                raise ValueError(f"{name}: invalid label name {label!r}")
        if len(set(labelnames)) != len(labelnames):
            raise ValueError(f"{name}: duplicate label names in {list(labelnames)}")
        if name in self._metrics:
            raise ValueError(f"metric {name!r} is already registered")
        return name, tuple(labelnames)

    def _register(self, metric: _M) -> _M:
        self._metrics[metric.name] = metric
        return metric
