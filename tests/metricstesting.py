"""Reading a Prometheus text exposition in tests (edged's and the hub's /metrics)."""

from __future__ import annotations


def series_value(text: str, series: str) -> float:
    """The value of one series (``name{labels}``) in an exposition; 0 when it is absent."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
