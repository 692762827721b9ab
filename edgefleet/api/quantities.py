"""Quantities with Kubernetes semantics: CPU, memory, integer-or-percent, durations.

Pure functions. Parsers raise :class:`ValueError` whose message says what was expected and what
was got; formatters render the canonical text that the parsers read back to an equal value.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

_MAX_TEXT = 64  # no quantity needs more characters; longer text is rejected before parsing
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_EXPONENT = r"(?:[eE][+-]?\d{1,2})"

_CPU = re.compile(rf"(?P<number>{_NUMBER}{_EXPONENT}?)(?P<milli>m?)")
_MEMORY = re.compile(
    rf"(?P<number>{_NUMBER})(?:(?P<suffix>[KMGTPE]i|[kMGTPE])|(?P<exp>{_EXPONENT}))?"
)
_PERCENT = re.compile(r"(?P<number>\d{1,9})%")
_INTEGER = re.compile(r"\d{1,18}")
_PLAIN_NUMBER = re.compile(rf"(?P<number>{_NUMBER})")
_DURATION_PART = re.compile(rf"(?P<number>{_NUMBER})(?P<unit>ns|us|µs|ms|s|m|h)")
_DURATION = re.compile(rf"(?:{_NUMBER}(?:ns|us|µs|ms|s|m|h))+")

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_DURATION_UNITS = {
    "ns": Decimal("1e-9"),
    "us": Decimal("1e-6"),
    "µs": Decimal("1e-6"),
    "ms": Decimal("1e-3"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
}

MAX_CPU_MILLIS = 10**9  # a million cores
MAX_MEMORY_BYTES = 2**63 - 1
MAX_DURATION_SECONDS = 10**9  # about 31 years


def describe(value: object) -> str:
    """Render a value found in a document for an error message: strings quoted, YAML words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = value if len(value) <= 60 else value[:57] + "..."
        return json.dumps(text, ensure_ascii=False)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return f"{type(value).__name__} {value!s}"


def _decimal_of(value: object, pattern: re.Pattern[str]) -> tuple[Decimal, re.Match[str]] | None:
    """The number in ``value`` (a string matching ``pattern``, an int or a finite float)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        value = str(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            return None
        value = repr(value)
        if "e" in value:  # 1e-05: spell it out so that the pattern reads it
            value = f"{Decimal(value):f}"
    if not isinstance(value, str) or len(value) > _MAX_TEXT:
        return None
    match = pattern.fullmatch(value.strip())
    if match is None:
        return None
    try:
        return Decimal(match["number"]), match
    except InvalidOperation:  # pragma: no cover - the pattern admits only valid numbers
        return None


def parse_cpu(value: object) -> int:
    """CPU quantity in millicores: ``"500m"`` -> 500, ``"1.5"`` -> 1500, ``2`` -> 2000."""
    expected = f'must be a CPU quantity such as "500m" or "2", got {describe(value)}'
    found = _decimal_of(value, _CPU)
    if found is None:
        raise ValueError(expected)
    number, match = found
    millis = number if match["milli"] else number * 1000
    if millis != millis.to_integral_value():
        raise ValueError(f"must be a whole number of millicores (0.001), got {describe(value)}")
    if millis <= 0:
        raise ValueError(f"must be more than 0, got {describe(value)}")
    if millis > MAX_CPU_MILLIS:
        raise ValueError(f"must be at most {MAX_CPU_MILLIS // 1000} cores, got {describe(value)}")
    return int(millis)


def format_cpu(millis: int) -> str:
    """Canonical CPU text: ``"2"`` for whole cores, else ``"500m"``."""
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def parse_memory(value: object) -> int:
    """Memory quantity in bytes: ``"256Mi"``, ``"1G"``, ``"129e6"``, ``"1.5Gi"``, ``1024``."""
    expected = f'must be a memory quantity such as "256Mi" or "1G", got {describe(value)}'
    if isinstance(value, float):
        raise ValueError(expected)
    found = _decimal_of(value, _MEMORY)
    if found is None:
        if isinstance(value, str) and re.fullmatch(rf"{_NUMBER}m", value.strip()):
            expected += ' (use "Mi" for mebibytes or "M" for megabytes; "m" means milli)'
        raise ValueError(expected)
    number, match = found
    if match["suffix"]:
        number *= _BINARY.get(match["suffix"]) or _DECIMAL[match["suffix"]]
    elif match["exp"]:
        number = number.scaleb(int(match["exp"][1:]))
    if number != number.to_integral_value():
        raise ValueError(f"must be a whole number of bytes, got {describe(value)}")
    if number > MAX_MEMORY_BYTES:
        raise ValueError(f"must be at most 8Ei, got {describe(value)}")
    return int(number)


def format_memory(size: int) -> str:
    """Canonical memory text: the largest exact binary then decimal suffix, else plain bytes."""
    if size > 0:
        for units in (_BINARY, _DECIMAL):
            for suffix, unit in reversed(units.items()):
                if size % unit == 0:
                    return f"{size // unit}{suffix}"
    return str(size)


@dataclass(frozen=True, slots=True)
class IntOrPercent:
    """A count (``3``) or a percentage of some total (``"25%"``), like Kubernetes' maxSurge."""

    value: int
    percent: bool

    def resolve(self, total: int, *, round_up: bool) -> int:
        """The count this stands for out of ``total``, rounding a percentage up or down."""
        if not self.percent:
            return self.value
        scaled = total * self.value
        return -(-scaled // 100) if round_up else scaled // 100

    def to_yaml(self) -> int | str:
        """``25`` or ``"25%"``: what :func:`parse_int_or_percent` reads back."""
        return f"{self.value}%" if self.percent else self.value

    def __str__(self) -> str:
        return f"{self.value}%" if self.percent else str(self.value)


def parse_percent(value: object) -> int:
    """A whole percentage ``"0%"``..``"100%"``, returned as the number."""
    expected = f'must be a percentage such as "50%", got {describe(value)}'
    if not isinstance(value, str):
        raise ValueError(expected)
    match = _PERCENT.fullmatch(value.strip())
    if match is None:
        raise ValueError(expected)
    number = int(match["number"])
    if number > 100:
        raise ValueError(f"must be a percentage from 0% to 100%, got {describe(value)}")
    return number


def parse_int_or_percent(value: object) -> IntOrPercent:
    """``3``, ``"3"`` or ``"10%"``. Percentages run 0..100 here (stricter than Kubernetes)."""
    expected = f'must be an integer >= 0 or a percentage such as "25%", got {describe(value)}'
    if isinstance(value, bool):
        raise ValueError(expected)
    if isinstance(value, int):
        if value < 0:
            raise ValueError(expected)
        return IntOrPercent(value, percent=False)
    if isinstance(value, str):
        text = value.strip()
        if _INTEGER.fullmatch(text):
            return IntOrPercent(int(text), percent=False)
        if text.endswith("%"):
            return IntOrPercent(parse_percent(text), percent=True)
    raise ValueError(expected)


def parse_duration(value: object) -> float:
    """Duration in seconds: ``"60s"``, ``"500ms"``, ``"1h30m"``; a bare number is seconds."""
    expected = f'must be a duration such as "500ms", "60s" or "1h30m", got {describe(value)}'
    if isinstance(value, bool):
        raise ValueError(expected)
    total: Decimal
    if isinstance(value, int | float):
        found = _decimal_of(value, _PLAIN_NUMBER)
        if found is None:
            raise ValueError(expected)
        total = found[0]
    elif isinstance(value, str) and len(value) <= _MAX_TEXT:
        text = value.strip()
        if _PLAIN_NUMBER.fullmatch(text):
            total = Decimal(text)
        elif _DURATION.fullmatch(text):
            total = Decimal(0)
            for part in _DURATION_PART.finditer(text):
                total += Decimal(part["number"]) * _DURATION_UNITS[part["unit"]]
        else:
            raise ValueError(expected)
    else:
        raise ValueError(expected)
    if total > MAX_DURATION_SECONDS:
        raise ValueError(f"must be at most {MAX_DURATION_SECONDS} seconds, got {describe(value)}")
    return float(total)


def format_duration(seconds: float) -> str:
    """Canonical duration text that parses back to ``seconds``, as people write it: whole
    milliseconds under a second in ``ms`` (``"2ms"``, ``"500ms"``), else seconds (``"60s"``,
    ``"1.5s"``, ``"0.00001s"``)."""
    number = Decimal(repr(float(seconds)))
    if number == number.to_integral_value():
        return f"{int(number)}s"
    millis = number * 1000
    if number < 1 and millis == millis.to_integral_value():
        return f"{int(millis)}ms"
    return f"{number.normalize():f}s"
