"""Loading manifest files: YAML (several documents) or JSON, into typed manifests.

Every problem of every document is reported in one :class:`ValidationError`. Duplicate keys
in a mapping are problems (a silently overridden field is worse than an error), and so are two
documents with the same kind and name in one file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from edgefleet.api.manifests import Manifest, parse_manifest
from edgefleet.api.quantities import describe
from edgefleet.api.validating import Problems, join_paths
from edgefleet.errors import Problem, ValidationError

MAX_FILE_BYTES = 1 << 20  # 1 MiB

if TYPE_CHECKING:
    _BaseLoader = yaml.SafeLoader
else:
    _BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _UniqueKeyLoader(_BaseLoader):
    """The safe loader (libyaml's when available) that rejects duplicate mapping keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable: the base constructor reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {describe(key)}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _DuplicateKeyError(ValueError):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKeyError(f"found duplicate key {describe(key)}")
        result[key] = value
    return result


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        text = f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
        if exc.context and exc.context_mark is not None:
            text += f" ({exc.context} at line {exc.context_mark.line + 1})"
        return text
    return f"invalid YAML: {exc}"


def _decode(text: str | bytes, source: str) -> str:
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_FILE_BYTES:
        raise ValidationError(
            [Problem("", f"is larger than 1 MiB ({MAX_FILE_BYTES} bytes), the most accepted")],
            source=source,
        )
    if isinstance(text, str):
        return text
    try:
        return text.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValidationError(
            [Problem("", f"is not UTF-8 text (byte {exc.start})")], source=source
        ) from exc


def _parse(text: str, source: str) -> list[object]:
    """The documents of ``text``: a JSON object or list of objects, else YAML documents."""
    if text.lstrip().startswith(("{", "[")):
        try:
            parsed = json.loads(text, object_pairs_hook=_unique_pairs)
        except _DuplicateKeyError as exc:
            raise ValidationError([Problem("", f"invalid JSON: {exc}")], source=source) from exc
        except (ValueError, RecursionError):
            pass  # not JSON: perhaps YAML flow style; YAML reports the error if not
        else:
            return parsed if isinstance(parsed, list) else [parsed]
    try:
        return list(yaml.load_all(text, Loader=_UniqueKeyLoader))
    except yaml.YAMLError as exc:
        raise ValidationError([Problem("", _yaml_problem(exc))], source=source) from exc
    except RecursionError as exc:
        raise ValidationError([Problem("", "is nested too deeply")], source=source) from exc
    except (ValueError, OverflowError, TypeError) as exc:
        # what a YAML constructor raises on a value it cannot build: an integer of more than
        # 4300 digits (Python's limit), a date out of range, an unhashable key...
        raise ValidationError([Problem("", f"invalid YAML: {exc}")], source=source) from exc


def load_documents(text: str | bytes, *, source: str) -> list[dict[str, Any]]:
    """The mappings in ``text`` (YAML documents, or JSON), empty documents skipped.

    Documents are numbered from 0 among the non-empty ones: ``documents[2]: must be a mapping``.
    """
    found = [doc for doc in _parse(_decode(text, source), source) if doc is not None]
    problems = [
        Problem(f"documents[{i}]", f"must be a mapping, got {describe(doc)}")
        for i, doc in enumerate(found)
        if not isinstance(doc, dict)
    ]
    if problems:
        raise ValidationError(problems, source=source)
    return [doc for doc in found if isinstance(doc, dict)]


def parse_documents(docs: list[dict[str, Any]], *, source: str) -> list[Manifest]:
    """Typed manifests of ``docs``, all problems reported together.

    With more than one document, problem paths start with ``documents[i].``. Two documents of
    the same kind and name are a problem.
    """
    problems = Problems()
    manifests: list[Manifest] = []
    first_of: dict[tuple[str, str], int] = {}
    for i, doc in enumerate(docs):
        prefix = f"documents[{i}]" if len(docs) > 1 else ""
        try:
            manifest = parse_manifest(doc, source=f"{source}[{i}]")
        except ValidationError as exc:
            problems.extend(exc.problems, prefix=prefix)
            continue
        key = (manifest.kind, manifest.name)
        if key in first_of:
            problems.add(
                join_paths(prefix, "metadata.name"),
                f'{manifest.kind} "{manifest.name}" is already in documents[{first_of[key]}]',
            )
            continue
        first_of[key] = i
        manifests.append(manifest)
    problems.raise_if_any(ValidationError, source=source)
    return manifests


def load_manifests(text: str | bytes, *, source: str) -> list[Manifest]:
    """Typed manifests from YAML or JSON text (see :func:`load_documents`)."""
    return parse_documents(load_documents(text, source=source), source=source)


def load_manifest_file(path: Path) -> list[Manifest]:
    """Typed manifests from a file; an unreadable file is a :class:`ValidationError` too."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ValidationError([Problem("", f"cannot read: {reason}")], source=str(path)) from exc
    return load_manifests(data, source=str(path))
