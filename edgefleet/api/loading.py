"""Loading manifest files: YAML (several documents) or JSON, into typed manifests.

Every problem of every document is reported in one :class:`ValidationError`. Duplicate keys
in a mapping are problems (a silently overridden field is worse than an error), and so are two
documents with the same kind and name in one file.

Hostile files are bounded before anything is built from them (the composed YAML node graph is
checked first; a problem is ``FILE:LINE: reason``):

* aliases may not expand the document past :data:`MAX_EXPANDED_NODES` values (a "billion
  laughs" file of a few hundred bytes is refused at once instead of growing to gigabytes), nor
  refer to themselves;
* only plain data: strings, integers, finite floats, booleans, null, lists and mappings
  (``!!binary``, ``!!set``, ``!!omap``, custom tags are refused; an unquoted date stays a
  string, as in Kubernetes);
* integers fit in 64 bits (manifests travel as JSON to the hub; a 5,000-digit integer is a
  problem, not a traceback); ``.nan`` and ``.inf`` are refused (JSON has neither).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgefleet.api.manifests import Manifest, parse_manifest
from edgefleet.api.quantities import describe
from edgefleet.api.validating import Problems, join_paths
from edgefleet.errors import Problem, ValidationError

MAX_FILE_BYTES = 1 << 20  # 1 MiB
MAX_EXPANDED_NODES = 100_000
"""Values (scalars, lists, mappings) in one file once aliases are expanded."""
MAX_INT_DIGITS = 40
INT_MIN, INT_MAX = -(2**63), 2**63 - 1


class _DuplicateKeyError(ValueError):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKeyError(f"found duplicate key {describe(key)}")
        result[key] = value
    return result


def _bounded_int(text: str) -> int:
    """JSON integers as the YAML path bounds them (an out-of-bounds one sends the text to the
    YAML path, which reports it with its line)."""
    value = int(text) if len(text) <= MAX_INT_DIGITS else None
    if value is None or not INT_MIN <= value <= INT_MAX:
        raise ValueError("out of bounds")
    return value


def _refused_constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


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
            parsed = json.loads(
                text,
                object_pairs_hook=_unique_pairs,
                parse_int=_bounded_int,
                parse_constant=_refused_constant,
            )
        except _DuplicateKeyError as exc:
            raise ValidationError([Problem("", f"invalid JSON: {exc}")], source=source) from exc
        except (ValueError, RecursionError):
            pass  # not JSON: perhaps YAML flow style; YAML reports the error if not
        else:
            return parsed if isinstance(parsed, list) else [parsed]
    from edgefleet.api.yamlloading import load_all  # here: manifests from the hub are JSON

    return load_all(text, source)


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
