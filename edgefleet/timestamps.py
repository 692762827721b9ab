"""Times as people and Kubernetes read them: RFC 3339 in UTC (``2026-11-30T21:05:09Z``), to
the second, or to the millisecond where events need their order. Pure."""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(epoch: float | None, *, millis: bool = False) -> str | None:
    """``epoch`` (seconds) as RFC 3339 UTC; None stays None."""
    if epoch is None:
        return None
    moment = datetime.fromtimestamp(epoch, UTC)
    if millis:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def epoch_of(value: object) -> float | None:
    """Seconds since the epoch of an RFC 3339 time (any offset) or a number; None when it is
    neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None
