"""The syntax of fields the kinds share (versions, digests, times of day, bounds), as
checkers for :class:`edgefleet.api.validating.Reader`: each returns the value or raises
ValueError saying what was expected."""

from __future__ import annotations

from collections.abc import Callable
from datetime import time

from edgefleet.api.quantities import (
    format_duration,
    parse_percent,
)
from edgefleet.api.validating import (
    matching,
    number_in,
    within,
)


def plain_number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


_version_text = matching(
    r"[A-Za-z0-9][A-Za-z0-9._+-]*",
    'a version such as "2.4.1": letters, digits, ".", "_", "+" and "-"',
    max_length=128,
)


def version_string(value: object) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise ValueError(
            f'must be a string, got the number {value!r}: write it in quotes (version: "{value}"); '
            "YAML reads unquoted numbers as numbers, so 2.40 would become 2.4"
        )
    return _version_text(value)


_sha256_text = matching(r"[0-9a-fA-F]{64}", "a SHA-256 digest: 64 hexadecimal digits")


def sha256_digest(value: object) -> str:
    return _sha256_text(value).lower()


execution_provider = matching(
    r"[A-Za-z][A-Za-z0-9_]*ExecutionProvider",
    'an ONNX Runtime execution provider such as "CUDAExecutionProvider"',
)


def at_most(limit: float, text: str) -> Callable[[float], str | None]:
    return lambda v: f"must be at most {text}, got {format_duration(v)}" if v > limit else None


def positive(text: str) -> Callable[[float], str | None]:
    return lambda v: f"must be more than {text}" if v <= 0 else None


_clock_text = matching(r"(?:[01]\d|2[0-3]):[0-5]\d", 'a time of day "HH:MM" (00:00 to 23:59)')


def clock_time(value: object) -> time:
    if isinstance(value, int) and not isinstance(value, bool):
        raise ValueError(
            f'must be a time "HH:MM" in quotes, got the number {value}: YAML reads an unquoted '
            "time such as 06:00 as a number of minutes"
        )
    text = _clock_text(value)
    return time(int(text[:2]), int(text[3:]))


seconds = number_in(above=0, high=86400)


fraction = number_in(0, 1)


step_percent = within(parse_percent, lambda v: "must be more than 0%" if v == 0 else None)
