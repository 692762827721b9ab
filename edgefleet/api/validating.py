"""Reading untyped documents (YAML, JSON, TOML) into typed values while collecting every problem.

A :class:`Problems` collector hands out :class:`Reader` views onto mappings. Readers convert
fields with small converter functions (``object -> T`` raising :class:`ValueError` with a
message), record a :class:`~edgefleet.errors.Problem` at the field's full path for every bad value,
and never raise. Any field a reader was not asked about is reported as unknown, with the closest
known name suggested. At the end the caller calls :meth:`Problems.raise_if_any`::

    problems = Problems()
    r = problems.reader(doc, "spec") or problems.empty_reader("spec")  # None: not a mapping
    size = r.optional("maxBatchSize", int_in(1, 1024), default=1)
    name = r.required("name", non_empty_str, fallback="")
    problems.raise_if_any(ValidationError, source="deploy.yaml")

A bad field yields the given default or fallback, so building the typed result never needs
``None`` checks; the result is discarded anyway when any problem was recorded.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from typing import TypeVar

from edgefleet.api.quantities import describe
from edgefleet.errors import ConfigError, Problem, ValidationError

T = TypeVar("T")
D = TypeVar("D")
E = TypeVar("E", bound=Enum)

Convert = Callable[[object], T]
"""A converter: returns the typed value or raises ValueError saying what was expected."""

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def field_path(parent: str, key: object) -> str:
    """``spec`` + ``runtime`` -> ``spec.runtime``; odd keys are quoted: ``labels["a.b/c"]``."""
    if isinstance(key, str) and _PLAIN_KEY.fullmatch(key):
        return f"{parent}.{key}" if parent else key
    text = json.dumps(key, ensure_ascii=False) if isinstance(key, str) else repr(key)
    return f"{parent}[{text}]"


def index_path(parent: str, index: int) -> str:
    """``spec.runtime.executionProviders`` + 1 -> ``spec.runtime.executionProviders[1]``."""
    return f"{parent}[{index}]"


def join_paths(prefix: str, path: str) -> str:
    """``documents[1]`` + ``spec.model`` -> ``documents[1].spec.model``."""
    if not prefix or not path:
        return prefix or path
    return prefix + path if path.startswith("[") else f"{prefix}.{path}"


class Problems:
    """Collects every problem of one document; hands out readers for its mappings.

    Call :meth:`collect` or :meth:`raise_if_any` once, after all reading: unknown fields are
    only known then.
    """

    def __init__(self) -> None:
        self._found: list[Problem] = []
        self._readers: list[Reader] = []

    def add(self, path: str, message: str) -> None:
        self._found.append(Problem(path, message))

    def extend(self, problems: Iterable[Problem], *, prefix: str = "") -> None:
        """Add problems found elsewhere, their paths put under ``prefix``."""
        for p in problems:
            self._found.append(Problem(join_paths(prefix, p.path), p.message))

    def reader(self, value: object, path: str = "") -> Reader | None:
        """A reader of ``value`` at ``path``; ``None`` (with a problem) if it is not a mapping."""
        if not isinstance(value, Mapping):
            self.add(path, f"must be a mapping, got {describe(value)}")
            return None
        reader = Reader(self, path, value)
        self._readers.append(reader)
        return reader

    def empty_reader(self, path: str) -> Reader:
        """A reader of an absent mapping: every optional field takes its default."""
        reader = self.reader({}, path)
        assert reader is not None
        return reader

    def convert(self, path: str, value: object, convert: Convert[T], fallback: D) -> T | D:
        """``convert(value)``, or ``fallback`` with a problem at ``path`` on ValueError."""
        try:
            return convert(value)
        except ValueError as exc:
            self.add(path, str(exc))
            return fallback

    def collect(self) -> tuple[Problem, ...]:
        """Every problem: those recorded, then the unknown fields of every reader."""
        found = list(self._found)
        for reader in self._readers:
            found.extend(reader.unknown_fields())
        return tuple(found)

    def raise_if_any(
        self, error: type[ValidationError] | type[ConfigError], *, source: str = ""
    ) -> None:
        """Raise ``error`` carrying every problem, if there is any."""
        found = self.collect()
        if found:
            raise error(found, source=source)


class Reader:
    """Reads the fields of one mapping; every field it is asked about becomes a known field."""

    def __init__(self, problems: Problems, path: str, value: Mapping[object, object]) -> None:
        self.problems = problems
        self.path = path
        self._value = value
        self._known: set[str] = set()

    def at(self, name: str) -> str:
        """The full path of field ``name``."""
        return field_path(self.path, name)

    def raw(self, name: str) -> object:
        """The field's value as found (``None`` when absent)."""
        self._known.add(name)
        return self._value.get(name)

    def has(self, name: str) -> bool:
        """Whether the field is present and not null (null means "use the default")."""
        self._known.add(name)
        return self._value.get(name) is not None

    def ignore(self, *names: str) -> None:
        """Accept these fields without reading them (e.g. ``status``, added by the hub)."""
        self._known.update(names)

    def required(self, name: str, convert: Convert[T], fallback: D) -> T | D:
        """A required field; ``fallback`` (with a problem) when missing or invalid."""
        value = self.raw(name)
        if value is None:
            self.problems.add(self.at(name), "required field is missing")
            return fallback
        return self.problems.convert(self.at(name), value, convert, fallback)

    def optional(self, name: str, convert: Convert[T], default: D) -> T | D:
        """An optional field; ``default`` when missing, null or (with a problem) invalid."""
        value = self.raw(name)
        if value is None:
            return default
        return self.problems.convert(self.at(name), value, convert, default)

    def section(self, name: str) -> Reader | None:
        """A nested mapping; ``None`` when absent or null, or (with a problem) not a mapping."""
        value = self.raw(name)
        return None if value is None else self.problems.reader(value, self.at(name))

    def required_section(self, name: str) -> Reader | None:
        """A nested mapping that must be present; ``None`` (with a problem) otherwise."""
        if not self.has(name):
            self.problems.add(self.at(name), "required field is missing")
            return None
        return self.section(name)

    def items(self, name: str) -> list[tuple[str, object]]:
        """The elements of a list field with their paths; ``[]`` when absent or not a list."""
        value = self.raw(name)
        if value is None:
            return []
        if not isinstance(value, list):
            self.problems.add(self.at(name), f"must be a list, got {describe(value)}")
            return []
        return [(index_path(self.at(name), i), item) for i, item in enumerate(value)]

    def list_of(self, name: str, convert: Convert[T], *, unique: bool = False) -> list[T] | None:
        """A list of converted scalars (bad ones left out, with problems); ``None`` when absent."""
        if not self.has(name):
            return None
        result: list[T] = []
        seen: dict[object, str] = {}
        for path, item in self.items(name):
            try:
                value = convert(item)
            except ValueError as exc:
                self.problems.add(path, str(exc))
                continue
            if unique and value in seen:
                self.problems.add(path, f"duplicates {seen[value]}")
                continue
            seen.setdefault(value, path)
            result.append(value)
        return result

    def string_map(
        self, name: str, key: Convert[str], value: Convert[str]
    ) -> dict[str, str] | None:
        """A mapping of strings to strings, sorted by key; ``None`` when absent."""
        raw = self.raw(name)
        if raw is None:
            return None
        if not isinstance(raw, Mapping):
            self.problems.add(self.at(name), f"must be a mapping, got {describe(raw)}")
            return None
        result: dict[str, str] = {}
        for k, v in raw.items():
            path = field_path(self.at(name), k)
            try:
                good_key = key(k)
            except ValueError as exc:
                self.problems.add(path, f"invalid key: {exc}")
                continue
            good_value = self.problems.convert(path, v, value, None)
            if good_value is not None:
                result[good_key] = good_value
        return dict(sorted(result.items()))

    def unknown_fields(self) -> list[Problem]:
        """A problem for every field present that no one asked about."""
        found = []
        for key in self._value:
            if key in self._known:
                continue
            message = "unknown field"
            if isinstance(key, str):
                close = difflib.get_close_matches(key, sorted(self._known), n=1, cutoff=0.6)
                if close:
                    message += f' (did you mean "{close[0]}"?)'
            found.append(Problem(field_path(self.path, key), message))
        return found


# Converters: object -> T, raising ValueError that says what was expected and what was got.


def as_str(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be a string, got {describe(value)}")
    return value


def non_empty_str(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be a non-empty string, got {describe(value)}")
    return value


def as_bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {describe(value)}")
    return value


def _range_text(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"from {low:g} to {high:g}"
    return f"at least {low:g}" if low is not None else f"at most {high:g}"


def int_in(low: int | None = None, high: int | None = None) -> Convert[int]:
    """An integer (never a bool, never ``"8"``) within ``low..high`` inclusive."""

    def convert(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"must be an integer, got {describe(value)}")
        if (low is not None and value < low) or (high is not None and value > high):
            raise ValueError(f"must be {_range_text(low, high)}, got {value}")
        return value

    return convert


def number_in(
    low: float | None = None, high: float | None = None, *, above: float | None = None
) -> Convert[float]:
    """A finite number (int or float, never a bool) within ``low..high``, and ``> above``."""

    def convert(value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"must be a number, got {describe(value)}")
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"must be a finite number, got {describe(value)}")
        if above is not None and number <= above:
            extra = f" and {_range_text(None, high)}" if high is not None else ""
            raise ValueError(f"must be more than {above:g}{extra}, got {describe(value)}")
        if (low is not None and number < low) or (high is not None and number > high):
            raise ValueError(f"must be {_range_text(low, high)}, got {describe(value)}")
        return number

    return convert


def one_of(enum: type[E]) -> Convert[E]:
    """A member of a string enum, given by its value."""
    choices = [str(member.value) for member in enum]

    def convert(value: object) -> E:
        for member in enum:
            if member.value == value:
                return member
        raise ValueError(f"must be one of {', '.join(choices)}, got {describe(value)}")

    return convert


def matching(pattern: str, what: str, *, max_length: int | None = None) -> Convert[str]:
    """A string matching ``pattern`` in full; ``what`` says in words what that is."""
    compiled = re.compile(pattern)

    def convert(value: object) -> str:
        if not isinstance(value, str):
            raise ValueError(f"must be {what} (a string), got {describe(value)}")
        if max_length is not None and len(value) > max_length:
            raise ValueError(f"must be at most {max_length} characters, got {len(value)}")
        if not compiled.fullmatch(value):
            raise ValueError(f"must be {what}, got {describe(value)}")
        return value

    return convert


def within(convert: Convert[T], check: Callable[[T], str | None]) -> Convert[T]:
    """``convert``, then ``check`` (which returns a problem message or ``None``)."""

    def checked(value: object) -> T:
        result = convert(value)
        message = check(result)
        if message:
            raise ValueError(message)
        return result

    return checked
