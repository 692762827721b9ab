"""Quantities as tables: CPU, memory, int-or-percent, durations (pure functions, nothing faked)."""

from __future__ import annotations

import re

import pytest

from edgefleet.api.quantities import (
    IntOrPercent,
    format_cpu,
    format_duration,
    format_memory,
    parse_cpu,
    parse_duration,
    parse_int_or_percent,
    parse_memory,
    parse_percent,
)


@pytest.mark.parametrize(
    ("value", "millis"),
    [
        ("500m", 500),
        ("1", 1000),
        (2, 2000),
        ("0.5", 500),
        (0.5, 500),
        ("1.5", 1500),
        ("1m", 1),
        ("0.001", 1),
        ("2.000", 2000),
        ("1e3m", 1000),
        (" 250m ", 250),
    ],
)
def test_parse_cpu(value: object, millis: int) -> None:
    assert parse_cpu(value) == millis


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("abc", 'must be a CPU quantity such as "500m" or "2", got "abc"'),
        ("-1", 'got "-1"'),
        (-1, "got -1"),
        ("0", "must be more than 0"),
        ("0m", "must be more than 0"),
        ("1.0005", "whole number of millicores"),
        ("0.5m", "whole number of millicores"),
        ("500Mi", "CPU quantity"),
        ("", "CPU quantity"),
        (True, "got true"),
        (None, "got null"),
        (float("nan"), "CPU quantity"),
        ("1" * 100, "CPU quantity"),
    ],
)
def test_parse_cpu_rejects(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_cpu(value)


@pytest.mark.parametrize(("millis", "text"), [(500, "500m"), (1000, "1"), (1500, "1500m")])
def test_format_cpu_round_trips(millis: int, text: str) -> None:
    assert format_cpu(millis) == text
    assert parse_cpu(text) == millis


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ("256Mi", 256 * 2**20),
        ("1Ki", 1024),
        ("1Gi", 2**30),
        ("1.5Gi", 3 * 2**29),
        ("2Ti", 2 * 2**40),
        ("1Pi", 2**50),
        ("1Ei", 2**60),
        ("1k", 1000),
        ("1M", 10**6),
        ("1G", 10**9),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1E", 10**18),
        ("129e6", 129 * 10**6),
        ("1E3", 1000),
        ("1024", 1024),
        (1024, 1024),
        (0, 0),
        ("0.5k", 500),
    ],
)
def test_parse_memory(value: object, size: int) -> None:
    assert parse_memory(value) == size


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1Mi", 'must be a memory quantity such as "256Mi" or "1G", got "-1Mi"'),
        (-5, "got -5"),
        ("1.5", "whole number of bytes"),
        ("1e-3", "whole number of bytes"),
        ("0.1Ki", "whole number of bytes"),
        ("256MB", "memory quantity"),
        ("256m", '"m" means milli'),
        ("10Xi", "memory quantity"),
        ("lots", "memory quantity"),
        (1.5, "got 1.5"),
        (True, "got true"),
        ("16Ei", "at most 8Ei"),
    ],
)
def test_parse_memory_rejects(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_memory(value)


@pytest.mark.parametrize(
    ("size", "text"),
    [(256 * 2**20, "256Mi"), (10**9, "1G"), (1536, "1536"), (1000 * 2**10, "1000Ki"), (0, "0")],
)
def test_format_memory_round_trips(size: int, text: str) -> None:
    assert format_memory(size) == text
    assert parse_memory(text) == size


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("10%", IntOrPercent(10, percent=True)),
        ("0%", IntOrPercent(0, percent=True)),
        ("100%", IntOrPercent(100, percent=True)),
        (3, IntOrPercent(3, percent=False)),
        ("3", IntOrPercent(3, percent=False)),
        (0, IntOrPercent(0, percent=False)),
    ],
)
def test_parse_int_or_percent(value: object, expected: IntOrPercent) -> None:
    assert parse_int_or_percent(value) == expected
    assert parse_int_or_percent(expected.to_yaml()) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("ten", 'must be an integer >= 0 or a percentage such as "25%", got "ten"'),
        ("-5%", 'got "-5%"'),
        (-5, "got -5"),
        ("150%", "from 0% to 100%"),
        ("2.5%", "percentage"),
        (2.5, "got 2.5"),
        (True, "got true"),
        (None, "got null"),
    ],
)
def test_parse_int_or_percent_rejects(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_int_or_percent(value)


@pytest.mark.parametrize(
    ("quantity", "total", "round_up", "count"),
    [
        (IntOrPercent(25, percent=True), 10, True, 3),
        (IntOrPercent(25, percent=True), 10, False, 2),
        (IntOrPercent(25, percent=True), 0, True, 0),
        (IntOrPercent(100, percent=True), 7, False, 7),
        (IntOrPercent(1, percent=True), 1, True, 1),
        (IntOrPercent(1, percent=True), 1, False, 0),
        (IntOrPercent(4, percent=False), 10, False, 4),
    ],
)
def test_int_or_percent_resolve(
    quantity: IntOrPercent, total: int, round_up: bool, count: int
) -> None:
    assert quantity.resolve(total, round_up=round_up) == count


@pytest.mark.parametrize(("value", "percent"), [("50%", 50), ("0%", 0), ("100%", 100), (" 7% ", 7)])
def test_parse_percent(value: str, percent: int) -> None:
    assert parse_percent(value) == percent


@pytest.mark.parametrize("value", [50, "50", "101%", "%", "5.5%", None])
def test_parse_percent_rejects(value: object) -> None:
    with pytest.raises(ValueError, match="percentage"):
        parse_percent(value)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("60s", 60.0),
        ("500ms", 0.5),
        ("250us", 0.00025),
        ("250µs", 0.00025),
        ("100ns", 1e-7),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("1m30.5s", 90.5),
        ("1.5s", 1.5),
        ("0s", 0.0),
        ("0", 0.0),
        ("90", 90.0),
        (90, 90.0),
        (0.25, 0.25),
    ],
)
def test_parse_duration(value: object, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1s", 'must be a duration such as "500ms", "60s" or "1h30m", got "-1s"'),
        (-1, "got -1"),
        ("1d", "duration"),
        ("s", "duration"),
        ("1h 30m", "duration"),
        ("abc", "duration"),
        ("", "duration"),
        (True, "got true"),
        (float("inf"), "duration"),
        ("99999999999h", "at most"),
    ],
)
def test_parse_duration_rejects(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_duration(value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (0.5, "500ms"),
        (60.0, "60s"),
        (0.001, "1ms"),
        (0.002, "2ms"),  # as written, not "0.002s"
        (1e-05, "0.00001s"),
        (0.1, "100ms"),
        (1.5, "1.5s"),
        (0.0015, "0.0015s"),
    ],
)
def test_format_duration_round_trips(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds
