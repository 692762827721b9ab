"""A model's configuration schema: the JSON Schema its publisher signs with the model
(the extra file :data:`FILE_NAME`, listed in the signed metadata like a validation set), and
the check of a ModelConfig's data against it (docs/model-config.md, "The schema").

Pure and stdlib only (edged validates again before a worker sees a config, and edged stays
small): a bounded subset of JSON Schema (draft 2020-12 words), enough for configuration:

* ``type`` (a name or a list: object, array, string, number, integer, boolean, null),
  ``enum``, ``const``;
* objects: ``properties``, ``required``, ``additionalProperties`` (true, false or a schema),
  ``minProperties``, ``maxProperties``;
* arrays: ``items`` (one schema), ``minItems``, ``maxItems``, ``uniqueItems``;
* numbers: ``minimum``, ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum``,
  ``multipleOf``; strings: ``minLength``, ``maxLength``;
* annotations, accepted and not checked: ``$schema``, ``$id``, ``$comment``, ``title``,
  ``description``, ``default``, ``examples``, ``deprecated``, ``readOnly``, ``writeOnly``.

Any other keyword (``$ref``, ``pattern``, ``allOf``, ``if``...) is refused when the schema is
read, with its path: "not supported", never silently ignored, so that a publisher's rule is
either checked or the artifact is refused. Bounds: :data:`MAX_SCHEMA_BYTES`,
:data:`MAX_SCHEMA_DEPTH`, :data:`MAX_PROBLEMS` problems reported per check.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgefleet.api.validating import field_path, index_path
from edgefleet.errors import Problem

FILE_NAME = "config.schema.json"
"""The extra file of a model artifact that holds its configuration schema."""

MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 16
MAX_PROBLEMS = 20

_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
_ANNOTATIONS = frozenset(
    {"$schema", "$id", "$comment", "title", "description", "default", "examples",
     "deprecated", "readOnly", "writeOnly"}
)  # fmt: skip
_NUMBERS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_COUNTS = (
    "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
)  # fmt: skip
_KEYWORDS = frozenset(
    {"type", "enum", "const", "properties", "required", "additionalProperties", "items",
     "uniqueItems", *_NUMBERS, *_COUNTS}
) | _ANNOTATIONS  # fmt: skip


class SchemaError(ValueError):
    """A schema this module cannot check: the message names the path."""


@dataclass(frozen=True, slots=True)
class ConfigSchema:
    """A checked schema (the document, read-only) and its digest."""

    document: Mapping[str, Any]
    sha256: str

    def problems(self, data: object, path: str = "data") -> list[Problem]:
        """Every way ``data`` breaks the schema (at most :data:`MAX_PROBLEMS`), each with the
        path of the value, ``data.zones.door[2]``."""
        found: list[Problem] = []
        _check(self.document, data, path, found)
        return found[:MAX_PROBLEMS]


def parse_schema(raw: bytes) -> ConfigSchema:
    """The schema in ``raw``; :class:`SchemaError` naming what is wrong and where."""
    import hashlib

    if len(raw) > MAX_SCHEMA_BYTES:
        raise SchemaError(f"{FILE_NAME} is {len(raw)} bytes, more than {MAX_SCHEMA_BYTES}")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise SchemaError(f"{FILE_NAME} is not JSON: {exc}") from None
    if not isinstance(doc, Mapping):
        raise SchemaError(f"{FILE_NAME}: must be a JSON object (a schema)")
    _read(doc, "", 0)
    return ConfigSchema(doc, hashlib.sha256(raw).hexdigest())


def _where(path: str) -> str:
    return f"{FILE_NAME} at {path or '(root)'}"


def _read(schema: object, path: str, depth: int) -> None:
    if isinstance(schema, bool):
        return  # true: anything; false: nothing
    if not isinstance(schema, Mapping):
        raise SchemaError(f"{_where(path)}: a schema must be an object or a boolean")
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaError(f"{_where(path)}: nested more than {MAX_SCHEMA_DEPTH} levels")
    for key, value in schema.items():
        at = field_path(path, key)
        if key not in _KEYWORDS:
            raise SchemaError(
                f"{_where(path)}: keyword {key!r} is not supported (edgefleet checks a subset "
                "of JSON Schema, docs/model-config.md); nothing is ignored"
            )
        if key == "type":
            names = value if isinstance(value, list) else [value]
            if not names or any(n not in _TYPES for n in names):
                raise SchemaError(f"{_where(at)}: must be one of {', '.join(_TYPES)} or a list")
        elif key == "enum" and not isinstance(value, list):
            raise SchemaError(f"{_where(at)}: must be a list")
        elif key == "properties":
            if not isinstance(value, Mapping):
                raise SchemaError(f"{_where(at)}: must be an object of schemas")
            for name, sub in value.items():
                _read(sub, field_path(at, name), depth + 1)
        elif key in ("additionalProperties", "items"):
            _read(value, at, depth + 1)
        elif key == "required":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise SchemaError(f"{_where(at)}: must be a list of property names")
        elif key in _NUMBERS:
            if not _is_number(value) or not math.isfinite(value):
                raise SchemaError(f"{_where(at)}: must be a number")
            if key == "multipleOf" and value <= 0:
                raise SchemaError(f"{_where(at)}: must be more than 0")
        elif key in _COUNTS:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise SchemaError(f"{_where(at)}: must be a non-negative integer")
        elif key == "uniqueItems" and not isinstance(value, bool):
            raise SchemaError(f"{_where(at)}: must be true or false")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _type_of(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, Mapping) else type(value).__name__


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True)


def _check(schema: object, value: object, path: str, found: list[Problem]) -> None:
    if len(found) >= MAX_PROBLEMS:
        return
    if schema is True:
        return
    if schema is False:
        found.append(Problem(path, "is not allowed here by the schema"))
        return
    assert isinstance(schema, Mapping)
    actual = _type_of(value)
    if "type" in schema:
        wanted = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        ok = actual in wanted or (actual == "integer" and "number" in wanted)
        if not ok:
            found.append(Problem(path, f"must be of type {' or '.join(wanted)}, got {actual}"))
            return
    if "const" in schema and _canonical(value) != _canonical(schema["const"]):
        found.append(Problem(path, f"must be {json.dumps(schema['const'])}"))
    if "enum" in schema and _canonical(value) not in {_canonical(v) for v in schema["enum"]}:
        choices = ", ".join(json.dumps(v) for v in schema["enum"][:10])
        found.append(Problem(path, f"must be one of {choices}, got {json.dumps(value)[:80]}"))
    if _is_number(value):
        _check_number(schema, float(value), path, found)  # type: ignore[arg-type]
    elif isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            found.append(Problem(path, f"must be at least {schema['minLength']} characters"))
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            found.append(Problem(path, f"must be at most {schema['maxLength']} characters"))
    elif isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            found.append(Problem(path, f"must have at least {schema['minItems']} items"))
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            found.append(Problem(path, f"must have at most {schema['maxItems']} items"))
        if schema.get("uniqueItems") and len({_canonical(v) for v in value}) != len(value):
            found.append(Problem(path, "must have unique items"))
        if "items" in schema:
            for i, item in enumerate(value):
                _check(schema["items"], item, index_path(path, i), found)
    elif isinstance(value, Mapping):
        _check_object(schema, value, path, found)


def _check_number(schema: Mapping[str, Any], v: float, path: str, found: list[Problem]) -> None:
    if "minimum" in schema and v < schema["minimum"]:
        found.append(Problem(path, f"must be at least {schema['minimum']}, got {v:g}"))
    if "maximum" in schema and v > schema["maximum"]:
        found.append(Problem(path, f"must be at most {schema['maximum']}, got {v:g}"))
    if "exclusiveMinimum" in schema and v <= schema["exclusiveMinimum"]:
        found.append(Problem(path, f"must be more than {schema['exclusiveMinimum']}, got {v:g}"))
    if "exclusiveMaximum" in schema and v >= schema["exclusiveMaximum"]:
        found.append(Problem(path, f"must be less than {schema['exclusiveMaximum']}, got {v:g}"))
    if "multipleOf" in schema:
        q = v / schema["multipleOf"]
        if not math.isclose(q, round(q), rel_tol=0, abs_tol=1e-9):
            found.append(Problem(path, f"must be a multiple of {schema['multipleOf']}"))


def _check_object(
    schema: Mapping[str, Any], value: Mapping[str, Any], path: str, found: list[Problem]
) -> None:
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        found.append(Problem(path, f"must have at least {schema['minProperties']} keys"))
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        found.append(Problem(path, f"must have at most {schema['maxProperties']} keys"))
    for name in schema.get("required", []):
        if name not in value:
            found.append(Problem(field_path(path, name), "is required by the schema"))
    props: Mapping[str, Any] = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        sub = field_path(path, key)
        if key in props:
            _check(props[key], item, sub, found)
        elif extra is False:
            known = ", ".join(sorted(props)) or "none"
            found.append(Problem(sub, f"is not a key the schema knows (it knows: {known})"))
        else:
            _check(extra, item, sub, found)
